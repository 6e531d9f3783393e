"""The pieces of a block: norms, rotary positions, causal attention, the FFN, and a residual
sublayer that applies one of the residual schemes at each visit."""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from .config import LoopConfig
from .kernels import rms_norm
from .parametrization import query_scale
from .visits import VisitTrace


class RMSNorm(nn.RMSNorm):
    """nn.RMSNorm (same parameter, same state-dict key) computed by `rms_norm`; its output times the fixed
    `out_scale` (1 but for the final Norm under μP, where it is the logit multiplier d₀/d)."""

    out_scale = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = rms_norm(x, self.weight, torch.finfo(x.dtype).eps if self.eps is None else self.eps)
        return y if self.out_scale == 1.0 else y * self.out_scale


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm with RMSNorm's fixed `out_scale`."""

    out_scale = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        return y if self.out_scale == 1.0 else y * self.out_scale


def make_norm(cfg: LoopConfig, out_scale: float = 1.0) -> nn.Module:
    """The config's Norm over d; `out_scale` multiplies its output (the final Norm's: μP's logit multiplier, so
    that every path reading the head, logits = W·final_norm(x), carries it)."""
    if cfg.norm == "rmsnorm":
        norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps or 1e-6, elementwise_affine=cfg.norm_affine)
    else:
        norm = LayerNorm(cfg.d_model, eps=cfg.norm_eps or 1e-5, bias=cfg.bias, elementwise_affine=cfg.norm_affine)
    if out_scale != 1.0:
        norm.out_scale = out_scale
    return norm


def unit_rms(x: torch.Tensor) -> torch.Tensor:
    """Parameter-free RMSNorm (the FLT code's `norm`), used between rounds: Norm(e), h = Norm(x)."""
    return rms_norm(x, None, 1e-6)


class Rotary(nn.Module):
    """Rotary position embedding tables for sequences up to `seq_len`."""

    def __init__(self, head_dim: int, seq_len: int, base: float = 10000.0):
        super().__init__()
        self.base = base  # the tables are recomputed from it where they are not stored (an exported model)
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
        self.register_buffer("cos", angles.cos()[None, None], persistent=False)  # (1, 1, T, hd/2)
        self.register_buffer("sin", angles.sin()[None, None], persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, H, T, hd) at positions 0..T-1, or at `positions` (B, T) (a cached generation's)."""
        if positions is None:
            T = x.size(-2)
            cos, sin = self.cos[..., :T, :].to(x.dtype), self.sin[..., :T, :].to(x.dtype)
        else:
            cos, sin = self.cos[0, 0][positions][:, None].to(x.dtype), self.sin[0, 0][positions][:, None].to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class QKVLinear(nn.Linear):
    """W_Q, W_K and W_V stacked into one d → 3d projection (rows [W_Q; W_K; W_V]): one matmul
    forward and two backward instead of three and six. Each d×d part is still its own matrix
    for the init (xavier's fan is d + d, not d + 3d) and for β, which scales W_V only: `parts()`."""

    PARTS = ("q_proj", "k_proj", "v_proj")  # the names the separate projections had (BETA_SCALED's)

    def __init__(self, d: int, bias: bool, kv: int | None = None):
        self.sizes = (d, kv or d, kv or d)  # rows of W_Q, W_K, W_V: fewer for K and V with grouped-query attention
        super().__init__(d, sum(self.sizes), bias=bias)

    def parts(self) -> dict[str, torch.Tensor]:
        """Views of W_Q, W_K, W_V by their old names."""
        return dict(zip(self.PARTS, self.weight.split(self.sizes)))

    @staticmethod
    def fuse_state(state_dict: dict, prefix: str) -> None:
        """Old checkpoints (before the fused projection) hold `q_proj`, `k_proj` and `v_proj`: stack them
        into this layout in place, so that they load unchanged."""
        for kind in ("weight", "bias"):
            old = [f"{prefix}{name}.{kind}" for name in QKVLinear.PARTS]
            if all(key in state_dict for key in old):
                state_dict[f"{prefix}qkv_proj.{kind}"] = torch.cat([state_dict.pop(key) for key in old])


class Attention(nn.Module):
    """Causal multi-head attention. With `q_src` the queries come from `q_src` and keys and values
    from `x` (attention injection: the same W_Q, W_K, W_V reused as cross-attention). With `kv` (a
    `CacheSlot` of a generation) x holds the new positions only: their keys and values join the
    cache and the queries attend to every cached position up to their own."""

    def __init__(self, cfg: LoopConfig):
        super().__init__()
        d, b = cfg.d_model, cfg.bias
        self.n_heads, self.n_kv_heads = cfg.n_heads, cfg.kv_heads
        self.qkv_proj = QKVLinear(d, b, self.n_kv_heads * cfg.head_dim)
        self.o_proj = nn.Linear(d, d, bias=b)
        self.dropout = cfg.dropout
        # qk-norm: each head's queries and keys RMS-normalised over d_h (own gains), so |q·k|/√d_h <= √d_h·|g_q|·|g_k|.
        hd = cfg.head_dim
        gain = cfg.norm_affine and cfg.qk_norm_gain  # without gains: Parcae's F.rms_norm at the dtype's epsilon
        self.q_norm = RMSNorm(hd, eps=1e-6 if gain else None, elementwise_affine=gain) if cfg.qk_norm else None
        self.k_norm = RMSNorm(hd, eps=1e-6 if gain else None, elementwise_affine=gain) if cfg.qk_norm else None
        # μP's attention logits q·k·√d_h₀/d_h: the queries times √(d₀/d), so that SDPA's 1/√d_h, the cache and
        # the probes' q·k/√d_h all see the scaled logits (1 under the standard parametrization).
        self.q_scale = query_scale(cfg)
        # Huginn's qk_bias: [query bias; key bias] per head, a bias of W_Q and W_K alone (W_V has none).
        self.qk_bias = nn.Parameter(torch.zeros(2, cfg.n_heads, 1, hd)) if cfg.qk_bias else None
        # Value embedding (`LoopConfig.value_embeds`, given to this block by `value_embed`): a table of the tokens
        # added to the values through a gate per kv head; `tokens` is set by the model's embed for the pass.
        self.value_embed: nn.Embedding | None = None
        self.value_gate: nn.Linear | None = None
        self.tokens: torch.Tensor | None = None
        # Called with (q, k) when set: on diagnostics steps only (`Sublayer.observed`), since
        # scaled_dot_product_attention does not expose the logits q·k/√d_h that the probe measures.
        self.qk_hook = None
        self.register_load_state_dict_pre_hook(
            lambda module, state_dict, prefix, *args: QKVLinear.fuse_state(state_dict, prefix)
        )

    def forward(self, x: torch.Tensor, q_src: torch.Tensor | None = None, rotary: Rotary | None = None, kv=None):
        B, T, C = x.shape
        split = lambda t: t.view(B, T, -1, C // self.n_heads).transpose(1, 2)  # noqa: E731
        sizes = self.qkv_proj.sizes
        if q_src is None:
            q, k, v = self.qkv_proj(x).split(sizes, dim=2)
        else:  # injection: Q from q_src through W_Q's rows, K and V from x through the other rows
            w, b = self.qkv_proj.weight, self.qkv_proj.bias
            q = F.linear(q_src, w[:C], None if b is None else b[:C])
            k, v = F.linear(x, w[C:], None if b is None else b[C:]).split(sizes[1:], dim=2)
        if self.value_embed is not None:
            gate = 2 * torch.sigmoid(self.value_gate(x[..., : self.value_gate.in_features]))  # (B, T, kv heads)
            ve = self.value_embed(self.tokens).view(B, T, self.n_kv_heads, -1)
            v = v + (gate[..., None] * ve).flatten(2)
        q, k, v = split(q), split(k), split(v)
        if self.qk_bias is not None:
            q, k = q + self.qk_bias[0], k + self.qk_bias[1]
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rotary is not None:
            positions = None if kv is None else kv.positions
            q, k = rotary(q, positions), rotary(k, positions)
        if self.q_scale != 1.0:
            q = q * self.q_scale
        if kv is not None:  # the cache keeps the n_kv_heads heads; its attention reads them grouped
            if self.qk_hook is not None:
                self.qk_hook(q, self.grouped(k))
            y = kv.attend(q, k, v)
        else:
            k, v = self.grouped(k), self.grouped(v)
            if self.qk_hook is not None:
                self.qk_hook(q, k)
            y = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
            )
        return self.o_proj(y.transpose(1, 2).reshape(B, T, C))

    def grouped(self, t: torch.Tensor) -> torch.Tensor:
        """Keys or values [B, n_kv_heads, T, d_h] as n_heads heads: grouped-query attention's query head h reads
        K/V head h // group."""
        if self.n_kv_heads == self.n_heads:
            return t
        return t.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)

    def add_value_embed(self, vocab_size: int, head_dim: int) -> None:
        """Give this attention a value embedding: VE of width n_kv_heads·d_h and its gate W_g (32 → n_kv_heads)."""
        self.value_embed = nn.Embedding(vocab_size, self.n_kv_heads * head_dim)
        self.value_gate = nn.Linear(32, self.n_kv_heads, bias=False)


class MLP(nn.Module):
    """fc2(GELU(fc1 x)), or with `LoopConfig.mlp` "swiglu" fc2(SiLU(gate)·up), [gate; up] = fc1 x, or "relu2"
    fc2(½·ReLU(fc1 x)²)."""

    def __init__(self, cfg: LoopConfig):
        super().__init__()
        self.kind = cfg.mlp
        self.fc1 = nn.Linear(cfg.d_model, cfg.d_ff * (2 if cfg.mlp == "swiglu" else 1), bias=cfg.bias)
        self.fc2 = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)

    def forward(self, x: torch.Tensor, q_src=None, rotary=None, kv=None) -> torch.Tensor:
        if self.kind == "swiglu":
            gate, up = self.fc1(x).chunk(2, dim=-1)
            return self.fc2(F.silu(gate) * up)
        if self.kind == "relu2":
            return self.fc2(F.relu(self.fc1(x)).square() * 0.5)
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh" if self.kind == "gelu_tanh" else "none"))


class Sublayer(nn.Module):
    """One physical residual sublayer j = (k, attn|ffn): its branch f and its Norm(s).

    A visit computes, with α from `residual_scales` and ε from `branch_scale` (both of the training depth):
        Pre-LN:            x ← x + ε·f(Norm(x))            (sandwich: ε·Norm_out(f(Norm(x))))
        Post-LN family:    x ← Norm(α·x + f(x))           (sandwich: f(Norm_in(x)))
    and returns (new x, pre-Norm stream, branch output) so observers can see all three; for Pre-LN the
    branch output is ε·f, what the visit adds to the stream.
    """

    def __init__(self, cfg: LoopConfig, kind: str):
        super().__init__()
        self.kind = kind
        self.pre_norm = cfg.pre_norm
        self.epsilon = cfg.branch_epsilon
        self.f = Attention(cfg) if kind == "attn" else MLP(cfg)
        self.norm = make_norm(cfg)
        self.inner_norm = make_norm(cfg) if cfg.sandwich and not cfg.pre_norm else None
        self.out_norm = make_norm(cfg) if cfg.sandwich and cfg.pre_norm else None
        self.drop = nn.Dropout(cfg.dropout)
        self.param_names = [name for name, _ in self.named_parameters()]

    def forward(self, x, alpha: float, q_src=None, rotary=None, kv=None):
        norm_in = self.norm if self.pre_norm else self.inner_norm
        if norm_in is not None:
            branch_in, q_in = norm_in(x), (None if q_src is None else norm_in(q_src))
        else:
            branch_in, q_in = x, q_src
        branch = self.f(branch_in, q_src=q_in, rotary=rotary, kv=kv)
        if self.out_norm is not None:
            branch = self.out_norm(branch)
        if self.training and self.drop.p:  # otherwise the identity: no module call per visit
            branch = self.drop(branch)
        if self.pre_norm:
            if self.epsilon != 1.0:
                branch = self.epsilon * branch
            stream = x + branch
            return stream, stream, branch
        stream = alpha * x + branch
        return self.norm(stream), stream, branch

    def observed(self, x, alpha: float, q_src=None, rotary=None) -> VisitTrace:
        """One visit that reads the weights through its own views (hooking their gradients gives the
        visit's contribution g_{r,j}), with what an observer sees."""
        qk = []  # an attention visit's queries and keys, for its logits (SDPA does not return them)
        if isinstance(self.f, Attention):
            self.f.qk_hook = lambda q, k: qk.append((q, k))
        try:
            with own_views(self, self.param_names) as views:
                new, stream, branch = self(x, alpha, q_src, rotary)
        finally:
            if isinstance(self.f, Attention):
                self.f.qk_hook = None
        return VisitTrace(x, alpha, branch, stream, new, views, qk[0] if qk else None)


@contextmanager
def own_views(module: nn.Module, names: list[str]):
    """`module`'s weights `names` (dotted) replaced by views of themselves while inside, the views
    yielded by name. Inside an FSDP unit's forward (use_orig_params) a weight is a plain tensor
    attribute, the gathered parameter's view, that shadows the registered Parameter; that attribute
    is the one the forward reads and the one replaced here (torch.func.functional_call would replace
    the shadowed Parameter, and the visit's gradient would not pass through its views)."""
    swapped, views = [], {}
    try:
        for name in names:
            owner_name, _, leaf = name.rpartition(".")
            owner = module.get_submodule(owner_name)
            table = owner.__dict__ if leaf in owner.__dict__ else owner._parameters
            weight = table[leaf]
            swapped.append((table, leaf, weight))
            table[leaf] = views[name] = weight.view_as(weight)
        yield views
    finally:
        for table, leaf, weight in reversed(swapped):
            table[leaf] = weight


class Block(nn.Module):
    """A physical block: attention sublayer then FFN sublayer. Its forward is one visit of the block
    (both sublayers), the unit that FSDP gathers and activation checkpointing recomputes."""

    def __init__(self, cfg: LoopConfig):
        super().__init__()
        self.attn = Sublayer(cfg, "attn")
        self.ffn = Sublayer(cfg, "ffn")

    def forward(self, x, alpha: float, q_src=None, rotary=None, observe: bool = False, kv=None):
        """x after attention (queries from `q_src` when given: injection) then the FFN. With `observe`,
        (x, [attn's VisitTrace, ffn's VisitTrace]): the model hands them to its observer as visits.
        `kv`: the attention's `CacheSlot` in a cached generation."""
        if not observe:
            x = self.attn(x, alpha, q_src, rotary, kv)[0]
            return self.ffn(x, alpha, None, rotary)[0]
        attn = self.attn.observed(x, alpha, q_src, rotary)
        ffn = self.ffn.observed(attn.state, alpha, None, rotary)
        return ffn.state, [attn, ffn]
