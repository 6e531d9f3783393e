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
