"""What every command shares about where it runs and how it ends; light to import (torch only
inside `machine`).

    hub_offline       HF_HUB_OFFLINE / HF_DATASETS_OFFLINE / TRANSFORMERS_OFFLINE set to a true value
    machine           where a command ran (the sweep's manifest, the probe's and the bench's reports)
    one_line_errors   the errors a user can fix: one line `<prog>: error: ...` and exit status 2
"""

from __future__ import annotations

import contextlib
import os
import platform
import sys
from collections.abc import Iterator

_TRUE = {"1", "on", "yes", "true"}


def hub_offline() -> bool:
    """HF_HUB_OFFLINE / HF_DATASETS_OFFLINE (or TRANSFORMERS_OFFLINE, which huggingface_hub reads as
    HF_HUB_OFFLINE) set to a true value, as huggingface_hub and datasets read them."""
    names = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
    return any(os.environ.get(v, "").strip().lower() in _TRUE for v in names)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(device: str | None = None) -> dict:
    """Where a command ran. With `device` (the bench's), also the device measured, Lightning's version
    and the load the command started under."""
    import torch

    info = {
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "cpu": cpu_model(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
    }
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    if device is not None:
        import lightning

        info["lightning"] = lightning.__version__
        info["device"] = "cpu"
        if device.startswith("cuda"):
            info["device"], info["cuda"] = torch.cuda.get_device_name(device), torch.version.cuda
        if hasattr(os, "getloadavg"):
            info["load_at_start"] = os.getloadavg()[0]
    return info


def error_line(prog: str, message: str) -> None:
    """`<prog>: error: <message>` on stderr in one write: the ranks of a run share one stderr, and a line
    written in pieces (print's text, then its newline) interleaves with another rank's."""
    sys.stderr.write(f"{prog}: error: {message}\n")
    sys.stderr.flush()


def fail(prog: str, message: str) -> None:
    """`<prog>: error: <message>` on stderr, exit status 2."""
    error_line(prog, message)
    sys.exit(2)


@contextlib.contextmanager
def one_line_errors(
    prog: str, errors: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError), debug: bool = False
) -> Iterator[None]:
    """`errors` raised inside become `fail(prog, str(err))`; with `debug`, LOOPNET_DEBUG=1 lets the
    traceback through instead, and the line says so."""
    try:
        yield
    except errors as err:
        if debug and os.environ.get("LOOPNET_DEBUG"):
            raise
        fail(prog, f"{err} (set LOOPNET_DEBUG=1 for the traceback)" if debug else str(err))
