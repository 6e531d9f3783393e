"""What tests across the folders share: the tiny model config, waiting on a process while it works, and a
command run in the test's own process."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from loopnet.model import LoopConfig


def tiny_config(**overrides) -> LoopConfig:
    """A model small enough for a test (K = 2 blocks × R = 3 rounds, d 32, 4 heads, T 16, 64 token ids);
    a test overrides what it needs. `residual="scaled"` gets p = 0.4 unless given."""
    config = dict(vocab_size=64, seq_len=16, d_model=32, n_heads=4, n_blocks=2, n_rounds=3) | overrides
    if config.get("residual") == "scaled":
        config.setdefault("p", 0.4)
    return LoopConfig(**config)


# ------------------------------------------------------------------------------ waiting on a process
# Tests wait on what a process does, never on a guess of how fast it runs: a process that has not yet
# done what a test waits for is waited on as long as it is alive and working. It is given up only when
# it stops working: no CPU time used by it or its children for STALL_S seconds (a deadlock, a wait on a
# dead peer). A starved process on a loaded machine still gets some CPU time every second; 2 minutes of
# none at all is not slowness.
STALL_S = 120.0


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) used by process `pid` and every descendant, alive or reaped, from
    /proc; None once `pid` is gone."""
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rpartition(")")[2].split()
            except OSError:
                continue
            # fields[1]: ppid; [11:15]: utime, stime, cutime, cstime (clock ticks)
            stats[int(entry)] = (int(fields[1]), sum(int(v) for v in fields[11:15]))
    if pid not in stats:
        return None
    tree, grew = {pid}, True
    while grew:  # descendants: processes whose parent is in the tree
        new = {p for p, (ppid, _) in stats.items() if ppid in tree} - tree
        tree |= new
        grew = bool(new)
    total = sum(stats[p][1] for p in tree)
    return total / os.sysconf("SC_CLK_TCK")


class Watch:
    """Whether process `proc` (a subprocess.Popen) still works: `check()` raises AssertionError once it
    used no CPU time (with its children) for `stall` seconds; `what` names what it was awaited for."""

    def __init__(self, proc, what: str, stall: float = STALL_S):
        self.proc, self.what, self.stall = proc, what, stall
        self.used, self.since, self.read_at = None, time.monotonic(), 0.0

    def check(self) -> None:
        now = time.monotonic()
        if now - self.read_at < 1.0:  # reading /proc costs a few ms: once a second
            return
        self.read_at, cpu = now, cpu_seconds(self.proc.pid)
        if cpu is not None and cpu != self.used:
            self.used, self.since = cpu, now
        elif now - self.since > self.stall:
            raise AssertionError(f"the process hung before {self.what}: no CPU time used for {self.stall:.0f} s")


def wait_until(done, proc, what: str, poll: float = 0.05, stall: float = STALL_S) -> None:
    """Wait until `done()` is true while `proc` (a subprocess.Popen) works towards it. AssertionError
    when `proc` exits first, or hangs (`Watch`); `what` names the wait."""
    watch = Watch(proc, what, stall)
    while not done():
        if proc.poll() is not None:
            if done():
                return
            raise AssertionError(f"the process ended (status {proc.returncode}) before {what}")
        watch.check()
        time.sleep(poll)


def communicate(proc, what: str = "it ended") -> tuple[str, str]:
    """`proc.communicate()` (its pipes read as they fill) while it works (`Watch`); a hung process is
    killed, and the error shows its output."""
    watch = Watch(proc, what)
    while True:
        try:
            return proc.communicate(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
        try:
            watch.check()
        except AssertionError as hung:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"{hung}\n{(out or '')[-2000:]}\n{(err or '')[-4000:]}") from None


def run_command(args: list, **kwargs):
    """subprocess.run(args, capture_output=True, text=True, **kwargs), waited on while the process works
    (`Watch`) instead of with a timeout."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
    out, err = communicate(proc, f"`{' '.join(map(str, args))[:200]}` ended")
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


# ------------------------------------------------------------------------------ a command in this process
def run_here(args: list, cwd=None) -> subprocess.CompletedProcess:
    """`loopnet ARGS` run in this process (`loopnet.commands.main`), as `subprocess.run(..., capture_output=True,
    text=True)` would report it: for tests about what a command does, not about its process (signals, ranks,
    start-up, the entry point), so that Lightning's start-up (~7 s of imports a process) is paid once per test
    worker rather than once per command. stdout and stderr are captured (print, rich and the logging handlers
    that write to them); an uncaught exception reaches the test. The working directory, sys.argv, os.environ,
    torch's thread count and the signal handlers are restored after."""
    import contextlib
    import io
    import logging
    import signal

    import torch

    import loopnet.training.cli  # noqa: F401  its import sets what a process of `loopnet` starts with
    from loopnet.commands import main

    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_cwd, saved_argv, threads = dict(os.environ), os.getcwd(), sys.argv, torch.get_num_threads()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE)}
    streams = {id(sys.stdout): out, id(sys.stderr): err}
    swapped = [
        (h, h.stream)
        for logger in (logging.getLogger(), *logging.Logger.manager.loggerDict.values())
        for h in getattr(logger, "handlers", [])
        if isinstance(h, logging.StreamHandler)
        and id(h.stream) in streams
        and not isinstance(getattr(type(h), "stream", None), property)  # logging's last resort follows sys.stderr
    ]
    for h, stream in swapped:
        h.setStream(streams[id(stream)])
    code = 0
    try:
        sys.argv = ["loopnet"]  # the arguments go to main(): LightningCLI warns when sys.argv holds others beside them
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main([str(a) for a in args])
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
                if isinstance(exit_.code, str):
                    print(exit_.code, file=sys.stderr)
    finally:
        for h, stream in swapped:
            h.setStream(stream)
        for s, handler in handlers.items():
            signal.signal(s, handler)
        torch.set_num_threads(threads)
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess(["loopnet", *map(str, args)], code, out.getvalue(), err.getvalue())
