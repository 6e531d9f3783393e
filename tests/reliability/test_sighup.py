"""SIGHUP (the terminal closed) stops `loopnet fit` as SIGTERM does: the interruption checkpoint and the
run summary, exit status 0. Under nohup (SIGHUP ignored) the fit ignores it and completes."""

import signal
import time

import pytest

from loopnet.diagnostics import read_summary
from tests.helpers import Watch

from .helpers import RUN, TINY, Progress, callbacks, finish, load, spawn

pytestmark = pytest.mark.slow  # real fits

ARGS = [*TINY, "--trainer.max_steps", "1000", "--trainer.val_check_interval", "3"]


@pytest.fixture(scope="module")
def hung_up(tmp_path_factory):
    """Two fits started together (their start-up dominates), each sent SIGHUP once past step 4: one as from
    a terminal, one under nohup (with max_steps 8, so that it completes)."""
    folders = {name: tmp_path_factory.mktemp(name) for name in ("terminal", "nohup")}
    progress = {
        name: callbacks((Progress, {"path": str(cwd / "progress"), "delay": 0.2})) for name, cwd in folders.items()
    }
    procs = {
        "terminal": spawn("fit", *ARGS, *progress["terminal"], cwd=folders["terminal"], hup=signal.SIG_DFL),
        "nohup": spawn(
            "fit", *ARGS, "--trainer.max_steps", "8", *progress["nohup"], cwd=folders["nohup"], hup=signal.SIG_IGN
        ),
    }
    waiting, watches = set(procs), {name: Watch(proc, "step 4") for name, proc in procs.items()}
    try:
        while waiting:
            for name in list(waiting):
                proc, mark = procs[name], folders[name] / "progress"
                if proc.poll() is not None:
                    res = finish(proc)
                    raise AssertionError(f"{name}: fit ended (code {res.code}) before step 4:\n{res.err[-4000:]}")
                if mark.exists() and int(mark.read_text() or 0) >= 4:
                    proc.send_signal(signal.SIGHUP)
                    waiting.discard(name)
                else:
                    watches[name].check()
            time.sleep(0.1)
        return {name: (folders[name], finish(proc)) for name, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()


def test_sighup_stops_a_fit_with_its_checkpoint_and_summary(hung_up):
    cwd, res = hung_up["terminal"]
    assert res.code == 0 and "Traceback" not in res.err, res.err[-4000:]
    ckpts = cwd / "runs" / RUN / "version_0" / "checkpoints"
    stopped = load(ckpts / "last-interrupted.ckpt")["global_step"]
    assert 4 <= stopped < 1000 and f"stopped at step {stopped}" in res.last_err_line
    summary = read_summary(cwd / "runs" / RUN / "version_0")
    assert summary["status"] == "interrupted" and summary["global_step"] == stopped
    assert summary["last_checkpoint"].endswith("last-interrupted.ckpt")


def test_under_nohup_sighup_leaves_the_fit_running(hung_up):
    cwd, res = hung_up["nohup"]
    assert res.code == 0, res.err[-4000:]
    summary = read_summary(cwd / "runs" / RUN / "version_0")
    assert summary["status"] == "completed" and summary["global_step"] == 8
    assert not (cwd / "runs" / RUN / "version_0" / "checkpoints" / "last-interrupted.ckpt").exists()
