"""Every command paid 6-9 s of start-up, even `--help`; `datasets` (with pandas,
~0.8 s of it) is imported only where documents are read."""

import sys

import pytest

from tests.helpers import run_command
from tests.reliability.helpers import ROOT, env

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def test_help():
    """`python -m loopnet test --help` (the Trainer's CLI: Lightning imported), every import it made logged
    on stderr (`-X importtime`)."""
    proc = run_command([sys.executable, "-X", "importtime", "-m", "loopnet", "test", "--help"], env=env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    imported = {line.rpartition("|")[2].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    return proc.stdout, imported


def test_the_cli_starts_without_importing_datasets(test_help):
    _, imported = test_help
    assert "loopnet.training.cli" in imported and "lightning" in imported
    assert not {"datasets", "pandas"} & imported


LIGHT = """
import sys
from loopnet.commands import main
try:
    main(sys.argv[1:])
except SystemExit as e:
    assert e.code in (0, None), e.code
print(sorted({'lightning', 'torch', 'datasets', 'matplotlib'} & set(sys.modules)), file=sys.stderr)
"""


def _light(*args: str) -> tuple[str, list[str]]:
    proc = run_command([sys.executable, "-c", LIGHT, *args], env=env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, eval(proc.stderr.strip().splitlines()[-1])


def test_loopnet_help_lists_the_commands_without_importing_lightning():
    """`loopnet --help` paid Lightning's import (3-4 s of its 5 s) to list the commands."""
    out, heavy = _light("--help")
    assert heavy == []
    for command in ("fit", "validate", "test", "predict", "sweep", "report", "probe", "eval", "export", "bench"):
        assert f"\n  {command} " in out
    assert out.startswith("usage: loopnet <command>")


@pytest.mark.parametrize("tool", ["sweep", "report", "probe", "eval", "export", "bench"])
def test_the_tools_start_without_lightning(tool):
    """`loopnet sweep/report/probe/eval --help` imported Lightning (through loopnet.diagnostics, loopnet.data,
    loopnet.training's package imports) and paid 4-10 s; now only what the tool itself needs (bench: torch)."""
    out, heavy = _light(tool, "--help")
    assert "usage:" in out
    assert heavy == (["torch"] if tool == "bench" else [])


def test_the_console_script_and_python_m_name_the_command_loopnet(test_help):
    import tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"]["loopnet"] == "loopnet.commands:main"
    out, _ = test_help
    assert out.startswith("usage: loopnet [options] test")
    assert "--ckpt_path" in out
