"""The byte-level proxy (data.vocab: bytes) and the measurement of where a step goes."""

import numpy as np
import pytest

from loopnet.data.bytelevel import BYTE_EOT_ID, N_BYTE_VOCAB, ByteVocab


def test_byte_vocab_round_trips_utf8_and_ends_documents():
    text = "Thou art — naïve?"
    ids = ByteVocab.document(text)
    assert ids.dtype == np.int32 and ids[-1] == BYTE_EOT_ID and len(ids) == len(text.encode("utf-8")) + 1
    assert ByteVocab.decode(ids) == text and ByteVocab.decode(ByteVocab.encode(text)) == text


def test_datamodule_bytes_batches_and_plateau():
    from loopnet.data import TokenStreamDataModule
    from loopnet.study.unigram import cross_entropy, run_plateau, val_limit

    dm = TokenStreamDataModule(seq_len=32, batch_size=2, vocab="bytes")
    assert dm.vocab_size == N_BYTE_VOCAB == 257
    x, y = next(iter(dm.train_dataloader()))
    assert x.max() < 257 and (x[:, 1:] == y[:, :-1]).all()
    assert dm.decode(dm.encode("ROMEO: hi")) == "ROMEO: hi"
    windows = dm.val_windows()
    assert windows.max() <= BYTE_EOT_ID
    # The plateau in the run's own ids (bytes), computed here from the raw text independently of the stream
    plateau, how = run_plateau(
        {
            "data": {"source": "shakespeare", "vocab": "bytes", "batch_size": 2},
            "model": {"config": {"seq_len": 32}},
            "trainer": {"limit_val_batches": 4},
        }
    )
    counts = np.zeros(257, dtype=np.int64)
    for d in dm.docs:
        if d["text"] and not dm.val(d["text"]):
            counts += np.bincount(np.frombuffer(d["text"].encode(), dtype=np.uint8), minlength=257)
            counts[BYTE_EOT_ID] += 1
    n = val_limit(4, -(-len(windows) // 2)) * 2
    assert plateau == pytest.approx(cross_entropy(windows[:n, 1:].numpy(), counts))
    assert 2.5 < plateau < np.log(257)


def test_proxy_counts_parameters_and_attributes_the_step():
    import torch

    from loopnet.model import LoopConfig
    from loopnet.study import proxy
    from loopnet.training.module import LoopedLM, OptimConfig

    d, k, v, t = 64, 2, 320, 32
    lm = LoopedLM(
        config=LoopConfig(vocab_size=v, seq_len=t, d_model=d, n_heads=4, n_blocks=k, n_rounds=2), optim=OptimConfig()
    )
    split = proxy.param_split(lm.model)
    assert split["blocks"] == k * (12 * d * d + 2 * d)  # QKV 3d², O d², fc1 and fc2 4d² each, two RMSNorm gains
    assert split["embed+head"] == v * d + t * d and split["final norm"] == d  # tied head: the token table
    opt = torch.optim.AdamW(lm.parameters(), lr=1e-3)
    batch = (torch.randint(0, v, (4, t)), torch.randint(0, v, (4, t)))
    proxy.scoped_step(lm, opt, batch)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_flops=True) as prof:
        proxy.scoped_step(lm, opt, batch)

    class Weighted:  # an event whose "time" is a count, so that the attribution is checked without a clock
        def __init__(self, event, value):
            self.event, self.self_cpu_time_total = event, value

        def __getattr__(self, name):
            return getattr(self.event, name)

    events = prof.events()
    # The matrix products' FLOPs, by place, against the model's arithmetic (N = 4·32 tokens): per block
    # visit the forward's QKV 6Nd², O 2Nd², fc1 and fc2 8Nd² each (24Nd²), the backward twice that
    # (72Nd² in all, its ops placed by their forward's sequence number), K·R = 4 visits; the head: the
    # logits 2NdV and both of their gradients (formed in the forward by the fused loss), 6NdV.
    mm = proxy.attribute([Weighted(e, e.flops if e.name == "aten::mm" else 0) for e in events])
    n = 4 * t
    assert mm == {"blocks": 72 * n * d * d * k * 2, "head": 6 * n * d * v, "embed": 0, "optimizer": 0, "other": 0}
    # Every op of the step has a place but a little bookkeeping (counted in ops, not timed).
    ops = proxy.attribute([Weighted(e, 1) for e in events])
    assert (
        ops["other"] < 0.05 * sum(ops.values()) and min(ops["blocks"], ops["head"], ops["embed"], ops["optimizer"]) > 0
    )
    assert not hasattr(lm.model, "__dict__") or "head" not in lm.model.__dict__  # the wrapper is gone
