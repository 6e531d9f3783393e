"""The Pre-LN parity bench runs loopnet and an independent nanoGPT-style GPT on the same batches."""

import math

from loopnet.bench import parity
from loopnet.bench.nanogpt import GPT, GPTConfig


def test_nanogpt_peer_is_independent_and_standard():
    model = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32))
    assert model.wte.weight is model.lm_head.weight  # tied head
    assert model.h[0].attn.c_attn.weight.shape == (96, 32)  # fused QKV
    assert abs(model.h[0].attn.c_proj.weight.std().item() - 0.02 / math.sqrt(4)) < 0.003


def test_parity_bench_trains_all_three_models(capsys):
    results = parity.main(["--steps", "12", "--seeds", "1", "--d-model", "32", "--n-heads", "2", "--seq-len", "32",
                           "--val-batches", "2", "--warmup", "2"])
    assert set(results) == {"nanoGPT (independent)", "loopnet preln", "loopnet preln, input_norm: true"}
    for losses in results.values():
        assert len(losses) == 1 and 0 < losses[0] < math.log(19136)  # learned something in 12 steps
    out = capsys.readouterr().out
    assert "| loopnet preln | " in out and "minus nanoGPT, paired" in out
