"""`loopnet sweep`: run every cell of a YAML grid through the normal `loopnet fit` path, resumably.

    loopnet sweep configs/sweeps/cpu_study.yaml                 # sequentially
    loopnet sweep configs/sweeps/cpu_study.yaml --jobs 2        # two fits at once
    loopnet sweep configs/sweeps/cpu_study.yaml --dry_run       # list the cells and commands

Each cell is one `python -m loopnet.training.cli fit ...` subprocess logging into
``<out>/<cell_id>/`` (TensorBoard events, config.yaml, checkpoints/, summary.json, and the fit's
own output in fit.log). A cell is *finished* when its summary.json has a final status
(completed or diverged); finished cells are skipped, so rerunning a killed or partial sweep
continues where it stopped. A cell that did not finish (killed, interrupted, crashed) runs again:
from its last checkpoint when it has one (``--resume ckpt``, the default; a cell without one starts
afresh), or from scratch with ``--resume restart``, which deletes the cell's folder, checkpoints
included. A cell that fails (nonzero exit without a final summary) is reported and does not stop the others.

Several sweep processes may share one folder (e.g. one per GPU, each with its own
CUDA_VISIBLE_DEVICES): a per-cell lock in ``<out>/.locks/`` gives every cell to one process only. A
cell whose fit still holds its run folder's lock (a fit that outlived its sweep) is left to that fit,
never deleted under it.

Fits start as forks of a server that imported torch and Lightning once (``--start forkserver``, the
default; `loopnet.study.launch`) or as fresh processes (``--start fresh``); either way each fit is a
process of its own, with the same per-step losses.

SIGTERM, SIGINT (Ctrl-C) and SIGHUP (a closed terminal; not under nohup) stop the sweep: it stops its
running fits as SIGTERM stops a fit (each saves last-interrupted.ckpt and its summary), logs each as
"stopped", and exits; rerunning the same command continues.

The sweep folder also holds ``sweep.json`` (the manifest: the sweep file, every cell's grid
values and command, how the sweep was invoked), ``sweep.yaml`` (a copy of the sweep file) and
``sweep_log.jsonl`` (one line per cell started, finished, failed or stopped, and one per stop signal
received, across invocations).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import fcntl
import fnmatch
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from loopnet.diagnostics import SUMMARY_NAME, read_summary
from loopnet.env import machine, one_line_errors

from . import launch
from .grid import CLI, Cell, Sweep, SweepError, expand, load_sweep

FINAL_STATUSES = ("completed", "diverged")
MANIFEST = "sweep.json"
LOG = "sweep_log.jsonl"
CELL_FILE = "cell.json"  # the cell's grid values and command, written when it starts
spawn = subprocess.Popen  # how `--start fresh` starts a cell's fit (a test replaces it)
STARTS = ("forkserver", "fresh")


def now() -> str:
    return dt.datetime.now().isoformat(timespec="seconds")


def cell_summary(cell_dir: Path) -> dict | None:
    """The cell's run summary, or None when there is none (or it is unreadable)."""
    try:
        return read_summary(cell_dir / SUMMARY_NAME)
    except (FileNotFoundError, ValueError, json.JSONDecodeError):
        return None


def is_finished(cell_dir: Path) -> bool:
    summary = cell_summary(cell_dir)
    return summary is not None and summary["status"] in FINAL_STATUSES


def shell_command(cmd: list[str]) -> str:
    """A command as one copy-pasteable shell line, with `python` in place of this interpreter's path."""
    shown = ["python" if i == 0 and c == sys.executable else c for i, c in enumerate(cmd)]
    return shlex.join(shown)


class SweepRunner:
    """Runs the unfinished cells of a sweep, at most `jobs` at a time, and logs what happens."""

    def __init__(
        self,
        sweep: Sweep,
        cells: list[Cell],
        jobs: int = 1,
        threads: int | None = None,
        max_cells: int | None = None,
        resume: str = "ckpt",
        echo=print,
        start: str = "forkserver",
    ):
        if jobs < 1:
            raise SweepError(f"--jobs must be >= 1, got {jobs}")
        self.sweep, self.cells, self.jobs = sweep, cells, jobs
        # Share the cores between concurrent fits: N processes each using every core thrash.
        self.threads = threads or max(1, (os.cpu_count() or 1) // jobs)
        self.max_cells, self.resume, self.echo = max_cells, resume, never_raising(echo)
        self.out = sweep.out
        self.results: dict[str, str] = {}  # cell id -> skipped | completed | diverged | failed | stopped | busy
        if start not in STARTS:
            raise SweepError(f"--start must be one of {STARTS}, got {start!r}")
        self.server = launch.ForkServer() if start == "forkserver" else None
        self.stop_signal: int | None = None  # the first stop signal received (the handler only notes it)

    def on_signal(self, signum, frame) -> None:
        """The stop signals' handler: it only notes the stop; the loop acts on it between starts
        (raising here could land between a fit's start and its registration, orphaning the fit)."""
        self.stop_signal = self.stop_signal or signum

    # ------------------------------------------------------------------------------ records
    def log(self, event: str, cell: Cell | None, **extra) -> None:
        """One line of sweep_log.jsonl (`cell` None: an event of the whole sweep)."""
        with open(self.out / LOG, "a") as f:
            f.write(json.dumps({"time": now(), "event": event, "cell": cell.id if cell else None, **extra}) + "\n")

    def write_manifest(self, argv: list[str], every_cell: list[Cell] | None = None) -> None:
        """sweep.json: the sweep file, how it was invoked, and *every* cell of the file (`every_cell`,
        default the cells run), so that a run of a subset (--only) leaves the others listed for the report."""
        invocation = shlex.join(["loopnet", "sweep", *argv])
        try:  # keep the history of invocations (a sweep is often continued several times)
            invocations = json.loads((self.out / MANIFEST).read_text()).get("invocations", [])
        except (FileNotFoundError, json.JSONDecodeError):
            invocations = []
        manifest = {
            "sweep_file": str(self.sweep.path) if self.sweep.path else None,
            "description": self.sweep.description,
            "spec": self.sweep.spec,
            "base": self.sweep.base,
            "overrides": self.sweep.overrides,
            "out": str(self.out),
            "cwd": os.getcwd(),
            "invocation": invocation,
            "invocations": [*invocations, invocation],
            "updated": now(),
            "machine": machine(),
            "jobs": self.jobs,
            "threads_per_cell": self.threads,
            "cells": [
                {"id": c.id, "params": c.params, "command": shell_command(c.command)}
                for c in (every_cell or self.cells)
            ],
        }
        (self.out / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str) + "\n")
        if self.sweep.path is not None:
            shutil.copyfile(self.sweep.path, self.out / "sweep.yaml")

    # ------------------------------------------------------------------------------ one cell
    def start(self, cell: Cell):
        """Start the cell's fit (a Popen-like handle). Called with the stop signals blocked, so that the
        "started" record, the fit and its registration by the caller come all or none."""
        cell_dir = self.out / cell.id
        cmd = list(cell.command)
        if self.resume == "ckpt" and any(cell_dir.glob("checkpoints/last*.ckpt")):
            cmd += ["--ckpt_path", "last"]  # Lightning picks the newer of last.ckpt / last-interrupted.ckpt
        elif cell_dir.exists():  # --resume restart, or a partial run without a checkpoint: start over
            shutil.rmtree(cell_dir)  # so that its logs and summary are one clean run
        cell_dir.mkdir(parents=True, exist_ok=True)
        (cell_dir / CELL_FILE).write_text(
            json.dumps({"id": cell.id, "params": cell.params, "command": shell_command(cmd)}, indent=2) + "\n"
        )
        self.log("started", cell, command=shell_command(cmd))
        if self.server is not None:
            return self.server.start(cmd, cell_dir / "fit.log", dict(os.environ), self.threads)
        return launch.start_fresh(cmd, cell_dir / "fit.log", dict(os.environ), self.threads, spawn=spawn)

    def finish(self, cell: Cell, rc: int, seconds: float, done: int, total: int, stopped: bool = False) -> None:
        """Record how a fit ended; `stopped`: ended by the sweep's own SIGTERM (`stop`), so that -SIGTERM after a
        finished summary is a finished cell (the signal came while its interpreter exited)."""
        summary = cell_summary(self.out / cell.id)
        status = summary["status"] if summary else None
        if status in FINAL_STATUSES and (rc == 0 or (stopped and rc == -signal.SIGTERM)):
            self.results[cell.id] = status
            val = summary.get("final_val_loss")
            extra = f" at step {summary['diverged_at_step']}" if status == "diverged" else ""
            self.echo(
                f"[{done}/{total}] {cell.id}: {status}{extra}, val loss "
                f"{'n/a' if val is None else f'{val:.4f}'} ({seconds:.0f} s)"
            )
            self.log(
                "finished",
                cell,
                status=status,
                rc=rc,
                seconds=round(seconds, 1),
                final_val_loss=val,
                diverged_at_step=summary.get("diverged_at_step"),
            )
        elif status == "interrupted" and rc == 0:  # stopped cleanly by a signal of its own (a process group's)
            self.results[cell.id] = "stopped"
            self.echo(
                f"[{done}/{total}] {cell.id}: stopped at step {summary.get('global_step')} by a signal; a rerun "
                f"continues it"
            )
            self.log("stopped", cell, rc=rc)
        else:
            self.results[cell.id] = "failed"
            why = f"exit code {rc}" + (f", summary status {status!r}" if status else ", no summary")
            self.echo(f"[{done}/{total}] {cell.id}: FAILED ({why}); see {self.out / cell.id / 'fit.log'}")
            self.log("failed", cell, rc=rc, status=status, seconds=round(seconds, 1))

    # ------------------------------------------------------------------------------ the loop
    def try_lock(self, cell: Cell):
        """An exclusive lock on the cell (released when its file closes), or None when another
        sweep process runs it: several processes (one per GPU) can share one sweep folder."""
        locks = self.out / ".locks"
        locks.mkdir(parents=True, exist_ok=True)
        f = open(locks / f"{cell.id}.lock", "w")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            return None
        return f

    def run(self) -> dict[str, str]:
        todo = []
        for cell in self.cells:
            if is_finished(self.out / cell.id):
                self.results[cell.id] = "skipped"
                self.warn_if_changed(cell)
            else:
                todo.append(cell)
        skipped = len(self.cells) - len(todo)
        total = len(todo) if self.max_cells is None else min(len(todo), self.max_cells)
        self.echo(
            f"loopnet sweep: {len(self.cells)} cells in {self.out}: {skipped} finished (skipped), "
            f"{total} to run, {self.jobs} at a time, {self.threads} thread(s) each"
        )
        if self.server is not None and todo and not self.stop_signal:
            self.echo(
                f"loopnet sweep: fit server ready ({self.server.warm():.1f} s: torch and Lightning imported "
                "once for every fit)"
            )
        running: dict[Any, tuple[Cell, float, Any]] = {}
        launched = done = 0
        try:
            while (todo or running) and not self.stop_signal:
                while (
                    todo
                    and len(running) < self.jobs
                    and (self.max_cells is None or launched < self.max_cells)
                    and not self.stop_signal
                ):
                    cell = todo.pop(0)
                    lock = self.try_lock(cell)
                    if lock is None:
                        self.results[cell.id] = "busy"
                        self.echo(f"loopnet sweep: {cell.id} is being run by another sweep process; left to it")
                        continue
                    if is_finished(self.out / cell.id):  # finished by another process meanwhile
                        lock.close()
                        self.results[cell.id] = "skipped"
                        continue
                    holder = fit_lock_holder(self.out / cell.id)
                    if holder is not None:  # a fit that outlived its sweep: its folder is never deleted under it
                        lock.close()
                        self.results[cell.id] = "busy"
                        self.echo(
                            f"loopnet sweep: {cell.id} is still being run by an earlier fit (pid {holder}) "
                            f"that outlived its sweep; left to it (fix: wait for it, or stop it with `kill "
                            f"{holder}`, then rerun)"
                        )
                        continue
                    with blocked(launch.STOP_SIGNALS):  # the record, the fit and its registration: all or none
                        running[self.start(cell)] = (cell, time.monotonic(), lock)
                    launched += 1
                if self.max_cells is not None and launched >= self.max_cells:
                    todo = []
                if not self.stop_signal:
                    time.sleep(0.2)
                for proc in [p for p in running if p.poll() is not None]:
                    cell, t0, lock = running.pop(proc)
                    done += 1
                    self.finish(cell, proc.returncode, time.monotonic() - t0, done, total)
                    lock.close()
        finally:
            self.stop(running, done, total)
        return self.results

    def stop(self, running: dict, done: int, total: int) -> None:
        """After a stop signal (or an error): stop the running fits cleanly (each saves last-interrupted.ckpt
        and its summary) and log each as "stopped", unless it finished by itself first. Further signals
        meanwhile are only noted: the fits' checkpoints are being written."""
        if self.stop_signal:
            self.log(
                "signal",
                None,
                signal=signal.Signals(self.stop_signal).name,
                running=[cell.id for cell, _, _ in running.values()],
            )
        if running:
            self.echo(f"loopnet sweep: stopping {len(running)} running cell(s)")
        for proc in running:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        for proc, (cell, t0, lock) in running.items():
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            # It completed before the stop reached it; or it had written its finished summary and our SIGTERM
            # came while its interpreter exited, the default handler back in place (-SIGTERM): finished too.
            if proc.returncode in (0, -signal.SIGTERM) and is_finished(self.out / cell.id):
                done += 1
                self.finish(cell, proc.returncode, time.monotonic() - t0, done, total, stopped=True)
            else:
                self.log("stopped", cell, rc=proc.returncode)
            lock.close()

    def warn_if_changed(self, cell: Cell) -> None:
        """A finished cell run with another command (the sweep file changed) is kept, but said."""
        try:
            previous = json.loads((self.out / cell.id / CELL_FILE).read_text())["command"]
        except (FileNotFoundError, KeyError, json.JSONDecodeError):
            return
        strip = lambda c: c.replace(" --ckpt_path last", "")  # noqa: E731
        if strip(previous) != strip(shell_command(cell.command)):
            self.echo(
                f"loopnet sweep: warning: {cell.id} finished with a different command than the sweep "
                f"file gives now; delete {self.out / cell.id} to rerun it"
            )


def never_raising(echo):
    """`echo` that ignores a reader gone away (`loopnet sweep | tee log` and Ctrl-C: tee ends first): the
    sweep's bookkeeping, above all stopping its fits, goes on without its output."""

    def say(line: str) -> None:
        with contextlib.suppress(OSError):
            echo(line)

    return say


def fit_lock_holder(cell_dir: Path) -> str | None:
    """The pid of a live fit that holds the run folder's lock (`loopnet.checkpoints.lock_version`), or None."""
    from loopnet.checkpoints import LOCK_NAME

    try:
        fd = os.open(cell_dir / LOCK_NAME, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released with the descriptor below
        return None
    except BlockingIOError:
        return os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
    finally:
        os.close(fd)


@contextlib.contextmanager
def blocked(signals):
    """The signals held back (delivered at the end) while the block runs."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextlib.contextmanager
def stop_signals(handler):
    """`handler` for SIGTERM, SIGINT and SIGHUP while the sweep runs; one the sweep was started with ignored
    (SIGHUP under nohup, SIGINT in a background job) stays ignored."""
    previous = {}
    for signum in launch.STOP_SIGNALS:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            previous[signum] = signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def parser() -> argparse.ArgumentParser:
    from . import grid

    p = argparse.ArgumentParser(
        prog="loopnet sweep",
        description=__doc__,
        epilog="The sweep file:\n" + grid.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("sweep_file", help="YAML sweep file (see loopnet/study/grid.py or configs/sweeps/)")
    p.add_argument("--out", help="sweep folder (default: the file's `out:`)")
    p.add_argument("--jobs", type=int, default=1, help="cells run at once (default 1)")
    p.add_argument("--threads", type=int, help="torch/OpenMP threads per cell (default: CPU cores / jobs)")
    p.add_argument("--max_cells", type=int, help="start at most this many unfinished cells, then stop")
    p.add_argument("--only", action="append", metavar="GLOB", help="run only cells whose id matches (repeatable)")
    p.add_argument(
        "--resume",
        choices=("ckpt", "restart"),
        default="ckpt",
        help="an unfinished cell continues from its last checkpoint (ckpt, default; from scratch when it "
        "has none) or reruns from scratch, its folder and checkpoints deleted (restart)",
    )
    p.add_argument(
        "--start",
        choices=STARTS,
        default="forkserver",
        help="how a fit starts: forked from a server that imported torch and Lightning once (forkserver, "
        "default), or as a fresh process that imports them itself (fresh)",
    )
    p.add_argument("--dry_run", action="store_true", help="list the cells, their state and commands; run nothing")
    return p


def check_cells(sweep, cells: list[Cell]) -> None:
    """Every unfinished cell's `loopnet fit` command passes the CLI's own checks (keys, types, the
    model config) before any cell runs: a typo in the grid fails here, not in each cell's log."""
    from loopnet.training.dry_run import check_command

    bad: dict[str, list[str]] = {}
    for cell in cells:
        if not is_finished(sweep.out / cell.id):
            why = check_command(cell.command[len(CLI) :])
            if why:
                bad.setdefault(why.removeprefix("loopnet: error: "), []).append(cell.id)
    if bad:
        lines = [
            f"{len(ids)} cell(s) ({', '.join(ids[:3])}{', ...' if len(ids) > 3 else ''}): {why}"
            for why, ids in bad.items()
        ]
        raise SweepError(
            f"{sum(map(len, bad.values()))} of {len(cells)} cells would fail at once, so none was "
            "started; fix the sweep file: " + " | ".join(lines)
        )


def run(argv: list[str], echo=None) -> int:
    """`loopnet sweep` without exiting: returns 1 when a cell failed or was stopped by a signal of its own, else 0."""
    echo = never_raising(echo or (lambda line: print(line, flush=True)))  # flushed: sweeps run for hours under nohup
    args = parser().parse_args(argv)
    sweep = load_sweep(args.sweep_file, out=args.out)
    cells = every_cell = expand(sweep)
    if args.only:
        cells = [c for c in cells if any(fnmatch.fnmatch(c.id, g) for g in args.only)]
    if args.dry_run:
        for c in cells:
            state = "finished" if is_finished(sweep.out / c.id) else "to run"
            echo(f"{c.id}  [{state}]\n    {shell_command(c.command)}")
        echo(f"{len(cells)} cells, out: {sweep.out}")
        return 0
    unchecked = sum(1 for c in cells if not is_finished(sweep.out / c.id))
    if unchecked:  # a CLI parse each: minutes for hundreds of cells, said so that the wait is not silent
        echo(f"loopnet sweep: checking the fit commands of {unchecked} unfinished cell(s) before any starts")
    check_cells(sweep, cells)
    sweep.out.mkdir(parents=True, exist_ok=True)
    runner = SweepRunner(
        sweep,
        cells,
        jobs=args.jobs,
        threads=args.threads,
        max_cells=args.max_cells,
        resume=args.resume,
        echo=echo,
        start=args.start,
    )
    runner.write_manifest(argv, every_cell)
    with stop_signals(runner.on_signal):
        results = runner.run()
        if runner.stop_signal:  # said while the handler holds: a second signal after it kills at once
            echo(f"loopnet sweep: stopped by {signal.Signals(runner.stop_signal).name}")
            raise KeyboardInterrupt  # `main` says how to continue, and exits 130
    failed = sorted(c for c, r in results.items() if r == "failed")
    unfinished = [c.id for c in cells if not is_finished(sweep.out / c.id)]
    counts = {
        k: sum(1 for r in results.values() if r == k)
        for k in ("completed", "diverged", "skipped", "failed", "stopped", "busy")
    }
    echo(
        "loopnet sweep: "
        + ", ".join(f"{v} {k}" for k, v in counts.items())
        + (f"; {len(unfinished)} cell(s) not finished" if unfinished else "; all cells finished")
        + (f"; failed: {', '.join(failed)}" if failed else "")
    )
    if not unfinished:
        echo(f"next: loopnet report {sweep.out}")
    return 1 if failed or counts["stopped"] else 0


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        with one_line_errors("loopnet sweep", (SweepError,)):
            rc = run(argv)
    except KeyboardInterrupt:
        print("loopnet sweep: interrupted; rerun the same command to continue", file=sys.stderr)
        sys.exit(130)
    if rc:
        sys.exit(rc)


if __name__ == "__main__":
    main()
