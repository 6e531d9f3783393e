"""Running the real `loopnet` CLI (in-process or in a subprocess), callbacks that tests plug into
those runs with `--trainer.callbacks`, and small readers of what runs leave on disk."""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback

from tests.helpers import run_here, wait_until

ROOT = Path(__file__).resolve().parents[2]
RUN = "deeploop_carry_k2_r2_d32_h2_ctx32"  # the run folder name of TINY's model (run_folders.run_name)
# A seconds-long CPU run: the DeepLoop method config, the CPU overlay, a 2-round model of width 32.
TINY = [
    "--config",
    str(ROOT / "configs/deeploop_r6.yaml"),
    "--config",
    str(ROOT / "configs/cpu.yaml"),
    "--model.config.d_model",
    "32",
    "--model.config.n_heads",
    "2",
    "--model.config.seq_len",
    "32",
    "--model.config.n_rounds",
    "2",
    "--data.batch_size",
    "4",
    "--model.optim.warmup_steps",
    "2",
    "--trainer.max_steps",
    "8",
    "--trainer.val_check_interval",
    "4",
    "--trainer.limit_val_batches",
    "2",
    "--trainer.limit_test_batches",
    "2",
    "--trainer.log_every_n_steps",
    "1",
    "--trainer.enable_progress_bar",
    "false",
    "--trainer.enable_model_summary",
    "false",
]

# Two steps with a validation at step 2: a finished run (checkpoints, events, config, summary) in seconds.
# A DDP fit on two CPU processes (gloo).
TWO_CPU_RANKS = ["--trainer.accelerator", "cpu", "--trainer.strategy", "ddp", "--trainer.devices", "2"]
SHORT = [*TINY, "--trainer.max_steps", "2", "--trainer.val_check_interval", "2"]


@dataclass
class Result:
    code: int  # exit status; negative: killed by that signal (subprocesses)
    out: str
    err: str

    @property
    def last_err_line(self) -> str:
        lines = [l for l in self.err.splitlines() if l.strip()]
        return lines[-1] if lines else ""


def loopnet(*args: str, cwd: Path) -> Result:
    """`loopnet <args>` in this process (`tests.helpers.run_here`: no interpreter start-up), run in `cwd`."""
    proc = run_here(args, cwd=cwd)
    return Result(proc.returncode, proc.stdout, proc.stderr)


def finished_run(cwd: Path) -> Result:
    """`loopnet fit` of SHORT in `cwd`, checked to have finished: runs/RUN/version_0 holds the run."""
    res = loopnet("fit", *SHORT, cwd=cwd)
    assert res.code == 0, res.err[-3000:]
    assert (cwd / "runs" / RUN / "version_0" / "checkpoints" / "last.ckpt").is_file()
    return res


def env() -> dict[str, str]:
    """Environment of a `loopnet` subprocess: offline, and `tests.reliability.helpers` importable."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONPATH=path)


def terminal_signals(hup=signal.SIG_DFL):
    """A `preexec_fn` giving the child a terminal's SIGINT (default) and SIGHUP `hup`: the test runner may itself run
    where a child would inherit them ignored (under `nohup`, or as a background job of a non-interactive shell,
    which ignores SIGINT), and a program such as `tee` keeps an ignored SIGINT."""

    def reset():
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, hup)

    return reset


# The fork server of this test worker (loopnet.study.launch's, as `loopnet sweep` starts its fits): it imports torch,
# Lightning, loopnet and these callbacks once, so that a spawned fit pays no ~7.7 s of imports of its own.
_server = None


def fork_server():
    global _server
    if _server is None:
        from loopnet.study import launch

        _server = launch.ForkServer([*launch.PRELOAD, "tests.reliability.helpers"])
    return _server


def _forked(cmd: list[str], out: str, err: str, env: dict[str, str], cwd: str, new_session: bool, hup) -> None:
    """In the fork: a session of its own if asked, a terminal's SIGINT and SIGHUP `hup` (as `terminal_signals`
    leaves a new interpreter, which then installs Python's SIGINT handler), the thread count a new interpreter
    would take from `env`, then `cmd` run as `python -m` runs it (loopnet.study.launch.run_command)."""
    from loopnet.study.launch import run_command

    if new_session:
        os.setsid()
    terminal_signals(hup)()
    signal.signal(signal.SIGINT, signal.default_int_handler)  # what a new interpreter installs over SIG_DFL
    threads = int(env.get("OMP_NUM_THREADS") or torch.get_num_threads())  # the server's: its environment's default
    run_command(cmd, out, env, threads, cwd, err_path=err)


def spawn(*args: str, cwd: Path, new_session: bool = False, hup=signal.SIG_DFL, fresh: bool = False):
    """`python -m loopnet.training.cli <args>` as a process of its own (for signals, kills and DDP), with Popen's
    interface (pid, poll, wait, send_signal, kill, returncode). A fork of this worker's `fork_server` that runs the
    command as `python -m` would; `fresh`: a new interpreter, for a test of what start-up itself does or prints.
    Lightning starts a DDP fit's other ranks as new interpreters either way.
    Its output goes to temporary files (`.logs`: stdout, stderr), not pipes, so it never blocks on a full pipe
    while a test waits.
    `new_session`: in a process group of its own (with the DDP ranks it starts), for `os.killpg`.
    `hup`: the child's SIGHUP disposition, SIG_DFL as from a terminal or SIG_IGN as `nohup` leaves it; set
    either way, since the test runner itself may run under nohup, whose SIG_IGN a child would inherit."""
    logs = tempfile.NamedTemporaryFile("w+"), tempfile.NamedTemporaryFile("w+")
    cmd = [sys.executable, "-m", "loopnet.training.cli", *args]
    if fresh:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env(),
            stdout=logs[0],
            stderr=logs[1],
            text=True,
            start_new_session=new_session,
            preexec_fn=terminal_signals(hup),
        )
    else:
        from loopnet.study.launch import ForkedFit

        server = fork_server()
        process = server.context.Process(
            target=_forked, args=(cmd, logs[0].name, logs[1].name, env(), str(cwd), new_session, hup), name="loopnet"
        )
        process.start()
        proc = ForkedFit(process)
    proc.logs = logs
    return proc


def finish(proc) -> Result:
    """Wait for a spawned process while it works (tests.helpers.Watch: no wall-clock limit, a hung one
    is killed); its exit status (negative: killed by that signal) and output."""
    hung = None
    try:
        wait_until(lambda: proc.poll() is not None, proc, "it ended", poll=0.1)
    except AssertionError as err:
        proc.kill()
        proc.wait()
        hung = err
    for f in proc.logs:
        f.seek(0)
    out, err = (f.read() for f in proc.logs)
    if hung is not None:
        raise AssertionError(f"loopnet: {hung}:\n{out[-2000:]}\n{err[-4000:]}")
    return Result(proc.returncode, out, err)


def wait_for(check, proc, what: str) -> None:
    """Wait until `check()` while the spawned `proc` works towards it (tests.helpers.wait_until); when
    it ends or hangs first, the error shows its output."""
    try:
        wait_until(check, proc, what)
    except AssertionError as err:
        if proc.poll() is None:
            proc.kill()
        raise AssertionError(f"{err}:\n{finish(proc).err[-4000:]}") from None


def stderr_so_far(proc) -> str:
    """What a spawned process wrote to stderr so far (read without moving the offset it writes at)."""
    fd = proc.logs[1].fileno()
    return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")


def load(path: Path) -> dict:
    """A checkpoint, with torch's restricted unpickler (as loopnet loads them)."""
    return torch.load(path, map_location="cpu", weights_only=True)


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` and its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


class SignalAt(Callback):
    """Send `signum` to this very process at the end of training step `step` (deterministic interruption)."""

    def __init__(self, step: int, signum: int = int(signal.SIGTERM)):
        self.step, self.signum = step, signum

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)


class RaiseAt(Callback):
    """Fail in the middle of training step `step`, before its backward, as running out of GPU memory does."""

    def __init__(self, step: int = 0):
        self.step = step

    def on_before_backward(self, trainer, pl_module, loss):
        if trainer.global_step == self.step:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (forced by the test)")


class SignalInValidation(Callback):
    """Send `signum` to this process at the end of validation batch `batch_idx` of the validation at
    global step `step` (`sanity`: of the sanity check before training)."""

    def __init__(
        self,
        step: int = 0,
        batch_idx: int = 0,
        sanity: bool = False,
        signum: int = int(signal.SIGTERM),
        rank: int | None = None,
    ):
        self.step, self.batch_idx, self.sanity, self.signum, self.rank = step, batch_idx, sanity, signum, rank

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if (
            trainer.sanity_checking == self.sanity
            and trainer.global_step == self.step
            and batch_idx == self.batch_idx
            and self.rank in (None, trainer.global_rank)
        ):
            os.kill(os.getpid(), self.signum)


class ValidationBatches(Callback):
    """Append `<rank> <global step> <batch_idx>` to `path` after every validation batch (not the sanity check's)."""

    def __init__(self, path: str):
        self.path = path

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if not trainer.sanity_checking:
            with open(self.path, "a") as f:
                f.write(f"{trainer.global_rank} {trainer.global_step} {batch_idx}\n")


class Progress(Callback):
    """Write the global step to `path` after every training step, then sleep `delay` s (so a test
    can send a signal from outside while training is still running)."""

    def __init__(self, path: str, delay: float = 0.0):
        self.path, self.delay = path, delay

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        tmp = f"{self.path}.{os.getpid()}.tmp"  # one per process: DDP ranks write the same file
        Path(tmp).write_text(str(trainer.global_step))
        os.replace(tmp, self.path)
        time.sleep(self.delay)


class RankRecorder(Callback):
    """Per rank, to `folder/rank<r>.json`: a digest of every training window read, the losses, and a
    digest of the parameters after training (equal on every rank iff gradients were all-reduced)."""

    def __init__(self, folder: str):
        self.folder, self.rows, self.losses = folder, [], []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.rows += [hashlib.blake2b(row.numpy().tobytes(), digest_size=8).hexdigest() for row in batch[0]]
        self.losses.append(float(outputs["loss"]))

    def on_train_end(self, trainer, pl_module):
        flat = torch.cat([p.detach().flatten() for p in pl_module.parameters()])
        out = {
            "rank": trainer.global_rank,
            "world": trainer.world_size,
            "rows": self.rows,
            "losses": self.losses,
            "params": hashlib.blake2b(flat.numpy().tobytes()).hexdigest(),
        }
        Path(self.folder).mkdir(parents=True, exist_ok=True)
        Path(self.folder, f"rank{trainer.global_rank}.json").write_text(json.dumps(out))


class KillDuringSave(Callback):
    """Make the `nth` torch.save of this process write half of its bytes, then SIGKILL the process:
    a crash in the middle of writing a checkpoint. The file names of the saves go to `log`."""

    def __init__(self, nth: int, log: str):
        real, count = torch.save, [0]

        def save(obj, f, *args, **kwargs):
            count[0] += 1
            name = os.readlink(f"/proc/self/fd/{f.fileno()}") if hasattr(f, "fileno") else f
            with open(log, "a") as out:
                out.write(f"{count[0]} {name}\n")
            if count[0] == nth:
                buf = io.BytesIO()
                real(obj, buf, *args, **kwargs)
                f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
                f.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            return real(obj, f, *args, **kwargs)

        torch.save = save


class SlowInterruptSave(Callback):
    """Hold the write of the interruption checkpoint (`last-interrupted.ckpt`) until the file `release`
    exists: torch.save waits before writing its bytes, after creating `marker` (so a test knows the save
    has begun, and lets it go on when it has done what it meant to do meanwhile)."""

    def __init__(self, marker: str, release: str):
        real = torch.save

        def save(obj, f, *args, **kwargs):
            name = os.readlink(f"/proc/self/fd/{f.fileno()}") if hasattr(f, "fileno") else str(f)
            if "last-interrupted" in name:
                Path(marker).write_text(name)
                while not Path(release).exists():  # sleeps again after a signal handler returns
                    time.sleep(0.05)
            return real(obj, f, *args, **kwargs)

        torch.save = save


def callbacks(*specs: tuple[type, dict]) -> list[str]:
    """`--trainer.callbacks` arguments for these (class, init_args) pairs."""
    value = [{"class_path": f"{cls.__module__}.{cls.__qualname__}", "init_args": kw} for cls, kw in specs]
    return ["--trainer.callbacks", json.dumps(value)]


def event_files(run: Path) -> list[Path]:
    """A run folder's TensorBoard event files, one per process that logged there, oldest first."""
    return sorted(run.glob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime)


def scalars(run: Path, tag: str = "train/loss") -> dict[int, float]:
    """{step: value} of a TensorBoard scalar, over every event file of a run folder (or one file)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[int, float] = {}
    for events in event_files(run) if run.is_dir() else [run]:
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0}).Reload()
        if tag in acc.Tags()["scalars"]:
            out.update({e.step: e.value for e in acc.Scalars(tag)})
    return out


def record(cwd: Path) -> dict:
    """What a run in `cwd` recorded (runs/RUN/version_0): training and validation points, val_history,
    its best checkpoints and loss; equal for a resumed run and an uninterrupted one."""
    run = cwd / "runs" / RUN / "version_0"
    summary = json.loads((run / "summary.json").read_text())
    best = sorted(p.name for p in (run / "checkpoints").glob("best-*.ckpt"))
    return {
        "train/loss": scalars(run),
        "val/loss": scalars(run, "val/loss"),
        "val_history": summary["val_history"],
        "best": best,
        "best_val_loss": summary["best_val_loss"],
    }
