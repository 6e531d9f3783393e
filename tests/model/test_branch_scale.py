"""Pre-LN's branch multiplier ε (x ← x + ε·f(Norm(x))): its values against the formulas, the forward
against a loop unrolled by hand, ε of the training depth at another R', the default unchanged, and
the refusals."""

import math

import pytest
import torch
import torch.nn.functional as F

from loopnet.model import LoopConfig, LoopedTransformer
from loopnet.model.scales import branch_scale
from tests.helpers import tiny_config


@pytest.mark.parametrize(
    "rule, lam, expected",
    [
        ("one", 1.0, 1.0),
        ("sqrt_depth", 1.0, 1 / math.sqrt(12)),  # K·R = 12
        ("wang", 1.0, 1 / (6 * math.sqrt(2))),  # R·√K = 6√2
        ("sqrt_depth", 2.0, 2 / math.sqrt(12)),
        ("wang", 0.5, 0.5 / (6 * math.sqrt(2))),
    ],
)
def test_epsilon_at_k2_r6_follows_the_formulas(rule, lam, expected):
    cfg = LoopConfig(residual="preln", n_blocks=2, n_rounds=6, branch_scale=rule, branch_lambda=lam)
    assert cfg.branch_epsilon == pytest.approx(expected, rel=1e-15)
    assert branch_scale(rule, 2, 6, lam) == cfg.branch_epsilon


def test_default_is_epsilon_one():
    cfg = LoopConfig(residual="preln")
    assert (cfg.branch_scale, cfg.branch_lambda, cfg.branch_epsilon) == ("one", 1.0, 1.0)


def _rms(x, weight):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight


def _attention(x, w_qkv, w_o, n_heads):
    """Causal multi-head attention written out: softmax(q·kᵀ/√d_h + mask)·v, heads concatenated, W_O."""
    B, T, C = x.shape
    q, k, v = (x @ w.T for w in w_qkv.chunk(3))
    heads = lambda t: t.view(B, T, n_heads, C // n_heads).transpose(1, 2)  # noqa: E731
    q, k, v = heads(q), heads(k), heads(v)
    scores = q @ k.transpose(-1, -2) / math.sqrt(C // n_heads)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
    y = torch.softmax(scores, -1) @ v
    return y.transpose(1, 2).reshape(B, T, C) @ w_o.T


def unrolled_logits(model: LoopedTransformer, idx: torch.Tensor, eps: float, rounds: int) -> torch.Tensor:
    """The carried Pre-LN loop by hand from the model's weights: x ← x + ε·Attn(Norm(x)), x ← x + ε·FFN(Norm(x))
    for each of K blocks, R rounds; logits = Norm_final(x)·Wᵀ."""
    cfg = model.config
    x = model.wte.weight[idx] + model.wpe.weight[: idx.size(1)]
    for _ in range(rounds):
        for block in model.blocks:
            a, f = block.attn, block.ffn
            x = x + eps * _attention(_rms(x, a.norm.weight), a.f.qkv_proj.weight, a.f.o_proj.weight, cfg.n_heads)
            h = _rms(x, f.norm.weight)
            x = x + eps * (F.gelu(h @ f.f.fc1.weight.T) @ f.f.fc2.weight.T)
    return _rms(x, model.final_norm.weight) @ model.lm_head.weight.T


def _model(rule: str, lam: float = 1.0, seed: int = 0) -> LoopedTransformer:
    torch.manual_seed(seed)
    model = LoopedTransformer(tiny_config(residual="preln", branch_scale=rule, branch_lambda=lam)).double().eval()
    with torch.no_grad():  # non-trivial Norm gains, so that a wrong Norm would show
        for p in model.parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    return model


IDX = torch.tensor([[3, 14, 15, 9, 2, 6, 5, 35], [8, 9, 7, 9, 3, 2, 38, 4]])
# float64 throughout: the two computations differ only in the order of roundings, ~1e-16 relative per
# operation over a few hundred operations on logits of size ~1, far below 1e-10.
TOL = dict(rtol=0, atol=1e-10)


@pytest.mark.parametrize("rule, lam", [("one", 1.0), ("sqrt_depth", 1.0), ("wang", 1.0), ("wang", 3.0)])
def test_forward_equals_the_loop_unrolled_by_hand(rule, lam):
    model = _model(rule, lam)
    eps = {"one": 1.0, "sqrt_depth": lam / math.sqrt(2 * 3), "wang": lam / (3 * math.sqrt(2))}[rule]  # K=2, R=3
    with torch.no_grad():
        logits, _ = model(IDX)
        torch.testing.assert_close(logits, unrolled_logits(model, IDX, eps, rounds=3), **TOL)
        if rule != "one":  # ε matters: the same weights at ε = 1 give other logits
            assert (logits - unrolled_logits(model, IDX, 1.0, rounds=3)).abs().max() > 1e-3


def test_another_round_count_keeps_the_training_epsilon():
    model = _model("wang")  # trained at R = 3: ε = 1/(3√2)
    with torch.no_grad():
        logits, _ = model(IDX, rounds=7)
        torch.testing.assert_close(logits, unrolled_logits(model, IDX, 1 / (3 * math.sqrt(2)), rounds=7), **TOL)


def test_default_losses_equal_epsilon_one():
    """The default model trains exactly as a Pre-LN model with ε = 1 given explicitly, and its forward is the
    unscaled loop (x ← x + f(Norm(x))) by hand."""
    losses = []
    for cfg in (tiny_config(residual="preln"), tiny_config(residual="preln", branch_scale="one", branch_lambda=1.0)):
        torch.manual_seed(0)
        model = LoopedTransformer(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        run = []
        for step in range(3):
            _, loss = model(IDX, targets=torch.roll(IDX, -1, 1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            run.append(loss.item())
        losses.append(run)
    assert losses[0] == losses[1]
    model = _model("one")
    with torch.no_grad():
        torch.testing.assert_close(model(IDX)[0], unrolled_logits(model, IDX, 1.0, rounds=3), **TOL)


@pytest.mark.parametrize(
    "overrides, words",
    [
        (dict(residual="deeploop", branch_scale="wang"), "residual: preln"),
        (dict(residual="postln", branch_scale="sqrt_depth"), "branch_scale: one"),
        (dict(residual="preln", branch_scale="one", branch_lambda=2.0), "branch_lambda: 1.0"),
        (dict(residual="preln", branch_scale="wang", branch_lambda=0.0), "positive"),
        (dict(residual="preln", branch_scale="sqrt"), "sqrt_depth"),
    ],
)
def test_bad_settings_are_refused_in_one_line_with_the_fix(overrides, words):
    with pytest.raises(ValueError) as err:
        tiny_config(**overrides)
    assert words in str(err.value) and "fix" in str(err.value) and "\n" not in str(err.value)


def test_run_name_names_a_non_default_rule_only():
    from loopnet.training.run_folders import run_name

    base = dict(residual="preln", wiring="carry", n_blocks=2, n_rounds=6, d_model=128)
    assert "branch" not in run_name(base)
    assert run_name(base | {"branch_scale": "wang"}) == "preln_carry_k2_r6_d128_branch_scale-wang"
    assert run_name(base | {"branch_scale": "sqrt_depth", "branch_lambda": 2.0}).endswith(
        "_branch_scale-sqrt_depth_branch_lambda-2"
    )
