"""data.vocab: compact — the corpus's own GPT-2 ids, renumbered; lossless."""

import numpy as np
import pytest
import torch

from loopnet.data import TokenStreamDataModule, gpt2_encoding
from loopnet.data.errors import DataConfigError
from loopnet.data.tokenizer import EOT_ID


def _modules(path):
    kw = dict(seq_len=16, batch_size=2, source="files", path=path, val_fraction=0.2, seed=3)
    return TokenStreamDataModule(**kw), TokenStreamDataModule(**kw, vocab="compact")


def test_compact_batches_are_the_gpt2_batches_renumbered(txt_corpus):
    path, texts = txt_corpus
    gpt2, compact = _modules(path)
    ids = sorted({t for text in texts for t in gpt2_encoding().encode_ordinary(text)} | {EOT_ID})
    assert compact.vocab_size == len(ids) and gpt2.vocab_size == 50257
    assert compact.vocab_ids.tolist() == ids  # GPT-2 order
    a, b = iter(gpt2.train_dataloader()), iter(compact.train_dataloader())
    for _ in range(5):
        (xa, ya), (xb, yb) = next(a), next(b)
        assert int(xb.max()) < compact.vocab_size
        assert torch.equal(torch.from_numpy(compact.vocab_ids)[xb.long()], xa.long())  # same windows, same order
        assert torch.equal(torch.from_numpy(compact.vocab_ids)[yb.long()], ya.long())
    va, vb = gpt2.val_windows(), compact.val_windows()
    assert torch.equal(torch.from_numpy(compact.vocab_ids)[vb], va)
    text = "doc0 word0 doc0 word1"
    assert compact.decode(compact.encode(text)) == text
    assert compact._config()["vocab"] == "compact" and "vocab" not in gpt2._config()  # old checkpoints resume


def test_compact_needs_a_local_corpus_and_a_large_enough_model(txt_corpus):
    with pytest.raises(DataConfigError, match="needs a local corpus"):
        TokenStreamDataModule(seq_len=16, batch_size=2, source="hub", vocab="compact")
    with pytest.raises(DataConfigError, match="data.vocab='tiny' is not known"):
        TokenStreamDataModule(seq_len=16, batch_size=2, vocab="tiny")
    from tests.helpers import tiny_config
    from loopnet.training.module import LoopedLM

    _, compact = _modules(txt_corpus[0])

    class FakeTrainer:
        datamodule = compact

    lm = LoopedLM(config=tiny_config(vocab_size=8, n_blocks=1, n_rounds=1))
    lm._trainer = FakeTrainer()
    with pytest.raises(
        ValueError, match=f"smaller than the data's {compact.vocab_size} token ids.*fix: set model.config.vocab_size"
    ):
        lm.setup("fit")
    assert np.all(compact._table[compact.vocab_ids] == np.arange(compact.vocab_size))
