"""`loopnet` command lines checked or read without running them: the sweep checks every cell's
`loopnet fit` before any runs (`check_command`), the probe reads a fit's settings (`parse_fit`)."""

from __future__ import annotations

import contextlib
import io
import os
import sys

from jsonargparse import Namespace

from loopnet.compat import NoRunHook
from loopnet.training.cli import LoopnetCLI, main


class CheckOnly(NoRunHook, LoopnetCLI):
    """Parses and checks a command line as `loopnet` does (config files, keys, types, the model config,
    checkpoints, writable folders), but builds and runs nothing (the caller's RNGs and log stay untouched)."""

    def instantiate_classes(self) -> None:
        pass


def check_command(argv: list[str]) -> str | None:
    """None when `loopnet <argv>` would get past its checks; else its one-line error (for `loopnet sweep`,
    so that a typo in a grid fails before any cell runs)."""
    err, environ, sys_argv = io.StringIO(), dict(os.environ), sys.argv
    try:
        sys.argv = sys.argv[:1]  # the caller's own arguments are not this command's (LightningCLI warns)
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            main(argv, cli_class=CheckOnly)
        return None
    except SystemExit as exit_:
        if exit_.code in (0, None):
            return None
        if exit_.code == 130:  # Ctrl-C: the caller's to handle, not this command's error
            raise KeyboardInterrupt from None
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        return lines[-1] if lines else f"exit status {exit_.code}"
    finally:  # seed_everything exports PL_GLOBAL_SEED; the caller's environment stays its own
        sys.argv = sys_argv
        os.environ.clear()
        os.environ.update(environ)


def parse_fit(args: list[str]) -> Namespace:
    """The parsed config of `loopnet fit <args>` (config files, keys, types and the CLI's checks);
    nothing is built or written."""
    got = {}

    class Capture(CheckOnly):
        def instantiate_classes(self) -> None:
            got["cfg"] = self.config["fit"]

    argv, sys.argv = sys.argv, sys.argv[:1]  # the caller's own arguments are not this fit's (LightningCLI warns)
    try:
        main(["fit", *args], cli_class=Capture)
    finally:
        sys.argv = argv
    return got["cfg"]
