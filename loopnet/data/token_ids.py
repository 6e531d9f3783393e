"""GPT-2's vocabulary as numbers, the names `data.vocab` takes, and the check that a model's embedding
fits the data's ids: light to import (no tokenizer, no `datasets`), for every module that needs them
without the BPE itself (the CLI's checks, the eval adapter, the unigram plateau). The vocabularies
themselves (size, text <-> ids) are `loopnet.data.vocabulary`."""

from __future__ import annotations

from typing import Literal

N_VOCAB = 50257  # GPT-2 BPE's token ids; LoopConfig.vocab_size pads it to a multiple of 64 (50304)
EOT_ID = 50256  # <|endoftext|>, appended after every document
EOT_TEXT = "<|endoftext|>"

VocabName = Literal[
    "gpt2", "compact", "bytes", "tokenizer"
]  # `data.vocab`: the data module's signature takes this type
DEFAULT: VocabName = "gpt2"


def check_fits(model_vocab: int, data_vocab: int, name: str) -> None:
    """The data's token ids must fit the model's embedding (else an IndexError in the first step)."""
    if model_vocab < data_vocab:
        raise ValueError(
            f"model.config.vocab_size={model_vocab} is smaller than the data's {data_vocab} token ids "
            f"(data.vocab: {name}); fix: set model.config.vocab_size to at least {data_vocab} "
            f"(a multiple of 64 is fastest, e.g. {-(-data_vocab // 64) * 64})"
            + ("" if name == "compact" else ", or use data.vocab: compact")
        )
