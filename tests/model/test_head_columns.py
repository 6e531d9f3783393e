"""`HeadColumns`, generate's layout of the LM head: the logits of F.linear for any vocabulary and
number of column blocks, and kept across `generate` calls only while the head's weight is unchanged."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from loopnet.model import LoopedTransformer
from loopnet.model.transformer import HeadColumns
from tests.helpers import tiny_config


@pytest.mark.parametrize("chunks", [1, 2, 3, 4, 96, 97])
def test_the_logits_are_f_linears_for_any_number_of_blocks(chunks):
    """V = 97 is prime: every chunks > 1 pads the last block, whose zero columns must not reach the
    logits. Each logit is the same d-term dot product; in any summation order it lies within
    γ_d·Σ_j |w_j·h_j| (γ_d = d·2⁻²⁴, fp32) of the exact one, so within 2γ_d·Σ|w||h| of F.linear's."""
    g = torch.Generator().manual_seed(0)
    weight, h = torch.randn(97, 32, generator=g), torch.randn(3, 32, generator=g)
    head = HeadColumns(weight, chunks)
    got, expected = head.logits(h), F.linear(h, weight)
    assert got.shape == (3, 97)
    bound = 2 * 32 * 2.0 ** -24 * (h.abs() @ weight.abs().t())
    assert bool(((got - expected).abs() <= bound).all())


def test_off_the_cpu_the_head_is_f_linear():
    weight = torch.empty(97, 32, device="meta")
    head = HeadColumns(weight, 2)
    assert head.columns is None  # no copy of the weight
    assert head.logits(torch.empty(3, 32, device="meta")).shape == (3, 97)


def plain_loop(model, prompt, max_new):
    """Greedy tokens through `forward`, whose head is `lm_head` itself."""
    seq = list(prompt)
    for _ in range(max_new):
        seq.append(int(model(torch.tensor([seq]))[0][0, -1].argmax()))
    return seq[len(prompt):]


@torch.no_grad()
def test_generate_keeps_the_layout_until_the_weight_changes():
    """Two calls share one layout; a change of the head in place (an optimiser step, a `load_state_dict`)
    makes a new one, so the tokens follow the weight generate is called with."""
    torch.manual_seed(0)
    model = LoopedTransformer(tiny_config(vocab_size=97, seq_len=12, n_rounds=3)).eval()
    torch.manual_seed(1)
    other = LoopedTransformer(tiny_config(vocab_size=97, seq_len=12, n_rounds=3)).eval()
    prompt = [5, 17, 3]
    first = model.generate([prompt], 6).tokens[0]
    layout = model._generation_head
    assert model.generate([prompt], 6).tokens[0] == first and model._generation_head is layout
    weight = model.lm_head.weight
    weight.copy_(torch.randn(weight.shape, generator=torch.Generator().manual_seed(2)) * weight.std())  # a new version
    changed = model.generate([prompt], 6).tokens[0]
    assert model._generation_head is not layout
    assert changed != first and changed == plain_loop(model, prompt, 6)
    model.load_state_dict(other.state_dict())
    assert model.generate([prompt], 6).tokens[0] == plain_loop(other, prompt, 6)
