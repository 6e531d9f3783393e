"""LoopConfig: every hyperparameter of a looped Transformer in one typed, documented place.

Symbols follow the papers: K = `n_blocks` physical blocks applied for R = `n_rounds` rounds, between
P = `n_prelude` untied blocks before the loop and C = `n_coda` after it; unrolled depth N = P + K·R + C
(every block visit counts), M = 2N sublayer visits. N and M are derived, never stored.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal, Optional, get_args

from .parametrization import PARAMETRIZATIONS, check_parametrization, completep_epsilon
from .scales import BRANCH_SCALES, SCHEMES, branch_scale, residual_scales

Residual = Literal["preln", "postln", "deepnorm", "deeploop", "scaled"]
BranchScale = Literal["one", "sqrt_depth", "wang"]
Wiring = Literal["carry", "lt", "inject", "flt"]
Init = Literal["xavier", "normal"]
Injection = Literal["add", "attention", "linear", "diagonal"]
InjectInto = Literal["first", "every"]
Positions = Literal["learned", "rope"]
Norm = Literal["rmsnorm", "layernorm"]
LossRounds = Literal["last", "all", "last_third", "expected"]
RoundSampling = Literal["fixed", "poisson_lognormal", "poisson_truncated"]
RoundDrawUnit = Literal["batch", "sequence"]
ScalesDepth = Literal["mean", "sampled"]
Parametrization = Literal["standard", "mup", "completep"]
Mlp = Literal["gelu", "gelu_tanh", "swiglu", "relu2"]
StateInit = Literal["zero", "random"]

assert get_args(Residual) == SCHEMES
assert get_args(BranchScale) == BRANCH_SCALES
assert get_args(Parametrization) == PARAMETRIZATIONS
_CHOICES = {
    "residual": Residual,
    "branch_scale": BranchScale,
    "wiring": Wiring,
    "injection": Injection,
    "inject_into": InjectInto,
    "positions": Positions,
    "norm": Norm,
    "loss_rounds": LossRounds,
    "round_sampling": RoundSampling,
    "round_draw": RoundDrawUnit,
    "scales_depth": ScalesDepth,
    "parametrization": Parametrization,
    "mlp": Mlp,
    "state_init": StateInit,
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
        n_blocks: K, physical blocks stored in the loop (tied: every round applies the same K).
        n_rounds: R, rounds the K-block stack is applied in training; with `round_sampling` the mean R
            (N = P + K·R + C).
        n_prelude: P, untied blocks applied once to the embedding before the loop (Huginn, Parcae); their
            output e is what the loop starts from and what injection re-injects.
        n_coda: C, untied blocks applied once after the loop, before the final Norm and the LM head.
        mlp_ratio: FFN hidden width as a multiple of d_model.
        bias: Biases in linear layers.
        mlp: The FFN: "gelu" (fc2(GELU(fc1 x)), erf GELU), "gelu_tanh" (GPT-2's tanh approximation of
            GELU) or "swiglu" (a gated MLP: fc1 maps d to 2·d_ff, [gate; up], and fc2(SiLU(gate)·up):
            Huginn's GatedMLP, Llama's MLP with gate_proj and up_proj stacked) or "relu2" (fc2(½·ReLU(fc1 x)²):
            Parcae's BaseMLP with its ReLU2).
        ffn_width: The FFN's hidden width d_ff exactly (an imported model's intermediate_size); None:
            mlp_ratio·d_model.
        rope_base: Base θ of the rotary frequencies θ^(−2i/d_h) (Huginn: 50000, Llama: 10000 or its
            rope_theta); positions="rope" only.
        n_kv_heads: Key/value heads (grouped-query attention, Llama 3, TinyLlama: each serves n_heads/n_kv_heads
            query heads); None: n_heads.
        qk_bias: A learned bias on every head's queries and keys (not on the values), added before the
            rotary embedding: Huginn's qk_bias. Zero at init.
        embed_scale: Multiply the token embedding by √d_model before the prelude (Huginn).
        loop_norm: Apply the final Norm (the same weights) also to the loop's output, before the coda:
            Huginn's ln_f, used twice.
        norm_eps: The ε of the Norms in the blocks and the final Norm (Llama's rms_norm_eps); None: 1e-6 for
            RMSNorm, 1e-5 for LayerNorm.
        round_norm: End every round with the final Norm (the same weights): the next round starts from
            final_norm(x_end), and the head reads that state without norming it again (Ouro's model.norm after
            every step). Needs n_coda 0, loop_norm false and the standard parametrization.
        exit_gate: A learned exit gate Linear(d, 1) with bias on what the head reads after each round:
            λ_r = σ(gate(h_r)), the exit probability p_r = λ_r·∏_{j<r}(1 − λ_j), the last round taking the
            remainder (Ouro's early_exit_gate). Read by the exit criterion "gate" (`loopnet.model.exit`) and
            by loss_rounds "expected".
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
        sandwich: The branch between two Norms. Post-LN family: an inner Norm on the branch input,
            x ← Norm(α·x + f(Norm_in(x))) (Huginn); Pre-LN: a Norm on the branch output, x ← x +
            Norm_out(f(Norm(x))) (Ouro's input_layernorm_2 and post_attention_layernorm_2).
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
            block's attention take its query from h (K/V from the current stream). The learned
            injections start every round, round 1 included, from inj(x, e), x the stream where the
            last round ended (0 before round 1), e the loop's input: "linear" is Huginn's adapter
            W·concat[x, e] (a d×2d matrix); "diagonal" is Parcae's x·exp(−softplus(dt)·exp(A_log)) +
            softplus(dt)·B·e, a per-channel decay in (0, 1) (a contraction in x) with B = I and the
            decay √(1/5) at init. Both need inject_into="first".
        inject_into: For wiring="inject": the "first" block only (LT_i, LT_ia) or "every" block (FLT_res).
        init: Initialiser of the linear layers before β: "xavier" (DeepNet/torchscale: xavier_normal,
            gain β on V/O/fc1/fc2, gain 1 elsewhere) or "normal" (GPT-2: N(0, init_std²), then ×β on
            V/O/fc1/fc2). None: the scheme's own, "normal" for Pre-LN, "xavier" for the Post-LN
            family. Embeddings are N(0, init_std²) under both.
        init_std: Standard deviation of the normal initialisation (embeddings always; linear layers
            with init="normal").
        qk_norm: RMSNorm (with a learned gain per channel of d_h) on every head's queries and keys, before
            the rotary embedding: bounds each attention logit by √d_h·max|g_q|·max|g_k| (Huginn, Parcae).
        qk_norm_gain: qk_norm's learned gains. False: Parcae's (nanochat's) parameter-free qk-norm,
            F.rms_norm at ε = the dtype's machine epsilon; each logit is then at most √d_h. (A rotation
            keeps a head's RMS, so normalising before the rotary embedding equals Parcae's after.)
        prelude_norm: A Norm (its own gains) on the prelude's output, so that the loop's input e is
            normalised (Parcae's ln_prelude).
        loop_proj: A learned d×d matrix on the loop's output before the coda (Parcae's C, the readout of
            its dynamical system); initialised like every linear.
        value_embeds: Value embeddings (nanochat's, which Parcae keeps): of the P + K + C stored blocks,
            those whose index u (prelude, then core, then coda) has the parity of P + K + C − 1 own a
            token embedding table VE of width n_kv_heads·d_h, added to the attention's values as
            v ← v + 2·σ(W_g·x[:32])·VE(tokens), a gate per kv head from the first 32 channels of the
            attention's input (so d_model ≥ 32). Every visit of a core block reads its table.
        parametrization: How init, multipliers and per-group learning rates scale with width and depth
            (`loopnet.model.parametrization`, docs/model.md): "standard"; "mup" (μP, Yang et al. 2022: hidden
            init std ∝ 1/√fan_in, hidden Adam lr and logit multiplier ×d₀/d, hidden weight decay ×d/d₀,
            attention logits ∝ 1/d_h); "completep" (μP plus CompleteP's depth rule, Dey et al. 2025: Pre-LN
            branch multiplier (N/N₀)^-a, blocks' lrs ×(N/N₀)^(a-1), AdamW ε ×(d₀/d)(N₀/N)^a, with N =
            P + K·n_rounds + C at the mean R). Every rule is 1 at d = d₀ and N = N₀.
        mup_base_width: d₀, the width whose hyperparameters are tuned (mup and completep; n_heads divides it).
        completep_base_depth: N₀, the depth P + K·R + C whose hyperparameters are tuned (completep).
        completep_alpha: a of CompleteP's branch multiplier (N/N₀)^-a: 1 (CompleteP), 0.5 (depth-μP).
    """

    vocab_size: int = 50304
    seq_len: int = 1024
    d_model: int = 768
    n_heads: int = 12
    n_blocks: int = 2
    n_rounds: int = 6
    n_prelude: int = 0
    n_coda: int = 0
    mlp_ratio: float = 4.0
    bias: bool = False
    mlp: Mlp = "gelu"
    ffn_width: Optional[int] = None
    rope_base: float = 10000.0
    n_kv_heads: Optional[int] = None
    qk_bias: bool = False
    embed_scale: bool = False
    loop_norm: bool = False
    round_norm: bool = False
    exit_gate: bool = False
    norm_eps: Optional[float] = None
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
    qk_norm: bool = False
    qk_norm_gain: bool = True
    prelude_norm: bool = False
    loop_proj: bool = False
    value_embeds: bool = False
    parametrization: Parametrization = "standard"
    mup_base_width: Optional[int] = None
    completep_base_depth: Optional[int] = None
    completep_alpha: float = 1.0

    # Derived quantities: computed, never stored twice.
    @property
    def n_unrolled(self) -> int:
        """N = P + K·R + C, the unrolled depth: every block visit of a forward pass at the mean R."""
        return self.depth(self.n_rounds)

    def depth(self, rounds: int) -> int:
        """N = P + K·R + C at R = `rounds`."""
        return self.n_prelude + self.n_blocks * rounds + self.n_coda

    @property
    def n_visits(self) -> int:
        """M = 2N sublayer visits per forward pass."""
        return 2 * self.n_unrolled

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def has_value_embed(self, u: int) -> bool:
        """Whether stored block u (0-based: prelude, then core, then coda) owns a value embedding (`value_embeds`)."""
        return self.value_embeds and u % 2 == (self.n_prelude + self.n_blocks + self.n_coda - 1) % 2

    @property
    def kv_heads(self) -> int:
        """Key/value heads: `n_kv_heads`, or n_heads without grouped-query attention."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def d_ff(self) -> int:
        return self.ffn_width if self.ffn_width is not None else int(self.mlp_ratio * self.d_model)

    @property
    def scales(self) -> tuple[float, float]:
        """(α, β) of the training depth N (at the mean R); kept fixed when evaluating at another R'."""
        return residual_scales(self.residual, self.n_unrolled, self.p)

    @property
    def branch_epsilon(self) -> float:
        """Pre-LN's branch multiplier ε of the training depth (K, R); kept fixed when evaluating at another R'.
        Under CompleteP, (N/N₀)^-a (`parametrization.completep_epsilon`)."""
        if self.parametrization == "completep":
            return completep_epsilon(self)
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
        loss_rounds: Train on the "last" round (default), the mean over "all" rounds, over the
            "last_third" of rounds, or on the "expected" logits Σ_r p_r·logits_r under the exit gate's
            distribution (Ouro's loss with labels; needs exit_gate; the forward then returns these logits).
        checkpoint_rounds: Activation checkpointing per round, so stored activations grow with K, not K·R.
        truncate_rounds: Run the first n rounds without grad (truncated backprop through rounds), at a
            fixed R: the same as backprop_rounds = n_rounds − truncate_rounds. Give one of the two.
        round_sampling: How many rounds a training step runs: "fixed" (n_rounds every step),
            "poisson_lognormal" (Huginn's released rule: rate ~ LogNormal(log(n_rounds) − σ²/2, σ = 0.5),
            R = Poisson(rate) + 1, mean n_rounds + 1) or "poisson_truncated" (Parcae's: R =
            max(Poisson(n_rounds), 1)). Drawn from the run's seed and the global step (`round_draw`), so a
            resumed run draws the same. Evaluation runs at n_rounds.
        round_draw: Who draws a training step's rounds (`loopnet.model.rounds`): "batch" (one R for the whole
            batch; every DDP rank draws the same) or "sequence" (every sequence its own R_i, of which k_i with
            gradients and n_i = R_i − k_i without: Parcae's `recurrent_iteration_method: per-sequence`. The
            batch runs max n_i rounds without grad, then max k_i with; sequence i advances in the first n_i
            and the first k_i of them and holds its state in the rest). Needs sampled rounds, loss_rounds
            "last", scales_depth "mean" and a wiring whose blocks do not read the previous round (not flt,
            nor inject by attention or into every block).
        backprop_rounds: The last this-many rounds of a step get gradients, the earlier ones run
            without (Huginn's mean backprop depth; memory grows with it, not with the drawn R). None:
            every round, less `truncate_rounds`.
        max_rounds: Cap on a drawn R (None: 2·n_rounds with sampling); the diagnostics' TensorBoard
            layout has a category per round up to it.
        round_curriculum_steps: Ramp the mean rounds run without gradient linearly from 0 up to
            n_rounds − backprop_rounds over this many steps (Parcae's linear "forward" curriculum); 0: none.
        state_init: With a learned injection, the state x that round 1 injects into: "zero" (loopnet's
            default, deterministic) or "random" (Huginn's "like-init": a fresh draw per forward pass,
            truncated normal N(0, init_std²) cut at ±3·init_std, times √d_model with embed_scale). A run
            setting: a model trained from one may be evaluated from the other.
        scales_depth: The N of α and β with sampled rounds: "mean" (α, β of N at n_rounds: Parcae
            initialises from the expected depth) or "sampled" (α of each step's drawn N; β stays its
            initialisation at the mean N).
        round_sigma: σ of poisson_lognormal's log-normal rate (Huginn's 0.5); μ = log(n_rounds) − σ²/2 keeps
            its mean at n_rounds.
        exit_kl: With loss_rounds "expected", the coefficient β of the exit distribution's KL to the uniform
            prior over the R rounds run, KL(p ‖ U_R) = Σ_r p_r·log p_r + log R averaged over tokens, added to
            the training loss (Ouro's prior over exit steps; β·KL = β·(log R − H(p)), so it rewards spread
            exits); 0: none. Logged as train/exit_kl.
    """

    dropout: float = 0.0
    loss_rounds: LossRounds = "last"
    checkpoint_rounds: bool = False
    truncate_rounds: int = 0
    round_sampling: RoundSampling = "fixed"
    round_draw: RoundDrawUnit = "batch"
    backprop_rounds: Optional[int] = None
    max_rounds: Optional[int] = None
    round_curriculum_steps: int = 0
    scales_depth: ScalesDepth = "mean"
    state_init: StateInit = "zero"
    round_sigma: float = 0.5
    exit_kl: float = 0.0


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
        sizes = {
            "vocab_size": "the token ids, e.g. 50304",
            "seq_len": "the context length in tokens, e.g. 256",
            "d_model": "the width, e.g. 128",
            "n_heads": "e.g. 4",
            "n_blocks": "K, e.g. 2",
            "n_rounds": "R, e.g. 6; R < 1 runs no round",
        }
        for name, example in sizes.items():
            if getattr(self, name) < 1:
                raise ValueError(
                    f"LoopConfig.{name} must be >= 1, got {getattr(self, name)}; "
                    f"fix: set model.config.{name} to a positive integer ({example})"
                )
        if self.d_model % self.n_heads:
            raise ValueError(
                f"LoopConfig.d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                f"fix: pick n_heads among the divisors of d_model"
            )
        if self.positions == "rope" and self.head_dim % 2:
            raise ValueError(
                f"positions='rope' needs an even head dimension, got d_model/n_heads={self.head_dim}; "
                f"fix: pick n_heads so that d_model/n_heads is even, or positions: learned"
            )
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
        for name in ("n_prelude", "n_coda", "round_curriculum_steps"):
            if getattr(self, name) < 0:
                raise ValueError(
                    f"LoopConfig.{name} must be >= 0, got {getattr(self, name)}; "
                    f"fix: set model.config.{name} to 0 or a positive integer"
                )
        if self.injection in ("linear", "diagonal") and (self.wiring != "inject" or self.inject_into != "first"):
            raise ValueError(
                f"LoopConfig.injection={self.injection!r} starts each round from inj(x, e); it needs "
                f"wiring='inject' and inject_into='first'; fix: set model.config.wiring: inject and "
                f"model.config.inject_into: first"
            )
        if self.ffn_width is not None and self.ffn_width < 1:
            raise ValueError(
                f"LoopConfig.ffn_width={self.ffn_width} must be >= 1; fix: give the FFN's hidden width, "
                f"or null for mlp_ratio·d_model"
            )
        if self.n_kv_heads is not None and (self.n_kv_heads < 1 or self.n_heads % self.n_kv_heads):
            raise ValueError(
                f"LoopConfig.n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads}; fix: give a "
                f"divisor of n_heads, or null (no grouped-query attention)"
            )
        if self.qk_bias and self.kv_heads != self.n_heads:
            raise ValueError(
                "LoopConfig.qk_bias has a key bias per query head; it needs n_kv_heads null; fix: drop one of them"
            )
        if self.norm_eps is not None and not self.norm_eps > 0:
            raise ValueError(f"LoopConfig.norm_eps={self.norm_eps} must be > 0; fix: give e.g. 1e-5, or null")
        if self.state_init != "zero" and self.injection not in ("linear", "diagonal"):
            raise ValueError(
                f"LoopConfig.state_init={self.state_init!r} is the state a learned injection starts from; "
                f"fix: set model.config.injection: linear (or diagonal), or state_init: zero"
            )
        if self.backprop_rounds is not None and self.backprop_rounds < 1:
            raise ValueError(
                f"LoopConfig.backprop_rounds={self.backprop_rounds} must be >= 1 (or null: every round); "
                f"fix: give the number of final rounds that get gradients, e.g. 2"
            )
        sampled = self.round_sampling != "fixed"
        if self.backprop_rounds is not None and self.truncate_rounds:
            if sampled or self.n_rounds - self.truncate_rounds != self.backprop_rounds:
                raise ValueError(
                    f"LoopConfig.backprop_rounds={self.backprop_rounds} and truncate_rounds={self.truncate_rounds} "
                    f"disagree (backprop_rounds = n_rounds - truncate_rounds at a fixed R; sampled R takes "
                    f"backprop_rounds only); fix: give one of them, e.g. remove model.config.truncate_rounds"
                )
        if self.max_rounds is not None and self.max_rounds < self.n_rounds:
            raise ValueError(
                f"LoopConfig.max_rounds={self.max_rounds} is below the mean n_rounds={self.n_rounds}; "
                f"fix: give max_rounds >= n_rounds (e.g. {2 * self.n_rounds}) or null"
            )
        if not sampled and (self.round_curriculum_steps or self.scales_depth != "mean"):
            raise ValueError(
                "LoopConfig.round_curriculum_steps and scales_depth='sampled' act on sampled rounds; "
                "fix: set model.config.round_sampling (poisson_lognormal or poisson_truncated) or remove them"
            )
        if self.round_draw == "sequence":
            if not sampled:
                raise ValueError(
                    "LoopConfig.round_draw='sequence' draws each sequence's rounds, but round_sampling='fixed' "
                    "draws none; fix: set model.config.round_sampling (poisson_truncated, Parcae's, or "
                    "poisson_lognormal), or round_draw: batch"
                )
            if self.scales_depth != "mean":
                raise ValueError(
                    "LoopConfig.scales_depth='sampled' gives a step the α of its one drawn depth; with "
                    "round_draw='sequence' every sequence has its own; fix: set model.config.scales_depth: mean, "
                    "or round_draw: batch"
                )
            problem = self.sequence_rounds_problem()
            if problem:
                raise ValueError(f"LoopConfig.round_draw='sequence': {problem}, or round_draw: batch")
        if self.backprop_rounds is not None and self.backprop_rounds > self.n_rounds:
            raise ValueError(
                f"LoopConfig.backprop_rounds={self.backprop_rounds} exceeds n_rounds={self.n_rounds}; "
                f"fix: give at most n_rounds (every round then gets gradients)"
            )
        if self.round_sigma < 0:
            raise ValueError(f"LoopConfig.round_sigma={self.round_sigma} must be >= 0; fix: give e.g. 0.5 (Huginn's)")
        if self.value_embeds and self.d_model < 32:
            raise ValueError(
                f"LoopConfig.value_embeds gates from the first 32 channels, but d_model={self.d_model}; "
                f"fix: give d_model >= 32 or value_embeds: false"
            )
        if self.n_coda and self.loss_rounds != "last":
            raise ValueError(
                f"LoopConfig.loss_rounds={self.loss_rounds!r} with a coda would run the coda once per loss "
                f"round; fix: set model.config.loss_rounds: last, or n_coda: 0"
            )
        truncated = self.backprop_rounds is not None or self.truncate_rounds > 0
        if self.n_prelude and truncated and self.wiring in ("carry", "lt"):
            raise ValueError(
                f"LoopConfig.wiring={self.wiring!r} feeds the prelude's output into round 1 only, which "
                f"runs without grad when rounds are truncated: the prelude would get no gradient; fix: "
                f"set model.config.wiring: inject (the prelude's output re-enters every round)"
            )
        if self.round_norm and (self.n_coda or self.loop_norm or self.parametrization != "standard"):
            raise ValueError(
                "LoopConfig.round_norm ends every round in the final Norm that the head reads; it needs n_coda 0, "
                "loop_norm false and parametrization standard; fix: drop round_norm or those settings"
            )
        if self.exit_kl < 0 or (self.exit_kl and self.loss_rounds != "expected"):
            raise ValueError(
                f"LoopConfig.exit_kl={self.exit_kl} is the coefficient of the exit distribution's KL to the uniform "
                f"prior with loss_rounds 'expected' (got {self.loss_rounds!r}); fix: give exit_kl >= 0 with "
                "loss_rounds: expected, or exit_kl: 0"
            )
        if self.loss_rounds == "expected" and not self.exit_gate:
            raise ValueError(
                "LoopConfig.loss_rounds='expected' weighs the rounds by the exit gate's distribution; "
                "fix: set model.config.exit_gate: true, or another loss_rounds"
            )
        if self.branch_scale != "one" and self.residual != "preln":
            raise ValueError(
                f"LoopConfig.branch_scale={self.branch_scale!r} scales the Pre-LN branch only; "
                f"fix: set model.config.residual: preln, or branch_scale: one for residual={self.residual!r}"
            )
        if self.parametrization != "completep" and self.completep_alpha != 1.0:
            raise ValueError("LoopConfig.completep_alpha belongs to parametrization completep; fix: remove it")
        check_parametrization(self)
        try:
            self.branch_epsilon
        except ValueError as err:
            raise ValueError(f"LoopConfig: {err}") from None

    @property
    def round_cap(self) -> int:
        """The most rounds a training step runs: n_rounds when fixed, else `max_rounds` (default 2·n_rounds)."""
        if self.round_sampling == "fixed":
            return self.n_rounds
        return self.max_rounds if self.max_rounds is not None else 2 * self.n_rounds

    def sequence_rounds_problem(self) -> str | None:
        """Why this model cannot run a round count per sequence (`LoopedTransformer.iter_rounds` with a
        tensor of rounds), or None. A sequence whose rounds all get gradients starts after the batch's
        rounds without grad, and its first round must be a round 1 for it alone: that holds where only
        the round's start (`round_start`) tells round 1 from the others, not where the blocks read the
        previous round's h; the loss is read after the last round only."""
        if self.wiring == "flt" or (
            self.wiring == "inject" and (self.injection == "attention" or self.inject_into == "every")
        ):
            how = "flt" if self.wiring == "flt" else f"inject (injection={self.injection!r}, {self.inject_into!r})"
            return (
                f"wiring={how} hands the previous round's state to the blocks, which a sequence's own round 1 "
                f"must not see; fix: choose wiring carry or lt, or inject into the first block by add, linear "
                f"or diagonal"
            )
        if self.loss_rounds != "last":
            return (
                f"loss_rounds={self.loss_rounds!r} reads rounds that differ between the sequences; "
                f"fix: set model.config.loss_rounds: last"
            )
        return None

    def grad_rounds(self, rounds: int) -> int:
        """How many of a pass's last rounds get gradients when it runs `rounds` rounds in training:
        `backprop_rounds`, or every round less `truncate_rounds` (at least one)."""
        if self.backprop_rounds is not None:
            return min(self.backprop_rounds, rounds)
        return max(rounds - self.truncate_rounds, 1)

    def architecture(self) -> dict:
        """The architecture's fields and values: what a checkpoint must match."""
        return {f.name: getattr(self, f.name) for f in fields(Architecture)}
