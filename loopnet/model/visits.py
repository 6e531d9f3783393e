"""One identity for a sublayer visit, shared by the model, the diagnostics and the report.

A visit i = (r, j) is the r-th application of physical sublayer j = (k, s): round r (1-based),
block k (1-based), sublayer s ∈ {attn, ffn}. The loop's K tied blocks make 2·K·R visits per forward
pass; the untied prelude blocks (before the loop) and coda blocks (after it) add one visit per
sublayer each, 2·(P + C) in all. A prelude or coda visit has its own `part` and round 0.

    loop visit       r03_k1_attn   (round 3, block 1 of the loop)    physical k1_attn
    prelude visit    p1_attn       (prelude block 1)                 physical p1_attn
    coda visit       c2_ffn        (coda block 2)                    physical c2_ffn

A prelude or coda sublayer is visited once per forward pass, so its own tag is also its physical name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:  # annotations only: the visit names are read by the report without torch
    import torch

SUBLAYERS = ("attn", "ffn")
PARTS = ("prelude", "loop", "coda")
_PREFIX = {"prelude": "p", "coda": "c"}
_TAG = re.compile(r"^(?:r(\d+)_k(\d+)|([pc])(\d+))_(attn|ffn)$")


class Visit(NamedTuple):
    round: int  # r, 1-based; 0 for a prelude or coda visit
    block: int  # k, 1-based (within the prelude, the loop or the coda)
    sublayer: str  # "attn" | "ffn"
    part: str = "loop"  # "prelude" | "loop" | "coda"

    @property
    def looped(self) -> bool:
        """A visit of the loop's tied blocks (prelude and coda blocks are untied)."""
        return self.part == "loop"

    @property
    def tag(self) -> str:
        """Name shown to people and used in TensorBoard tags, e.g. ``r03_k1_attn``, ``p1_attn``, ``c2_ffn``."""
        if self.looped:
            return f"r{self.round:02d}_k{self.block}_{self.sublayer}"
        return f"{_PREFIX[self.part]}{self.block}_{self.sublayer}"

    @property
    def physical(self) -> str:
        """The physical sublayer j visited, e.g. ``k1_attn`` (shared by all rounds), ``p1_attn``."""
        if self.looped:
            return f"k{self.block}_{self.sublayer}"
        return self.tag

    @classmethod
    def parse(cls, tag: str) -> "Visit":
        m = _TAG.match(tag)
        if not m:
            raise ValueError(f"{tag!r} is not a visit tag like 'r03_k1_attn', 'p1_attn' or 'c1_ffn'")
        if m[1] is not None:
            return cls(int(m[1]), int(m[2]), m[5])
        return cls(0, int(m[4]), m[5], "prelude" if m[3] == "p" else "coda")


def visit_order(n_blocks: int, n_rounds: int, n_prelude: int = 0, n_coda: int = 0) -> list[Visit]:
    """All visits of a forward pass in execution order: prelude, the loop's rounds, coda."""
    prelude = [Visit(0, k, s, "prelude") for k in range(1, n_prelude + 1) for s in SUBLAYERS]
    loop = [Visit(r, k, s) for r in range(1, n_rounds + 1) for k in range(1, n_blocks + 1) for s in SUBLAYERS]
    coda = [Visit(0, k, s, "coda") for k in range(1, n_coda + 1) for s in SUBLAYERS]
    return prelude + loop + coda


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
    qk:     an attention visit's queries and keys (B, H, T, d_h), after qk-norm and the rotary
            embedding: the logits are q·kᵀ/√d_h; None for an FFN visit
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
