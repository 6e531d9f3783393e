"""Data: GPT-2 BPE offline, streamed document sources, packing, and the Lightning data module.

The data module and the tokenizer are imported on first use (PEP 562), so that the tokenizer and the
sources load without Lightning (the data module's) and `loopnet.data.token_ids` (GPT-2's vocabulary size)
stays light to import."""

from loopnet.lazy import lazy_attributes

_WHERE = {
    "TokenStreamDataModule": "loopnet.data.datamodule",
    "DataConfigError": "loopnet.data.errors",
    "EOT_ID": "loopnet.data.token_ids",
    "gpt2_encoding": "loopnet.data.tokenizer",
}

__getattr__, __dir__, __all__ = lazy_attributes(__name__, _WHERE)
