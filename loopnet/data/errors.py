"""The one error type the data package raises for bad configuration or bad input, and the fix its
messages name when a hub dataset cannot be reached."""


class DataConfigError(ValueError):
    """A data source, a file or an argument cannot be used; the message names the problem and the fix."""


# The fix named when a hub dataset cannot be listed or read (offline, unknown, private).
LOCAL_ALTERNATIVES = (
    "Offline alternatives: `source: shakespeare` (the embedded corpus), "
    "`source: files` with `path:` local files or globs (txt, json/jsonl, parquet), "
    "or `source: hub` with `path:` a local dataset folder (the hub's parquet layout); "
    "on a CPU machine, add `--config configs/cpu.yaml` to the method config."
)
