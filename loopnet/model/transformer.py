"""LoopedTransformer: P prelude blocks, K physical blocks applied for R rounds, C coda blocks, with
the residual schemes, loop wirings and injections of `LoopConfig`.

Notation (DeepLoop / loopnet): K physical blocks, R rounds, N = P + K·R + C unrolled depth (P = C = 0:
the seed papers' N = K·R). The FLT paper calls the loop count K; here it is R. With e = the prelude's
output (the embedding itself when P = 0) and Norm the parameter-free RMSNorm used between rounds:

    e = prelude(embedding(tokens))
    round 1 starts from x0 = e, or Norm(e) with `input_norm` (the FLT code's choice)
    carry:   round r+1 starts from the stream x_end where round r ended (DeepLoop)
    lt:      round r+1 starts from h = Norm(x_end) (the FLT code's LT)
    inject:  h enters round r+1: "add" into the first block starts it from Norm(e + h) (LT_i),
             "add" into every block restarts from x0 and does x ← Norm(x + h) before each (FLT_res),
             "attention" restarts from x0 and the first (or every) block's attention takes its
             query from h (LT_ia); round 1 is plain self-attention
    flt:     restart from x0, inject by attention into every block (Fully Looped Transformer)
    inject with a learned injection ("linear", "diagonal"): every round, round 1 included, starts from
             inj(x_end, x0), x_end = 0 before round 1 (`loopnet.model.injection`)

Logits come from LM_head(Norm_final(coda(x_end))). α and β always belong to the *training* depth
N = P + K·config.n_rounds + C, also when `forward(..., rounds=R')` runs another round count; with
sampled rounds and scales_depth "sampled" a training step passes α of its drawn depth (`alpha=`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .config import LoopConfig
from .injection import make_injection
from .kernels import LinearCrossEntropy, z_loss_term
from .layers import Block, QKVLinear, Rotary, make_norm, unit_rms
from .parametrization import hidden_init_gain, logit_multiplier
from .rounds import check_sequence_rounds, sequence_grad_rounds, sequence_layout
from .scales import BETA_SCALED
from .visits import SUBLAYERS, Visit, VisitObserver

if TYPE_CHECKING:
    from loopnet.generate import Generation

    from .cache import KVCache


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in fp32; targets of -1 are ignored. The one loss formula of
    training and evaluation."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-1)


class LoopedTransformer(nn.Module):
    def __init__(self, config: LoopConfig):
        super().__init__()
        self.config = cfg = config
        self.alpha, self.beta = cfg.scales
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.seq_len, cfg.d_model) if cfg.positions == "learned" else None
        self.rotary = Rotary(cfg.head_dim, cfg.seq_len, cfg.rope_base) if cfg.positions == "rope" else None
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_blocks))
        # Untied blocks before and after the loop; none by default (the state dict then has no such keys).
        if cfg.n_prelude:
            self.prelude = nn.ModuleList(Block(cfg) for _ in range(cfg.n_prelude))
        if cfg.n_coda:
            self.coda = nn.ModuleList(Block(cfg) for _ in range(cfg.n_coda))
        self.injection = make_injection(cfg.injection, cfg.d_model, cfg.bias)  # None for add / attention
        # Parcae's ln_prelude on the loop's input, C on the loop's output, value embeddings in some blocks.
        self.prelude_norm = make_norm(cfg) if cfg.prelude_norm else None
        self.loop_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias) if cfg.loop_proj else None
        for u, block in enumerate([*self.prelude_blocks, *self.blocks, *self.coda_blocks]):
            if cfg.has_value_embed(u):
                block.attn.f.add_value_embed(cfg.vocab_size, cfg.head_dim)
                block.attn.param_names = [name for name, _ in block.attn.named_parameters()]  # per-visit views
        self.final_norm = make_norm(cfg, logit_multiplier(cfg))  # μP's logit multiplier d₀/d rides on its output
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.exit_gate = nn.Linear(cfg.d_model, 1) if cfg.exit_gate else None  # Ouro's learned exit
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self.observer: VisitObserver | None = None
        # z-loss coefficient c: the training loss adds c·mean((log Z)²) (set from `OptimConfig.z_loss`); after a
        # forward with targets, `z_term` holds the mean (log Z)² of its loss rounds (detached), else None.
        self.z_loss = 0.0
        self.z_term: torch.Tensor | None = None
        self._head_z: torch.Tensor | None = None  # the last head evaluation's mean (log Z)², with z-loss on
        self.exit_kl_term: torch.Tensor | None = None  # KL(p ‖ U_R) of the last expected loss, with exit_kl on
        self._compiled_head = None
        # Counted once, whole: under FSDP the parameters are later shards (flops_per_token reads these).
        self._block_numel = sum(p.numel() for p in self.blocks[0].parameters())
        self._injection_matmul = {"linear": 2 * cfg.d_model**2, "diagonal": cfg.d_model**2}.get(cfg.injection, 0)
        self._head_numel = self.lm_head.weight.numel()
        self.reset_parameters()

    # ----------------------------------------------------------------------------- init
    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Initialise, then W = β·W̃ for the DeepNorm set (value, output, fc1, fc2) only. β is
        applied here once and never again at run time.

        init="xavier" (DeepNet, torchscale): every linear W̃ ~ xavier_normal (std √(2/(fan_in+fan_out))),
        so W = xavier_normal with gain β on V/O/fc1/fc2 and gain 1 on Q, K and an untied head.
        init="normal" (GPT-2): every linear W̃ ~ N(0, init_std²). Embeddings are N(0, init_std²).
        Under μP the hidden matrices' (the blocks' and the linear injection's, not an untied head's) normal std
        is init_std·√(d₀/d) (`parametrization.hidden_init_gain`)."""
        cfg = self.config
        hidden_gain = hidden_init_gain(cfg)
        for name, module in self.named_modules():
            if module is self.lm_head and cfg.tie_embeddings:
                continue  # its weight is the embedding's
            if isinstance(module, nn.Linear):
                # The fused QKV projection's parts are matrices of their own, initialised in the order
                # the separate projections were (same draws from a seed) and scaled by β or not by name.
                parts = module.parts() if isinstance(module, QKVLinear) else {name.rsplit(".", 1)[-1]: module.weight}
                for part, weight in parts.items():
                    if cfg.init_scheme == "xavier":
                        nn.init.xavier_normal_(weight)
                    else:
                        nn.init.normal_(weight, 0.0, cfg.init_std * (1.0 if module is self.lm_head else hidden_gain))
                    if part in BETA_SCALED:
                        weight.mul_(self.beta)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, 0.0, cfg.init_std)
            elif isinstance(module, (nn.RMSNorm, nn.LayerNorm)) or hasattr(module, "decay_stats"):
                module.reset_parameters()  # norms' gains 1; the diagonal injection's own init

    @property
    def prelude_blocks(self) -> list[Block]:
        return list(self.prelude) if self.config.n_prelude else []

    @property
    def coda_blocks(self) -> list[Block]:
        return list(self.coda) if self.config.n_coda else []

    def num_params(self, non_embedding: bool = True) -> int:
        """Stored parameters (independent of R); minus the position table if `non_embedding`."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and self.wpe is not None:
            n -= self.wpe.weight.numel()
        return n

    def flops_per_token(
        self,
        seq_len: int | None = None,
        rounds: int | None = None,
        training: bool = True,
        grad_rounds: int | None = None,
    ) -> float:
        """Model FLOPs per token, PaLM/nanoGPT style, counting every visit: a forward pass costs
        2·params + 4·d·T (attention scores and mixing) per block visit (prelude, loop and coda alike),
        2·matrix params per learned injection and 2·head_params per LM-head evaluation; training adds
        backward (2× forward) for the prelude, the coda and the `grad_rounds` last rounds that get
        gradients (default `LoopConfig.grad_rounds`), not for those run without grad, and evaluates the
        head once per loss round. Evaluation (`training=False`) is one forward with one head."""
        cfg = self.config
        R, T = rounds or cfg.n_rounds, seq_len or cfg.seq_len
        block, head = self._block_numel, self._head_numel
        per_block = 2.0 * block + 4.0 * cfg.d_model * T  # forward of one block visit
        per_round = cfg.n_blocks * per_block + 2.0 * self._injection_matmul  # forward of one round
        untied = (cfg.n_prelude + cfg.n_coda) * per_block
        if not training:
            return untied + R * per_round + 2.0 * head
        k = cfg.grad_rounds(R) if grad_rounds is None else grad_rounds
        heads = len(self.loss_round_indices(R))
        return 3.0 * untied + 3.0 * k * per_round + (R - k) * per_round + 6.0 * head * heads

    # ----------------------------------------------------------------------------- compile
    def compile(self, *args, **kwargs) -> None:
        """`torch.compile` each physical sublayer and the head (final Norm, LM head, loss) once.

        A sublayer's graph takes its parameters as inputs, so one attention graph and one FFN graph
        serve every block, every round and any R' (plus one for the head): compile time does not
        grow with R and nothing recompiles per round. The loop over rounds stays in Python, where
        activation checkpointing per round and the visit observers keep working unchanged.
        Arguments are those of `torch.compile`."""
        # All sublayers share one code object (Module._call_impl), so its graph variants (attn/ffn,
        # train/eval, with visit observers, query injection) count against one recompile limit.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        for block in [*self.prelude_blocks, *self.blocks, *self.coda_blocks]:
            block.attn.compile(*args, **kwargs)
            block.ffn.compile(*args, **kwargs)
        self._compiled_head = torch.compile(self._head, *args, **kwargs)

    def _head(self, x: torch.Tensor, targets: torch.Tensor | None):
        """(logits, loss, mean (log Z)² or None) of the final state x: with targets, the loss is their
        cross-entropy plus the z-loss c·mean((log Z)²) when c = `self.z_loss` > 0. Training in fp32 eager
        takes the loss through `LinearCrossEntropy` (the same numbers, fewer passes over the N×V
        logits), which returns the logits without grad: the loss carries the gradient."""
        h = self.head_input(x)
        weight = self.lm_head.weight
        if (
            targets is not None
            and torch.is_grad_enabled()
            and (h.requires_grad or weight.requires_grad)
            and h.dtype == weight.dtype == torch.float32
            and not torch.is_autocast_enabled(h.device.type)
            and not torch.compiler.is_compiling()
        ):  # compiled, inductor fuses the loss itself
            loss, logits, *z = LinearCrossEntropy.apply(h.flatten(0, 1), weight, targets.flatten(), self.z_loss)
            return logits.view(*h.shape[:-1], -1), loss, (z[0] if z else None)
        logits = self.lm_head(h)
        if targets is None:
            return logits, None, None
        loss, z = lm_loss(logits, targets), None
        if self.z_loss:
            z = z_loss_term(logits, targets)
            loss = loss + self.z_loss * z
        return logits, loss, z

    # ----------------------------------------------------------------------------- probes
    def attach_observer(self, observer: VisitObserver | None) -> None:
        """Let `observer.on_visit(visit, trace)` see every visit of the next forward passes.
        While attached, each visit reads its weights through its own views (per-visit gradients)
        and `checkpoint_rounds` is bypassed so hooks see one forward. A block checkpointed as a whole
        (Lightning's activation_checkpointing_policy) runs its forward again in the backward, but the
        observer sees the first only: the model hands it the traces the block returns. An attention
        visit's trace carries its queries and keys (`VisitTrace.qk`). An observer with an
        ``on_logits(round, logits)`` method also sees the logits of every head evaluation. None detaches."""
        self.observer = observer

    def _block(
        self, r: int, k: int, block: Block, x, q_src, alpha: float, part: str = "loop", kv: KVCache | None = None
    ):
        """Block k's visits of round r (of the prelude or coda: `part`, r = 0): one call of the block
        (FSDP's unit, checkpointed as one), whose two sublayer visits the observer, when attached, then
        sees in order. With `kv` (a cached generation) its attention reads and extends the cache of this
        visit: ("core", r, k) in the loop, (part, k) in the prelude or coda."""
        if kv is not None:
            slot = kv.slot(("core", r, k) if part == "loop" else (part, k))
            return block(x, alpha, q_src, self.rotary, kv=slot)
        if self.observer is None:
            return block(x, alpha, q_src, self.rotary)
        x, traces = block(x, alpha, q_src, self.rotary, observe=True)
        for sublayer, trace in zip(SUBLAYERS, traces):
            self.observer.on_visit(Visit(r, k, sublayer, part), trace)
        return x

    # ----------------------------------------------------------------------------- forward
    def embed(
        self,
        idx: torch.Tensor,
        alpha: float | None = None,
        positions: torch.Tensor | None = None,
        kv: KVCache | None = None,
    ) -> torch.Tensor:
        """e: the token (and learned position) embedding, dropout, then the prelude blocks. A cached
        generation passes the tokens' `positions` [B, T] (default 0..T-1) and its cache."""
        T = idx.size(1)
        if T > self.config.seq_len:
            raise ValueError(
                f"sequence length {T} exceeds the position table (LoopConfig.seq_len={self.config.seq_len}); "
                f"shorten the input or train with a larger seq_len"
            )
        e = self.wte(idx)
        if self.config.value_embeds:  # the tokens every visit's value embedding reads in this pass
            for block in [*self.prelude_blocks, *self.blocks, *self.coda_blocks]:
                if block.attn.f.value_embed is not None:
                    block.attn.f.tokens = idx
        if self.config.embed_scale:
            e = e * math.sqrt(self.config.d_model)
        if self.wpe is not None:
            e = e + self.wpe(torch.arange(T, device=idx.device) if positions is None else positions)
        e = self.drop(e)
        for p, block in enumerate(self.prelude_blocks, start=1):
            e = self._block(0, p, block, e, None, self.alpha if alpha is None else alpha, "prelude", kv)
        return e if self.prelude_norm is None else self.prelude_norm(e)

    def round(self, r: int, x, h, alpha: float, kv: KVCache | None = None):
        """Round r (1-based) of the loop: its K blocks from the round's start x (`round_start`), with
        h = Norm(x_end of round r-1) (None in round 1) for the wirings that inject it, at skip scale
        `alpha`; returns x_end of round r. `iter_rounds` runs it for every round; with `round_start` it
        is the round map x_{r-1} -> x_r (`loopnet.diagnostics.fixed_point.round_map`)."""
        cfg = self.config
        injecting = h is not None and cfg.wiring in ("inject", "flt")
        attention_inject = cfg.wiring == "flt" or cfg.injection == "attention"
        every = cfg.wiring == "flt" or cfg.inject_into == "every"
        for k, block in enumerate(self.blocks, start=1):
            q_src = None
            if injecting and (every or k == 1):
                if attention_inject:
                    q_src = h
                elif every:  # FLT_res; LT_i injected at the round's start (`round_start`)
                    x = unit_rms(x + h)
            x = self._block(r, k, block, x, q_src, alpha, "loop", kv)
        return self.final_norm(x) if cfg.round_norm else x

    def round_start(self, r: int, e, x0, x, h):
        """Where round r starts: with a learned injection inj(x_end, x0) (x_end = 0 before round 1);
        otherwise x0 (the round-1 input) in round 1, then, by wiring, the stream x_end itself (carry),
        h = Norm(x_end) (lt), Norm(e + h) (LT_i, as the FLT code has it), or x0."""
        cfg = self.config
        if self.injection is not None:
            return self.injection(self._initial_state(x0) if r == 1 else x, x0)
        if r == 1 or cfg.wiring == "flt":
            return x0
        if cfg.wiring == "carry":
            return x
        if cfg.wiring == "lt":
            return h
        if cfg.injection == "add" and cfg.inject_into == "first":
            return unit_rms(e + h)
        return x0

    def _initial_state(self, x0: torch.Tensor) -> torch.Tensor:
        """The state round 1's learned injection reads (`LoopConfig.state_init`): zeros, or Huginn's draw (the
        same calls in the same order, so that a seeded run draws Huginn's numbers)."""
        cfg = self.config
        if cfg.state_init == "zero":
            return torch.zeros_like(x0)
        std = cfg.init_std
        state = nn.init.trunc_normal_(torch.randn_like(x0), 0.0, std, -3 * std, 3 * std)
        return state * math.sqrt(cfg.d_model) if cfg.embed_scale else state

    def loss_round_indices(self, rounds: int) -> range:
        """Rounds (1-based) whose logits enter the loss."""
        mode = self.config.loss_rounds
        if mode in ("all", "expected"):
            return range(1, rounds + 1)
        if mode == "last_third":
            return range(rounds - max(1, math.ceil(rounds / 3)) + 1, rounds + 1)
        return range(rounds, rounds + 1)

    def round_plan(
        self,
        idx: torch.Tensor,
        rounds: int | torch.Tensor | None = None,
        grad_rounds: int | torch.Tensor | None = None,
        kv: KVCache | None = None,
    ) -> tuple[int, int, torch.Tensor | None]:
        """(R, no_grad, active) of a pass of `iter_rounds`: the rounds it runs, how many of the first run
        without grad, and with per-sequence `rounds` the [R, B] bool (CPU) mask of the sequences that advance
        in each round (`loopnet.model.rounds.sequence_layout`); None when every sequence runs every round."""
        cfg = self.config
        if not torch.is_tensor(rounds):
            R = cfg.n_rounds if rounds is None else rounds
            if R < 1:
                raise ValueError(f"rounds must be >= 1, got {R}")
            return R, R - (cfg.grad_rounds(R) if grad_rounds is None else grad_rounds), None
        problem = cfg.sequence_rounds_problem()
        if problem:
            raise ValueError(f"rounds per sequence: {problem}")
        if kv is not None:
            raise ValueError("a cached generation runs one round count for every sequence; fix: give rounds as an int")
        check_sequence_rounds(rounds, grad_rounds, idx.size(0))
        rounds = rounds.cpu()
        grad_rounds = sequence_grad_rounds(cfg, rounds) if grad_rounds is None else grad_rounds.cpu()
        no_grad, active = sequence_layout(rounds, grad_rounds)
        return active.size(0), no_grad, active

    def iter_rounds(
        self,
        idx: torch.Tensor,
        rounds: int | torch.Tensor | None = None,
        grad_rounds: int | torch.Tensor | None = None,
        alpha: float | None = None,
        *,
        positions: torch.Tensor | None = None,
        kv: KVCache | None = None,
        start: bool = False,
    ):
        """Run the prelude and the loop on token ids `idx`, yielding (r, x_end of round r) for r = 1..R'.
        The one loop of the model: `forward`, `generate` and the update-size diagnostic read it. In training
        only the last `grad_rounds` rounds (default `LoopConfig.grad_rounds(R')`) get gradients; `alpha`
        replaces the skip scale α of every visit (default: α of the training N). A cached generation
        passes the new tokens' `positions` [B, T] and its `kv` cache; `start` first yields (0, x0), the
        round-1 input.

        Per sequence (`round_draw` "sequence"), `rounds` and `grad_rounds` are [B] integer tensors R_i and
        k_i (default k_i = `LoopConfig.grad_rounds(R_i)`): the pass runs n = max(R_i − k_i) rounds without
        grad, then max k_i with, and sequence i advances in the first R_i − k_i of the n and the first k_i
        of the rest, its state unchanged in the others (`round_plan`). A sequence with no round without
        grad (n > 0) takes round n + 1 as its own round 1, started as round 1 starts. Round r yields the
        batch's state after pass round r; the last is every sequence's state after its own R_i rounds."""
        cfg = self.config
        R, no_grad, active = self.round_plan(idx, rounds, grad_rounds, kv)
        alpha = self.alpha if alpha is None else alpha
        e = self.embed(idx, alpha, positions, kv)
        x0 = unit_rms(e) if cfg.input_norm else e
        if start:
            yield 0, x0
        use_ckpt = cfg.checkpoint_rounds and self.observer is None and torch.is_grad_enabled() and kv is None
        reads_h = cfg.wiring != "carry" and self.injection is None
        masks, late = [None] * R, None  # per round: where the state advances ([B, 1, 1]), None: everywhere
        if active is not None:
            masks = [None if a.all() else a.to(x0.device)[:, None, None] for a in active]
            starts_late = ~active[:no_grad].any(0)  # no round without grad: round no_grad + 1 is its round 1
            late = starts_late.to(x0.device)[:, None, None] if no_grad and starts_late.any() else None
        x, h = x0, None
        for r in range(1, R + 1):
            if r > 1 and reads_h:  # h = Norm(x_end): only for a next round whose wiring reads it
                h = unit_rms(x)
            with torch.set_grad_enabled(torch.is_grad_enabled() and r > no_grad):
                begin = self.round_start(r, e, x0, x, h)
                if late is not None and r == no_grad + 1:
                    begin = torch.where(late, self.round_start(1, e, x0, x0, None), begin)
                if use_ckpt and r > no_grad:
                    new = checkpoint(self.round, r, begin, h, alpha, use_reentrant=False)
                else:
                    new = self.round(r, begin, h, alpha, kv)
                x = new if masks[r - 1] is None else torch.where(masks[r - 1], new, x)
            yield r, x

    def head(
        self,
        x: torch.Tensor,
        targets: torch.Tensor | None = None,
        alpha: float | None = None,
        kv: KVCache | None = None,
    ):
        """(logits, loss or None) of a loop state x: the coda (skip scale `alpha`, default α), then the
        final Norm, LM head and loss, compiled with the model. `kv`: a cached generation's (the coda's)."""
        head = self._head if self._compiled_head is None else self._compiled_head
        logits, loss, self._head_z = head(self.finish(x, alpha, kv), targets)  # z: `forward` reads it for `z_term`
        return logits, loss

    def head_input(self, x: torch.Tensor) -> torch.Tensor:
        """What the LM head reads of a final state x: final_norm(x), or x itself with `round_norm` (the round
        ended in the final Norm)."""
        return x if self.config.round_norm else self.final_norm(x)

    def exit_lambda(self, x: torch.Tensor) -> torch.Tensor:
        """λ = σ(gate(h)) [...] in fp32 of a round's state x (`exit_gate`, on what the head reads): the
        probability of exiting at this round, given that no earlier round exited."""
        if self.exit_gate is None:
            raise ValueError("this model has no exit gate (LoopConfig.exit_gate); fix: choose another exit criterion")
        return torch.sigmoid(self.exit_gate(self.head_input(x)).squeeze(-1).float())

    def finish(self, x: torch.Tensor, alpha: float | None = None, kv: KVCache | None = None) -> torch.Tensor:
        """The coda blocks on a loop state x (x itself without a coda), after the final Norm with `loop_norm`;
        `kv`: a cached generation's."""
        alpha = self.alpha if alpha is None else alpha
        if self.config.loop_norm:
            x = self.final_norm(x)
        if self.loop_proj is not None:
            x = self.loop_proj(x)
        for c, block in enumerate(self.coda_blocks, start=1):
            x = self._block(0, c, block, x, None, alpha, "coda", kv)
        return x

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        rounds: int | torch.Tensor | None = None,
        grad_rounds: int | torch.Tensor | None = None,
        alpha: float | None = None,
    ):
        """Return (logits of the last round, loss or None). `rounds` = R' ≥ 1 evaluates the same
        weights at another round count (α, β stay those of the training N); `rounds` and `grad_rounds` per
        sequence, and `alpha`: see `iter_rounds` (a training step with sampled rounds passes its draw)."""
        per_sequence = torch.is_tensor(rounds)
        R = self.config.n_rounds if rounds is None else rounds
        if per_sequence:  # the pass's rounds; the loss reads its last
            R = self.round_plan(idx, rounds, grad_rounds)[0]
        if self.config.loss_rounds == "expected":
            return self._expected(idx, targets, R, grad_rounds, alpha)
        loss_rounds = self.loss_round_indices(R) if targets is not None else range(R, R + 1)
        losses, logits, z_terms = [], None, []
        for r, x in self.iter_rounds(idx, rounds if per_sequence else R, grad_rounds, alpha):
            if r in loss_rounds:
                logits, loss = self.head(x, targets, alpha)
                if self._head_z is not None:
                    z_terms.append(self._head_z.detach())
                if self.observer is not None and hasattr(self.observer, "on_logits"):
                    self.observer.on_logits(r, logits)
                if loss is not None:
                    losses.append(loss)
        self.z_term = torch.stack(z_terms).mean() if z_terms else None
        if not losses:
            return logits, None
        # One loss round (the default): the loss itself, no stack and mean to run forward and back.
        return logits, losses[0] if len(losses) == 1 else torch.stack(losses).mean()

    def _expected(self, idx, targets, R: int, grad_rounds: int | None, alpha: float | None):
        """(Σ_r p_r·logits_r, its loss or None): the logits of every round weighted by the exit gate's
        distribution p_r = λ_r·∏_{j<r}(1 − λ_j), the last round taking the remainder (loss_rounds "expected").
        With targets and `exit_kl` = β > 0 the loss adds β·mean over tokens of KL(p ‖ U_R) = Σ_r p_r·log p_r +
        log R (Ouro's uniform prior over exit steps); `exit_kl_term` then holds that KL (detached)."""
        expected, remaining, z_terms, probs = None, None, [], []
        for r, x in self.iter_rounds(idx, R, grad_rounds, alpha):
            logits = self.lm_head(self.head_input(x))
            if self.observer is not None and hasattr(self.observer, "on_logits"):
                self.observer.on_logits(r, logits)
            lam = self.exit_lambda(x)
            remaining = torch.ones_like(lam) if remaining is None else remaining
            p = remaining if r == R else lam * remaining
            remaining = remaining * (1 - lam)
            probs.append(p)
            term = logits * p[..., None].to(logits.dtype)
            expected = term if expected is None else expected + term
        loss, self.exit_kl_term = None, None
        if targets is not None:
            loss = lm_loss(expected, targets)
            if self.z_loss:
                z = z_loss_term(expected, targets)
                z_terms.append(z.detach())
                loss = loss + self.z_loss * z
            if self.config.exit_kl:
                p = torch.stack(probs, dim=-1)  # [B, T, R], fp32 (exit_lambda's)
                kl = (torch.xlogy(p, p).sum(-1) + math.log(R)).mean()  # xlogy: 0·log 0 = 0
                self.exit_kl_term = kl.detach()
                loss = loss + self.config.exit_kl * kl
        self.z_term = torch.stack(z_terms).mean() if z_terms else None
        return expected, loss

    # ----------------------------------------------------------------------------- generate
    def generate(self, prompts: torch.Tensor | Sequence[Sequence[int]], max_new_tokens: int, **kwargs) -> Generation:
        """Continue `prompts` by up to `max_new_tokens` tokens: `loopnet.generate.generate(self, ...)`, whose
        keyword arguments (rounds, temperature, top_k, window, stop, cache, exit, compile, ...) it takes."""
        from loopnet.generate import generate

        return generate(self, prompts, max_new_tokens, **kwargs)
