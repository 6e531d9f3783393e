"""The pieces of a block: norms, rotary positions, causal attention, the FFN, and a residual
sublayer that applies one of the residual schemes at each visit."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import LoopConfig


def make_norm(cfg: LoopConfig) -> nn.Module:
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(cfg.d_model, eps=1e-6)
    return nn.LayerNorm(cfg.d_model, bias=cfg.bias)


def unit_rms(x: torch.Tensor) -> torch.Tensor:
    """Parameter-free RMSNorm (the FLT code's `norm`), used between rounds: Norm(e), h = Norm(x)."""
    return F.rms_norm(x, (x.size(-1),), eps=1e-6)


class Rotary(nn.Module):
    """Rotary position embedding tables for sequences up to `seq_len`."""

    def __init__(self, head_dim: int, seq_len: int, base: float = 10000.0):
        super().__init__()
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
        self.register_buffer("cos", angles.cos()[None, None], persistent=False)  # (1, 1, T, hd/2)
        self.register_buffer("sin", angles.sin()[None, None], persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, H, T, hd)
        T = x.size(-2)
        cos, sin = self.cos[..., :T, :].to(x.dtype), self.sin[..., :T, :].to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class Attention(nn.Module):
    """Causal multi-head attention. With `q_src` the queries come from `q_src` and keys and values
    from `x` (attention injection: the same W_Q, W_K, W_V reused as cross-attention)."""

    def __init__(self, cfg: LoopConfig):
        super().__init__()
        d, b = cfg.d_model, cfg.bias
        self.n_heads = cfg.n_heads
        self.q_proj = nn.Linear(d, d, bias=b)
        self.k_proj = nn.Linear(d, d, bias=b)
        self.v_proj = nn.Linear(d, d, bias=b)
        self.o_proj = nn.Linear(d, d, bias=b)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor, q_src: torch.Tensor | None = None, rotary: Rotary | None = None):
        B, T, C = x.shape
        split = lambda t: t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)  # noqa: E731
        q = split(self.q_proj(x if q_src is None else q_src))
        k, v = split(self.k_proj(x)), split(self.v_proj(x))
        if rotary is not None:
            q, k = rotary(q), rotary(k)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg: LoopConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias)
        self.fc2 = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)

    def forward(self, x: torch.Tensor, q_src=None, rotary=None) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Sublayer(nn.Module):
    """One physical residual sublayer j = (k, attn|ffn): its branch f and its Norm(s).

    A visit computes, with α from `residual_scales`:
        Pre-LN:            x ← x + f(Norm(x))
        Post-LN family:    x ← Norm(α·x + f(x))           (sandwich: f(Norm_in(x)))
    and returns (new x, pre-Norm stream, branch output) so observers can see all three.
    """

    def __init__(self, cfg: LoopConfig, kind: str):
        super().__init__()
        self.kind = kind
        self.pre_norm = cfg.pre_norm
        self.f = Attention(cfg) if kind == "attn" else MLP(cfg)
        self.norm = make_norm(cfg)
        self.inner_norm = make_norm(cfg) if cfg.sandwich else None
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, alpha: float, q_src=None, rotary=None):
        norm_in = self.norm if self.pre_norm else self.inner_norm
        if norm_in is not None:
            branch_in, q_in = norm_in(x), (None if q_src is None else norm_in(q_src))
        else:
            branch_in, q_in = x, q_src
        branch = self.drop(self.f(branch_in, q_src=q_in, rotary=rotary))
        if self.pre_norm:
            stream = x + branch
            return stream, stream, branch
        stream = alpha * x + branch
        return self.norm(stream), stream, branch


class Block(nn.Module):
    """A physical block: attention sublayer then FFN sublayer."""

    def __init__(self, cfg: LoopConfig):
        super().__init__()
        self.attn = Sublayer(cfg, "attn")
        self.ffn = Sublayer(cfg, "ffn")
