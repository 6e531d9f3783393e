"""Scale-out on CPU: `--trainer.strategy ddp --trainer.devices 2` (gloo) runs end to end; each rank
reads disjoint data, gradients are all-reduced (the ranks' weights stay identical), and the loss
is close to a single process's at the same global batch."""

import json

import pytest

from .helpers import RUN, TINY, RankRecorder, callbacks, finish, load, loopnet, spawn

pytestmark = pytest.mark.slow

ARGS = [*TINY, "--trainer.max_steps", "4", "--trainer.val_check_interval", "4"]


def test_ddp_on_two_cpu_processes(tmp_path):
    ddp, single = tmp_path / "ddp", tmp_path / "single"
    ddp.mkdir(), single.mkdir()
    proc = spawn(
        "fit",
        *ARGS,
        "--data.batch_size",
        "2",
        "--trainer.accelerator",
        "cpu",
        "--trainer.strategy",
        "ddp",
        "--trainer.devices",
        "2",
        *callbacks((RankRecorder, {"folder": str(ddp)})),
        cwd=ddp,
    )
    # Meanwhile, one process with the same global batch (2 ranks x 2 = 4).
    res = loopnet(
        "fit", *ARGS, "--data.batch_size", "4", *callbacks((RankRecorder, {"folder": str(single)})), cwd=single
    )
    assert res.code == 0, res.err[-3000:]
    res = finish(proc)
    assert res.code == 0, res.err[-4000:]

    r0, r1 = (json.loads((ddp / f"rank{r}.json").read_text()) for r in (0, 1))
    (one,) = [json.loads((single / "rank0.json").read_text())]
    assert r0["world"] == r1["world"] == 2 and one["world"] == 1
    assert len(r0["rows"]) == len(r1["rows"]) == 4 * 2
    assert not set(r0["rows"]) & set(r1["rows"])  # the ranks read disjoint windows
    assert r0["params"] == r1["params"]  # gradients were all-reduced: the replicas stayed identical
    ddp_loss = [(a + b) / 2 for a, b in zip(r0["losses"], r1["losses"])]  # the global batch's loss
    assert ddp_loss == pytest.approx(one["losses"], rel=0.01)

    # The checkpoint holds every rank's data position and RNG states, and loads safely.
    ckpt = load(ddp / "runs" / RUN / "version_0" / "checkpoints" / "last.ckpt")
    assert ckpt["global_step"] == 4
    assert len(ckpt["rng_states"]) == 2
    assert json.loads((ddp / "runs" / RUN / "version_0" / "summary.json").read_text())["status"] == "completed"
    ranks = ckpt["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["ranks"]
    assert [r["consumed"] for r in ranks] == [4, 4]


def _children(pid: int) -> list[int]:
    from pathlib import Path

    return [int(c) for t in Path(f"/proc/{pid}/task").iterdir() for c in (t / "children").read_text().split()]


@pytest.mark.parametrize("to", ["all_ranks", "rank1"])
def test_ddp_stops_cleanly_on_a_signal_to_every_rank_or_to_rank_1(tmp_path, to):
    """SIGTERM to all ranks (a terminal's Ctrl-C, SLURM, Kubernetes, `timeout`) or to a
    rank other than 0 hung the job forever: Lightning's handler broadcasts inside the signal handler."""
    import os
    import signal
    from .helpers import Progress, wait_for

    progress = tmp_path / "progress"
    proc = spawn(
        "fit",
        *TINY,
        "--trainer.max_steps",
        "1000",
        "--data.batch_size",
        "2",
        "--trainer.accelerator",
        "cpu",
        "--trainer.strategy",
        "ddp",
        "--trainer.devices",
        "2",
        *callbacks((Progress, {"path": str(progress), "delay": 0.2})),
        cwd=tmp_path,
        new_session=True,
    )
    try:
        wait_for(lambda: progress.exists() and int(progress.read_text() or 0) >= 2, proc, "step 2")
        if to == "all_ranks":
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            (rank1,) = _children(proc.pid)
            os.kill(rank1, signal.SIGTERM)
        res = finish(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert res.code == 0 and "Traceback" not in res.err, res.err[-4000:]
    assert "loopnet: stopped at step" in res.err
    run = tmp_path / "runs" / RUN / "version_0"
    ckpt = load(run / "checkpoints" / "last-interrupted.ckpt")
    ranks = ckpt["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["ranks"]
    assert ckpt["global_step"] >= 2 and [r["consumed"] for r in ranks] == [ckpt["global_step"]] * 2
    assert len(ckpt["rng_states"]) == 2
    assert json.loads((run / "summary.json").read_text())["status"] == "interrupted"
