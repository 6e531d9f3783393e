"""Races and leftovers: two fits pinned to one version never both write into it (an exclusive
lock), a crash between a best and a last checkpoint leaves no orphan `best-*-v1.ckpt` after the resume,
and `summary.json` names only checkpoints that exist (a best one whose write failed is not named; an
interrupted run names its `last-interrupted.ckpt`)."""

import errno
import fcntl
import json
import os
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from loopnet.checkpoints import LOCK_NAME

from .helpers import RUN, TINY, SignalAt, callbacks, finish, loopnet, spawn

pytestmark = pytest.mark.slow

ARGS = [*TINY, "--trainer.max_steps", "6", "--trainer.val_check_interval", "2"]


class FailSave(Callback):
    """Make this process's `nth` torch.save fail as a full disk does (ENOSPC), before writing a byte;
    torch.save is restored when the fit ends, however it ends."""

    def __init__(self, nth: int):
        self.real, count = torch.save, [0]

        def save(obj, f, *args, **kwargs):
            count[0] += 1
            if count[0] == nth:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.real(obj, f, *args, **kwargs)

        torch.save = save

    def on_exception(self, trainer, pl_module, exception):
        torch.save = self.real

    def teardown(self, trainer, pl_module, stage):
        torch.save = self.real


def summary_files_exist(run: Path) -> dict:
    """The run's summary.json, checked to name only files that exist."""
    summary = json.loads((run / "summary.json").read_text())
    for key in ("last_checkpoint", "best_checkpoint"):
        assert summary[key] is None or Path(run.parents[2], summary[key]).is_file() or Path(summary[key]).is_file(), (
            key,
            summary[key],
        )
    return summary


def test_summary_never_names_a_best_checkpoint_whose_write_failed(tmp_path):
    """Saves: best-step2, last (step 2), best-step4: the disk is full."""
    res = loopnet("fit", *ARGS, *callbacks((FailSave, {"nth": 3})), cwd=tmp_path)
    assert res.code == 1 and "No space left on device" in res.last_err_line, res.err[-3000:]
    run = tmp_path / "runs" / RUN / "version_0"
    assert not (run / "checkpoints" / "best-step000004.ckpt").exists()
    summary = summary_files_exist(run)
    assert summary["best_checkpoint"] is None  # was best-step000004.ckpt, never written
    assert summary["last_checkpoint"].endswith("last.ckpt")


def test_interrupted_summary_names_the_interruption_checkpoint(tmp_path):
    """Stopped before its first validation: last_checkpoint was null beside last-interrupted.ckpt."""
    res = loopnet("fit", *ARGS, *callbacks((SignalAt, {"step": 1})), cwd=tmp_path)
    assert res.code == 0 and "stopped at step 1" in res.err, res.err[-3000:]
    run = tmp_path / "runs" / RUN / "version_0"
    summary = summary_files_exist(run)
    assert summary["status"] == "interrupted"
    assert summary["last_checkpoint"] == str(run / "checkpoints" / "last-interrupted.ckpt")  # save_dir made absolute


def test_no_orphan_best_checkpoint_after_a_crash_and_resume(tmp_path):
    """A crash after best-step4 but before last (step 4): the resume re-validates at step 4 and wrote
    best-step000004-v1.ckpt beside the orphan, although save_top_k is 1."""
    res = loopnet("fit", *ARGS, *callbacks((FailSave, {"nth": 4})), cwd=tmp_path)
    assert res.code == 1, res.err[-3000:]
    ckpts = tmp_path / "runs" / RUN / "version_0" / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("*.ckpt")) == ["best-step000004.ckpt", "last.ckpt"]
    res = loopnet("fit", *ARGS, "--ckpt_path", "last", cwd=tmp_path)
    assert res.code == 0, res.err[-3000:]
    names = sorted(p.name for p in ckpts.glob("*.ckpt"))
    assert len(names) == 2 and names[1] == "last.ckpt" and names[0].startswith("best-step"), names  # save_top_k 1
    assert "-v" not in names[0], names
    summary_files_exist(tmp_path / "runs" / RUN / "version_0")


def test_a_fit_pinned_to_a_version_in_use_is_refused(tmp_path):
    """Another process holds the version's lock (as a fit does from its start, before it writes a file)."""
    folder = tmp_path / "runs" / RUN / "version_3"
    folder.mkdir(parents=True)
    with open(folder / LOCK_NAME, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write("12345")
        held.flush()
        res = loopnet("fit", *ARGS, "--trainer.max_steps", "2", "--trainer.logger.init_args.version", "3", cwd=tmp_path)
    assert res.code == 2, res.err[-3000:]
    assert res.last_err_line.startswith(
        f"loopnet: error: {folder} is in use by another loopnet fit "
        f"(pid 12345) pinned to the same version; fix: wait for it to end"
    )
    assert [p.name for p in folder.iterdir()] == [LOCK_NAME]  # nothing written beside it
    # Once free, the same command runs, and leaves no lock file behind.
    res = loopnet("fit", *ARGS, "--trainer.max_steps", "2", "--trainer.logger.init_args.version", "3", cwd=tmp_path)
    assert res.code == 0, res.err[-3000:]
    assert (folder / "checkpoints" / "last.ckpt").is_file() and not (folder / LOCK_NAME).exists()


@pytest.mark.slow
def test_two_fits_pinned_to_one_version_started_together(tmp_path):
    """Both wrote into it: last.ckpt and last-v1.ckpt, two event files, one summary overwritten."""
    pin = ["--trainer.max_steps", "4", "--trainer.logger.init_args.version", "0"]
    procs = [spawn("fit", *ARGS, *pin, cwd=tmp_path) for _ in range(2)]
    try:
        results = [finish(proc) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    codes = sorted(r.code for r in results)
    assert codes == [0, 2], [r.err[-2000:] for r in results]
    refused = next(r for r in results if r.code == 2).last_err_line
    assert "version_0" in refused and (
        "is in use by another loopnet fit" in refused or "already holds a run" in refused
    )
    run = tmp_path / "runs" / RUN / "version_0"
    assert sorted(p.name for p in (run / "checkpoints").glob("last*.ckpt")) == ["last.ckpt"]
    assert len(list(run.glob("events.out.tfevents.*"))) == 1
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"
    assert not (run / LOCK_NAME).exists() and not os.listdir(tmp_path / "runs" / RUN) == []


def test_a_pinned_fit_refused_by_a_later_check_leaves_no_folder(tmp_path):
    """The lock's folder is made before the corpus is read; a corpus refused then leaves nothing."""
    (tmp_path / "empty.txt").write_text("")
    res = loopnet(
        "fit",
        *ARGS,
        "--trainer.logger.init_args.version",
        "3",
        "--data.source",
        "files",
        "--data.path",
        "empty.txt",
        cwd=tmp_path,
    )
    assert res.code == 2 and "The corpus is empty" in res.last_err_line, res.err[-3000:]
    assert not (tmp_path / "runs").exists()
