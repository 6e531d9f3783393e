"""Data: GPT-2 BPE offline, streamed document sources, packing, and the Lightning data module."""

from loopnet.data.datamodule import TokenStreamDataModule
from loopnet.data.errors import DataConfigError
from loopnet.data.tokenizer import EOT_ID, gpt2_encoding

__all__ = ["DataConfigError", "EOT_ID", "TokenStreamDataModule", "gpt2_encoding"]
