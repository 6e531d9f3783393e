"""Interruption: SIGTERM or SIGINT during `loopnet fit` writes a resumable checkpoint and exits
cleanly; a kill in the middle of writing a checkpoint leaves the previous one intact; and
`loopnet fit ... --ckpt_path last` resumes from whichever is newest."""

import fcntl
import os
import signal
import subprocess
import sys
import tempfile
import termios
import time

import pytest
import torch

from loopnet.checkpoints import AtomicCheckpointIO
from tests.helpers import Watch

from .helpers import (
    RUN,
    TINY,
    KillDuringSave,
    Progress,
    SlowInterruptSave,
    callbacks,
    env,
    event_files,
    finish,
    load,
    loopnet,
    scalars,
    spawn,
    stderr_so_far,
    wait_for,
)

pytestmark = pytest.mark.slow


SIGNALS = {"SIGTERM": signal.SIGTERM, "SIGINT": signal.SIGINT}
STOP_ARGS = [*TINY, "--trainer.max_steps", "1000", "--trainer.val_check_interval", "3"]
KILL_ARGS = [*TINY, "--trainer.val_check_interval", "2"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three real `loopnet fit` processes, started together (their start-up dominates): two get a
    signal from outside once past step 4, the third is killed while writing a checkpoint."""
    procs, folders = {}, {}
    for name in (*SIGNALS, "kill"):
        cwd = folders[name] = tmp_path_factory.mktemp(name)
        if name == "kill":
            # Saves: best-step2 and last at step 2, best-step4 and then last at step 4: killed half way.
            extra = callbacks((KillDuringSave, {"nth": 4, "log": str(cwd / "saves.log")}))
            procs[name] = spawn("fit", *KILL_ARGS, *extra, cwd=cwd)
        else:
            extra = callbacks((Progress, {"path": str(cwd / "progress"), "delay": 0.2}))
            procs[name] = spawn("fit", *STOP_ARGS, *extra, cwd=cwd)
    waiting = set(SIGNALS)
    watches = {name: Watch(procs[name], "step 4") for name in waiting}  # waited on while they work
    try:
        while waiting:
            for name in list(waiting):
                proc, progress = procs[name], folders[name] / "progress"
                if proc.poll() is not None:
                    res = finish(proc)
                    raise AssertionError(f"{name}: fit ended (code {res.code}) before step 4:\n{res.err[-4000:]}")
                if progress.exists() and int(progress.read_text() or 0) >= 4:
                    proc.send_signal(SIGNALS[name])
                    waiting.discard(name)
                else:
                    watches[name].check()
            time.sleep(0.1)
        return {name: (folders[name], finish(proc)) for name, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()


@pytest.mark.parametrize("name", list(SIGNALS))
def test_signal_stops_fit_with_a_resumable_checkpoint(name, runs):
    cwd, res = runs[name]
    assert res.code == 0, res.err[-4000:]  # a clean stop at the end of the batch, not a crash
    assert "Traceback" not in res.err
    ckpts = cwd / "runs" / RUN / "version_0" / "checkpoints"
    ckpt = load(ckpts / "last-interrupted.ckpt")  # loads with the restricted unpickler
    stopped = ckpt["global_step"]
    assert 4 <= stopped < 1000
    assert f"stopped at step {stopped}" in res.last_err_line and "--ckpt_path last" in res.last_err_line
    assert load(ckpts / "last.ckpt")["global_step"] < stopped  # the validation checkpoint is older

    # Same command with --ckpt_path last: continues at the stopped step, in the same folder.
    before = event_files(cwd / "runs" / RUN / "version_0")
    res = loopnet("fit", *STOP_ARGS, "--trainer.max_steps", str(stopped + 2), "--ckpt_path", "last", cwd=cwd)
    assert res.code == 0, res.err[-3000:]
    assert "resuming from" in res.err and "last-interrupted.ckpt" in res.err
    (new,) = [f for f in event_files(cwd / "runs" / RUN / "version_0") if f not in before]
    assert sorted(scalars(new)) == [stopped, stopped + 1]


def _take_terminal() -> None:  # in the child: the pty on stdin becomes its controlling terminal
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def test_second_ctrl_c_while_saving_completes_the_checkpoint(tmp_path):
    """Ctrl-C typed twice on a real terminal (the pty's line discipline signals the foreground process
    group), the second while the interruption checkpoint is written: one line says it is saving, the
    checkpoint is completed, no traceback, status 0."""
    master, slave = os.openpty()
    progress, saving, release = tmp_path / "progress", tmp_path / "saving", tmp_path / "release"
    extra = callbacks(
        (Progress, {"path": str(progress), "delay": 0.2}),
        (SlowInterruptSave, {"marker": str(saving), "release": str(release)}),
    )
    logs = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "loopnet.training.cli", "fit", *STOP_ARGS, *extra],
        cwd=tmp_path,
        env=env(),
        stdin=slave,
        stdout=logs[0],
        stderr=logs[1],
        text=True,
        start_new_session=True,
        preexec_fn=_take_terminal,
    )
    proc.logs = logs
    os.close(slave)
    try:
        wait_for(lambda: progress.exists() and int(progress.read_text() or 0) >= 2, proc, "step 2")
        os.write(master, b"\x03")  # Ctrl-C
        wait_for(saving.exists, proc, "the interruption checkpoint's save")
        os.write(master, b"\x03")  # Ctrl-C again, in the middle of the save (held until `release`)
        wait_for(lambda: "saving the interrupted checkpoint" in stderr_so_far(proc), proc, "the second Ctrl-C's line")
        release.touch()
        res = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    assert res.code == 0, res.err[-4000:]
    assert "Traceback" not in res.err, res.err[-4000:]
    saving_lines = [line for line in res.err.splitlines() if "saving the interrupted checkpoint" in line]
    assert len(saving_lines) == 1, res.err[-4000:]
    ckpts = tmp_path / "runs" / RUN / "version_0" / "checkpoints"
    stopped = load(ckpts / "last-interrupted.ckpt")["global_step"]  # complete: loads
    assert stopped >= 2 and f"stopped at step {stopped}" in res.last_err_line
    assert not list(ckpts.glob(".*.tmp"))


def test_kill_while_writing_a_checkpoint_leaves_last_ckpt_intact(runs):
    cwd, res = runs["kill"]
    assert res.code == -signal.SIGKILL, res.err[-4000:]
    ckpts = cwd / "runs" / RUN / "version_0" / "checkpoints"
    killed = (cwd / "saves.log").read_text().splitlines()[-1].split(" ", 1)[1]
    assert killed.startswith(str(ckpts / ".last.ckpt."))  # it was writing the new last.ckpt

    assert load(ckpts / "last.ckpt")["global_step"] == 2  # the previous one, whole
    (partial,) = ckpts.glob(".last.ckpt.*.tmp")  # what the kill left: a partial temporary file
    with pytest.raises(Exception):
        torch.load(partial, weights_only=True)

    res = loopnet("fit", *KILL_ARGS, "--trainer.max_steps", "4", "--ckpt_path", "last", cwd=cwd)
    assert res.code == 0, res.err[-3000:]
    assert "resuming from" in res.err and "version_0/checkpoints/last.ckpt" in res.err
    assert load(ckpts / "last.ckpt")["global_step"] == 4


def test_failed_write_keeps_the_previous_file(tmp_path):
    path = tmp_path / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}, "global_step": 1}, path)
    before = path.read_bytes()

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        io.save_checkpoint({"state_dict": {"w": torch.zeros(1 << 20)}, "boom": Unpicklable()}, path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # no temporary file left


def test_cli_writes_checkpoints_atomically(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["loopnet"])  # pytest's own arguments are not this command line's
    from loopnet.data import TokenStreamDataModule
    from loopnet.training.cli import LoopnetCLI, OneLineErrorParser
    from loopnet.training.defaults import TRAINER_DEFAULTS
    from loopnet.training.module import LoopedLM

    cli = LoopnetCLI(
        LoopedLM,
        TokenStreamDataModule,
        trainer_defaults=TRAINER_DEFAULTS,
        auto_configure_optimizers=False,
        parser_class=OneLineErrorParser,
        run=False,
        args=[*TINY, "--trainer.logger.init_args.save_dir", str(tmp_path / "runs")],
    )
    assert type(cli.trainer.strategy.checkpoint_io) is AtomicCheckpointIO
