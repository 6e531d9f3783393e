"""What tests across the folders share: the tiny model config."""

from __future__ import annotations

from loopnet.model import LoopConfig


def tiny_config(**overrides) -> LoopConfig:
    """A model small enough for a test (K = 2 blocks × R = 3 rounds, d 32, 4 heads, T 16, 64 token ids);
    a test overrides what it needs. `residual="scaled"` gets p = 0.4 unless given."""
    config = dict(vocab_size=64, seq_len=16, d_model=32, n_heads=4, n_blocks=2, n_rounds=3) | overrides
    if config.get("residual") == "scaled":
        config.setdefault("p", 0.4)
    return LoopConfig(**config)
