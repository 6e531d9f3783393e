"""How many rounds a training step runs (`LoopConfig.round_sampling`), and how many of them get gradients.

With m = n_rounds the mean rounds and s = backprop_rounds (Huginn's mean backprop depth), each step draws
R rounds in all, of which the last k = min(s, R) get gradients (k = R when backprop_rounds is null):

    fixed               R = m (k from backprop_rounds or truncate_rounds)
    poisson_lognormal   rate ~ LogNormal(μ, σ), σ = round_sigma (0.5), μ = log(m) − σ²/2 (so E[rate] = m);
                        R = Poisson(rate) + 1         (Huginn's released `poisson-lognormal-filling`;
                        E[R] = m + 1, Var[R] = m + m²·(e^{σ²} − 1))
    poisson_truncated   R = max(Poisson(m), 1)        (Parcae's `poisson-truncated-full`)

then R = min(R, max_rounds). With `round_curriculum_steps` = L the mean ramps up, as Parcae's linear
"forward" curriculum does: at step t < L the rounds run without gradient have mean ⌈(t/L)·(m − s)⌉,
so m_t = s + ⌈(t/L)·(m − s)⌉ (s = 1 when backprop_rounds is null).

One draw per step for the whole batch, from a generator seeded by (run seed, global step) alone: a
resumed run draws the same rounds, every DDP rank draws the same, and the global RNG streams (data
order, dropout) are untouched.
"""

from __future__ import annotations

import math
import os
from typing import NamedTuple

import torch

from .config import LoopConfig
from .scales import residual_scales


class RoundDraw(NamedTuple):
    rounds: int  # R, rounds run
    grad_rounds: int  # k, the last k rounds get gradients
    alpha: float | None  # the skip scale α of this step (scales_depth "sampled"), None: the model's own


def run_seed() -> int:
    """The run's seed (Lightning's `seed_everything` exports it to every rank as PL_GLOBAL_SEED), 0 without one."""
    return int(os.environ.get("PL_GLOBAL_SEED", 0))


def mean_rounds(cfg: LoopConfig, step: int) -> int:
    """m_t: the mean rounds at `step`, ramped over `round_curriculum_steps` (see the module docstring)."""
    m, L = cfg.n_rounds, cfg.round_curriculum_steps
    if not L or step >= L:
        return m
    s = cfg.backprop_rounds or 1
    return s + math.ceil(step / L * max(m - s, 0))


def step_generator(seed: int, step: int) -> torch.Generator:
    """A CPU generator for `step` alone: the same numbers for the same (seed, step) anywhere."""
    return torch.Generator().manual_seed((seed * 1_000_003 + step) % (2**63 - 1))


def sample_rounds(rule: str, mean: float, generator: torch.Generator, sigma: float = 0.5) -> int:
    """One R from `rule` at mean `mean` (log-normal σ `sigma`: Huginn's 0.5), before the cap."""
    if rule == "poisson_lognormal":
        mu = math.log(mean) - sigma**2 / 2
        rate = math.exp(mu + sigma * torch.randn((), generator=generator).item())
        return int(torch.poisson(torch.tensor(rate, dtype=torch.float64), generator=generator).item()) + 1
    if rule == "poisson_truncated":
        return max(int(torch.poisson(torch.tensor(float(mean), dtype=torch.float64), generator=generator).item()), 1)
    raise ValueError(f"round_sampling={rule!r} draws nothing; choose poisson_lognormal or poisson_truncated")


def draw_rounds(cfg: LoopConfig, step: int, seed: int | None = None) -> RoundDraw:
    """The rounds of training step `step` (see the module docstring); `seed`: the run's (default `run_seed`)."""
    if cfg.round_sampling == "fixed":
        return RoundDraw(cfg.n_rounds, cfg.grad_rounds(cfg.n_rounds), None)
    g = step_generator(run_seed() if seed is None else seed, step)
    R = min(sample_rounds(cfg.round_sampling, mean_rounds(cfg, step), g, cfg.round_sigma), cfg.round_cap)
    alpha = residual_scales(cfg.residual, cfg.depth(R), cfg.p)[0] if cfg.scales_depth == "sampled" else None
    return RoundDraw(R, cfg.grad_rounds(R), alpha)
