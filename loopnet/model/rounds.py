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

With `round_draw` "batch" (the default): one draw per step for the whole batch, from a generator seeded by
(run seed, global step) alone: a resumed run draws the same rounds, every DDP rank draws the same, and the
global RNG streams (data order, dropout) are untouched.

With `round_draw` "sequence" (Parcae's `recurrent_iteration_method: per-sequence`): every sequence i of a
micro-batch draws its own R_i by the same rule at the same m_t (and the same cap), k_i = min(s, R_i) of
them with gradients (`LoopConfig.grad_rounds`), n_i = R_i − k_i without. The batch runs n = max n_i rounds
without grad, then k = max k_i with grad; sequence i advances in the first n_i of the n and the first k_i
of the k and keeps its state unchanged in the others (`sequence_layout`), so its output is that of R_i
rounds of its own, the last k_i with gradients. The generator is seeded by (run seed, global step, shard),
shard = micro-batch index within the step · world size + rank: every sequence of a step's global batch
draws independently, and a resumed run on as many ranks with the same accumulation draws the same.
"""

from __future__ import annotations

import math
import os
from typing import NamedTuple

import numpy as np
import torch

from .config import LoopConfig
from .scales import residual_scales


class RoundDraw(NamedTuple):
    rounds: int | torch.Tensor  # R, rounds run; round_draw "sequence": [B] long, each sequence's R_i
    grad_rounds: int | torch.Tensor  # k, the last k rounds get gradients; "sequence": [B] long, each k_i
    alpha: float | None  # the skip scale α of this step (scales_depth "sampled"), None: the model's own

    @property
    def run(self) -> tuple[int, int]:
        """(rounds the batch's pass runs, of them with grad): (R, k), per sequence (max n_i + max k_i, max k_i)."""
        return pass_rounds(self.rounds, self.grad_rounds)

    @property
    def mean(self) -> float:
        """R, or per sequence the mean of the R_i."""
        return float(self.rounds.double().mean()) if torch.is_tensor(self.rounds) else float(self.rounds)


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


def sequence_generator(seed: int, step: int, shard: int) -> torch.Generator:
    """A CPU generator for the sequences of `shard` (micro-batch index · world size + rank) at `step`."""
    state = np.random.SeedSequence([seed % 2**64, step, shard]).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(state) >> 1)


def sample_rounds(rule: str, mean: float, generator: torch.Generator, sigma: float = 0.5) -> int:
    """One R from `rule` at mean `mean` (log-normal σ `sigma`: Huginn's 0.5), before the cap."""
    if rule == "poisson_lognormal":
        mu = math.log(mean) - sigma**2 / 2
        rate = math.exp(mu + sigma * torch.randn((), generator=generator).item())
        return int(torch.poisson(torch.tensor(rate, dtype=torch.float64), generator=generator).item()) + 1
    if rule == "poisson_truncated":
        return max(int(torch.poisson(torch.tensor(float(mean), dtype=torch.float64), generator=generator).item()), 1)
    raise ValueError(f"round_sampling={rule!r} draws nothing; choose poisson_lognormal or poisson_truncated")


def sample_sequence_rounds(rule: str, mean: float, generator: torch.Generator, n: int, sigma: float = 0.5):
    """`n` independent R from `rule` at mean `mean` (see `sample_rounds`), before the cap: a [n] long tensor."""
    if rule == "poisson_lognormal":
        z = torch.randn(n, generator=generator, dtype=torch.float64)
        rate = torch.exp(math.log(mean) - sigma**2 / 2 + sigma * z)
        return torch.poisson(rate, generator=generator).long() + 1
    if rule == "poisson_truncated":
        rate = torch.full((n,), float(mean), dtype=torch.float64)
        return torch.poisson(rate, generator=generator).long().clamp_(min=1)
    raise ValueError(f"round_sampling={rule!r} draws nothing; choose poisson_lognormal or poisson_truncated")


def pass_rounds(rounds: int | torch.Tensor, grad_rounds: int | torch.Tensor) -> tuple[int, int]:
    """(rounds a pass runs, of them with grad) for R and k, or for per-sequence R_i and k_i: (max(R_i − k_i) +
    max k_i, max k_i)."""
    if not torch.is_tensor(rounds):
        return int(rounds), int(grad_rounds)
    k = int(grad_rounds.max())
    return int((rounds - grad_rounds).max()) + k, k


def sequence_layout(rounds: torch.Tensor, grad_rounds: torch.Tensor) -> tuple[int, torch.Tensor]:
    """(n, active) of a pass with per-sequence R_i and k_i ([B] integer tensors): n = max(R_i − k_i) rounds
    without grad, then max k_i with grad, and active [n + max k_i, B] bool: whether sequence i advances in
    pass round r (row r − 1), in the first R_i − k_i of the rounds without grad and the first k_i with."""
    own = rounds - grad_rounds
    n, total = int(own.max()), pass_rounds(rounds, grad_rounds)[0]
    r = torch.arange(total, device=rounds.device)[:, None]  # 0-based pass round
    return n, torch.where(r < n, r < own[None], r - n < grad_rounds[None])


def check_sequence_rounds(rounds: torch.Tensor, grad_rounds: torch.Tensor | None, batch: int) -> None:
    """Per-sequence rounds as `iter_rounds` takes them: [B] integer tensors with R_i >= 1 and 1 <= k_i <= R_i."""
    if grad_rounds is not None and not torch.is_tensor(grad_rounds):
        raise ValueError(
            f"per-sequence rounds take per-sequence grad_rounds, got {grad_rounds!r}; fix: give a [B] tensor of k_i, "
            f"or None (LoopConfig.grad_rounds of each R_i)"
        )
    for name, t in (("rounds", rounds), ("grad_rounds", grad_rounds)):
        if t is None:
            continue
        if t.dim() != 1 or t.numel() != batch or t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise ValueError(
                f"per-sequence {name} must be a 1-D integer tensor with one entry per sequence ({batch}), got "
                f"{t.dtype} of shape {tuple(t.shape)}; fix: give e.g. torch.tensor([...]) of {batch} round counts"
            )
    if int(rounds.min()) < 1:
        raise ValueError(f"per-sequence rounds must all be >= 1, got {rounds.tolist()}")
    if grad_rounds is not None and (int(grad_rounds.min()) < 1 or bool((grad_rounds > rounds).any())):
        raise ValueError(
            f"per-sequence grad_rounds must be in [1, rounds] for every sequence, got {grad_rounds.tolist()} for "
            f"rounds {rounds.tolist()}; fix: give k_i <= R_i (LoopConfig.grad_rounds of each R_i by default)"
        )


def sequence_grad_rounds(cfg: LoopConfig, rounds: torch.Tensor) -> torch.Tensor:
    """k_i = `LoopConfig.grad_rounds`(R_i) of every sequence, a [B] long tensor on the rounds' device."""
    return torch.tensor([cfg.grad_rounds(r) for r in rounds.tolist()], dtype=torch.long, device=rounds.device)


def draw_rounds(
    cfg: LoopConfig, step: int, seed: int | None = None, batch_size: int | None = None, shard: int = 0
) -> RoundDraw:
    """The rounds of training step `step` (see the module docstring); `seed`: the run's (default `run_seed`).
    With `round_draw` "sequence", one R_i per sequence of a micro-batch of `batch_size`, the `shard`-th of the
    step's (micro-batch index · world size + rank)."""
    if cfg.round_sampling == "fixed":
        return RoundDraw(cfg.n_rounds, cfg.grad_rounds(cfg.n_rounds), None)
    seed = run_seed() if seed is None else seed
    if cfg.round_draw == "sequence":
        if batch_size is None or batch_size < 1:
            raise ValueError(
                f"round_draw='sequence' draws one R per sequence; got batch_size={batch_size}; fix: pass the "
                f"micro-batch's number of sequences"
            )
        g = sequence_generator(seed, step, shard)
        m = mean_rounds(cfg, step)
        R = sample_sequence_rounds(cfg.round_sampling, m, g, batch_size, cfg.round_sigma).clamp_(max=cfg.round_cap)
        return RoundDraw(R, sequence_grad_rounds(cfg, R), None)
    g = step_generator(seed, step)
    R = min(sample_rounds(cfg.round_sampling, mean_rounds(cfg, step), g, cfg.round_sigma), cfg.round_cap)
    alpha = residual_scales(cfg.residual, cfg.depth(R), cfg.p)[0] if cfg.scales_depth == "sampled" else None
    return RoundDraw(R, cfg.grad_rounds(R), alpha)
