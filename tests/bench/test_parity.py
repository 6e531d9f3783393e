"""The Pre-LN parity bench runs loopnet and an independent nanoGPT-style GPT on the same batches."""

import argparse
import math
import statistics

import pytest
import torch

from loopnet.bench import parity
from loopnet.bench.nanogpt import GPT, GPTConfig
from loopnet.data import TokenStreamDataModule
from loopnet.model import lm_loss


def test_nanogpt_peer_is_independent_and_standard():
    model = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32))
    assert model.wte.weight is model.lm_head.weight  # tied head
    assert model.h[0].attn.c_attn.weight.shape == (96, 32)  # fused QKV
    assert abs(model.h[0].attn.c_proj.weight.std().item() - 0.02 / math.sqrt(4)) < 0.003


def test_parity_bench_trains_all_three_models(capsys):
    """Learning, shown against the untrained models on the same held-out windows and against the
    independent nanoGPT trained on the same batches: at init every logit is ~0, so the loss is log V;
    12 steps must take each model well below it, loopnet's Pre-LN as far as nanoGPT (paired)."""
    argv = [
        "--steps",
        "12",
        "--seeds",
        "1",
        "--d-model",
        "32",
        "--n-heads",
        "2",
        "--seq-len",
        "32",
        "--val-batches",
        "2",
        "--warmup",
        "2",
    ]
    results = parity.main(argv)
    assert set(results) == {"nanoGPT (independent)", "loopnet preln", "loopnet preln, input_norm: true"}
    data = TokenStreamDataModule(seq_len=32, batch_size=8, vocab="compact")
    data.setup("fit")
    val = data.val_windows()[:16]
    vocab = -(-data.vocab_size // 64) * 64
    args = argparse.Namespace(seq_len=32, d_model=32, n_heads=2, n_layers=2)
    untrained = {}
    for name, build in parity.models(args, vocab).items():
        torch.manual_seed(1)  # the weights each model starts its training from
        model = build().eval()
        with torch.no_grad():
            untrained[name] = statistics.fmean(
                lm_loss(logits_of(model, w[:, :-1]), w[:, 1:]).item() for w in val.split(8)
            )
        assert untrained[name] == pytest.approx(math.log(vocab), abs=0.05), name  # small logits: uniform
        assert len(results[name]) == 1
    gain = {name: untrained[name] - results[name][0] for name in results}
    reference = gain["nanoGPT (independent)"]
    assert reference > 0.3  # the independent model learns in these 12 steps (~0.6 nat)
    assert gain["loopnet preln"] > 0.8 * reference  # loopnet's Pre-LN as much, on the same batches
    assert abs(results["loopnet preln"][0] - results["nanoGPT (independent)"][0]) < 0.1
    assert gain["loopnet preln, input_norm: true"] > 0.2 * reference  # the weaker control learns too
    out = capsys.readouterr().out
    assert "| loopnet preln | " in out and "minus nanoGPT, paired" in out


def logits_of(model, inputs):
    """Logits from either model, each called its own way (LoopedTransformer: (logits, loss); GPT: (logits, ...))."""
    return model(inputs)[0]
