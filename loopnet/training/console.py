"""A run's stdout and stderr, kept writable when the reader at the other end of their pipe goes away.

`loopnet fit ... | tee run.log` and Ctrl-C: the terminal signals `tee` too, `tee` exits, and the run's
next write (the progress bar, the line saying it is stopping) would raise BrokenPipeError in the middle
of training, ending the run before its interruption checkpoint. Guarded, a write that finds the pipe
broken sends that stream's file descriptor to a log file in the run folder (`output-after-broken-pipe.log`;
/dev/null before the run folder exists) and carries on; the run then stops after the current step with
its interruption checkpoint, as for SIGTERM (`GracefulInterrupt`): a reader that went away is a stop
request, as SIGPIPE is for any Unix program, only a clean one. Python's own flush of stdout at exit finds
the file, so no "Exception ignored ... BrokenPipeError" and no exit status 120 either.

Only streams that are pipes or sockets are guarded (a terminal, a file, a test's StringIO are left alone).
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import stat
import sys
import threading

LOG_NAME = "output-after-broken-pipe.log"

_target: str = os.devnull  # where a broken stream's output goes from then on
_broken = threading.Event()


def pipe_broken() -> bool:
    """Whether a guarded stream found its reader gone (this process)."""
    return _broken.is_set()


def send_broken_output_to(folder: str | None) -> None:
    """A broken stream's output goes to `folder`/output-after-broken-pipe.log from now on (None: /dev/null)."""
    global _target
    _target = os.path.join(folder, LOG_NAME) if folder else os.devnull


def _is_broken_pipe(err: OSError) -> bool:
    return isinstance(err, BrokenPipeError) or err.errno in (errno.EPIPE, errno.ECONNRESET)


class GuardedStream:
    """A text stream (sys.stdout, sys.stderr) whose writes survive a broken pipe: the first one that
    fails moves the stream's file descriptor to the log file (`os.dup2`, so that every writer of that
    descriptor, C code and Python's exit included, follows) and the write is retried there."""

    def __init__(self, stream):
        self._stream = stream

    def _moved(self) -> None:
        first = not _broken.is_set()
        _broken.set()
        try:
            fd, target = os.open(_target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644), _target
        except OSError:  # the run folder is not there (yet)
            fd, target = os.open(os.devnull, os.O_WRONLY), os.devnull
        try:
            os.dup2(fd, self._stream.fileno())
            if first and target != os.devnull:
                os.write(
                    fd,
                    b"loopnet: the reader of this run's output went away (broken pipe); the output "
                    b"continues here, and the run stops after this step with its interruption checkpoint\n",
                )
        finally:
            os.close(fd)

    def _guarded(self, call, *args):
        try:
            return call(*args)
        except OSError as err:
            if not _is_broken_pipe(err):
                raise
        self._moved()
        try:  # what the failed write left in the stream's buffer goes to the file now
            return call(*args)
        except OSError:
            return None

    def write(self, text: str):
        written = self._guarded(self._stream.write, text)
        return len(text) if written is None else written

    def writelines(self, lines) -> None:
        self._guarded(self._stream.writelines, list(lines))

    def flush(self) -> None:
        self._guarded(self._stream.flush)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _is_pipe(stream) -> bool:
    try:
        mode = os.fstat(stream.fileno()).st_mode
    except (AttributeError, OSError, ValueError):  # no file descriptor: StringIO, pytest's capture, closed
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def guard_console() -> None:
    """Guard sys.stdout and sys.stderr when they are pipes (once per process), and the logging handlers
    that already write to them (Lightning's, created at its import)."""
    swapped = {}
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if not isinstance(stream, GuardedStream) and _is_pipe(stream):
            swapped[id(stream)] = guarded = GuardedStream(stream)
            setattr(sys, name, guarded)
    if not swapped:
        return
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for logger in loggers:
        for handler in getattr(logger, "handlers", []):
            if isinstance(handler, logging.StreamHandler) and id(handler.stream) in swapped:
                handler.setStream(swapped[id(handler.stream)])
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # Python's default: a broken pipe is an error, not a kill
