"""How `loopnet sweep` starts a cell's fit: a fresh process, or a fork of a server that imported torch once.

A fit's command is ``python -m loopnet.training.cli fit ...``. Run as a fresh process (``fresh``), each
fit pays the interpreter's start-up and the import of torch, Lightning and loopnet (8-10 s on a CPU
machine) before its first step. ``forkserver`` (the default) pays it once per sweep: a server process
(Python's multiprocessing forkserver) imports them at the sweep's start, and each fit is a fork of it
that runs the same module as ``python -m`` would (`runpy`), with the same arguments, environment, thread
count, working directory and output file. A fit is still a process of its own: one that crashes or is
killed leaves the sweep and the other fits running, and a signal to it reaches the fit's own handlers.

Both hand back a handle with Popen's interface (poll, wait, send_signal, kill, pid, returncode), so the
sweep treats them alike.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

# What the fork server imports once, before any fit: most of a fit's start-up.
PRELOAD = ["torch", "loopnet.training.cli"]  # Lightning through loopnet's CLI (`compat.lean_torchmetrics`)
# The signals that stop a sweep; blocked around a start, unblocked in the fit.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _unblock() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def start_fresh(cmd: list[str], log_path, env: dict[str, str], threads: int, spawn=subprocess.Popen):
    """The fit as a new process (`spawn`: subprocess.Popen, or a test's stand-in). The sweep blocks its
    stop signals while it starts a fit: the fit unblocks them before it runs (a mask survives exec)."""
    env = dict(env, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    with open(log_path, "ab") as log:  # the child holds its own descriptor
        return spawn(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=_unblock)


class ForkedFit:
    """A fit forked from the server (a multiprocessing.Process) behind Popen's interface. The server
    reports the fit's exit; should the server itself die first (exit report 255), the fit is followed by
    its pid until it ends."""

    def __init__(self, process):
        self.process, self.pid = process, process.pid

    @property
    def returncode(self) -> int | None:
        return self.poll()

    def poll(self) -> int | None:
        code = self.process.exitcode  # negative: killed by that signal, as Popen's
        if code == 255 and running(self.pid):  # the server's report was lost, not the fit
            return None
        return code

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        self.process.join(timeout)
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"fit pid {self.pid}", timeout)
            time.sleep(0.1)
        return self.poll()

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    if os.path.isdir("/proc"):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
        except FileNotFoundError:
            return False
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


class ForkServer:
    """Starts fits as forks of one server process that imported `preload` (`PRELOAD`) once."""

    def __init__(self, preload: list[str] | None = None):
        import multiprocessing

        self.context = multiprocessing.get_context("forkserver")
        self.context.set_forkserver_preload(list(PRELOAD if preload is None else preload))

    def warm(self) -> float:
        """Start the server and wait until it has imported its modules (a first fork returns): seconds.
        Called with the stop signals unblocked, so that a stop during the imports is seen at once.

        The server, and the resource tracker started with it, are spawned with the stop signals blocked, a mask
        they keep (each fit unblocks them): a stop signal to the whole process group (a closed terminal's
        SIGHUP, `kill -TERM -<pgid>`) would otherwise kill them under the running fits, losing the fits' exit
        statuses and breaking their exit (the tracker's fd). They end with the sweep (their pipes close)."""
        from multiprocessing import forkserver, resource_tracker

        t0 = time.monotonic()
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            resource_tracker.ensure_running()  # which unblocks SIGINT and SIGTERM on its way out: blocked again
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            forkserver.ensure_running()  # spawns the server only: it imports `preload` afterwards
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        probe = self.context.Process(target=_nothing, daemon=False)
        probe.start()
        probe.join()
        return time.monotonic() - t0

    def start(self, cmd: list[str], log_path, env: dict[str, str], threads: int) -> ForkedFit:
        env = dict(env, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        process = self.context.Process(
            target=run_command, args=(cmd, str(log_path), env, threads, os.getcwd()), name="loopnet-fit"
        )
        process.start()
        return ForkedFit(process)


def _nothing() -> None:
    pass


def _append_to(path: str, *fds: int) -> None:
    """Point file descriptors `fds` at the end of `path` (created if missing)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for target in fds:
        os.dup2(fd, target)
    os.close(fd)


def run_command(
    cmd: list[str], log_path: str, env: dict[str, str], threads: int, cwd: str, err_path: str | None = None
) -> None:
    """In the forked process: run `cmd` (``python -m module args`` or ``python script args``) as the
    interpreter would, with `env` as the whole environment and both output streams appended to `log_path`
    (stderr to `err_path` when given). Exits as the interpreter would: non-daemon threads joined, then atexit."""
    import runpy
    import threading

    from loopnet.compat import run_exit_handlers

    signal.pthread_sigmask(signal.SIG_SETMASK, ())  # the server's mask is the sweep's at its start
    _append_to(log_path, 1, 2)
    if err_path:
        _append_to(err_path, 2)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    if "torch" in sys.modules:  # imported by the server, before OMP_NUM_THREADS was this fit's
        sys.modules["torch"].set_num_threads(threads)
    args = cmd[1:]
    try:
        if args[:1] == ["-m"]:
            sys.argv = [args[1], *args[2:]]
            sys.modules.pop(args[1], None)  # preloaded as a module: run afresh as __main__, as `python -m` does
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(args)
            runpy.run_path(args[0], run_name="__main__")
    finally:
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()
        run_exit_handlers()
