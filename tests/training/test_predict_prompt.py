"""The prompt `loopnet predict` continues: an empty one starts from the model's own end-of-text, whatever
its vocabulary; one that is not UTF-8 is refused in one line."""

import numpy as np
import pytest
import torch

from loopnet.data.bytelevel import BYTE_EOT_ID
from loopnet.data.token_ids import EOT_ID
from loopnet.data.vocabulary import BytesVocab, CompactVocab, GPT2Vocab
from loopnet.training.options import GenerateConfig
from tests.helpers import tiny_config


@pytest.mark.parametrize(
    "vocab", [BytesVocab(), CompactVocab(np.array([5, 17, EOT_ID])), GPT2Vocab()], ids=["bytes", "compact", "gpt2"]
)
def test_an_empty_prompt_starts_from_the_vocabularys_end_of_text(vocab):
    from loopnet.training.module import LoopedLM

    eot = {"bytes": BYTE_EOT_ID, "compact": 2, "gpt2": EOT_ID}[vocab.name]  # compact: EOT_ID is its third id
    torch.manual_seed(0)
    lm = LoopedLM(
        config=tiny_config(vocab_size=max(vocab.size, 64), seq_len=8, n_heads=2, n_blocks=1, n_rounds=2),
        generate={"prompt": "", "max_new_tokens": 3},
    )
    lm.vocabulary = vocab  # as `loopnet predict` sets it for a model trained on that vocabulary
    lm.eval()
    (batch,) = list(lm.predict_dataloader())
    assert batch.tolist() == [[eot]]
    assert isinstance(lm.predict_step(batch), str)


def test_a_prompt_that_is_not_utf8_is_refused_in_one_line():
    prompt = b"ROMEO:\xff\xfe".decode("utf-8", "surrogateescape")  # as Python holds such command-line bytes
    with pytest.raises(ValueError) as err:
        GenerateConfig(prompt=prompt)
    assert str(err.value) == (
        "model.generate.prompt is not UTF-8 text (bytes ff fe at character 6); fix: give the "
        "prompt in UTF-8 (e.g. convert it with `iconv -t UTF-8`)"
    )
