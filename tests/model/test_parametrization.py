"""μP and CompleteP (`LoopConfig.parametrization`): the init stds, the attention scale, the logit multiplier,
CompleteP's branch multiplier and AdamW's per-group rates against their formulas, written out here:

    m_d = d/d₀, m_L = N/N₀ with N = P + K·R + C, a = completep_alpha
    hidden normal init std  σ/√m_d                 (embeddings, untied head: σ)
    attention logits        q·k·√d_h₀/d_h          (d_h₀ = d₀/n_heads; standard: q·k/√d_h)
    logits                  (1/m_d)·W·Norm(x)
    CompleteP's ε           m_L^-a
    hidden matrices         lr·m_L^(a−1)/m_d, weight decay λ·m_d    (μP: lr/m_d, λ·m_d)
    AdamW ε, every group    ε·m_d^-1·m_L^-a                         (CompleteP; μP: ε)
    the blocks' vectors     lr·m_L^(a−1), no decay
    embeddings, final Norm  lr, λ (embeddings) or no decay (the final Norm)
"""

import math

import pytest
import torch
import torch.nn.functional as F

from loopnet.model import LoopConfig, LoopedTransformer
from loopnet.training.module import LoopedLM
from loopnet.training.options import OptimConfig
from tests.helpers import tiny_config


def _std_tolerance(n: int) -> float:
    """Six standard errors of a sample std's relative error from n normal draws (≈ 1/√(2n))."""
    return 6 / math.sqrt(2 * n)


@pytest.mark.parametrize(
    "parametrization, d, d0", [("standard", 256, None), ("mup", 256, 64), ("mup", 64, 64), ("mup", 128, 256)]
)
def test_init_stds_follow_the_formulas(parametrization, d, d0):
    cfg = LoopConfig(
        vocab_size=320,
        seq_len=16,
        d_model=d,
        n_heads=4,
        n_blocks=2,
        n_rounds=2,
        residual="preln",
        tie_embeddings=False,
        parametrization=parametrization,
        mup_base_width=d0,
    )
    torch.manual_seed(0)
    model = LoopedTransformer(cfg)
    sigma, m_d = cfg.init_std, (d / d0 if d0 else 1.0)
    hidden = {
        "qkv": model.blocks[0].attn.f.qkv_proj.weight,
        "o": model.blocks[1].attn.f.o_proj.weight,
        "fc1": model.blocks[0].ffn.f.fc1.weight,
        "fc2": model.blocks[1].ffn.f.fc2.weight,
    }
    for name, w in hidden.items():
        assert w.std().item() == pytest.approx(sigma / math.sqrt(m_d), rel=_std_tolerance(w.numel())), name
    for name, w in {"wte": model.wte.weight, "wpe": model.wpe.weight, "head": model.lm_head.weight}.items():
        assert w.std().item() == pytest.approx(sigma, rel=_std_tolerance(w.numel())), name


def test_xavier_init_is_unchanged_by_mup():
    """xavier's std √(2/(fan_in+fan_out)) already falls as 1/√width: μP leaves it (and β) as it is."""
    kw = dict(vocab_size=64, seq_len=16, d_model=128, n_heads=4, residual="deeploop")
    weights = []
    for extra in ({}, {"parametrization": "mup", "mup_base_width": 32}):
        torch.manual_seed(0)
        weights.append(LoopedTransformer(LoopConfig(**kw, **extra)).blocks[0].ffn.f.fc1.weight)
    torch.testing.assert_close(weights[0], weights[1], rtol=0, atol=0)


def _rms(x, weight):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight


def _attention(x, w_qkv, w_o, n_heads, scale):
    """softmax(scale·q·kᵀ + causal mask)·v, heads concatenated, W_O."""
    B, T, C = x.shape
    q, k, v = (x @ w.T for w in w_qkv.chunk(3))
    heads = lambda t: t.view(B, T, n_heads, C // n_heads).transpose(1, 2)  # noqa: E731
    q, k, v = heads(q), heads(k), heads(v)
    scores = (q @ k.transpose(-1, -2) * scale).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
    return (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(B, T, C) @ w_o.T


def _unrolled_logits(model, idx, eps, attn_scale, logit_mult, rounds):
    """The carried Pre-LN loop by hand: x ← x + ε·Attn(Norm(x)), x ← x + ε·FFN(Norm(x));
    logits = mult·W·Norm(x)."""
    cfg = model.config
    x = model.wte.weight[idx] + model.wpe.weight[: idx.size(1)]
    for _ in range(rounds):
        for block in model.blocks:
            a, f = block.attn, block.ffn
            x = x + eps * _attention(
                _rms(x, a.norm.weight), a.f.qkv_proj.weight, a.f.o_proj.weight, cfg.n_heads, attn_scale
            )
            x = x + eps * (F.gelu(_rms(x, f.norm.weight) @ f.f.fc1.weight.T) @ f.f.fc2.weight.T)
    return logit_mult * _rms(x, model.final_norm.weight) @ model.lm_head.weight.T


IDX = torch.tensor([[3, 14, 15, 9, 2, 6, 5, 35], [8, 9, 7, 9, 3, 2, 38, 4]])


@pytest.mark.parametrize(
    "parametrization, d0, alpha",
    [("standard", None, 1.0), ("mup", 16, 1.0), ("completep", 16, 1.0), ("completep", 8, 0.5)],
)
def test_forward_carries_the_attention_scale_logit_multiplier_and_branch_multiplier(parametrization, d0, alpha):
    d, H, K, R = 32, 4, 2, 3
    extra = {} if parametrization == "standard" else {"mup_base_width": d0}
    if parametrization == "completep":
        extra |= {"completep_base_depth": 2, "completep_alpha": alpha}
    cfg = tiny_config(residual="preln", parametrization=parametrization, **extra)
    torch.manual_seed(0)
    model = LoopedTransformer(cfg).double().eval()
    with torch.no_grad():  # non-trivial Norm gains and a larger init, so that a wrong scale would show
        for p in model.parameters():
            p.uniform_(0.5, 1.5) if p.dim() == 1 else p.mul_(8)
    d_h = d // H
    m_d = d / d0 if d0 else 1.0
    attn_scale = math.sqrt(d0 // H) / d_h if d0 else 1 / math.sqrt(d_h)
    eps = (K * R / 2) ** -alpha if parametrization == "completep" else 1.0  # N = K·R (P = C = 0), N₀ = 2
    assert cfg.branch_epsilon == pytest.approx(eps, rel=1e-15)
    with torch.no_grad():
        logits, _ = model(IDX)
        want = _unrolled_logits(model, IDX, eps, attn_scale, 1 / m_d, R)
        torch.testing.assert_close(logits, want, rtol=0, atol=1e-10)  # float64: rounding order only
        if parametrization != "standard":  # the rules matter: the standard scales give other logits
            assert (logits - _unrolled_logits(model, IDX, 1.0, 1 / math.sqrt(d_h), 1.0, R)).abs().max() > 1e-3


def test_completep_depth_counts_prelude_and_coda():
    cfg = tiny_config(
        residual="preln",
        n_prelude=1,
        n_coda=2,
        n_blocks=2,
        n_rounds=5,
        parametrization="completep",
        mup_base_width=16,
        completep_base_depth=4,
    )
    assert cfg.branch_epsilon == pytest.approx(4 / (1 + 2 * 5 + 2), rel=1e-15)  # N = P + K·R + C = 13


def _groups(config: LoopConfig, **optim):
    lm = LoopedLM(config=config, optim=OptimConfig(lr=1e-3, weight_decay=0.1, eps=1e-8, **optim))
    names = {id(p): n for n, p in lm.named_parameters()}
    return {names[id(p)]: g for g in lm.adamw_groups() for p in g["params"]}


def test_standard_groups_are_unchanged():
    groups = _groups(tiny_config(residual="preln"))
    assert {g.get("lr") for g in groups.values()} == {None}  # the optimiser's default lr
    assert groups["model.blocks.0.ffn.f.fc1.weight"]["weight_decay"] == 0.1
    assert groups["model.blocks.0.ffn.norm.weight"]["weight_decay"] == 0.0


@pytest.mark.parametrize("parametrization, alpha", [("mup", 1.0), ("completep", 1.0), ("completep", 0.5)])
def test_per_group_rates_follow_the_formulas(parametrization, alpha):
    d, d0, K, R, N0 = 64, 16, 2, 3, 2
    extra = {"completep_base_depth": N0, "completep_alpha": alpha} if parametrization == "completep" else {}
    cfg = tiny_config(
        d_model=d,
        residual="preln",
        bias=True,
        tie_embeddings=False,
        parametrization=parametrization,
        mup_base_width=d0,
        **extra,
    )
    groups = _groups(cfg)
    lr, wd, eps, m_d = 1e-3, 0.1, 1e-8, d / d0
    m_L = K * R / N0 if parametrization == "completep" else 1.0
    depth_lr = m_L ** (alpha - 1) if parametrization == "completep" else 1.0
    adam_eps = eps / (m_d * m_L**alpha) if parametrization == "completep" else eps
    want = {  # name: (lr, weight decay)
        "model.blocks.0.attn.f.qkv_proj.weight": (lr * depth_lr / m_d, wd * m_d),
        "model.blocks.1.ffn.f.fc2.weight": (lr * depth_lr / m_d, wd * m_d),
        "model.blocks.0.attn.norm.weight": (lr * depth_lr, 0.0),
        "model.blocks.1.ffn.f.fc1.bias": (lr * depth_lr, 0.0),
        "model.wte.weight": (lr, wd),
        "model.wpe.weight": (lr, wd),
        "model.lm_head.weight": (lr, wd),
        "model.final_norm.weight": (lr, 0.0),
    }
    for name, (want_lr, want_wd) in want.items():
        g = groups[name]
        assert (g["lr"], g["weight_decay"]) == pytest.approx((want_lr, want_wd), rel=1e-12), name
        assert g["eps"] == pytest.approx(adam_eps, rel=1e-12), name
    assert len(groups) == sum(1 for p in LoopedLM(config=cfg).parameters())  # every parameter in one group


def test_schedule_scales_each_group_from_its_own_rate():
    cfg = tiny_config(d_model=64, residual="preln", parametrization="mup", mup_base_width=16)
    lm = LoopedLM(config=cfg, optim=OptimConfig(lr=1e-3, warmup_steps=4, decay_steps=100))
    sched = lm.configure_optimizers()
    opt, scheduler = sched["optimizer"], sched["lr_scheduler"]["scheduler"]
    first = [g["lr"] for g in opt.param_groups]
    assert sorted(set(first)) == pytest.approx([1e-3 / 4 / 4, 1e-3 / 4])  # warm-up step 1 of 4: ×1/4; hidden /m_d
    opt.step()
    scheduler.step()
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([2 * x for x in first])


@pytest.mark.parametrize(
    "overrides, words",
    [
        ({"parametrization": "mup"}, "needs mup_base_width"),
        ({"mup_base_width": 64}, "belong to parametrization mup"),
        ({"parametrization": "mup", "mup_base_width": 30}, "not divisible by n_heads"),
        ({"parametrization": "completep", "mup_base_width": 16}, "needs completep_base_depth"),
        (
            {"parametrization": "completep", "mup_base_width": 16, "completep_base_depth": 4, "residual": "deeploop"},
            "residual: preln",
        ),
        (
            {
                "parametrization": "completep",
                "mup_base_width": 16,
                "completep_base_depth": 4,
                "residual": "preln",
                "branch_scale": "wang",
            },
            "branch_scale: one",
        ),
        (
            {
                "parametrization": "completep",
                "mup_base_width": 16,
                "completep_base_depth": 4,
                "residual": "preln",
                "completep_alpha": 2.0,
            },
            "must be in [0.5, 1]",
        ),
        (
            {"parametrization": "mup", "mup_base_width": 16, "completep_alpha": 0.5},
            "belongs to parametrization completep",
        ),
        (
            {
                "parametrization": "completep",
                "mup_base_width": 16,
                "completep_base_depth": 4,
                "residual": "preln",
                "round_sampling": "poisson_truncated",
                "scales_depth": "sampled",
            },
            "scales_depth: mean",
        ),
    ],
)
def test_refusals_name_the_fix(overrides, words):
    with pytest.raises(ValueError, match="fix:") as err:
        tiny_config(**overrides)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_muon_is_refused_under_mup():
    cfg = tiny_config(parametrization="mup", mup_base_width=16)
    with pytest.raises(ValueError, match="optimizer: adamw"):
        LoopedLM(config=cfg, optim=OptimConfig(optimizer="muon"))


@pytest.mark.parametrize("parametrization", ["mup", "completep"])
def test_at_the_base_width_and_depth_the_model_is_the_standard_one(parametrization):
    """Every rule is 1 at d = d₀ (and N = N₀): the same init draws, forward, rates and losses as `standard`."""
    extra = {"completep_base_depth": 6} if parametrization == "completep" else {}  # N = K·R = 6
    losses = []
    for cfg in (
        tiny_config(residual="preln"),
        tiny_config(residual="preln", parametrization=parametrization, mup_base_width=32, **extra),
    ):
        torch.manual_seed(0)
        lm = LoopedLM(config=cfg, optim=OptimConfig(lr=1e-2, warmup_steps=0, decay_steps=10))
        opt = lm.configure_optimizers()["optimizer"]
        run = []
        for _ in range(3):
            _, loss = lm.model(IDX, targets=torch.roll(IDX, -1, 1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            run.append(loss.item())
        losses.append(run)
    assert losses[0] == losses[1]
