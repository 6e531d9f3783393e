"""LoopedLM: the LightningModule that says *what* to compute for a looped language model.

The Trainer and callbacks decide *how* to run it (precision, clipping, devices, checkpoints,
diagnostics). A training step runs the rounds that `loopnet.model.rounds.draw_rounds` gives its global
step (n_rounds unless `round_sampling` draws them; per sequence with `round_draw`). Evaluation always runs
at the mean R: its loss is the cross-entropy of the last round, token-weighted, and `eval_rounds`
re-evaluates the same weights at other round counts R'.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict
from typing import Any, Optional

import lightning as L
from lightning.pytorch.utilities import rank_zero_info
import numpy as np
import torch
from torchmetrics import MeanMetric

from loopnet.checkpoints import check_model_config
from loopnet.data.vocabulary import GPT2Vocab, Vocabulary
from loopnet.model import LoopConfig, LoopedTransformer, lm_loss
from loopnet.diagnostics.depth_eval import DepthEvaluation
from loopnet.generate import generate
from loopnet.model.parametrization import check_optimizer, group_rules
from loopnet.model.rounds import RoundDraw, draw_rounds
from loopnet.training.options import FrontierConfig, GenerateConfig, OptimConfig


def fuse_qkv_optimizer_states(checkpoint: dict, group_names: list[list[str]]) -> None:
    """Bring a checkpoint from before the fused QKV projection to the fused layout, in place.

    Its weights convert when loaded (`QKVLinear.fuse_state`); here AdamW's state follows: the moments
    of W_Q, W_K, W_V are stacked as the weights are, so that a resumed run continues exactly.
    `group_names` are the parameter names of the optimizer's groups in the fused layout; in the old
    one each `qkv_proj` stood as three consecutive parameters, q_proj, k_proj, v_proj."""
    if not any(key.endswith(".q_proj.weight") for key in checkpoint.get("state_dict", {})):
        return
    width = lambda name: 3 if ".qkv_proj." in name else 1  # noqa: E731  its parameters in the old layout
    for opt in checkpoint.get("optimizer_states", []):
        old_counts = [sum(width(n) for n in names) for names in group_names]
        if [len(g["params"]) for g in opt["param_groups"]] != old_counts:
            raise ValueError(
                "the checkpoint's optimizer state does not match this model's parameters in the "
                "layout before the fused QKV projection; load its weights without the optimizer "
                "(e.g. LoopedLM.load_from_checkpoint) or start the run afresh"
            )
        old_state, state, old, new = opt["state"], {}, 0, 0
        for group, names in zip(opt["param_groups"], group_names):
            group["params"] = list(range(new, new + len(names)))
            for name in names:
                parts = [old_state[i] for i in range(old, old + width(name)) if i in old_state]
                old += width(name)
                if parts:  # moments (tensors of the parameter's shape) stacked; the step count shared
                    state[new] = {
                        key: torch.cat([p[key] for p in parts]) if torch.is_tensor(value) and value.dim() else value
                        for key, value in parts[0].items()
                    }
                new += 1
        opt["state"] = state


# loopnet writes its configs into checkpoints as plain dicts; should a LoopConfig, OptimConfig or
# GenerateConfig instance be in one (saved by hand, or by other code), torch's restricted
# weights_only unpickler may still rebuild these plain dataclasses. Nothing else is allowed.
# (OptimConfig and GenerateConfig lived in this module before loopnet.training.options: both names load.)
torch.serialization.add_safe_globals(
    [
        LoopConfig,
        OptimConfig,
        GenerateConfig,
        FrontierConfig,
        (OptimConfig, f"{__name__}.OptimConfig"),
        (GenerateConfig, f"{__name__}.GenerateConfig"),
    ]
)


def rng_states() -> dict[str, Any]:
    """This process's torch, CUDA, NumPy and Python RNG states, as plain data (tensors, ints,
    tuples), so that a checkpoint holding them still loads with the weights_only unpickler."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss)),
        "python": random.getstate(),
    }


def set_rng_states(states: dict[str, Any]) -> None:
    """Restore what `rng_states` captured."""
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available() and len(states["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(states["cuda"])
    kind, keys, pos, has_gauss, gauss = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, state, gauss = states["python"]
    random.setstate((version, tuple(state), gauss))


def _as(cls, value):
    """Accept a dataclass instance (from the CLI) or a plain dict (from a checkpoint's hparams)."""
    return value if isinstance(value, cls) else cls(**(value or {}))


class LoopedLM(L.LightningModule):
    """A looped GPT-style language model.

    Args:
        config: The model's hyperparameters (K, R, residual scheme, wiring, ...).
        optim: Optimiser and learning-rate schedule.
        eval_rounds: Extra test-time round counts R' at which validation and test also report loss,
            e.g. [1, 2, 4, 6, 8, 12]. The training R is always reported.
        compile: Compile the model with torch.compile.
        generate: Settings of `loopnet predict`.
        extrapolate_rounds: Run validation and test batches up to this many rounds (e.g. 4R) and record,
            per round, the loss, the relative change of the state, the KL between successive rounds'
            predictions and the largest singular value of the round's Jacobian
            (`loopnet.diagnostics.fixed_point`). None: off. The Jacobian's σ_max is measured at test only,
            unless `jacobian_at_validation`.
        jacobian_at_validation: With `extrapolate_rounds`, measure σ_max at each validation too (on the first
            batch; seconds to minutes each, docs/diagnostics.md).
        frontier: The exit criterion and thresholds whose loss and mean rounds per token `loopnet test`
            reports (`loopnet.diagnostics.frontier`).
        init_weights: A model folder (`loopnet import`, `loopnet retrofit`) whose weights a fit starts from; its
            architecture must equal `config`'s. A checkpoint given with --ckpt_path replaces them.
    """

    def __init__(
        self,
        config: LoopConfig = LoopConfig(),
        optim: OptimConfig = OptimConfig(),
        eval_rounds: Optional[list[int]] = None,
        compile: bool = False,
        generate: GenerateConfig = GenerateConfig(),
        extrapolate_rounds: Optional[int] = None,
        frontier: FrontierConfig = FrontierConfig(),
        jacobian_at_validation: bool = False,
        init_weights: Optional[str] = None,
    ):
        super().__init__()
        self.config, self.optim, self.gen = (
            _as(LoopConfig, config),
            _as(OptimConfig, optim),
            _as(GenerateConfig, generate),
        )
        if eval_rounds and min(eval_rounds) < 1:
            raise ValueError(f"model.eval_rounds must all be >= 1, got {eval_rounds}")
        if extrapolate_rounds is not None and extrapolate_rounds < 2:
            raise ValueError(
                f"model.extrapolate_rounds={extrapolate_rounds} must be >= 2 (rounds compared in pairs); "
                f"fix: give e.g. 4R = {4 * self.config.n_rounds}, or null for off"
            )
        check_optimizer(self.config.parametrization, self.optim.optimizer)
        self.frontier = _as(FrontierConfig, frontier)
        self.eval_rounds = sorted(set(eval_rounds or []) - {self.config.n_rounds})
        # Plain dicts in the checkpoint, so it loads with torch's weights_only unpickler.
        self.save_hyperparameters(
            {
                "config": asdict(self.config),
                "optim": asdict(self.optim),
                "eval_rounds": eval_rounds,
                "compile": compile,
                "generate": asdict(self.gen),
                "extrapolate_rounds": extrapolate_rounds,
                "frontier": asdict(self.frontier),
                "jacobian_at_validation": jacobian_at_validation,
            }
        )
        self.model = LoopedTransformer(self.config)
        if init_weights is not None:
            from loopnet.formats.folder import load_weights

            load_weights(self.model, init_weights)
        self.model.z_loss = self.optim.z_loss
        if compile:
            self.model.compile()
        self.flops_per_batch: Optional[float] = None  # read by ThroughputMonitor; set per stage and shape
        self._flops: dict[tuple[str, int, int], float] = {}
        self._resume_rng: Optional[dict] = None  # RNG states from a checkpoint, applied at the next training step
        self.depth_eval = DepthEvaluation(
            extrapolate_rounds, self.frontier, self.config.n_rounds, jacobian_at_validation
        )
        self.eval_loss = torch.nn.ModuleDict({str(r): MeanMetric() for r in [self.config.n_rounds, *self.eval_rounds]})

    # ----------------------------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Store every rank's RNG states (Lightning's checkpoints do not), so that a resumed run
        draws the same dropout masks as an uninterrupted one. Every rank calls this hook."""
        states = rng_states()
        if torch.distributed.is_available() and torch.distributed.is_initialized() and self.trainer.world_size > 1:
            gathered: list = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(gathered, states)
            checkpoint["rng_states"] = gathered
        else:
            checkpoint["rng_states"] = [states]

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Refuse a checkpoint trained with another model config, naming the differing fields;
        keep the checkpoint's RNG states for the first training step of the resumed run."""
        check_model_config(checkpoint.get("hyper_parameters", {}).get("config"), asdict(self.config))
        fuse_qkv_optimizer_states(checkpoint, [[name for name, _ in group] for group in self._param_groups()])
        states = checkpoint.get("rng_states")
        rank = self.global_rank if self._trainer is not None else 0
        # Same number of ranks: each continues its own stream; otherwise seed_everything's stays.
        world = self.trainer.world_size if self._trainer is not None else 1
        self._resume_rng = states[rank] if states and len(states) == world else None

    def setup(self, stage: str) -> None:
        """The data's ids must fit the embedding (else an IndexError deep inside the first step)."""
        vocab = self._data_vocabulary()
        if vocab is not None:
            vocab.check_fits(self.config.vocab_size)

    # ----------------------------------------------------------------------------- train
    def draw(self, step: int | None = None, batch_size: int | None = None, batch_idx: int = 0) -> RoundDraw:
        """The rounds of training step `step` (default: this one): a function of the run's seed and the step
        alone, so the diagnostics, a resumed run and every DDP rank see the same draw. With `round_draw`
        "sequence", the R_i of the `batch_size` sequences of micro-batch `batch_idx` on this rank, a function
        of the seed, the step and the shard (batch_idx mod accumulate_grad_batches) · world size + rank."""
        step = self.global_step if step is None else step
        if self.config.round_draw == "batch":
            return draw_rounds(self.config, step)
        trainer = self._trainer
        rank, world = (self.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        micro = batch_idx % trainer.accumulate_grad_batches if trainer is not None else 0
        return draw_rounds(self.config, step, batch_size=batch_size, shard=micro * world + rank)

    def on_train_batch_start(self, batch, batch_idx):
        if self._resume_rng is not None:
            # Restored here, not at load time: building the DataLoader iterators after the
            # restore draws from torch's RNG, which the uninterrupted run did before saving.
            set_rng_states(self._resume_rng)
            self._resume_rng = None
        self._set_flops(batch, "train", self.draw(batch_size=batch[0].size(0), batch_idx=batch_idx))

    def _set_flops(self, batch, stage: str, draw: RoundDraw | None = None) -> None:
        """`flops_per_batch` (read by ThroughputMonitor after each batch) for this stage's batches:
        forward + backward of the rounds that ran in training; one forward at every evaluated R' otherwise."""
        B, T = batch[0].shape
        key = (stage, B, T) + (draw.run if draw else ())
        if key not in self._flops:
            if stage == "train":  # per sequence: every round of the pass runs on every sequence
                rounds, grad_rounds = draw.run
                per_token = self.model.flops_per_token(seq_len=T, rounds=rounds, grad_rounds=grad_rounds)
            else:
                per_token = sum(
                    self.model.flops_per_token(seq_len=T, rounds=int(r), training=False) for r in self.eval_loss
                )
            self._flops[key] = per_token * B * T
        self.flops_per_batch = self._flops[key]

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        draw = self.draw(batch_size=inputs.size(0), batch_idx=batch_idx)
        _, loss = self.model(inputs, targets, rounds=draw.rounds, grad_rounds=draw.grad_rounds, alpha=draw.alpha)
        self.log("train/loss", loss, prog_bar=True)
        if self.config.round_sampling != "fixed":
            self.log("train/rounds", draw.mean)
        if self.model.z_term is not None:
            self.log("train/z_loss", self.optim.z_loss * self.model.z_term)  # the term added to the loss
        if self.model.exit_kl_term is not None:
            self.log("train/exit_kl", self.model.exit_kl_term)  # KL(p ‖ U_R), before its coefficient
        if hasattr(self.model.injection, "decay_stats"):  # Parcae's names for the diagonal injection's decay
            for name, value in self.model.injection.decay_stats().items():
                self.log(f"injection/{name}", value)
        return loss

    # ----------------------------------------------------------------------------- evaluate
    def _evaluate(self, batch):
        inputs, targets = batch
        for rounds, metric in self.eval_loss.items():
            logits, _ = self.model(inputs, rounds=int(rounds))
            loss = lm_loss(logits, targets)
            metric.update(loss, weight=(targets != -1).sum())

    def _log_eval(self, stage: str):
        """`<stage>/loss` at the training R; with eval_rounds, `<stage>/loss_r<R'>` at every R' and R itself,
        zero-padded to the widest (r01, r02, r12: sorted by name is sorted by R')."""
        losses = {int(r): float(m.compute()) for r, m in self.eval_loss.items() if m.update_called}
        self.depth_eval.end(stage, self, losses)
        width = len(str(max(int(r) for r in self.eval_loss)))
        for rounds, metric in self.eval_loss.items():
            loss = metric.compute()
            names = [f"_r{int(rounds):0{width}d}"] if len(self.eval_loss) > 1 else []
            if int(rounds) == self.config.n_rounds:
                names.insert(0, "")
            for suffix in names:
                self.log(f"{stage}/loss{suffix}", loss, prog_bar=not suffix, sync_dist=False)
                self.log(f"{stage}/ppl{suffix}", torch.exp(loss), sync_dist=False)
            metric.reset()

    def on_validation_batch_start(self, batch, batch_idx, dataloader_idx=0):
        self._set_flops(batch, "eval")

    def on_test_batch_start(self, batch, batch_idx, dataloader_idx=0):
        self._set_flops(batch, "eval")

    def on_predict_batch_start(self, batch, batch_idx, dataloader_idx=0):
        self.flops_per_batch = None  # generation: not counted

    def validation_step(self, batch, batch_idx):
        self._evaluate(batch)
        self.depth_eval.update("val", self.model, *batch, say=self._trainer is None or self._trainer.is_global_zero)

    def on_validation_epoch_end(self):
        self._log_eval("val")

    def test_step(self, batch, batch_idx):
        self._evaluate(batch)
        self.depth_eval.update("test", self.model, *batch, say=self._trainer is None or self._trainer.is_global_zero)

    def on_test_epoch_end(self):
        self._log_eval("test")

    # ----------------------------------------------------------------------------- predict
    def _data_vocabulary(self) -> Vocabulary | None:
        """The data's vocabulary: the data module's (a compact one renumbers the ids), or the one `loopnet
        predict` sets as `vocabulary` (it runs without the corpus); None without either (a bare DataLoader)."""
        dm = self._trainer.datamodule if self._trainer is not None else None
        if dm is not None and hasattr(dm, "vocabulary"):
            return dm.vocabulary
        return getattr(self, "vocabulary", None)

    def _vocabulary(self) -> Vocabulary:
        """How text becomes ids and back: the data's vocabulary, else GPT-2's."""
        return self._data_vocabulary() or GPT2Vocab()

    def predict_dataloader(self):
        vocab = self._vocabulary()
        ids = vocab.encode(self.gen.prompt) or [vocab.eot]  # an empty prompt starts from the model's end-of-text
        return torch.utils.data.DataLoader([torch.tensor(ids[-self.config.seq_len :])], batch_size=1)

    @torch.no_grad()
    def predict_step(self, batch, batch_idx=0):
        g, vocab, trainer = self.gen, self._vocabulary(), self._trainer
        prompt = batch[0].tolist()
        # A stop signal (Lightning's SIGTERM flag, which `GracefulInterrupt` sets for SIGINT and SIGHUP too)
        # ends the generation between tokens: the text so far is returned, printed and saved.
        stopping = (lambda: trainer.received_sigterm) if trainer is not None else None
        out = generate(
            self.model,
            [prompt],
            g.max_new_tokens,
            rounds=g.rounds,
            temperature=g.temperature,
            top_k=g.top_k,
            n_vocab=vocab.size,
            cache=g.cache,
            exit=g.exit,
            exit_threshold=g.exit_threshold,
            max_rounds=g.max_rounds,
            compile=g.compile,
            interrupted=stopping,
        )
        new, self.generated_rounds = out.tokens[0], out.rounds[0]
        stopped = " (stopped by a signal)" if len(new) < g.max_new_tokens and stopping and stopping() else ""
        rank_zero_info(
            f"loopnet: {len(new)} tokens generated{stopped}, {out.mean_rounds():.2f} rounds per token "
            f"(exit: {g.exit}; rounds per token {self.generated_rounds})"
        )
        # Returned, not printed (that would land inside the progress bar): `loopnet predict` prints and saves it.
        return vocab.decode(prompt + new)

    # ----------------------------------------------------------------------------- optimiser
    def _grad_scaler(self) -> bool:
        """Whether the run uses a GradScaler (fp16 mixed precision); bf16 and fp32 do not."""
        trainer = self._trainer  # None outside a Trainer
        return trainer is not None and getattr(trainer.precision_plugin, "scaler", None) is not None

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Clip as the Trainer is told to, also with fused AdamW and under FSDP.

        Lightning refuses to clip any fused optimizer under mixed precision, bf16 included, because
        with fp16 a fused step unscales internally; and it refuses norm clipping under FSDP. Here the
        gradients are already unscaled (Lightning unscales before this hook), so clip them, under
        FSDP through the root module's `clip_grad_norm_`, the only one that sees every shard. Only
        a fused optimizer under fp16 is left to Lightning, which names the problem. DeepSpeed clips
        by its own config."""
        from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy

        if not gradient_clip_val or gradient_clip_val <= 0 or isinstance(self.trainer.strategy, DeepSpeedStrategy):
            return
        if self._grad_scaler() and getattr(optimizer, "_step_supports_amp_scaling", False):
            return self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if gradient_clip_algorithm == "value":
            torch.nn.utils.clip_grad_value_(params, gradient_clip_val)
        elif isinstance(self.trainer.strategy, FSDPStrategy):
            self.trainer.strategy.model.clip_grad_norm_(gradient_clip_val)
        else:
            torch.nn.utils.clip_grad_norm_(params, gradient_clip_val)

    def _param_groups(self) -> list[list[tuple[str, torch.nn.Parameter]]]:
        """AdamW's groups, (name, parameter) in order: the weight matrices (of linear layers and embeddings:
        decayed), then norms and biases. Told apart by the module that holds them, not by `p.dim()`: under
        FSDP the optimiser is built on the sharded parameters, each a 1-D slice."""
        matrices = {id(m.weight) for m in self.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Embedding))}
        named = [(name, p) for name, p in self.named_parameters() if p.requires_grad]
        return [[(n, p) for n, p in named if id(p) in matrices], [(n, p) for n, p in named if id(p) not in matrices]]

    def adamw_groups(self) -> list[dict]:
        """AdamW's param groups: the decayed weight matrices and the undecayed rest (`_param_groups`), each
        at `lr` and `weight_decay`; under μP or CompleteP each split further by role, with its own lr, weight
        decay and ε (`loopnet.model.parametrization.group_rules`: hidden matrices, the blocks' vectors, the
        rest). Empty groups are left out."""
        o = self.optim
        decay, no_decay = ([p for _, p in group] for group in self._param_groups())
        if self.config.parametrization == "standard":
            return [{"params": decay, "weight_decay": o.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        model = self.model
        blocks = [*model.prelude_blocks, *model.blocks, *model.coda_blocks]
        hidden = {id(m.weight) for b in blocks for m in b.modules() if isinstance(m, torch.nn.Linear)}
        if model.injection is not None:  # the linear adapter's matrix; the diagonal injection's B (d×d)
            hidden |= {id(p) for name, p in model.injection.named_parameters() if name in ("adapter.weight", "B")}
        in_blocks = {id(p) for b in blocks for p in b.parameters()}
        rules = group_rules(self.config)
        groups = []
        for params, decays in ((decay, True), (no_decay, False)):
            for role in ("hidden", "block_vector", "other"):
                picked = [
                    p
                    for p in params
                    if role == ("hidden" if id(p) in hidden else "block_vector" if id(p) in in_blocks else "other")
                ]
                if picked:
                    rule = rules[role]
                    groups.append(
                        {
                            "params": picked,
                            "lr": o.lr * rule["lr"],
                            "eps": o.eps * rule["eps"],
                            "weight_decay": o.weight_decay * rule["weight_decay"] if decays else 0.0,
                        }
                    )
        return groups

    def muon_matrices(self) -> list[tuple[str, torch.nn.Parameter]]:
        """The parameters Muon updates: the 2-D weights of the linear layers inside the blocks (loop,
        prelude, coda), in order."""
        blocks = [*self.model.prelude_blocks, *self.model.blocks, *self.model.coda_blocks]
        ids = {id(m.weight) for b in blocks for m in b.modules() if isinstance(m, torch.nn.Linear)}
        return [(n, p) for n, p in self.named_parameters() if id(p) in ids and p.requires_grad]

    def configure_optimizers(self):
        o = self.optim
        decay, no_decay = ([p for _, p in group] for group in self._param_groups())
        fused = o.fused
        if fused is None:
            # One kernel per tensor for the whole update, on CPU too: there the for-loop AdamW runs
            # ~5 kernels per tensor (lerp_, mul_, addcmul_, sqrt, addcdiv_); fused took 0.66× its time here
            # (d 256, K 4, vocabulary 50304, paired) and matches it to ~1e-8.
            fused = self.device.type in ("cuda", "cpu") and not self._grad_scaler()
        adamw = dict(lr=o.lr, betas=o.betas, eps=o.eps, fused=fused)
        if o.optimizer == "muon":
            from lightning.pytorch.strategies import FSDPStrategy

            from loopnet.training.optimizers import MuonWithAdamW

            if self._trainer is not None and isinstance(self.trainer.strategy, FSDPStrategy):
                raise ValueError(
                    "model.optim.optimizer=muon needs whole 2-D matrices, and FSDP shards them into 1-D "
                    "slices; fix: train with DDP (trainer.strategy: ddp) or optimizer: adamw"
                )
            matrices = {id(p) for _, p in self.muon_matrices()}
            muon = [p for p in decay if id(p) in matrices]
            rest = [
                {"params": [p for p in decay if id(p) not in matrices], "weight_decay": o.weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ]
            optimizer = MuonWithAdamW(
                [{"params": muon}],
                rest,
                adamw=adamw,
                muon=dict(
                    lr=o.lr if o.muon_lr is None else o.muon_lr, momentum=o.muon_momentum, weight_decay=o.weight_decay
                ),
            )
        else:
            optimizer = torch.optim.AdamW(self.adamw_groups(), **adamw)
        total = o.decay_steps or self.trainer.max_steps
        if total is None or total < 1:
            raise ValueError("set trainer.max_steps (or model.optim.decay_steps) so the cosine schedule has a length")

        def lr_lambda(step: int) -> float:
            if step < o.warmup_steps:
                return (step + 1) / o.warmup_steps
            progress = min(1.0, (step - o.warmup_steps) / max(1, total - o.warmup_steps))
            return o.min_lr_ratio + (1 - o.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
