"""Adaptive exit per token: stop a token's rounds once its prediction has settled (Huginn's criteria).

Each criterion compares round r with round r − 1, per position (rows of [N, d] states and [N, V]
logits); round 1 compares with a reference, as Huginn's code does:

    kl       KL(p_{r−1} ‖ p_r) of the next-token distributions < threshold   (round 1: p_0 uniform)
    latent   ‖x_r − x_{r−1}‖ / ‖x_r‖ < threshold      (x_r the state at the end of round r; x_0 the
             round-1 input)
    entropy  |H(p_r) − H(p_{r−1})| < threshold                                 (round 1: H_0 = log V)
    argmax   the argmax has been the same for `threshold` successive rounds (an integer n; round 1
             counts 0, so n = 0 exits after round 1 and n ≥ max_rounds never exits early)
    gate     the learned exit gate's cumulative exit probability Σ_{j≤r} p_j ≥ threshold, p_j = λ_j·∏_{i<j}
             (1 − λ_i), λ_j = σ(gate(h_j)) (Ouro's early_exit_gate and early_exit_threshold; a model with
             `LoopConfig.exit_gate`). Not strict, as Ouro's: 0 exits after round 1, above 1 never early

For kl, latent and entropy the comparison is strict, so a threshold of 0 never exits early and
`math.inf` always exits after round 1. Defaults are Huginn's (gate: 0.5, the median exit round).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

EXITS = ("none", "kl", "latent", "entropy", "argmax", "gate")
DEFAULT_THRESHOLDS = {"kl": 1e-3, "latent": 0.03, "entropy": 1e-3, "argmax": 5, "gate": 0.5}


def check_exit(exit: str, threshold: float | None, where: str = "model.generate") -> None:
    """One-line errors for a bad criterion or threshold."""
    if exit not in EXITS:
        raise ValueError(f"{where}.exit={exit!r} is not a criterion; choose one of {', '.join(EXITS)}")
    if threshold is not None and not threshold >= 0:
        raise ValueError(
            f"{where}.exit_threshold={threshold} must be >= 0; fix: give e.g. "
            f"{DEFAULT_THRESHOLDS.get(exit, 1e-3)} (null: the criterion's default)"
        )


class ExitCriterion:
    """The running state of one criterion over N positions: `start(x0)`, then `step(x_r, logits_r)`
    for r = 1, 2, ... returns (exits [N] bool, value [N]): whether each position's criterion holds
    after round r, and the compared quantity. "gate" reads `model.exit_lambda`."""

    def __init__(self, kind: str, threshold: float | None = None, model=None):
        check_exit(kind, threshold)
        if kind == "none":
            raise ValueError("ExitCriterion needs a criterion other than 'none'")
        if kind == "gate" and getattr(model, "exit_gate", None) is None:
            raise ValueError(
                "exit 'gate' reads the model's learned exit gate, and this model has none (LoopConfig.exit_gate); "
                "fix: choose kl, latent, entropy or argmax"
            )
        self.kind, self.model = kind, model
        self.threshold = DEFAULT_THRESHOLDS[kind] if threshold is None else float(threshold)
        self.needs_logits = kind not in ("latent", "gate")

    def start(self, x0: torch.Tensor) -> None:
        self.prev_x = x0.float()
        self.prev_logp = self.prev_entropy = self.prev_argmax = None
        self.stable = torch.zeros(x0.shape[:-1], dtype=torch.long, device=x0.device)
        self.remaining = torch.ones(x0.shape[:-1], device=x0.device)  # gate: ∏(1 − λ_j) of the rounds so far
        self.cumulative = torch.zeros(x0.shape[:-1], device=x0.device)

    def step(self, x: torch.Tensor, logits: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if self.kind == "gate":
            lam = self.model.exit_lambda(x)
            self.cumulative = self.cumulative + lam * self.remaining
            self.remaining = self.remaining * (1 - lam)
            return self.cumulative >= self.threshold, self.cumulative
        x = x.float()
        if self.kind == "latent":
            value = (x - self.prev_x).norm(dim=-1) / x.norm(dim=-1)
            self.prev_x = x
            return value < self.threshold, value
        logp = F.log_softmax(logits.float(), dim=-1)
        if self.kind == "kl":
            prev = self.prev_logp if self.prev_logp is not None else torch.full_like(logp, -math.log(logp.size(-1)))
            value = (prev.exp() * (prev - logp)).sum(-1).clamp_min(0)  # ≥ 0; rounding can dip below
            self.prev_logp = logp
            return value < self.threshold, value
        if self.kind == "entropy":
            entropy = -(logp.exp() * logp).sum(-1)
            prev = (
                self.prev_entropy
                if self.prev_entropy is not None
                else torch.full_like(entropy, math.log(logp.size(-1)))
            )
            value = (entropy - prev).abs()
            self.prev_entropy = entropy
            return value < self.threshold, value
        argmax = logp.argmax(-1)
        if self.prev_argmax is not None:
            self.stable = torch.where(argmax == self.prev_argmax, self.stable + 1, torch.zeros_like(self.stable))
        self.prev_argmax = argmax
        return self.stable >= self.threshold, self.stable.float()


@torch.no_grad()
def exit_logits(
    model, idx: torch.Tensor, exit: str, threshold: float | None, max_rounds: int, n_vocab: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced adaptive exit: (logits [B, T, V], rounds [B, T]) where each position's logits are
    those of the first round ≤ `max_rounds` at which its criterion holds (`max_rounds` if none).

    Every round runs over the whole sequence, so each position reads the others at full depth; a
    position's exit only decides which round's prediction it gives. The criteria see the first
    `n_vocab` ids' logits (default all), as generation samples them. `exit="none"`: round `max_rounds`."""
    B, T = idx.shape
    rounds = torch.full((B, T), max_rounds, dtype=torch.long, device=idx.device)
    if exit == "none":
        *_, (_, x) = model.iter_rounds(idx, max_rounds)
        return model.head(x)[0], rounds
    criterion = ExitCriterion(exit, threshold, model)
    chosen = done = None
    for r, x in model.iter_rounds(idx, max_rounds, start=True):
        if r == 0:  # the round-1 input
            criterion.start(x)
            continue
        logits = model.head(x)[0]
        exits, _ = criterion.step(x, logits[..., :n_vocab])
        if chosen is None:
            chosen, done = logits.clone(), torch.zeros_like(exits)
        newly = exits & ~done if r < max_rounds else ~done
        chosen = torch.where(newly[..., None], logits, chosen)
        rounds = torch.where(newly, r, rounds)
        done = done | newly
        if bool(done.all()):
            break
    return chosen, rounds
