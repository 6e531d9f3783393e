"""Data: GPT-2 BPE offline, streamed document sources, packing, and the Lightning data module."""

import importlib

# Imported on first use (PEP 562): the tokenizer and the sources load without Lightning (the data module's).
_WHERE = {"TokenStreamDataModule": "loopnet.data.datamodule", "DataConfigError": "loopnet.data.errors",
          "EOT_ID": "loopnet.data.tokenizer", "gpt2_encoding": "loopnet.data.tokenizer"}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
