"""KVCache: the keys and values of every attention visit of a generation, so that each new token
runs its rounds over one position instead of re-reading the whole context.

A looped model's attention at round r, block k reads keys and values computed from the stream of
that same round and block, so the cache holds one (K, V) per attention visit: per (round, block)
of the core, and once per prelude or coda block where the model has them. The key names the visit,
e.g. ("core", r, k). Each sequence of the batch has its own length: the next call writes its
positions `positions[b]` (a [B, T] tensor) and attends to the cached positions up to them.

Static (`static=True`, for a compiled decode step): every call writes by scatter and attends over the
whole capacity under a mask of the positions not yet reached, so that each call has the same shapes and
one compiled graph serves every token (the default slices up to the newest position: less work eagerly,
a new shape every token).

Exited tokens (adaptive exit): a token that stops after round e supplies, for every later round
r > e, the keys and values of its round e (`fill_later_rounds`), so that later tokens reading round
r find a dense row. Huginn's cache instead stores what ran and resolves a missing entry when it is
read (its lookup strategies, e.g. the latest round that ran for the same layer).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class KVCache:
    """Keys and values [B, H_kv, capacity, d_h] per attention visit, allocated at the first write. Under
    grouped-query attention H_kv = n_kv_heads < n_heads: the cache keeps the shared heads once, and query head h
    reads K/V head h // (n_heads / n_kv_heads) (`enable_gqa`)."""

    def __init__(self, batch: int, capacity: int, device: torch.device | str, static: bool = False):
        self.capacity, self.static = capacity, static
        self.span = torch.arange(capacity, device=device) if static else None  # the static mask's positions
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)  # filled positions per sequence
        self.positions: torch.Tensor | None = None  # [B, T] positions of the current call
        self.store: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def begin(self, positions: torch.Tensor) -> None:
        """Start a call over `positions` [B, T] (each row consecutive, from the row's length on)."""
        top = int(positions.max())
        if top >= self.capacity:
            raise ValueError(f"position {top} is past the cache's capacity {self.capacity}")
        self.positions = positions
        # one new token at the same position in every row (batch 1, or rows in step): plain slices, no mask
        self.shared = top if positions.size(1) == 1 and int(positions.min()) == top else None

    def end(self, last: torch.Tensor) -> None:
        """The call's positions up to `last` [B] (each row's last real one; right padding beyond) are
        now cached; a padded position is overwritten by the row's next token."""
        self.lengths = last + 1

    def keep(self, rows: list[int]) -> None:
        """Keep only these sequences (in this order): a finished one leaves the batch."""
        index = torch.tensor(rows, dtype=torch.long, device=self.lengths.device)
        self.lengths = self.lengths[index]
        self.store = {key: (k[index], v[index]) for key, (k, v) in self.store.items()}

    def _slot(self, key: tuple, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if key not in self.store:
            B, H, _, D = like.shape
            shape = (self.lengths.numel(), H, self.capacity, D)
            self.store[key] = (like.new_zeros(shape), like.new_zeros(shape))
        return self.store[key]

    def attend(self, key: tuple, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Write this call's k, v [B, H_kv, T, d_h] at their positions under `key`, then causal attention
        of the queries q [B, H, T, d_h] over every cached position up to each query's own."""
        K, V = self._slot(key, k)
        pos = self.positions
        gqa = q.size(1) != K.size(1)
        if self.static:  # fixed shapes: unfilled positions (zeros) lie past every query's own and are masked
            index = pos[:, None, :, None].expand(-1, K.size(1), -1, K.size(3))
            K.scatter_(2, index, k)
            V.scatter_(2, index, v)
            mask = self.span[None, None, :] <= pos[:, :, None]  # [B, T, capacity]
            if q.size(2) > 1:  # a prefill
                return F.scaled_dot_product_attention(q, K, V, attn_mask=mask[:, None], enable_gqa=gqa)
            # One query (a decode step): softmax(q·Kᵀ/√d_h)·V as products and sums, which inductor fuses with
            # the step's other work into one kernel (SDPA would be an opaque call per visit, ~25 µs on CPU).
            # The query heads as [B, H_kv, group, d_h]: each group reads its K/V head.
            B, H, _, D = q.shape
            qg = q.view(B, K.size(1), H // K.size(1), 1, D)
            scores = (qg * K[:, :, None]).sum(-1) * D**-0.5  # [B, H_kv, group, capacity]
            p = scores.masked_fill(~mask[:, None, None, 0], float("-inf")).softmax(-1)
            return (p[..., None] * V[:, :, None]).sum(3).view(B, H, 1, D)
        if self.shared is not None:
            p = self.shared
            K[:, :, p], V[:, :, p] = k[:, :, 0], v[:, :, 0]
            return F.scaled_dot_product_attention(q, K[:, :, : p + 1], V[:, :, : p + 1], enable_gqa=gqa)
        rows = torch.arange(pos.size(0), device=pos.device)[:, None].expand_as(pos)
        K[rows, :, pos] = k.transpose(1, 2)  # advanced indices first: [B, T, H, d_h]
        V[rows, :, pos] = v.transpose(1, 2)
        if not bool(self.lengths.any()):  # first call over empty cache: plain causal attention
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        span = int(pos.max()) + 1
        mask = torch.arange(span, device=pos.device)[None, None, :] <= pos[:, :, None]  # [B, T, span]
        return F.scaled_dot_product_attention(
            q, K[:, :, :span], V[:, :, :span], attn_mask=mask[:, None], enable_gqa=gqa
        )

    def fill_later_rounds(self, exit_round: torch.Tensor, rounds: int, n_blocks: int, positions: torch.Tensor) -> None:
        """The exit rule: sequence b's token at `positions[b]` stopped after round `exit_round[b]`; its
        keys and values of that round stand in for rounds exit_round[b]+1 .. `rounds`."""
        for e in torch.unique(exit_round).tolist():
            if e >= rounds:
                continue
            rows = (exit_round == e).nonzero().squeeze(1)
            pos = positions[rows]
            for k in range(1, n_blocks + 1):
                src_k, src_v = self.store[("core", e, k)]
                for r in range(e + 1, rounds + 1):
                    K, V = self._slot(("core", r, k), src_k)
                    K[rows, :, pos] = src_k[rows, :, pos]
                    V[rows, :, pos] = src_v[rows, :, pos]

    def slot(self, key: tuple) -> "CacheSlot":
        return CacheSlot(self, key)


class CacheSlot:
    """One attention visit's place in a `KVCache`: what a block's attention is handed."""

    def __init__(self, cache: KVCache, key: tuple):
        self.cache, self.key = cache, key

    @property
    def positions(self) -> torch.Tensor:
        return self.cache.positions

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.cache.attend(self.key, q, k, v)
