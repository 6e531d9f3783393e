"""Scale-out on CPU: `--trainer.strategy ddp --trainer.devices 2` (gloo) runs end to end; each rank
reads disjoint data, gradients are all-reduced (the ranks' weights stay identical), and the loss
is close to a single process's at the same global batch. A stop signal to every rank or to one of them
stops the run cleanly, also in a validation, which both ranks abandon together."""

import json

import pytest

from .helpers import (
    TWO_CPU_RANKS,
    RUN,
    TINY,
    RankRecorder,
    SignalInValidation,
    ValidationBatches,
    callbacks,
    finish,
    load,
    loopnet,
    record,
    spawn,
)
from .test_signals import ARGS, _interrupt_state

pytestmark = pytest.mark.slow

# The signal tests' run (validations of 4 batches at steps 3 and 6) on 2 ranks of 2 windows each.
DDP = [
    *ARGS,
    "--data.batch_size",
    "2",
    *TWO_CPU_RANKS,
]


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory):
    """Started together (their start-up dominates): an uninterrupted DDP run of the signal tests' DDP
    command (validations of 4 batches at steps 3 and 6) that also records each rank's windows, losses and
    weights; the same command sent SIGTERM in rank 1 alone in the first batch of the validation at step 3;
    and, in this process meanwhile, one process with the same global batch (2 ranks x 2 = 4)."""
    ref, cut, single = (tmp_path_factory.mktemp(name) for name in ("reference", "interrupted", "single"))
    procs = [
        spawn("fit", *DDP, *callbacks((RankRecorder, {"folder": str(ref)})), cwd=ref),
        spawn(
            "fit",
            *DDP,
            *callbacks(
                (ValidationBatches, {"path": str(cut / "val")}),
                (SignalInValidation, {"step": 3, "batch_idx": 0, "rank": 1}),
            ),
            cwd=cut,
        ),
    ]
    try:
        res = loopnet(
            "fit", *ARGS, "--data.batch_size", "4", *callbacks((RankRecorder, {"folder": str(single)})), cwd=single
        )
        assert res.code == 0, res.err[-3000:]
        reference, interrupted = (finish(p) for p in procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return {"reference": (ref, reference), "interrupted": (cut, interrupted), "single": single}


def test_ddp_on_two_cpu_processes(ddp_runs):
    (ddp, res), single = ddp_runs["reference"], ddp_runs["single"]
    assert res.code == 0, res.err[-4000:]

    r0, r1 = (json.loads((ddp / f"rank{r}.json").read_text()) for r in (0, 1))
    (one,) = [json.loads((single / "rank0.json").read_text())]
    assert r0["world"] == r1["world"] == 2 and one["world"] == 1
    assert len(r0["rows"]) == len(r1["rows"]) == 6 * 2
    assert not set(r0["rows"]) & set(r1["rows"])  # the ranks read disjoint windows
    assert r0["params"] == r1["params"]  # gradients were all-reduced: the replicas stayed identical
    ddp_loss = [(a + b) / 2 for a, b in zip(r0["losses"], r1["losses"])]  # the global batch's loss
    assert ddp_loss == pytest.approx(one["losses"], rel=0.01)

    # The checkpoint holds every rank's data position and RNG states, and loads safely.
    ckpt = load(ddp / "runs" / RUN / "version_0" / "checkpoints" / "last.ckpt")
    assert ckpt["global_step"] == 6
    assert len(ckpt["rng_states"]) == 2
    assert json.loads((ddp / "runs" / RUN / "version_0" / "summary.json").read_text())["status"] == "completed"
    ranks = ckpt["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["ranks"]
    assert [r["consumed"] for r in ranks] == [6, 6]


def test_ddp_ranks_abandon_the_validation_together_when_one_gets_the_signal(ddp_runs):
    """SIGTERM to rank 1 alone in the validation at step 3: both ranks leave it after the same batch
    (the ranks agree after every validation batch), one checkpoint, and the resumed run's record equals
    that of an uninterrupted run (started alongside)."""
    (ref, reference), (cut, interrupted) = ddp_runs["reference"], ddp_runs["interrupted"]
    assert reference.code == 0, reference.err[-3000:]
    assert interrupted.code == 0 and "Traceback" not in interrupted.err, interrupted.err[-4000:]
    assert "loopnet: stopped at step 3" in interrupted.err
    lines = [line.split() for line in (cut / "val").read_text().splitlines()]
    by_rank = {r: [int(b) for rank, s, b in lines if int(rank) == r and int(s) == 3] for r in (0, 1)}
    assert by_rank[0] == by_rank[1] and len(by_rank[0]) < 4, by_rank
    assert _interrupt_state(cut) == {"step": 3, "rerun_validation_at": 3}

    res = finish(spawn("fit", *DDP, "--ckpt_path", "last", cwd=cut))
    assert res.code == 0, res.err[-3000:]
    assert record(cut) == record(ref)


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
        *TWO_CPU_RANKS,
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
