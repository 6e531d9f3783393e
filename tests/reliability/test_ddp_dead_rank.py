"""A DDP rank killed with SIGKILL at any moment (at start-up, while rank 0 waits for it; mid-run) leaves
rank 0's summary.json, naming the dead rank: Lightning's launcher SIGKILLs rank 0 itself within seconds
of noticing the death, unless a collective failed first."""

import json
import os
import signal
import time
from pathlib import Path

import pytest

from .helpers import RUN, TINY, Progress, callbacks, finish, spawn, wait_for, TWO_CPU_RANKS
from .test_ddp import _children

pytestmark = pytest.mark.slow


def _rank1(pid: int) -> list[int]:
    """The rank the launcher started (a child running loopnet; not a transient helper process)."""
    found = []
    for child in _children(pid):
        try:
            if b"loopnet" in Path(f"/proc/{child}/cmdline").read_bytes():
                found.append(child)
        except OSError:
            pass
    return found


@pytest.mark.parametrize("when", ["start_up", "step_5"])
def test_a_killed_rank_leaves_a_summary(tmp_path, when):
    progress = tmp_path / "progress"
    proc = spawn(
        "fit",
        *TINY,
        "--trainer.max_steps",
        "1000",
        "--data.batch_size",
        "2",
        *TWO_CPU_RANKS,
        *callbacks((Progress, {"path": str(progress), "delay": 0.2})),
        cwd=tmp_path,
        new_session=True,
        fresh=True,  # as a user's rank 0: forked, Lightning's rank watcher once printed after loopnet's last line
    )
    try:
        if when == "start_up":  # rank 1 started, rank 0 waiting for it at the rendezvous or the first barrier
            wait_for(lambda: _rank1(proc.pid), proc, "rank 1 started")
            time.sleep(1.0)
        else:
            wait_for(lambda: progress.exists() and int(progress.read_text() or 0) >= 5, proc, "step 5")
        (rank1,) = _rank1(proc.pid)
        os.kill(rank1, signal.SIGKILL)
        res = finish(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert res.code != 0
    summary = json.loads((tmp_path / "runs" / RUN / "version_0" / "summary.json").read_text())
    assert summary["status"] == "interrupted", summary
    # at start-up the launcher's termination comes first (its summary names the rank); mid-run, whichever
    # of it and the failed collective (gloo: "Connection closed by peer") comes first
    assert summary["global_step"] == 0 if when == "start_up" else summary["global_step"] >= 5, summary
    if when == "start_up":
        assert "rank 1 (killed by SIGKILL)" in summary["error"], summary["error"]
    assert any(
        line.startswith("loopnet: error: rank 1 (killed by SIGKILL) of this DDP run ended")
        for line in res.err.splitlines()
    ), res.err[-3000:]
