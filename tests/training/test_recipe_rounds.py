"""Sampled rounds: the draw against the reference's formulas, its seeding, what a step runs, logs and
counts, and memory that grows with backprop_rounds, not with the drawn R."""

from __future__ import annotations

import math
import warnings

import lightning as L
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from loopnet.model import LoopedTransformer, residual_scales
from loopnet.model.rounds import draw_rounds, mean_rounds
from loopnet.training.module import LoopedLM, OptimConfig
from tests.helpers import tiny_config

N_DRAWS = 20_000


# ------------------------------------------------------------------------------ the reference's rules
def poisson_pmf(j: np.ndarray, rate: np.ndarray) -> np.ndarray:
    """P(Poisson(rate) = j), for arrays broadcast together."""
    from math import lgamma

    lg = np.vectorize(lgamma)(j + 1.0)
    return np.exp(j * np.log(rate) - rate - lg)


def reference_pmf(rule: str, m: float, cap: int, top: int = 400, sigma: float = 0.5) -> np.ndarray:
    """P(R = j), j = 0..top, of the reference's rule (looped-transformers.md §8) at mean m, capped at `cap`:
        poisson_lognormal  rate ~ LogNormal(log m − σ²/2, σ = 0.5 unless given), R = Poisson(rate) + 1  (Huginn)
        poisson_truncated  R = max(Poisson(m), 1)                                          (Parcae)
    The log-normal mixture is integrated by Gauss-Hermite quadrature over the normal variable (200 nodes)."""
    j = np.arange(top + 1, dtype=float)
    if rule == "poisson_lognormal":
        nodes, weights = np.polynomial.hermite_e.hermegauss(200)  # ∫ f(z) e^{-z²/2} dz
        rates = np.exp(np.log(m) - sigma**2 / 2 + sigma * nodes)
        weights = weights / math.sqrt(2 * math.pi)
        pmf = np.zeros(top + 1)
        pmf[1:] = (poisson_pmf(j[:-1, None], rates[None, :]) * weights[None, :]).sum(1)  # R − 1 ~ Poisson(rate)
    else:
        pmf = poisson_pmf(j, np.full_like(j, m))
        pmf[1] += pmf[0]
        pmf[0] = 0.0
    capped = np.zeros_like(pmf)
    capped[: cap + 1] = pmf[: cap + 1]
    capped[cap] += pmf[cap + 1 :].sum()
    return capped


@pytest.mark.parametrize(
    "rule, m, cap, sigma",
    [
        ("poisson_lognormal", 8, 400, 0.5),
        ("poisson_lognormal", 6, 10, 0.5),
        ("poisson_lognormal", 8, 3000, 1.0),  # round_sigma: a wider spread (a longer tail), the same mean
        ("poisson_truncated", 8, 400, 0.5),
        ("poisson_truncated", 2, 3, 0.5),
    ],
)
def test_20000_draws_have_the_reference_mean_and_variance(rule, m, cap, sigma):
    cfg = tiny_config(n_rounds=m, round_sampling=rule, backprop_rounds=1, max_rounds=cap, round_sigma=sigma)
    draws = np.array([draw_rounds(cfg, step, seed=1234).rounds for step in range(N_DRAWS)], dtype=float)
    pmf = reference_pmf(rule, m, cap, top=max(cap, 400), sigma=sigma)
    j = np.arange(pmf.size)
    assert abs(pmf.sum() - 1) < 1e-9
    mean = (j * pmf).sum()
    var = ((j - mean) ** 2 * pmf).sum()
    mu4 = ((j - mean) ** 4 * pmf).sum()
    if cap >= 400 and rule == "poisson_lognormal":  # the closed forms, uncapped
        # 200 Gauss-Hermite nodes integrate the σ = 1 tail to ~1e-5 relative (σ = 0.5: ~1e-9)
        assert mean == pytest.approx(m + 1, rel=1e-4)
        assert var == pytest.approx(m + m * m * (math.exp(sigma**2) - 1), rel=1e-4)
    if cap == 400 and rule == "poisson_truncated":
        assert mean == pytest.approx(m + math.exp(-m), rel=1e-9)
    n = draws.size
    se_mean = math.sqrt(var / n)
    # The sample variance s² has Var(s²) = (μ4 − (n−3)/(n−1)·σ⁴)/n.
    se_var = math.sqrt((mu4 - (n - 3) / (n - 1) * var**2) / n)
    assert abs(draws.mean() - mean) < 3 * se_mean, (draws.mean(), mean, se_mean)
    assert abs(draws.var(ddof=1) - var) < 3 * se_var, (draws.var(ddof=1), var, se_var)
    assert draws.min() >= 1 and draws.max() <= cap


def test_the_draw_depends_on_the_seed_and_step_only_and_leaves_the_global_rng_alone():
    cfg = tiny_config(n_rounds=6, round_sampling="poisson_lognormal", backprop_rounds=2, max_rounds=40)
    state = torch.get_rng_state()
    a = [draw_rounds(cfg, s, seed=7) for s in range(50)]
    assert torch.equal(torch.get_rng_state(), state)
    torch.manual_seed(123)  # the global stream plays no part
    assert [draw_rounds(cfg, s, seed=7) for s in range(50)] == a
    assert [draw_rounds(cfg, s, seed=8) for s in range(50)] != a
    assert all(d.grad_rounds == min(2, d.rounds) and d.alpha is None for d in a)
    assert len({d.rounds for d in a}) > 3


def test_fixed_sampling_runs_n_rounds_with_truncate_or_backprop_rounds():
    assert tuple(draw_rounds(tiny_config(n_rounds=5, truncate_rounds=2), 3)) == (5, 3, None)
    assert tuple(draw_rounds(tiny_config(n_rounds=5, backprop_rounds=3), 3)) == (5, 3, None)
    with pytest.raises(ValueError, match="disagree"):
        tiny_config(n_rounds=5, backprop_rounds=2, truncate_rounds=2)
    with pytest.raises(ValueError, match="max_rounds=3 is below"):
        tiny_config(n_rounds=5, round_sampling="poisson_truncated", max_rounds=3)
    with pytest.raises(ValueError, match="act on sampled rounds"):
        tiny_config(scales_depth="sampled")


def test_the_curriculum_ramps_the_rounds_without_gradient_linearly():
    cfg = tiny_config(n_rounds=10, round_sampling="poisson_truncated", backprop_rounds=2, round_curriculum_steps=100)
    assert [mean_rounds(cfg, t) for t in (0, 1, 50, 99, 100, 500)] == [2, 2 + 1, 2 + 4, 2 + 8, 10, 10]
    # ⌈t/L·(m − s)⌉: t = 1 → ⌈0.08⌉ = 1; t = 50 → 4; t = 99 → ⌈7.92⌉ = 8


def test_scales_depth_sampled_gives_alpha_of_the_drawn_depth_to_every_visit():
    cfg = tiny_config(
        n_rounds=3,
        n_prelude=1,
        n_coda=1,
        wiring="inject",
        round_sampling="poisson_truncated",
        scales_depth="sampled",
        max_rounds=8,
    )
    draws = [draw_rounds(cfg, s, seed=0) for s in range(20)]
    d = next(d for d in draws if d.rounds != 3)
    assert d.alpha == residual_scales("deeploop", 1 + 2 * d.rounds + 1)[0]
    model = LoopedTransformer(cfg)
    assert model.beta == residual_scales("deeploop", 1 + 2 * 3 + 1)[1]  # β: the mean depth's, at init

    class Alphas:
        def __init__(self):
            self.seen = []

        def on_visit(self, visit, trace):
            self.seen.append((visit, trace.alpha))

    obs = Alphas()
    model.attach_observer(obs)
    model(torch.zeros(1, 8, dtype=torch.long), rounds=d.rounds, alpha=d.alpha)
    assert len(obs.seen) == 2 * (1 + 2 * d.rounds + 1) and all(a == d.alpha for _, a in obs.seen)


# ------------------------------------------------------------------------------ memory
def saved_bytes(model, rounds: int, grad_rounds: int) -> int:
    """Bytes of the tensors autograd saves for the backward of one training forward."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _, loss = model(idx, idx, rounds=rounds, grad_rounds=grad_rounds)
    loss.backward()
    return total


def test_memory_grows_with_backprop_rounds_not_with_the_drawn_rounds():
    torch.manual_seed(0)
    model = LoopedTransformer(
        tiny_config(
            n_rounds=6,
            n_prelude=1,
            n_coda=1,
            wiring="inject",
            round_sampling="poisson_truncated",
            backprop_rounds=2,
            max_rounds=12,
        )
    )
    # R > k throughout: round 1 (which starts from x0, not from an injection) runs without grad in each.
    at = {(R, k): saved_bytes(model, R, k) for R, k in ((5, 2), (12, 2), (5, 4), (12, 4))}
    assert at[(5, 2)] == at[(12, 2)] and at[(5, 4)] == at[(12, 4)]
    per_round = (at[(5, 4)] - at[(5, 2)]) / 2
    assert per_round > 0 and at[(12, 4)] - at[(12, 2)] == 2 * per_round
    print(f"saved bytes: R=5,k=2 {at[(5, 2)]}  R=12,k=2 {at[(12, 2)]}  R=5,k=4 {at[(5, 4)]}  R=12,k=4 {at[(12, 4)]}")


# ------------------------------------------------------------------------------ a training step
class StepRecord(L.Callback):
    """Per step: the draw, the blocks' forward calls (rounds run), the logged metrics and flops_per_batch."""

    def __init__(self):
        self.rows = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.calls = 0
        self.hook = pl_module.model.blocks[0].register_forward_hook(lambda *a: setattr(self, "calls", self.calls + 1))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.hook.remove()
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
        self.rows.append(
            (
                trainer.global_step - 1,
                pl_module.draw(trainer.global_step - 1),
                self.calls,
                metrics,
                pl_module.flops_per_batch,
            )
        )


def fit(tmp_path, steps=6, optim=None, **overrides):
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    torch.manual_seed(0)
    lm = LoopedLM(config=tiny_config(**overrides), optim=optim or OptimConfig(lr=1e-2, warmup_steps=1, decay_steps=10))
    tokens = torch.randint(0, 64, (4 * steps, 17), generator=torch.Generator().manual_seed(0))
    data = DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=4)
    record = StepRecord()
    L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[record],
    ).fit(lm, data)
    return lm, record.rows


def test_a_step_runs_logs_and_counts_the_drawn_rounds(tmp_path):
    lm, rows = fit(
        tmp_path,
        n_rounds=3,
        wiring="inject",
        n_prelude=1,
        round_sampling="poisson_lognormal",
        backprop_rounds=1,
        max_rounds=7,
    )
    drawn = [d.rounds for _, d, _, _, _ in rows]
    assert len(set(drawn)) > 1
    for step, d, calls, metrics, flops in rows:
        assert d == draw_rounds(lm.config, step)
        assert calls == d.rounds  # block 1 of the loop ran once per round
        assert metrics["train/rounds"] == d.rounds
        assert flops == lm.model.flops_per_token(seq_len=16, rounds=d.rounds, grad_rounds=d.grad_rounds) * 4 * 16
