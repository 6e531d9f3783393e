"""`make fit` says how to put `loopnet` on PATH (the venv's bin is not on it), whatever
the fit's outcome, and keeps the fit's exit status."""

import os
import shutil
from pathlib import Path

import pytest
from tests.helpers import run_command

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize("status", [0, 3])
def test_make_fit_says_how_to_put_loopnet_on_path(tmp_path, status):
    venv = tmp_path / "venv"  # a stand-in venv: its `loopnet` only records how it was called
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "loopnet").write_text(f'#!/bin/sh\necho "loopnet $*" > {tmp_path}/called\nexit {status}\n')
    (venv / "bin" / "loopnet").chmod(0o755)
    (venv / ".installed").touch()
    os.utime(venv / ".installed", (4e9, 4e9))  # newer than pyproject.toml: no set-up
    res = run_command(["make", "-s", "-C", str(ROOT), "fit", f"VENV={venv}"])
    assert (tmp_path / "called").read_text().startswith("loopnet fit --config configs/deeploop_r6.yaml")
    assert (res.returncode == 0) == (status == 0), res.stderr
    assert f"run '. {venv}/bin/activate' (or 'export PATH={venv}/bin:$PATH')" in res.stdout


def stand_in_venv(tmp_path):
    """A venv whose `loopnet` records its arguments and LOOPNET_RESUME, set up already (no install)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "loopnet").write_text(
        f'#!/bin/sh\necho "loopnet $*" > {tmp_path}/called\necho "$LOOPNET_RESUME" > {tmp_path}/resume\n'
    )
    (venv / "bin" / "loopnet").chmod(0o755)
    (venv / ".installed").touch()
    os.utime(venv / ".installed", (4e9, 4e9))  # newer than pyproject.toml: no set-up
    return venv


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize(
    "given, resume",
    [
        ([], 'make fit ARGS="--ckpt_path last"'),
        (["ARGS=--ckpt_path last"], 'make fit ARGS="--ckpt_path last"'),
        (
            ["ARGS=--trainer.max_steps 5", "CONFIG=configs/deepnorm_r6.yaml"],
            'make fit CONFIG=configs/deepnorm_r6.yaml ARGS="--trainer.max_steps 5 --ckpt_path last"',
        ),
    ],
)
def test_make_fit_takes_args_and_says_how_to_resume_itself(tmp_path, given, resume):
    venv = stand_in_venv(tmp_path)
    res = run_command(["make", "-s", "-C", str(ROOT), "fit", f"VENV={venv}", *given])
    assert res.returncode == 0, res.stderr
    args = next((g.removeprefix("ARGS=") for g in given if g.startswith("ARGS=")), "")
    config = next((g.removeprefix("CONFIG=") for g in given if g.startswith("CONFIG=")), "configs/deeploop_r6.yaml")
    assert (tmp_path / "called").read_text().split() == [
        "loopnet",
        "fit",
        "--config",
        config,
        "--config",
        "configs/cpu.yaml",
        *args.split(),
    ]
    assert (tmp_path / "resume").read_text().strip() == resume


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_fit_installs_what_training_needs_and_make_test_the_test_extra(tmp_path):
    venv = tmp_path / "fresh"  # nothing installed: make lists every step (-n), runs none
    fit = run_command(["make", "-n", "-s", "-C", str(ROOT), "fit", f"VENV={venv}"]).stdout
    test = run_command(["make", "-n", "-s", "-C", str(ROOT), "test", f"VENV={venv}"]).stdout
    assert "pip install --no-compile -e .\n" in fit and "[test]" not in fit
    # a fresh `make test`: one install of loopnet and the test extra, after the pinned torch in both
    assert "pip install --no-compile -e .\n" not in test and "pip install --no-compile -e '.[test]'" in test
    for out, install in ((fit, "pip install --no-compile -e ."), (test, "pip install --no-compile -e '.[test]'")):
        assert "pip install --no-compile torch==2.13.0" in out and out.index("torch==2.13.0") < out.index(install)
        # the bytecode pip leaves out is written after the install, on every core
        assert out.index(install) < out.rindex("-m compileall -q -j 0 ")


def test_the_stop_line_names_the_resume_command(monkeypatch):
    from loopnet.checkpoints import resume_hint

    monkeypatch.delenv("LOOPNET_RESUME", raising=False)
    assert resume_hint() == "the same command and --ckpt_path last"
    monkeypatch.setenv("LOOPNET_RESUME", 'make fit ARGS="--ckpt_path last"')
    assert resume_hint() == 'make fit ARGS="--ckpt_path last"'
