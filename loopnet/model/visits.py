"""One identity for a sublayer visit, shared by the model, the diagnostics and the report.

A visit i = (r, j) is the r-th application of physical sublayer j = (k, s): round r (1-based),
block k (1-based), sublayer s ∈ {attn, ffn}. There are M = 2·K·R visits per forward pass.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:  # annotations only: the visit names are read by the report without torch
    import torch

SUBLAYERS = ("attn", "ffn")
_TAG = re.compile(r"^r(\d+)_k(\d+)_(attn|ffn)$")


class Visit(NamedTuple):
    round: int  # r, 1-based
    block: int  # k, 1-based
    sublayer: str  # "attn" | "ffn"

    @property
    def tag(self) -> str:
        """Name shown to people and used in TensorBoard tags, e.g. ``r03_k1_attn``."""
        return f"r{self.round:02d}_k{self.block}_{self.sublayer}"

    @property
    def physical(self) -> str:
        """The physical sublayer j visited, e.g. ``k1_attn`` (shared by all rounds)."""
        return f"k{self.block}_{self.sublayer}"

    @classmethod
    def parse(cls, tag: str) -> "Visit":
        m = _TAG.match(tag)
        if not m:
            raise ValueError(f"{tag!r} is not a visit tag like 'r03_k1_attn'")
        return cls(int(m[1]), int(m[2]), m[3])


def visit_order(n_blocks: int, n_rounds: int) -> list[Visit]:
    """All visits of a forward pass in execution order."""
    return [Visit(r, k, s) for r in range(1, n_rounds + 1) for k in range(1, n_blocks + 1) for s in SUBLAYERS]


@dataclass
class VisitTrace:
    """What an observer sees at one visit (all tensors are live autograd tensors).

    x:      the visit's input stream
    alpha:  the skip scale α (1 for Pre-LN)
    branch: f(·), the branch output
    stream: the pre-Norm stream α·x + f (for Pre-LN, the new stream x + f)
    state:  the visit's output (after the Norm for the Post-LN family; = stream for Pre-LN)
    params: this visit's own views of the physical sublayer's parameters; hooking their
            gradient gives the per-visit contribution g_{r,j} (they sum to the parameter's .grad)
    qk:     an attention visit's queries and keys (B, H, T, d_h), after the rotary embedding: the
            logits are q·kᵀ/√d_h; None for an FFN visit
    """

    x: torch.Tensor
    alpha: float
    branch: torch.Tensor
    stream: torch.Tensor
    state: torch.Tensor
    params: dict[str, torch.Tensor]
    qk: tuple[torch.Tensor, torch.Tensor] | None = None


class VisitObserver(Protocol):
    def on_visit(self, visit: Visit, trace: VisitTrace) -> None: ...
