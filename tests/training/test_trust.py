"""A config cannot run code: every class path and callable a config names is checked against the
allow-list (loopnet, lightning, torch, torchmetrics classes) before it is imported; anything else needs
`--trust_config` / `LOOPNET_TRUST_CONFIG=1` (loopnet.training.trust)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import run_command
from tests.reliability.helpers import ROOT, SHORT, env

# The adversary's config: LambdaCallback calls its `on_fit_start` with (trainer, module); jsonargparse
# builds that callable by calling os.system(command=...) while it instantiates the callbacks.
EVIL = """\
trainer:
  callbacks:
    - class_path: lightning.pytorch.callbacks.LambdaCallback
      init_args:
        on_fit_start:
          class_path: os.system
          init_args: {command: "id > pwned.txt"}
"""
# Runs `loopnet <argv>`; reports on stderr's last line which heavy modules were imported and whether
# the module `this` (whose import prints the Zen of Python) was.
PROBE = """
import sys
from loopnet.commands import main
try:
    main(sys.argv[1:])
except SystemExit as e:
    print('exit', e.code, file=sys.stderr)
print(sorted({'lightning', 'this'} & set(sys.modules)), file=sys.stderr)
"""


def _loopnet(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """`loopnet <args>` without the test session's opt-in (tests/conftest.py)."""
    return run_command([sys.executable, "-c", PROBE, *args], env={**env(), "LOOPNET_TRUST_CONFIG": ""}, cwd=tmp_path)


def _refused(proc: subprocess.CompletedProcess, path: str) -> None:
    lines = proc.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("loopnet: error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert path in errors[0] and "--trust_config" in errors[0] and "LOOPNET_TRUST_CONFIG=1" in errors[0], errors
    assert "Traceback" not in proc.stderr
    assert lines[-2] == "exit 2", lines[-2:]


def test_the_issues_config_is_refused_before_lightning_and_runs_nothing(tmp_path):
    (tmp_path / "evil.yaml").write_text(EVIL)
    proc = _loopnet(tmp_path, "fit", *SHORT, "--trainer.default_root_dir", str(tmp_path), "--config", "evil.yaml")
    _refused(proc, "os.system")
    assert not (tmp_path / "pwned.txt").exists()
    assert eval(proc.stderr.strip().splitlines()[-1]) == []  # refused before Lightning's import


@pytest.mark.parametrize(
    "form", [["--trainer.callbacks+=this.Foo"], ["--trainer.logger.class_path=this.Foo"], ["--config", "this.yaml"]]
)
def test_an_unlisted_module_is_refused_without_being_imported(tmp_path, form):
    (tmp_path / "this.yaml").write_text("trainer:\n  logger:\n    class_path: this.Foo\n")
    proc = _loopnet(tmp_path, "fit", *SHORT, *form)
    _refused(proc, "this.Foo")
    assert "Zen of Python" not in proc.stdout + proc.stderr
    assert "this" not in eval(proc.stderr.strip().splitlines()[-1])


def _check(argv: list[str]) -> str | None:
    from loopnet.training.dry_run import check_command

    return check_command(argv)


@pytest.fixture
def own_callback(tmp_path, monkeypatch):
    """A Callback subclass in a module of the user's own (`mycallbacks.MyCallback`), on sys.path."""
    (tmp_path / "mycallbacks.py").write_text(
        "from lightning.pytorch.callbacks import Callback\n\nclass MyCallback(Callback):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("LOOPNET_TRUST_CONFIG", raising=False)
    return ["fit", *SHORT, "--trainer.callbacks+=mycallbacks.MyCallback"]


def test_a_listed_callback_passes_and_an_unlisted_one_needs_the_opt_in(tmp_path, own_callback, monkeypatch):
    (tmp_path / "lr.yaml").write_text(
        "trainer:\n  callbacks:\n    - class_path: lightning.pytorch.callbacks.LearningRateMonitor\n"
        "      init_args: {logging_interval: step}\n"
    )
    assert _check(["fit", *SHORT, "--config", str(tmp_path / "lr.yaml")]) is None
    refused = _check(own_callback)
    assert refused and "mycallbacks.MyCallback" in refused and "--trust_config" in refused
    assert "mycallbacks" not in sys.modules
    assert _check([*own_callback, "--trust_config"]) is None  # the flag
    assert "mycallbacks" in sys.modules
    del sys.modules["mycallbacks"]
    monkeypatch.setenv("LOOPNET_TRUST_CONFIG", "1")
    assert _check(own_callback) is None  # the environment variable


def test_lightning_clis_own_parse_refuses_too(tmp_path, monkeypatch):
    """`LoopnetCLI` without the early checks (the guard in LightningCLI's parse path): the import path
    policy refuses os.system, and a function of an allowed package named where a callable goes (imported
    at the parse, called at fit start) is refused before anything is built."""
    from loopnet.training.dry_run import CheckOnly
    from loopnet.training.cli import build

    monkeypatch.delenv("LOOPNET_TRUST_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", sys.argv[:1])  # pytest's own arguments are not the command's
    (tmp_path / "evil.yaml").write_text(EVIL)
    with pytest.raises(SystemExit) as exit_:
        build(["fit", *SHORT, "--config", "evil.yaml"], CheckOnly)
    assert exit_.value.code == 2
    (tmp_path / "fn.yaml").write_text(
        "trainer:\n  callbacks:\n    - class_path: lightning.pytorch.callbacks.LambdaCallback\n"
        "      init_args: {on_fit_start: torch.save}\n"
    )
    with pytest.raises(ValueError, match=r"torch\.serialization\.save.*it is a function, not a class"):
        build(["fit", *SHORT, "--config", "fn.yaml"], CheckOnly)
    assert not (tmp_path / "pwned.txt").exists()


@pytest.fixture(autouse=True)
def untrusted(monkeypatch):
    """This module tests the refusal: without the test session's opt-in (tests/conftest.py)."""
    monkeypatch.delenv("LOOPNET_TRUST_CONFIG", raising=False)


def test_a_sweep_file_is_held_to_the_same_rule(tmp_path, monkeypatch):
    from loopnet.study.grid import load_sweep

    monkeypatch.delenv("LOOPNET_TRUST_CONFIG", raising=False)
    (tmp_path / "evil.yaml").write_text(EVIL)
    grid = tmp_path / "grid.yaml"
    grid.write_text(
        f"base: [{ROOT / 'configs/cpu.yaml'}]\nout: {tmp_path / 'out'}\ngrid:\n  trainer.callbacks+: [this.Foo]\n"
    )
    with pytest.raises(ValueError, match=r"this\.Foo.*--trust_config"):
        load_sweep(grid)
    grid.write_text(f"base: [{tmp_path / 'evil.yaml'}]\nout: {tmp_path / 'out'}\ngrid:\n  model.optim.lr: [0.1]\n")
    with pytest.raises(ValueError, match=r"os\.system.*--trust_config"):
        load_sweep(grid)
    monkeypatch.setenv("LOOPNET_TRUST_CONFIG", "1")
    assert load_sweep(grid).base == [str(tmp_path / "evil.yaml")]
