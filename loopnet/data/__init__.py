"""Data: GPT-2 BPE offline, streamed document sources, packing, and the Lightning data module.

The data module and the tokenizer are imported on first use, so that `loopnet.data.vocab` (GPT-2's
vocabulary size) stays light to import."""

from loopnet.data.vocab import EOT_ID

__all__ = ["DataConfigError", "EOT_ID", "TokenStreamDataModule", "gpt2_encoding"]


def __getattr__(name: str):
    if name == "TokenStreamDataModule":
        from loopnet.data.datamodule import TokenStreamDataModule

        return TokenStreamDataModule
    if name == "DataConfigError":
        from loopnet.data.errors import DataConfigError

        return DataConfigError
    if name == "gpt2_encoding":
        from loopnet.data.tokenizer import gpt2_encoding

        return gpt2_encoding
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
