"""Packing: documents joined (each ends with end-of-text) and cut into windows of seq_len + 1 tokens.

Consecutive windows share one token (stride seq_len, as Megatron-LM packs): window k holds
tokens [k*T, k*T + T], so inputs = window[:-1] and targets = window[1:], and every next-token
pair of the stream is trained on exactly once. No token is dropped except the final partial
window of a finite stream. Documents shorter than a window are simply joined with the next ones.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np


class Packer:
    """A token buffer fed with whole documents and drained window by window.

    Every document is pushed with an opaque `pos` (where it sits in its source stream) so that
    `position()` can say where the next window starts: (pos of its document, token offset in it).
    That pair is all a resumed stream needs to rebuild the buffer.
    """

    def __init__(self, seq_len: int):
        self.seq_len = seq_len
        self._segs: deque[list[Any]] = deque()  # [pos, tokens, offset of the first unread token]
        self.available = 0

    def push(self, pos: Any, tokens: np.ndarray, offset: int = 0) -> None:
        if offset < len(tokens):
            self._segs.append([pos, tokens, offset])
            self.available += len(tokens) - offset

    def position(self) -> tuple[Any, int]:
        """(pos, offset) of the first buffered token, i.e. where the next window starts."""
        pos, _, offset = self._segs[0]
        return pos, offset

    def pop(self) -> np.ndarray | None:
        """The next window of seq_len + 1 tokens, or None when fewer are buffered."""
        n = self.seq_len + 1
        if self.available < n:
            return None
        pos, tokens, off = self._segs[0]
        if len(tokens) - off >= n:  # common case: the window lies inside one document
            window = tokens[off : off + n]
        else:
            parts, need = [], n
            for _, t, o in self._segs:
                take = min(need, len(t) - o)
                parts.append(t[o : o + take])
                need -= take
                if need == 0:
                    break
            window = np.concatenate(parts)
        self._advance(self.seq_len)  # keep the last token: it starts the next window
        return window

    def _advance(self, n: int) -> None:
        self.available -= n
        while n:
            seg = self._segs[0]
            left = len(seg[1]) - seg[2]
            if left > n:
                seg[2] += n
                return
            n -= left
            self._segs.popleft()


def block_permutation(size: int, seed: int, *key: int) -> np.ndarray:
    """The seeded order in which a block of `size` windows is emitted (identity when size is 1)."""
    if size == 1:
        return np.zeros(1, dtype=np.int64)
    return np.random.default_rng([seed % 2**32, *key]).permutation(size)
