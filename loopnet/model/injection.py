"""The learned injections of the loop's input e into the state x at the start of every round
(`LoopConfig.injection` "linear" and "diagonal"); "add" and "attention" live in the model's forward.

    linear     x ← W·concat[x, e]                          Huginn's adapter, W: d × 2d
    diagonal   x ← a ⊙ x + softplus(dt) ⊙ (B·e),            Parcae's injection
               a = exp(−softplus(dt) ⊙ exp(A_log)) ∈ (0, 1)^d

The diagonal map is a contraction in x (every channel decays by a_c < 1), whatever the other
weights; at init A_log = 0 (A = 1), softplus(dt) = −log √(1/5), so every a_c = √(1/5), and B = I.
Parcae logs max_c a_c as the map's spectral norm and mean_c a_c as its contraction factor.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

INIT_DECAY = math.sqrt(1 / 5)  # Parcae's default a_c at init


class LinearInjection(nn.Module):
    def __init__(self, d: int, bias: bool):
        super().__init__()
        self.adapter = nn.Linear(2 * d, d, bias=bias)  # initialised by the model's scheme, like every linear

    def forward(self, x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        return self.adapter(torch.cat([x, e], dim=-1))


class DiagonalInjection(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.A_log = nn.Parameter(torch.empty(d))
        self.dt = nn.Parameter(torch.empty(d))
        self.B = nn.Parameter(torch.empty(d, d))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        self.A_log.zero_()
        step = -math.log(INIT_DECAY)  # softplus(dt) at init: a = exp(−step·1)
        self.dt.fill_(step + math.log(-math.expm1(-step)))  # softplus⁻¹(step)
        self.B.copy_(torch.eye(self.B.size(0)))

    def decay(self) -> torch.Tensor:
        """a ∈ (0, 1)^d, the per-channel factor on x."""
        return torch.exp(-F.softplus(self.dt) * torch.exp(self.A_log))

    def forward(self, x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        return x * self.decay() + F.softplus(self.dt) * (e @ self.B.t())

    @torch.no_grad()
    def decay_stats(self) -> dict[str, torch.Tensor]:
        """{"spectral_norm": max_c a_c, "contraction": mean_c a_c}, 0-d tensors (Parcae's names)."""
        a = self.decay().float()
        return {"spectral_norm": a.max(), "contraction": a.mean()}


def make_injection(kind: str, d: int, bias: bool) -> nn.Module | None:
    """The learned injection module of `LoopConfig.injection`, or None for "add" and "attention"."""
    if kind == "linear":
        return LinearInjection(d, bias)
    if kind == "diagonal":
        return DiagonalInjection(d)
    return None
