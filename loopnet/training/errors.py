"""How a Trainer command reports what went wrong: one line, the problem and the fix.

OneLineErrors   a jsonargparse parser's command-line or config error as one line on stderr (the
                early checks' parser and LightningCLI's share it, so both say it alike)
peer_lost       one line for a DDP collective that failed because a peer process ended
Reported        an error already printed (on every rank, before any rank exits)
"""

from __future__ import annotations

import difflib
import os
import re
import signal

from loopnet.env import fail
from loopnet.training.subcommands import SUBCOMMANDS


class OneLineErrors:
    """Mixed into a jsonargparse parser: a command-line or config error is one line on stderr (the
    problem and the fix) instead of the whole usage text; exit status 2 as before. Option names must be
    given whole: a prefix (`--model.config.n_round`) is an unknown option, not an abbreviation."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str, ex: Exception | None = None):
        if not self.exit_on_error or os.environ.get("LOOPNET_DEBUG"):
            super().error(message, ex)  # raises: jsonargparse's internal parsing relies on it
        fail("loopnet", self.one_line(message, ex))

    def one_line(self, message: str, ex: Exception | None = None) -> str:
        """`<problem>; fix: <what to do>` for the parser's error `message`."""
        denied = re.search(r"Importing '([\w.]+)' is not allowed", str(message))
        if denied:  # jsonargparse's import-path policy (loopnet.training.trust): the path and the opt-in
            from loopnet.training.trust import refusal

            return refusal(denied.group(1), "the config")
        text = " ".join(line.strip() for line in str(message).splitlines() if line.strip())
        if len(text) > 400:
            text = text[:400] + " ..."
        return f"{text}; fix: {self._hint(message, ex)}"

    def _hint(self, message: str, ex: Exception | None) -> str:
        parser = getattr(ex, "subcommand_parser", None) or self
        sub = parser.prog.split()[-1] if parser.prog else ""
        prog = "loopnet" + (f" {sub}" if sub in SUBCOMMANDS else "")
        help_ = f"`{prog} --help` lists every option and its type"
        unknown = re.search(
            r"(?:Group '([^']+)' )?does not accept option '([^']+)'|unrecognized arguments: --?([^\s=]+)", message
        )
        if unknown:
            group, option, argument = unknown.groups()
            key = f"{group}.{option}" if group else option or argument
            parent, _, leaf = key.rpartition(".")
            siblings = {
                a.dest.rpartition(".")[2]: a.dest
                for a in parser._actions
                if isinstance(a.dest, str) and a.dest.rpartition(".")[0] == parent
            }
            close = [siblings[k] for k in difflib.get_close_matches(leaf, list(siblings), n=1, cutoff=0.75)]
            return (f"did you mean '{close[0]}'? " if close else "check the key's spelling and nesting; ") + help_
        if "File does not exist" in message:
            return "check the path given with --config (relative paths start from the current folder)"
        if "Problems parsing config" in message or "Unable to load config" in message:
            return "give an existing YAML file with --config, valid YAML; " + help_
        if "Expected a" in message or "Does not validate" in message or "not a valid" in message.lower():
            return "give the option a value of the expected type; " + help_
        return help_


# How gloo and NCCL report a peer process that died in the middle of a collective.
PEER_ERROR = re.compile(
    r"Connection (reset|closed) by peer|Broken pipe|remote process exited|NCCL communicator was "
    r"aborted|DistNetworkError",
    re.IGNORECASE,
)


class Reported(Exception):
    """An error this process has already printed as its one line: the command only exits with status 2."""


class PeerLost(RuntimeError):
    """A process of a multi-process run ended, and this one lost its connection to it."""


def dead_ranks(trainer) -> list[str]:
    """`rank N (killed by SIGKILL)` for each process this one launched (Lightning's launcher, rank 0) that
    has ended with an error."""
    dead = []
    for local_rank, proc in enumerate(getattr(trainer.strategy.launcher, "procs", None) or [], start=1):
        code = proc.poll()
        if code not in (None, 0):
            how = (
                f"killed by {signal.Signals(-code).name}"
                if code < 0 and -code in signal.valid_signals()
                else f"exit status {code}"
            )
            dead.append(f"rank {local_rank + trainer.node_rank * trainer.num_devices} ({how})")
    return dead


def peer_lost(trainer, err: BaseException) -> str | None:
    """One line for a collective that failed because a peer process ended (killed, out of memory), naming
    that rank when this process launched it (Lightning's launcher on rank 0), else the peer's address;
    None for any other error."""
    if trainer.world_size < 2 or not isinstance(err, RuntimeError) or not PEER_ERROR.search(str(err)):
        return None
    dead = dead_ranks(trainer)
    peer = re.search(r"\[([^\]]+)\]:(\d+)", str(err))
    who = (
        (" and ".join(dead) + " of this DDP run ended")
        if dead
        else (
            f"a peer process of this DDP run ({peer.group(1)}:{peer.group(2)}) ended"
            if peer
            else "a peer process of this DDP run ended"
        )
    )
    return (
        f"{who}, and rank {trainer.global_rank} lost its connection at step {trainer.global_step} "
        f"({type(err).__name__}: {PEER_ERROR.search(str(err)).group(0)}); fix: see that rank's output for why it "
        f"ended (killed: out of memory? see `dmesg`), then run the same command with --ckpt_path last on every rank"
    )
