"""The optimiser's and `loopnet predict`'s settings (typed dataclasses, checked when built); light to
import (no Lightning, no torch), so that `loopnet` checks them before Lightning's import
(`loopnet.training.precheck`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

EXITS = ("none", "kl", "latent", "entropy", "argmax", "gate")  # loopnet.model.exit's (kept torch-free here)


@dataclass
class OptimConfig:
    """AdamW (or Muon with AdamW) with linear warm-up then cosine decay.

    Args:
        lr: Peak learning rate (of AdamW's parameters; also Muon's unless `muon_lr` is given).
        min_lr_ratio: Final learning rate as a fraction of `lr`.
        weight_decay: Decoupled weight decay, applied to ≥ 2-D weights only (not norms, biases).
        betas: AdamW (β1, β2).
        eps: AdamW ε.
        warmup_steps: Linear warm-up steps.
        decay_steps: Steps of the cosine decay; None uses the Trainer's max_steps.
        fused: fused AdamW kernel; None: on CUDA and CPU unless fp16 (whose GradScaler Lightning must
            unscale before clipping, which a fused step does internally).
        optimizer: "adamw" on every parameter, or "muon": `torch.optim.Muon` on the 2-D weight matrices of
            the blocks (loop, prelude and coda: the fused QKV projection as one 3d×d matrix, O, fc1, fc2) at
            `muon_lr`, AdamW on the rest (embeddings, LM head, norm gains, biases, injection weights) at
            `lr`. Both follow the same warm-up and decay.
        muon_lr: Muon's peak learning rate (None: `lr`); torch scales it per matrix by √max(1, rows/cols).
        muon_momentum: Muon's (Nesterov) momentum.
        z_loss: Coefficient c of the z-loss c·mean((log Z)²) added to the training loss (log Z: the
            logsumexp of a position's output logits; PaLM uses 1e-4); 0: none. Logged as train/z_loss.
    """

    lr: float = 6e-4
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    warmup_steps: int = 200
    decay_steps: Optional[int] = None
    fused: Optional[bool] = None
    optimizer: Literal["adamw", "muon"] = "adamw"
    muon_lr: Optional[float] = None
    muon_momentum: float = 0.95
    z_loss: float = 0.0

    def __post_init__(self) -> None:
        b1, b2 = self.betas
        for ok, what, fix in (
            (
                self.optimizer in ("adamw", "muon"),
                f"model.optim.optimizer={self.optimizer!r} is not known",
                "choose adamw or muon",
            ),
            (
                self.muon_lr is None or self.muon_lr >= 0,
                f"model.optim.muon_lr={self.muon_lr} must be >= 0",
                "give Muon's peak learning rate, e.g. 0.02, or null for lr",
            ),
            (
                0 <= self.muon_momentum < 1,
                f"model.optim.muon_momentum={self.muon_momentum} must be in [0, 1)",
                "give e.g. 0.95",
            ),
            (self.z_loss >= 0, f"model.optim.z_loss={self.z_loss} must be >= 0", "give 0 (none) or e.g. 1e-4"),
            (self.lr >= 0, f"model.optim.lr={self.lr} must be >= 0", "give a positive peak learning rate, e.g. 6e-4"),
            (
                0 <= self.min_lr_ratio <= 1,
                f"model.optim.min_lr_ratio={self.min_lr_ratio} must be in [0, 1]",
                "give the final learning rate as a fraction of lr, e.g. 0.1",
            ),
            (
                self.weight_decay >= 0,
                f"model.optim.weight_decay={self.weight_decay} must be >= 0",
                "give 0 (none) or a positive value, e.g. 0.1",
            ),
            (
                0 <= b1 < 1 and 0 <= b2 < 1,
                f"model.optim.betas={list(self.betas)} must each be in [0, 1)",
                "give e.g. [0.9, 0.95]",
            ),
            (self.eps > 0, f"model.optim.eps={self.eps} must be > 0", "give e.g. 1e-8"),
            (
                self.warmup_steps >= 0,
                f"model.optim.warmup_steps={self.warmup_steps} must be >= 0",
                "give the number of linear warm-up steps, 0 for none",
            ),
            (
                self.decay_steps is None or self.decay_steps >= 1,
                f"model.optim.decay_steps={self.decay_steps} must be >= 1",
                "give a step count, or null for max_steps",
            ),
        ):
            if not ok:
                raise ValueError(f"{what}; fix: {fix}")


def not_utf8(text: str) -> str | None:
    """Where `text` is not UTF-8, or None: Python holds command-line bytes it cannot decode as lone surrogates."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raw = text[err.start : err.end].encode("utf-8", "surrogateescape")
        return f"byte{'s' if len(raw) > 1 else ''} {raw[:4].hex(' ')} at character {err.start}"
    return None


@dataclass
class GenerateConfig:
    """Text continuation for `loopnet predict`.

    Args:
        prompt: Text to continue.
        max_new_tokens: Tokens to generate.
        temperature: Softmax temperature; 0 means greedy.
        top_k: Sample among the k most likely tokens (None: all).
        rounds: Round count R' used to generate (None: the training R).
        cache: Keep keys and values per (round, block), so that each new token runs its rounds over one
            position (the same greedy tokens as recomputing the context for every token, faster).
        exit: Adaptive exit per token (`loopnet.model.exit`): "none", or stop a token's rounds once
            "kl" (KL between successive rounds' next-token distributions), "latent" (relative change
            of the state), "entropy" (change of the entropy) falls below `exit_threshold`, or once the
            "argmax" has been stable for `exit_threshold` rounds, or once the learned exit gate's cumulative
            probability reaches it ("gate", a model with exit_gate: Ouro's).
        exit_threshold: The criterion's threshold (None: Huginn's default, kl 1e-3, latent 0.03,
            entropy 1e-3, argmax 5; gate 0.5).
        max_rounds: Most rounds a token runs with an exit criterion (None: `rounds`, or the training R).
        compile: With the cache and no exit criterion, run each token's step as one `torch.compile` graph:
            a compile of seconds to tens of seconds for a faster token (docs/inference.md).
    """

    prompt: str = "ROMEO:"
    max_new_tokens: int = 64
    temperature: float = 0.8
    top_k: Optional[int] = 50
    rounds: Optional[int] = None
    cache: bool = True
    exit: str = "none"
    exit_threshold: Optional[float] = None
    max_rounds: Optional[int] = None
    compile: bool = False

    def __post_init__(self) -> None:
        for ok, what, fix in (
            (
                self.max_new_tokens >= 1,
                f"model.generate.max_new_tokens={self.max_new_tokens} must be >= 1",
                "give the number of tokens to generate, e.g. 64",
            ),
            (
                self.temperature >= 0,
                f"model.generate.temperature={self.temperature} must be >= 0",
                "give 0 (greedy) or a positive temperature, e.g. 0.8",
            ),
            (
                self.top_k is None or self.top_k >= 1,
                f"model.generate.top_k={self.top_k} must be >= 1",
                "give a positive k, or null for all tokens",
            ),
            (
                self.rounds is None or self.rounds >= 1,
                f"model.generate.rounds={self.rounds} must be >= 1",
                "give a round count R' >= 1, or null for the training R",
            ),
            (
                self.exit in EXITS,
                f"model.generate.exit={self.exit!r} is not a criterion",
                f"choose one of {', '.join(EXITS)}",
            ),
            (
                self.exit_threshold is None or self.exit_threshold >= 0,
                f"model.generate.exit_threshold={self.exit_threshold} must be >= 0",
                "give e.g. 1e-3 for kl, or null for the criterion's default",
            ),
            (
                self.max_rounds is None or self.max_rounds >= 1,
                f"model.generate.max_rounds={self.max_rounds} must be >= 1",
                "give the most rounds a token may run, or null for `rounds`",
            ),
            (
                not_utf8(self.prompt) is None,
                f"model.generate.prompt is not UTF-8 text ({not_utf8(self.prompt)})",
                "give the prompt in UTF-8 (e.g. convert it with `iconv -t UTF-8`)",
            ),
            (
                not self.compile or (self.cache and self.exit == "none"),
                "model.generate.compile needs the cache and no exit criterion (a token's rounds must not depend on its values)",
                "set model.generate.cache: true and model.generate.exit: none, or compile: false",
            ),
        ):
            if not ok:
                raise ValueError(f"{what}; fix: {fix}")


@dataclass
class FrontierConfig:
    """The compute–quality frontier of adaptive exit, measured by `loopnet test` (and validation when
    `at_validation`): loss and mean rounds per token at each threshold (`loopnet.diagnostics.frontier`).

    Args:
        exit: The criterion ("none" turns the frontier off): "kl", "latent", "entropy", "argmax" or "gate".
        thresholds: The thresholds to measure, e.g. [0, 1e-4, 1e-3, 1e-2].
        max_rounds: Most rounds a token runs (None: the training R).
    """

    exit: str = "none"
    thresholds: list[float] = field(default_factory=list)
    max_rounds: Optional[int] = None

    def __post_init__(self) -> None:
        for ok, what, fix in (
            (
                self.exit in EXITS,
                f"model.frontier.exit={self.exit!r} is not a criterion",
                f"choose one of {', '.join(EXITS)}",
            ),
            (
                self.exit == "none" or bool(self.thresholds),
                f"model.frontier.exit={self.exit!r} needs thresholds",
                "give model.frontier.thresholds, e.g. [0, 1e-4, 1e-3, 1e-2]",
            ),
            (
                all(t >= 0 for t in self.thresholds),
                f"model.frontier.thresholds={list(self.thresholds)} must be >= 0",
                "give non-negative thresholds",
            ),
            (
                self.max_rounds is None or self.max_rounds >= 1,
                f"model.frontier.max_rounds={self.max_rounds} must be >= 1",
                "give the most rounds a token may run, or null for the training R",
            ),
        ):
            if not ok:
                raise ValueError(f"{what}; fix: {fix}")
