"""Extrapolation and fixed-point diagnostics: what happens to a looped model's state and prediction
as the rounds go on, past the training R.

Per round r = 1..R_max (`round_profile`, on a batch):
    loss           next-token cross-entropy of round r's logits (the model evaluated at R' = r)
    latent_change  ‖x_r − x_{r−1}‖ / ‖x_r‖ per position, averaged over positions (x_r: the state at the
                   end of round r); r ≥ 2
    kl             KL(p_{r−1} ‖ p_r) between successive rounds' next-token distributions, averaged over
                   positions; r ≥ 2
    sigma_max      the largest singular value of one round's Jacobian ∂x_r/∂x_{r−1} at the model's own
                   trajectory (`round_jacobian_norm`, on the first `jacobian_sequences` sequences); r ≥ 2.
                   Below 1 the round map contracts around there: the rounds approach a fixed point.

The round map x_{r−1} ↦ x_r holds the embedding fixed and includes the wiring's re-entry (h = Norm(x),
the restart from x0, the injection), so it is the map a further round applies whatever the wiring.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from loopnet.model.layers import unit_rms

QUANTITIES = ("loss", "latent_change", "kl", "sigma_max")
TOKEN_WEIGHTED = QUANTITIES[:3]  # averaged over the batches' target tokens; sigma_max: the first batch's


def round_map(model, idx: torch.Tensor, r: int):
    """The function x_{r−1} ↦ x_r of round r ≥ 2 on token ids `idx` (embedding fixed)."""
    cfg = model.config
    with torch.no_grad():  # the embedding and the prelude are constants of the map: nothing of them is saved
        e = model.embed(idx)
    x0 = unit_rms(e) if cfg.input_norm else e
    reads_h = cfg.wiring != "carry" and model.injection is None  # as `iter_rounds` has it

    def step(x: torch.Tensor) -> torch.Tensor:
        h = unit_rms(x) if reads_h else None
        return model.round(r, model.round_start(r, e, x0, x, h), h, model.alpha)

    return step


def round_jacobian_norm(
    model, idx: torch.Tensor, x_prev: torch.Tensor, r: int, iters: int = 10, generator: torch.Generator | None = None
) -> float:
    """σ_max of J = ∂x_r/∂x_{r−1} at x_prev, by power iteration on JᵀJ with one jvp and one vjp per step
    (torch.func). From a random unit v_0, v_i = JᵀJ v_{i−1} / ‖JᵀJ v_{i−1}‖, and the estimate is ‖J v_iters‖
    (the square root of JᵀJ's Rayleigh quotient): it approaches σ_max from below, with an error of order
    (σ_2/σ_1)^(4·iters)."""
    step = round_map(model, idx, r)
    x_prev = x_prev.detach().clone()  # a state of an inference-mode pass cannot be saved for backward; its copy can
    v = torch.randn(x_prev.shape, generator=generator, dtype=x_prev.dtype, device="cpu").to(x_prev.device)
    v = v / v.norm()
    # The fused attention kernels have no forward-mode derivative; the math kernel's ops all do. torch's own
    # forward-AD decompositions still use torch.jit.script, which torch deprecates: its warning is not ours.
    with sdpa_kernel(SDPBackend.MATH), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`torch.jit.script` is deprecated", category=DeprecationWarning)
        _, vjp = torch.func.vjp(step, x_prev)
        for _ in range(iters):
            _, jv = torch.func.jvp(step, (x_prev,), (v,))
            (w,) = vjp(jv)
            v = w / w.norm()
        _, jv = torch.func.jvp(step, (x_prev,), (v,))
    return float(jv.detach().norm())


@torch.no_grad()
def round_profile(model, idx: torch.Tensor, targets: torch.Tensor, max_rounds: int) -> dict[str, list[float | None]]:
    """{quantity: [value at round 1, ..., round max_rounds]} for loss, latent_change and kl (None where
    undefined: round 1 of the last two) on one batch; sums over positions are means per position."""
    out: dict[str, list[float | None]] = {"loss": [], "latent_change": [], "kl": []}
    prev_x = prev_logp = None
    for r, x in model.iter_rounds(idx, max_rounds):
        wide = torch.promote_types(x.dtype, torch.float32)  # fp32 at least
        logits, x = model.head(x)[0].to(wide), x.to(wide)
        out["loss"].append(float(F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1)))
        logp = F.log_softmax(logits, -1)
        if prev_x is None:
            out["latent_change"].append(None)
            out["kl"].append(None)
        else:
            out["latent_change"].append(float(((x - prev_x).norm(dim=-1) / x.norm(dim=-1)).mean()))
            out["kl"].append(float((prev_logp.exp() * (prev_logp - logp)).sum(-1).clamp_min(0).mean()))
        prev_x, prev_logp = x, logp
    return out


def jacobian_profile(
    model, idx: torch.Tensor, max_rounds: int, iters: int = 10, seed: int = 0, progress=None
) -> list[float | None]:
    """[σ_max of round r's Jacobian for r = 1..max_rounds] (None at round 1) on sequences `idx`, each at the
    trajectory's own x_{r−1}; `progress(r, max_rounds)` is called before (r = 1) and after each round. Runs
    with grad enabled for the jvp/vjp; eval mode is the caller's."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        states = [x for _, x in model.iter_rounds(idx, max_rounds)]
    sigmas: list[float | None] = [None]
    if progress is not None:
        progress(1, max_rounds)  # starting
    # Lightning's test loop runs in inference mode, whose tensors autograd cannot save: leave it for the jvp/vjp.
    with torch.inference_mode(False), torch.enable_grad():
        idx = idx.clone()  # the ids too: a value embedding (`value_embeds`) saves them for backward
        for r in range(2, max_rounds + 1):
            sigmas.append(round_jacobian_norm(model, idx, states[r - 2], r, iters, generator))
            if progress is not None:
                progress(r, max_rounds)
    return sigmas


class RoundProfileMeter:
    """Accumulates `round_profile` over batches (weighted by their target tokens) and the Jacobian profile
    of the first batch; `compute()` gives {quantity: [per round]}."""

    def __init__(self, max_rounds: int, jacobian_sequences: int = 2, jacobian_iters: int = 10):
        self.max_rounds, self.jacobian_sequences, self.jacobian_iters = max_rounds, jacobian_sequences, jacobian_iters
        self.reset()

    def reset(self) -> None:
        self.sums: dict[str, list[float]] = {}
        self.weight = 0.0
        self.sigma: list[float | None] | None = None

    def update(self, model, idx: torch.Tensor, targets: torch.Tensor, jacobian: bool = True, progress=None) -> None:
        """Add a batch; `jacobian`: measure σ_max on it if not yet measured (`progress`: `jacobian_profile`'s)."""
        n = float((targets != -1).sum())
        for q, values in round_profile(model, idx, targets, self.max_rounds).items():
            acc = self.sums.setdefault(q, [0.0] * self.max_rounds)
            for i, v in enumerate(values):
                acc[i] += (v if v is not None else math.nan) * n
        self.weight += n
        if jacobian and self.sigma is None and self.jacobian_sequences > 0:
            self.sigma = jacobian_profile(
                model, idx[: self.jacobian_sequences], self.max_rounds, self.jacobian_iters, progress=progress
            )

    def sync(self, reduce) -> None:
        """Pool the processes' batches (DDP ranks each see their own): the token-weighted sums and weights
        add up; σ_max, measured on each process's first batch, becomes the mean over the processes that
        measured it. `reduce` sums a float64 tensor over the processes (`Strategy.reduce(...,
        reduce_op="sum")`), a collective every rank must call."""
        M, Q = self.max_rounds, len(TOKEN_WEIGHTED)
        sums = torch.tensor([self.sums.get(q, [0.0] * M) for q in TOKEN_WEIGHTED], dtype=torch.float64)  # [Q, M]
        sigma = torch.tensor([math.nan if v is None else v for v in (self.sigma or [None] * M)], dtype=torch.float64)
        measured = ~sigma.isnan()
        packed = torch.cat(
            [sums.flatten(), torch.tensor([self.weight], dtype=torch.float64), sigma.nan_to_num(0.0), measured.double()]
        )
        sums, weight, sigma_sum, counts = reduce(packed).split([Q * M, 1, M, M])
        sums = sums.view(Q, M)
        # a quantity another process measured counts here too (nan, a round without it, is not 0)
        self.sums = {q: row.tolist() for q, row in zip(TOKEN_WEIGHTED, sums) if q in self.sums or bool(row.ne(0).any())}
        self.weight = float(weight)
        self.sigma = (
            None
            if not bool(counts.any())
            else [s / c if c else None for s, c in zip(sigma_sum.tolist(), counts.tolist())]
        )

    def compute(self) -> dict[str, list[float | None]]:
        out = {q: [None if math.isnan(s) else s / self.weight for s in acc] for q, acc in self.sums.items()}
        if self.sigma is not None:
            out["sigma_max"] = self.sigma
        return out


def fixed_point_table(runs: list[tuple[str, dict | None]]) -> str | None:
    """A markdown table of the runs' last validation profile (summary.json's `fixed_point`): per run, each
    quantity at round 2, at the training R and at the last round measured; None when no run has one."""
    rows = []
    for name, summary in runs:
        profile = (summary or {}).get("fixed_point")
        if not profile:
            continue
        R = ((summary or {}).get("config") or {}).get("n_rounds")
        M = len(profile["loss"])
        picks = sorted({r for r in (2, R, M) if r and 1 <= r <= M})
        cells = []
        for q in QUANTITIES:
            values = profile.get(q) or []
            cells.append(
                " / ".join("–" if r > len(values) or values[r - 1] is None else f"{values[r - 1]:.3g}" for r in picks)
            )
        rows.append(f"| {name} | {', '.join(map(str, picks))} | " + " | ".join(cells) + " |")
    if not rows:
        return None
    head = [
        "| run | rounds r | loss | ‖x_r − x_{r−1}‖/‖x_r‖ | KL(p_{r−1}‖p_r) | σ_max of round r's Jacobian |",
        "|---|---|---|---|---|---|",
    ]
    return "\n".join(head + rows)
