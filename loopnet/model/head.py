"""The LM head at generation: the next token's logits h·Wᵀ (or only its greedy argmax) for one position
per row, where the head's V·d weights are the bulk of a cached token's work (V 50304, d 128: 25.7 MB
of fp32 read per token, against ~1.6 MB for all of a small model's rounds).

`HeadColumns`: the fp32 logits, laid out for all CPU threads. `GreedyScreen`: the greedy token from a
bf16 copy of the weight (half the bytes), exact: a bound on the bf16 rounding says when the copy's
argmax is the exact logits' argmax, and otherwise the fp32 logits decide. Both are kept on the model
while the weight they copy is unchanged (`weight_key`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def weight_key(weight: torch.Tensor, *layout) -> tuple:
    """What a copy of the head's weight depends on: an optimiser step or a `load_state_dict` writes the
    weight in place, which bumps its version."""
    return weight.data_ptr(), weight._version, weight.dtype, weight.device, tuple(weight.shape), *layout


class HeadColumns:
    """The LM head's weight W [V, d] laid out for a generated token's logits h·Wᵀ on CPU: Wᵀ cut into
    `chunks` column blocks [chunks, d, ⌈V/chunks⌉] (the last zero-padded), multiplied as one batched
    matmul. MKL runs a single row times one [d, V] matrix on one thread (V 50304, d 128: 0.8-1.2 ms on
    the AMD machine however many threads torch has), a batch of blocks on all of them (0.35-0.55 ms on
    two); each logit is the same d-term dot product, so the logits equal F.linear's up to rounding. On
    other devices they are F.linear's. `key` tells whether it still holds for a weight (`matches`)."""

    def __init__(self, weight: torch.Tensor, chunks: int):
        V, d = weight.shape
        self.vocab, self.key, self.weight = V, weight_key(weight, chunks), weight
        self.columns = None
        if weight.device.type == "cpu":
            width = -(-V // chunks)
            columns = torch.empty(chunks * width, d, dtype=weight.dtype)
            columns[:V], columns[V:] = weight, 0
            self.columns = columns.view(chunks, width, d).transpose(1, 2).contiguous()

    def matches(self, weight: torch.Tensor, chunks: int) -> bool:
        return self.key == weight_key(weight, chunks)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """h [B, d] → logits [B, V]."""
        if self.columns is None:
            return F.linear(h, self.weight)
        chunks, d, width = self.columns.shape
        blocks = torch.bmm(h.expand(chunks, *h.shape), self.columns)  # [chunks, B, width]
        return blocks.transpose(0, 1).reshape(h.size(0), chunks * width)[:, : self.vocab]


class GreedyScreen:
    """The greedy next token [B] from h [B, d] without the fp32 logits, for a compiled decode step (`screen`
    is traced into it): a_v = Σ_i bf16(w_vi)·h_i, summed in fp32, reads half the bytes of h·Wᵀ.

    Exactness. bf16 keeps 8 significant bits (unit roundoff 2⁻⁸), so |bf16(w) − w| ≤ 2⁻⁸|w|; the fp32
    products and the d-term sum add at most (d + 1)·2⁻²⁴ of Σ|w_vi||h_i| (γ_{d+1}), and Σ|w_vi||h_i| ≤
    ‖w_v‖‖h‖ (Cauchy–Schwarz). So the exact logit l_v = w_v·h lies within e_v = ε‖w_v‖‖h‖ + 2⁻¹⁰⁰ of a_v,
    with ε = 2⁻⁸ + (d + 2)·2⁻²³ and a factor 1 + 2⁻¹⁰ for the rounding of e_v, ‖h‖ and a_v ± e_v
    themselves (2⁻¹⁰⁰: products that underflow fp32).
    Every token whose exact logit can be the largest has a_v + e_v ≥ max_u (a_u − e_u); the token that
    attains that maximum is one. When it is the only one (`settled`), it is the argmax of the exact logits;
    otherwise (a near tie, or a non-finite value) the caller takes the argmax of the fp32 logits. Both are
    greedy decoding over fp32 logits, which other paths (F.linear, `HeadColumns`) compute to within their
    own rounding. `usable` is false when a weight is outside bf16's normal range (inf, or below 2⁻¹²⁶ and
    not 0: the relative bound does not hold there); the caller then takes the fp32 logits."""

    def __init__(self, weight: torch.Tensor):
        V, d = weight.shape
        self.key = weight_key(weight)
        w = weight.detach()
        self.low = w.to(torch.bfloat16)  # [V, d]
        # ‖w_v‖ in float64, rounded up into fp32
        self.norms = (w.double().norm(dim=1) * (1 + 2.0**-20)).float()  # [V]
        self.eps = (2.0**-8 + (d + 2) * 2.0**-23) * (1 + 2.0**-10)
        magnitude = w.abs()
        normal = (magnitude == 0) | (magnitude >= 2.0**-126)
        self.usable = bool(torch.isfinite(self.low).all()) and bool(normal.all())

    def matches(self, weight: torch.Tensor) -> bool:
        return self.key == weight_key(weight)

    def args(self, n_vocab: int) -> tuple:
        """`screen`'s arguments after h, over the first `n_vocab` ids."""
        return self.low, self.norms, self.eps, n_vocab

    @staticmethod
    def bounds(
        h: torch.Tensor, low: torch.Tensor, norms: torch.Tensor, eps: float, n_vocab: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(a [B, V], e [B, V]): each exact logit w_v·h lies in [a_v − e_v, a_v + e_v]."""
        a = (low[:n_vocab].float() * h[:, None, :]).sum(-1)
        e = eps * norms[:n_vocab] * torch.linalg.vector_norm(h, dim=-1, keepdim=True) + 2.0**-100
        return a, e

    @staticmethod
    def screen(
        h: torch.Tensor, low: torch.Tensor, norms: torch.Tensor, eps: float, n_vocab: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the token [B] that attains max_v (a_v − e_v), whether it is the only candidate [B])."""
        a, e = GreedyScreen.bounds(h, low, norms, eps, n_vocab)
        below = a - e
        lowest = below.amax(-1, keepdim=True)  # a NaN anywhere makes it NaN: no candidate, not settled
        return below.argmax(-1), (a + e >= lowest).sum(-1) == 1
