"""Before Lightning is imported (~40-100 s under load): is the hub dataset a Trainer command would read reachable?

`loopnet fit --config configs/deeploop_r6.yaml` on a machine without the hub (a laptop, a CPU node,
HF_HUB_OFFLINE=1) must say so in seconds, and say what to do: add the CPU overlay, or read a local copy.
The command line's data settings are read as jsonargparse would (the --config files in order, then
--data.* options); anything this simple reading cannot follow is left to the CLI's own checks.
"""

from __future__ import annotations

import os

import yaml

from loopnet.data.errors import DataConfigError

OVERLAY = "add `--config configs/cpu.yaml` after the method config (a CPU run on the embedded corpus)"
EMBEDDED = "read the embedded corpus with `--data.source shakespeare`"
LOCAL = ("read a local copy with `--data.path <folder of its parquet files>` (laid out as the hub serves them, e.g. by "
         "`huggingface-cli download Skylion007/openwebtext --repo-type dataset --revision refs/convert/parquet "
         "--local-dir <folder>`)")


def _read_config(path: str | None, data: dict, depth: int = 0) -> bool:
    """Merge the `data` section of config file `path` into `data`, after the files its own `config:`
    key names (relative to it, as jsonargparse reads them); False when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            cfg = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError, UnicodeDecodeError, TypeError):
        return False
    if not isinstance(cfg, dict) or depth > 8:
        return False
    nested = cfg.get("config")
    for inner in [nested] if isinstance(nested, str) else nested if isinstance(nested, list) else []:
        if not _read_config(os.path.join(os.path.dirname(path), inner), data, depth + 1):
            return False
    if isinstance(cfg.get("data"), dict):
        data.update(cfg["data"])
    return True


def data_settings(argv: list[str]) -> dict | None:
    """The `data` settings of a Trainer command line (config files, then --data.* options); None if unsure."""
    data: dict = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        key, value = (arg.split("=", 1) + [None])[:2] if arg.startswith("--") and "=" in arg else (arg, None)
        if value is None and i + 1 < len(argv) and key.startswith("-"):
            value, i = argv[i + 1], i + 1
        i += 1
        if key in ("--config", "-c"):
            if not _read_config(value, data):
                return None  # the CLI names the problem
        elif key.startswith("--data.") and key.count(".") == 1 and value is not None:
            data[key[len("--data."):]] = None if value in ("null", "None") else value
    return data


def check_hub(argv: list[str]) -> None:
    """Raise `DataConfigError` (one line naming the overlay and the local alternative) when the command
    reads a hub dataset that cannot be reached now; the commit found is kept for the data module."""
    from loopnet.data.sources import OPENWEBTEXT, hub_revision

    if any(arg in ("-h", "--help") or arg.startswith("--print_config") for arg in argv):
        return  # reads no data
    data = data_settings(argv)
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
        raise DataConfigError(f"{reason}; fix: {EMBEDDED if overlaid else 'on a machine without the hub ' + OVERLAY}, "
                              f"or {LOCAL}") from None
