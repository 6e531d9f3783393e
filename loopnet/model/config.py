"""LoopConfig: every hyperparameter of a looped Transformer in one typed, documented place.

Symbols follow the papers: K = `n_blocks` physical blocks applied for R = `n_rounds` rounds,
unrolled depth N = K·R, M = 2N sublayer visits. N and M are derived, never stored.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal, Optional, get_args

from .scales import BRANCH_SCALES, SCHEMES, branch_scale, residual_scales

Residual = Literal["preln", "postln", "deepnorm", "deeploop", "scaled"]
BranchScale = Literal["one", "sqrt_depth", "wang"]
Wiring = Literal["carry", "lt", "inject", "flt"]
Init = Literal["xavier", "normal"]
Injection = Literal["add", "attention"]
InjectInto = Literal["first", "every"]
Positions = Literal["learned", "rope"]
Norm = Literal["rmsnorm", "layernorm"]
LossRounds = Literal["last", "all", "last_third"]

assert get_args(Residual) == SCHEMES
assert get_args(BranchScale) == BRANCH_SCALES
_CHOICES = {
    "residual": Residual,
    "branch_scale": BranchScale,
    "wiring": Wiring,
    "injection": Injection,
    "inject_into": InjectInto,
    "positions": Positions,
    "norm": Norm,
    "loss_rounds": LossRounds,
    "init": (None, *get_args(Init)),
}


@dataclass
class Architecture:
    """What the weights' shapes and the forward math depend on: a checkpoint loads only into a model
    with the same values, and they name its run folder.

    Args:
        vocab_size: Vocabulary size; GPT-2's 50257 padded to a multiple of 64.
        seq_len: Longest sequence the model accepts (size of the position table).
        d_model: Residual stream width d.
        n_heads: Attention heads; must divide d_model.
        n_blocks: K, physical blocks stored.
        n_rounds: R, rounds the K-block stack is applied in training (N = K·R).
        mlp_ratio: FFN hidden width as a multiple of d_model.
        bias: Biases in linear layers.
        tie_embeddings: Share the token embedding with the LM head (GPT-2, nanoGPT; the FLT code unties).
        input_norm: Feed Norm(e) (parameter-free RMSNorm of the embedding) into round 1 instead of e
            itself. The FLT code does (its configs set it); GPT-2, nanoGPT and DeepNet do not. With a
            tied head it costs Pre-LN ~0.3 nat at small scale: the embedding's scale no longer reaches
            the stream, so the head and the input pull the shared matrix apart.
        positions: "learned" absolute positions or "rope" rotary embeddings.
        norm: "rmsnorm" (DeepLoop's choice) or "layernorm".
        norm_affine: The Norms' learned gains (and LayerNorm's bias). False: parameter-free Norms, so
            that an update changes the output through the matrices and embeddings only (the gains'
            term of an update, ≈ lr per visit, is the same under every residual scheme).
        residual: Residual scheme: "preln", "postln", "deepnorm" (p = 1/4), "deeploop" (p = 1/2),
            or "scaled" with exponent `p`.
        p: Exponent for residual="scaled": α = (2N)^p, β = (8N)^-p.
        sandwich: Post-LN family only: add an inner Norm on the branch input, x ← Norm(α·x + f(Norm(x))).
        branch_scale: Pre-LN only: the branch multiplier ε of x ← x + ε·f(Norm(x)): "one" (ε = 1),
            "sqrt_depth" (ε = λ/√(K·R)) or "wang" (ε = λ/(R·√K), Wang et al. 2026); `scales.branch_scale`.
        branch_lambda: λ of the "sqrt_depth" and "wang" rules (1.0 for "one").
        wiring: Loop wiring. With x_end the stream at the end of a round and h = Norm(x_end):
            "carry" starts round r+1 from x_end itself (DeepLoop's x_{r+1,1} = x_{r,K+1});
            "lt" starts it from h (the FLT code's plain looped Transformer, LT);
            "inject" restarts from the round-1 input and injects h (see `injection`, `inject_into`);
            "flt" is the Fully Looped Transformer (= inject by attention into every block).
        injection: For wiring="inject": "add" starts the round from Norm(e + h) (LT_i) or, into every
            block, does x ← Norm(x + h) before each block (FLT_res); "attention" makes the
            block's attention take its query from h (K/V from the current stream).
        inject_into: For wiring="inject": the "first" block only (LT_i, LT_ia) or "every" block (FLT_res).
        init: Initialiser of the linear layers before β: "xavier" (DeepNet/torchscale: xavier_normal,
            gain β on V/O/fc1/fc2, gain 1 elsewhere) or "normal" (GPT-2: N(0, init_std²), then ×β on
            V/O/fc1/fc2). None: the scheme's own, "normal" for Pre-LN, "xavier" for the Post-LN
            family. Embeddings are N(0, init_std²) under both.
        init_std: Standard deviation of the normal initialisation (embeddings always; linear layers
            with init="normal").
    """

    vocab_size: int = 50304
    seq_len: int = 1024
    d_model: int = 768
    n_heads: int = 12
    n_blocks: int = 2
    n_rounds: int = 6
    mlp_ratio: float = 4.0
    bias: bool = False
    tie_embeddings: bool = True
    input_norm: bool = False
    positions: Positions = "learned"
    norm: Norm = "rmsnorm"
    norm_affine: bool = True
    residual: Residual = "deeploop"
    p: Optional[float] = None
    sandwich: bool = False
    branch_scale: BranchScale = "one"
    branch_lambda: float = 1.0
    wiring: Wiring = "carry"
    injection: Injection = "add"
    inject_into: InjectInto = "first"
    init: Optional[Init] = None
    init_std: float = 0.02

    # Derived quantities: computed, never stored twice.
    @property
    def n_unrolled(self) -> int:
        """N = K·R, the unrolled depth."""
        return self.n_blocks * self.n_rounds

    @property
    def n_visits(self) -> int:
        """M = 2N sublayer visits per forward pass."""
        return 2 * self.n_unrolled

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def d_ff(self) -> int:
        return int(self.mlp_ratio * self.d_model)

    @property
    def scales(self) -> tuple[float, float]:
        """(α, β) of the training depth N; kept fixed when evaluating at another R'."""
        return residual_scales(self.residual, self.n_unrolled, self.p)

    @property
    def branch_epsilon(self) -> float:
        """Pre-LN's branch multiplier ε of the training depth (K, R); kept fixed when evaluating at another R'."""
        return branch_scale(self.branch_scale, self.n_blocks, self.n_rounds, self.branch_lambda)

    @property
    def pre_norm(self) -> bool:
        return self.residual == "preln"

    @property
    def init_scheme(self) -> str:
        """The initialiser used: `init`, or the scheme's own (GPT-2's normal for Pre-LN, DeepNet's
        xavier for the Post-LN family)."""
        if self.init is not None:
            return self.init
        return "normal" if self.pre_norm else "xavier"


@dataclass
class RunSettings:
    """How a run trains the architecture: these may differ between a checkpoint and the run that
    loads it, and never name a run folder.

    Args:
        dropout: Dropout on attention weights, branch outputs and embeddings.
        loss_rounds: Train on the "last" round (default), the mean over "all" rounds, or over the
            "last_third" of rounds.
        checkpoint_rounds: Activation checkpointing per round, so stored activations grow with K, not K·R.
        truncate_rounds: Run the first n rounds without grad (truncated backprop through rounds).
    """

    dropout: float = 0.0
    loss_rounds: LossRounds = "last"
    checkpoint_rounds: bool = False
    truncate_rounds: int = 0


RUN_SETTINGS = frozenset(f.name for f in fields(RunSettings))  # the LoopConfig fields a checkpoint need not match


@dataclass
class LoopConfig(RunSettings, Architecture):
    """Configuration of a `LoopedTransformer`: its `Architecture` and its `RunSettings`, one flat set of
    fields (``model.config.d_model``, ``model.config.truncate_rounds``, ...)."""

    def __post_init__(self) -> None:
        for name, choices in _CHOICES.items():  # name the field and the allowed values
            allowed = choices if isinstance(choices, tuple) else get_args(choices)
            if getattr(self, name) not in allowed:
                names = ", ".join("null" if a is None else a for a in allowed)
                raise ValueError(
                    f"LoopConfig.{name}={getattr(self, name)!r} is not allowed; choose one of {names} "
                    f"(fix: set model.config.{name} to one of them)"
                )
        sizes = {"vocab_size": "the token ids, e.g. 50304", "seq_len": "the context length in tokens, e.g. 256",
                 "d_model": "the width, e.g. 128", "n_heads": "e.g. 4", "n_blocks": "K, e.g. 2",
                 "n_rounds": "R, e.g. 6; R < 1 runs no round"}
        for name, example in sizes.items():
            if getattr(self, name) < 1:
                raise ValueError(f"LoopConfig.{name} must be >= 1, got {getattr(self, name)}; "
                                 f"fix: set model.config.{name} to a positive integer ({example})")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"LoopConfig.d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                f"fix: pick n_heads among the divisors of d_model"
            )
        if self.positions == "rope" and self.head_dim % 2:
            raise ValueError(f"positions='rope' needs an even head dimension, got d_model/n_heads={self.head_dim}; "
                             f"fix: pick n_heads so that d_model/n_heads is even, or positions: learned")
        if self.init_std <= 0:
            raise ValueError(f"LoopConfig.init_std must be > 0, got {self.init_std}; fix: give e.g. 0.02")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LoopConfig.dropout must be in [0, 1), got {self.dropout}; fix: give e.g. 0.0 or 0.1")
        if self.mlp_ratio <= 0:
            raise ValueError(f"LoopConfig.mlp_ratio must be > 0, got {self.mlp_ratio}; fix: give e.g. 4")
        if not 0 <= self.truncate_rounds < self.n_rounds:
            raise ValueError(
                f"LoopConfig.truncate_rounds={self.truncate_rounds} must be in [0, n_rounds={self.n_rounds}) "
                f"so that at least one round trains; fix: lower model.config.truncate_rounds"
            )
        if self.residual == "scaled" and (self.p is None or not self.p > 0):
            raise ValueError(f"LoopConfig.residual='scaled' needs p > 0 (e.g. p: 0.4), got p={self.p}")
        if self.residual != "scaled" and self.p is not None:
            raise ValueError("LoopConfig.p is only used with residual='scaled'; remove it or set residual: scaled")
        if self.sandwich and self.residual == "preln":
            raise ValueError("LoopConfig.sandwich applies to the Post-LN family; Pre-LN already normalises the branch input")
        if self.branch_scale != "one" and self.residual != "preln":
            raise ValueError(f"LoopConfig.branch_scale={self.branch_scale!r} scales the Pre-LN branch only; "
                             f"fix: set model.config.residual: preln, or branch_scale: one for residual={self.residual!r}")
        try:
            self.branch_epsilon
        except ValueError as err:
            raise ValueError(f"LoopConfig: {err}") from None

    def architecture(self) -> dict:
        """The architecture's fields and values: what a checkpoint must match."""
        return {f.name: getattr(self, f.name) for f in fields(Architecture)}

