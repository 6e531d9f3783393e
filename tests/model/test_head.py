"""generate's copies of the LM head (`loopnet.model.head`). `HeadColumns`: the logits of F.linear for any
vocabulary and number of column blocks, kept across `generate` calls only while the head's weight is
unchanged. `GreedyScreen`: its bound holds, a settled token is the exact argmax, a near tie is not settled,
and a compiled greedy step then takes the fp32 logits' argmax."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from loopnet.model import LoopedTransformer
from loopnet.model.head import GreedyScreen, HeadColumns
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
    bound = 2 * 32 * 2.0**-24 * (h.abs() @ weight.abs().t())
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
    return seq[len(prompt) :]


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


def exact_logits(weight, h):
    return h.double() @ weight.double().t()


def screen_inputs(seed, rows=64, V=1000, d=32):
    """Row norms over four orders of magnitude (a trained head's rare and common tokens differ), h of
    the final Norm's scale."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(V, d, generator=g) * 10.0 ** (torch.rand(V, 1, generator=g) * 4 - 3)
    return weight, torch.randn(rows, d, generator=g)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_screens_bound_holds_at_every_logit(seed):
    """|a_v − w_v·h| ≤ e_v for every row and token (a in the eager summation order; the derivation covers
    any order), over the first n_vocab ids."""
    weight, h = screen_inputs(seed)
    screen = GreedyScreen(weight)
    a, e = GreedyScreen.bounds(h, *screen.args(900))
    assert a.shape == e.shape == (64, 900)
    assert bool(((a.double() - exact_logits(weight, h)[:, :900]).abs() <= e.double()).all())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_settled_token_is_the_argmax_of_the_exact_logits(seed):
    weight, h = screen_inputs(seed)
    token, settled = GreedyScreen.screen(h, *GreedyScreen(weight).args(1000))
    exact = exact_logits(weight, h).argmax(-1)
    assert int(settled.sum()) >= 48  # mostly settled: the bound is ~2⁻⁸ of ‖w‖‖h‖
    assert bool((token[settled] == exact[settled]).all())


def test_a_near_tie_or_a_nan_is_not_settled():
    """Rows 0 and 1 differ by 2⁻¹² (below bf16's resolution): their bf16 copies are equal, and either may
    hold the larger exact logit, so the screen cannot settle. A NaN in h settles nothing."""
    g = torch.Generator().manual_seed(0)
    u = torch.randn(32, generator=g)
    weight = torch.cat([u[None], u[None] * (1 + 2.0**-12), torch.randn(30, 32, generator=g) * 0.01])
    h = torch.stack([u, torch.full((32,), float("nan"))])
    screen = GreedyScreen(weight)
    assert bool((screen.low[0] == screen.low[1]).all())
    token, settled = GreedyScreen.screen(h, *screen.args(32))
    assert settled.tolist() == [False, False]
    assert int(exact_logits(weight, h[:1]).argmax()) == 1


def test_a_weight_outside_bf16s_normal_range_is_not_screened():
    for bad in (3.4e38, 1e-40):  # bf16 rounds the first to inf; the second is subnormal
        weight = torch.randn(8, 4)
        weight[3, 2] = bad
        assert not GreedyScreen(weight).usable
    assert GreedyScreen(torch.zeros(8, 4)).usable


def test_a_compiled_greedy_step_leaves_a_near_tie_to_the_fp32_logits():
    """A head whose only candidates are pairs of rows 2⁻¹² apart (u, u(1 + 2⁻¹²), −u, −u(1 + 2⁻¹²), the
    rest 0): the exact argmax is 1 or 3 for any h with u·h ≠ 0; the screen's own pick would be 0 or 2 (the
    smaller bound). Every token of the compiled step is 1 or 3 and equals the eager cache's and the
    recompute's, also over the first n_vocab ids only."""
    torch.manual_seed(0)
    model = LoopedTransformer(tiny_config(vocab_size=97, seq_len=12, n_rounds=3, tie_embeddings=False)).eval()
    u = torch.randn(model.config.d_model)
    with torch.no_grad():
        model.lm_head.weight.zero_()
        model.lm_head.weight[:4] = torch.stack([u, u * (1 + 2.0**-12), -u, -u * (1 + 2.0**-12)])
    prompts = [[5, 17, 3], [9]]
    torch._dynamo.reset()
    got = model.generate(prompts, 6, compile=True, n_vocab=50)
    assert {t for row in got.tokens for t in row} <= {1, 3}
    assert got.tokens == model.generate(prompts, 6, n_vocab=50).tokens
    assert got.tokens == [plain_loop(model, p, 6) for p in prompts]
