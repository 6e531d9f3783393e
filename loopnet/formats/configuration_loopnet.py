"""The `transformers` configuration of an exported loopnet model (`model_type` "loopnet").

Shipped verbatim beside `modeling_loopnet.py` in an exported folder, so it needs only transformers.
It holds every `LoopConfig` field of loopnet's model as a plain attribute (config.json lists them);
`modeling_loopnet` builds the model's own `LoopConfig` from them, which checks them.
"""

from __future__ import annotations

from transformers import PretrainedConfig


class LoopnetConfig(PretrainedConfig):
    """A loopnet `LoopConfig` as a transformers config.

    Besides the `LoopConfig` fields: `loopnet_vocab` names the vocabulary the model was trained on
    ("gpt2": GPT-2's BPE ids; "bytes": UTF-8 bytes, 256 = end-of-text; "tokenizer": the folder's own
    tokenizer files, an imported model's), `loopnet_n_vocab` is its id count (the logits cover these ids,
    not the padding of `vocab_size`, as loopnet's evaluation and generation do; None: all), and `tie_word_embeddings` mirrors `tie_embeddings` (transformers ties
    the head to the embedding by it)."""

    model_type = "loopnet"

    def __init__(
        self, tie_embeddings: bool = True, loopnet_vocab: str = "gpt2", loopnet_n_vocab: int | None = None, **kwargs
    ):
        self.tie_embeddings = tie_embeddings
        self.loopnet_vocab = loopnet_vocab
        self.loopnet_n_vocab = loopnet_n_vocab
        kwargs["tie_word_embeddings"] = tie_embeddings
        super().__init__(**kwargs)
