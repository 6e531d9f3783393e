"""Before Lightning is imported (~40-100 s under load): is the hub dataset a Trainer command would read reachable?

`loopnet fit --config configs/deeploop_r6.yaml` on a machine without the hub (a laptop, a CPU node,
HF_HUB_OFFLINE=1) must say so in seconds, and say what to do: add the CPU overlay, or read a local copy.
The data settings are those the early checks read (`loopnet.training.precheck`, LightningCLI's parser
without Lightning).
"""

from __future__ import annotations

import os

from loopnet.data.errors import DataConfigError

OVERLAY = "add `--config configs/cpu.yaml` after the method config (a CPU run on the embedded corpus)"
EMBEDDED = "read the embedded corpus with `--data.source shakespeare`"
LOCAL = (
    "read a local copy with `--data.path <folder of its parquet files>` (laid out as the hub serves them, e.g. by "
    "`huggingface-cli download Skylion007/openwebtext --repo-type dataset --revision refs/convert/parquet "
    "--local-dir <folder>`)"
)


def check_hub(data, argv: list[str]) -> None:
    """Raise `DataConfigError` (one line naming the overlay and the local alternative) when the command
    `argv` reads a hub dataset that cannot be reached now; the commit found is kept for the data module.
    `data`: its data settings (a mapping; None: none read, e.g. for --help)."""
    from loopnet.data.sources import OPENWEBTEXT, hub_revision

    overlaid = any(os.path.basename(arg) == "cpu.yaml" for arg in argv)
    if not data or data.get("source") != "hub":
        return
    path = data.get("path") or OPENWEBTEXT
    if not isinstance(path, str) or os.path.isdir(path):
        return
    try:
        hub_revision(path, data.get("revision"), timeout=5.0)
    except DataConfigError as e:
        reason = str(e).split(" Offline alternatives:")[0].rstrip(". ")
        raise DataConfigError(
            f"{reason}; fix: {EMBEDDED if overlaid else 'on a machine without the hub ' + OVERLAY}, or {LOCAL}"
        ) from None
