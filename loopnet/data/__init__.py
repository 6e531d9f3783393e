"""Data: GPT-2 BPE offline, streamed document sources, packing, and the Lightning data module.

The names below are imported on first use, so that `loopnet.data.vocab` (GPT-2's vocabulary size)
stays light to import: the data module pulls in Lightning and the tokenizer tiktoken."""

from loopnet.data.vocab import EOT_ID

_LAZY = {
    "TokenStreamDataModule": "loopnet.data.datamodule",
    "DataConfigError": "loopnet.data.errors",
    "gpt2_encoding": "loopnet.data.tokenizer",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'loopnet.data' has no attribute {name!r}")


__all__ = ["DataConfigError", "EOT_ID", "TokenStreamDataModule", "gpt2_encoding"]
