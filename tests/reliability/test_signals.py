"""A stop lands anywhere and the run still ends within seconds with its checkpoint.

- Output piped through `tee` and Ctrl-C: `tee` dies first, and the run's next write found a broken pipe
  (BrokenPipeError), ending the run in 2.7 s without the interruption checkpoint.
- A stop during a validation waited for the whole validation (minutes on the GPU configs; SLURM kills
  30 s after its SIGTERM): now the validation is abandoned, and the resumed run runs it again, so the
  record equals the uninterrupted run's.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from lightning.pytorch.callbacks import TQDMProgressBar

from tests.helpers import Watch, wait_until
from .helpers import (
    RUN,
    record,
    TINY,
    Progress,
    SignalAt,
    SignalInValidation,
    ValidationBatches,
    callbacks,
    env,
    load,
    loopnet,
    scalars,
    terminal_signals,
)

pytestmark = pytest.mark.slow

# Validations of 4 batches at steps 3 and 6.
ARGS = [*TINY, "--trainer.max_steps", "6", "--trainer.val_check_interval", "3", "--trainer.limit_val_batches", "4"]


def batches_run(path, step: int) -> list[int]:
    """The validation batches a run went through at `step` (ValidationBatches' file), in order."""
    lines = path.read_text().split("\n") if path.exists() else []
    return [int(b) for _, s, b in (line.split() for line in lines if line) if int(s) == step]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("reference")
    res = loopnet("fit", *ARGS, *callbacks((ValidationBatches, {"path": str(cwd / "val")})), cwd=cwd)
    assert res.code == 0, res.err[-3000:]
    assert batches_run(cwd / "val", 3) == [0, 1, 2, 3]
    rec = record(cwd)
    assert [s for s, _ in rec["val_history"]] == [3, 6] and sorted(rec["train/loss"]) == list(range(6))
    return rec


STOPS = {
    "in_the_first_validation_batch": (SignalInValidation, {"step": 3, "batch_idx": 0}),
    "at_the_end_of_the_step_that_validates": (SignalAt, {"step": 3}),
}


def _interrupt_state(cwd) -> dict:
    ckpt = load(cwd / "runs" / RUN / "version_0" / "checkpoints" / "last-interrupted.ckpt")
    states = [
        v for k, v in ckpt["callbacks"].items() if "GracefulInterrupt" in k
    ]  # (Lightning leaves out an empty one)
    return {"step": ckpt["global_step"], **(states[0] if states else {})}


@pytest.mark.parametrize("when", list(STOPS))
def test_stop_during_validation_abandons_it_and_the_resume_runs_it_again(reference, tmp_path, when):
    val = tmp_path / "val"
    seen = callbacks((ValidationBatches, {"path": str(val)}), STOPS[when])
    res = loopnet("fit", *ARGS, *seen, cwd=tmp_path)
    assert res.code == 0 and "loopnet: stopped at step 3" in res.err, res.err[-3000:]
    # Abandoned: at most the batch the stop was agreed after, not the 4 of the whole validation.
    assert batches_run(val, 3) == ([0] if when.startswith("in_the") else [])
    assert _interrupt_state(tmp_path) == {"step": 3, "rerun_validation_at": 3}
    assert scalars(tmp_path / "runs" / RUN / "version_0", "val/loss") == {}

    res = loopnet(
        "fit", *ARGS, "--ckpt_path", "last", *callbacks((ValidationBatches, {"path": str(val)})), cwd=tmp_path
    )
    assert res.code == 0, res.err[-3000:]
    assert batches_run(val, 3)[-4:] == [0, 1, 2, 3]  # run again, whole, before step 4
    assert record(tmp_path) == reference


def test_a_stop_in_the_validation_run_again_is_abandoned_the_same_way(reference, tmp_path):
    res = loopnet("fit", *ARGS, *callbacks(STOPS["in_the_first_validation_batch"]), cwd=tmp_path)
    assert res.code == 0, res.err[-3000:]
    # the rerun validation comes before the resumed run's first step: the guard keeps summary.json as it was
    with pytest.warns(UserWarning, match="the resumed run stopped before its first step"):
        res = loopnet(
            "fit",
            *ARGS,
            "--ckpt_path",
            "last",
            *callbacks((SignalInValidation, {"step": 3, "batch_idx": 1})),
            cwd=tmp_path,
        )
    assert res.code == 0 and "loopnet: stopped at step 3" in res.err, res.err[-3000:]
    assert _interrupt_state(tmp_path) == {"step": 3, "rerun_validation_at": 3}
    res = loopnet("fit", *ARGS, "--ckpt_path", "last", cwd=tmp_path)
    assert res.code == 0, res.err[-3000:]
    assert record(tmp_path) == reference


def test_a_stop_after_the_last_validation_batch_keeps_that_validation(reference, tmp_path):
    """Lightning completes a validation whose last batch saw the stop: nothing to run again."""
    res = loopnet("fit", *ARGS, *callbacks((SignalInValidation, {"step": 3, "batch_idx": 3})), cwd=tmp_path)
    assert res.code == 0 and "loopnet: stopped at step 3" in res.err, res.err[-3000:]
    assert _interrupt_state(tmp_path) == {"step": 3}
    assert sorted(scalars(tmp_path / "runs" / RUN / "version_0", "val/loss")) == [2]  # logged at its logger step
    res = loopnet("fit", *ARGS, "--ckpt_path", "last", cwd=tmp_path)
    assert res.code == 0, res.err[-3000:]
    assert record(tmp_path) == reference


# ------------------------------------------------------------------------------------------ broken pipe
PIPE_ARGS = [
    *TINY,
    "--trainer.max_steps",
    "1000",
    "--trainer.val_check_interval",
    "500",
    "--trainer.enable_progress_bar",
    "true",
]


def _spawn_into_tee(cwd):
    """`loopnet fit PIPE_ARGS 2>&1 | tee cwd/tee.log`, with a progress file the test waits on."""
    read, write = os.pipe()
    tee = subprocess.Popen(
        ["tee", str(cwd / "tee.log")], stdin=read, stdout=subprocess.DEVNULL, preexec_fn=terminal_signals()
    )
    # tqdm's bar writes at every step, so the fit finds its reader gone at the next step. (Lightning picks Rich's
    # bar when rich is installed, as transformers' dependencies bring it; off a terminal it writes at the end only.)
    extra = callbacks((Progress, {"path": str(cwd / "progress"), "delay": 0.2}), (TQDMProgressBar, {}))
    fit = subprocess.Popen(
        [sys.executable, "-m", "loopnet.training.cli", "fit", *PIPE_ARGS, *extra],
        cwd=cwd,
        env=env(),
        stdout=write,
        stderr=write,
        preexec_fn=terminal_signals(),
    )
    os.close(read), os.close(write)  # the fit and tee hold the pipe's ends now
    return fit, tee


@pytest.fixture(scope="module")
def piped(tmp_path_factory):
    """Two fits whose output goes through `tee`: once past step 2, `tee` gets Ctrl-C's SIGINT and exits;
    then the fit gets its own SIGINT ("ctrl_c", as from the terminal), or nothing ("reader_gone")."""
    runs = {name: (tmp_path_factory.mktemp(name), None) for name in ("ctrl_c", "reader_gone")}
    procs = {name: _spawn_into_tee(cwd) for name, (cwd, _) in runs.items()}
    try:
        waiting = set(procs)
        watches = {name: Watch(fit, f"{name}: step 2") for name, (fit, _) in procs.items()}  # no wall-clock guess
        while waiting:
            for name in list(waiting):
                (fit, tee), progress = procs[name], runs[name][0] / "progress"
                assert fit.poll() is None, f"{name}: fit ended (code {fit.returncode}) before step 2"
                watches[name].check()
                if progress.exists() and int(progress.read_text() or 0) >= 2:
                    tee.send_signal(signal.SIGINT)
                    tee.wait(timeout=60)
                    if name == "ctrl_c":
                        fit.send_signal(signal.SIGINT)
                    waiting.discard(name)
            time.sleep(0.05)
        out = {}
        for name, (fit, tee) in procs.items():
            wait_until(lambda: fit.poll() is not None, fit, f"{name}: the fit ended")
            out[name] = (runs[name][0], fit.returncode)
        return out
    finally:
        for fit, tee in procs.values():
            for proc in (fit, tee):
                if proc.poll() is None:
                    proc.kill()


@pytest.mark.parametrize("name", ["ctrl_c", "reader_gone"])
def test_a_broken_output_pipe_still_ends_with_the_interruption_checkpoint(piped, name):
    cwd, code = piped[name]
    run = cwd / "runs" / RUN / "version_0"
    assert (cwd / "tee.log").read_text()  # tee read the fit's output until it exited
    log = (run / "output-after-broken-pipe.log").read_text()  # where the output went once tee was gone
    assert code == 0, log[-4000:]
    assert "Traceback" not in log and "Exception ignored" not in log, log[-4000:]
    assert log.startswith("loopnet: the reader of this run's output went away (broken pipe)")
    stopped = load(run / "checkpoints" / "last-interrupted.ckpt")["global_step"]
    assert 2 <= stopped < 1000
    assert f"loopnet: stopped at step {stopped}, saved" in log
    assert json.loads((run / "summary.json").read_text())["status"] == "interrupted"


# ------------------------------------------------------------------------------------------ the last step
# (a stop in a DDP run's validation: tests/reliability/test_ddp.py)
@pytest.mark.parametrize(
    "stop",
    [(SignalInValidation, {"step": 6, "batch_idx": 0}), (SignalAt, {"step": 6})],
    ids=["in_its_first_batch", "at_the_end_of_the_last_step"],
)
def test_a_stop_in_the_last_steps_validation_lets_the_run_complete(reference, tmp_path, stop):
    """The validation after the last step is the run's end: abandoned, its resume would have no step
    left to run it before (the fit loop is done at max_steps), and the final weights would be only in
    the interruption checkpoint, which a completed fit removes. It completes, and so does the run."""
    res = loopnet("fit", *ARGS, *callbacks(stop), cwd=tmp_path)
    assert res.code == 0 and "loopnet: stopped at step" not in res.err, res.err[-3000:]
    ckpts = tmp_path / "runs" / RUN / "version_0" / "checkpoints"
    assert not (ckpts / "last-interrupted.ckpt").exists() and load(ckpts / "last.ckpt")["global_step"] == 6
    assert json.loads((tmp_path / "runs" / RUN / "version_0" / "summary.json").read_text())["status"] == "completed"
    assert record(tmp_path) == reference
