"""What `LoopedLM` measures across rounds at validation and test, besides the loss at each R': the
extrapolation and fixed-point profile (`fixed_point`) up to `extrapolate_rounds`, and at test the
compute–quality frontier of adaptive exit (`frontier`). The module calls `update` per batch and `end`
per epoch; everything else lives here.

Logged: the scalars ``fixed_point/<quantity>/r<rr>`` at validation and ``test_fixed_point/...`` at test
(a chart per quantity and round), and per quantity an image of it against the round r with the training R
marked (``fixed_point/<quantity>``, ``test_fixed_point/<quantity>``; `profile.round_figure`), one per
validation, each quantity on one y-axis across the validations; ``test/frontier/{loss,ppl,mean_rounds}/t<i>``
per threshold i; the image ``frontier/loss_vs_rounds``.
Files in the run folder: ``fixed_point.json`` (test) and ``frontier.json`` with ``frontier.png``.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

from .fixed_point import QUANTITIES, RoundProfileMeter
from .frontier import FrontierMeter, write_frontier

JACOBIAN_SEQUENCES = 2  # sequences of the first batch whose round Jacobians are measured
JACOBIAN_ITERS = 10  # power-iteration steps: error of order (σ2/σ1)^40
PROGRESS_EVERY = 10.0  # seconds between the progress lines of a σ_max measurement


class JacobianProgress:
    """`jacobian_profile`'s progress as lines on stderr (rank 0): the round reached and the time so far, at most
    every `every` seconds, and the total once done if that took longer; a measurement of minutes is never silent."""

    def __init__(self, stage: str, say: bool, every: float = PROGRESS_EVERY):
        self.stage, self.say, self.every = stage, say, every
        self.start = self.last = time.monotonic()

    def __call__(self, r: int, max_rounds: int) -> None:
        now = time.monotonic()
        if r == 1:  # the measurement starts
            self.start = self.last = now
            return
        if not self.say or (now - self.last < self.every and (r < max_rounds or now - self.start < self.every)):
            return
        self.last = now
        done = "done" if r == max_rounds else f"round {r} of {max_rounds}"
        print(
            f"loopnet: {self.stage}: σ_max of the round Jacobians (model.extrapolate_rounds): {done}, "
            f"{now - self.start:.0f} s",
            file=sys.stderr,
            flush=True,
        )


def fixed_point_prefix(stage: str) -> str:
    """The tag group of a stage's round profile: ``fixed_point`` at validation, ``test_fixed_point`` at test."""
    return "fixed_point" if stage == "val" else f"{stage}_fixed_point"


def fixed_point_tag(stage: str, quantity: str, round_: int) -> str:
    return f"{fixed_point_prefix(stage)}/{quantity}/r{round_:02d}"


class DepthEvaluation:
    """`jacobian_at_validation`: σ_max also at validation (always at test): it costs a validation seconds to
    minutes (docs/diagnostics.md)."""

    def __init__(
        self, extrapolate_rounds: int | None, frontier=None, train_rounds: int = 1, jacobian_at_validation: bool = False
    ):
        self.profile = (
            RoundProfileMeter(extrapolate_rounds, JACOBIAN_SEQUENCES, JACOBIAN_ITERS) if extrapolate_rounds else None
        )
        self.jacobian_at_validation = jacobian_at_validation
        self.frontier_config = frontier
        self.frontier = None
        if frontier is not None and frontier.exit != "none":
            self.frontier = FrontierMeter(frontier.exit, list(frontier.thresholds), frontier.max_rounds or train_rounds)
        self.last_profile: dict | None = None  # the last validation's, for summary.json
        self.train_rounds = train_rounds
        self.ylims: dict[str, tuple[float, float]] = {}  # the round images' axes so far, per tag

    def update(self, stage: str, model, inputs, targets, say: bool = True) -> None:
        """Add a batch of `stage`; `say`: this process prints the σ_max progress (rank 0)."""
        if self.profile is not None:
            jacobian = stage == "test" or self.jacobian_at_validation
            self.profile.update(model, inputs, targets, jacobian, JacobianProgress(stage, say) if jacobian else None)
        if stage == "test" and self.frontier is not None:
            self.frontier.update(model, inputs, targets)

    def end(self, stage: str, module, fixed_losses: dict[int, float]) -> None:
        """Log (and at test write) what the epoch measured; `fixed_losses`: {R': loss} of the epoch."""
        if self.profile is None and self.frontier is None:  # neither asked for: nothing to log or write
            return
        trainer = module.trainer
        folder = Path(trainer.log_dir) if trainer.log_dir else None
        if trainer.world_size > 1:  # every rank saw its own batches: pool them (a collective on every rank)

            def reduce(t):
                return trainer.strategy.reduce(t.to(module.device), reduce_op="sum").cpu()

            for meter in (self.profile, self.frontier if stage == "test" else None):
                if meter is not None:
                    meter.sync(reduce)
        if self.profile is not None and self.profile.weight:
            profile = self.profile.compute()
            self.profile.reset()
            for q in QUANTITIES:
                for r, value in enumerate(profile.get(q) or [], start=1):
                    if value is not None and math.isfinite(value):
                        module.log(fixed_point_tag(stage, q, r), value, sync_dist=False)
            if trainer.is_global_zero:
                self._write_round_images(trainer, stage, profile)
            if stage == "val":
                self.last_profile = profile
            elif folder is not None and trainer.is_global_zero:
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "fixed_point.json").write_text(json.dumps(profile, indent=2) + "\n", encoding="utf-8")
        if stage == "test" and self.frontier is not None and self.frontier.tokens:
            points = self.frontier.compute()
            self.frontier.reset()
            for i, p in enumerate(points):
                for key in ("loss", "ppl", "mean_rounds"):
                    module.log(f"test/frontier/{key}/t{i}", p[key], sync_dist=False)
            frontier = {
                "exit": self.frontier.exit,
                "max_rounds": self.frontier.max_rounds,
                "points": points,
                "fixed": {str(r): loss for r, loss in sorted(fixed_losses.items())},
            }
            self.last_frontier = frontier
            if folder is not None and trainer.is_global_zero:
                _, png, fig = write_frontier(folder, frontier, label=folder.name)
                for logger in trainer.loggers:
                    experiment = getattr(logger, "experiment", None)
                    if hasattr(experiment, "add_figure"):
                        experiment.add_figure("frontier/loss_vs_rounds", fig, global_step=trainer.global_step)
            _print_frontier(frontier)

    def _write_round_images(self, trainer, stage: str, profile: dict) -> None:
        """Each quantity of the round profile as an image against r (`profile.round_pngs`)."""
        from .profile import round_pngs, write_png

        pngs = None
        for logger in trainer.loggers:
            experiment = getattr(logger, "experiment", None)
            if getattr(experiment, "file_writer", None) is None:  # not TensorBoard's SummaryWriter
                continue
            if pngs is None:
                per_round = {q: profile.get(q) or [] for q in QUANTITIES}
                pngs = round_pngs(per_round, fixed_point_prefix(stage), self.train_rounds, self.ylims)
            for tag, png in pngs.items():
                write_png(experiment, tag, png, trainer.global_step)


def _print_frontier(frontier: dict) -> None:
    from lightning.pytorch.utilities import rank_zero_info

    lines = [
        f"loopnet: exit frontier ({frontier['exit']}, at most {frontier['max_rounds']} rounds)",
        "  threshold      loss       ppl   mean rounds",
    ]
    lines += [
        f"  {p['threshold']:>9g}  {p['loss']:8.4f}  {p['ppl']:8.2f}  {p['mean_rounds']:12.3f}"
        for p in frontier["points"]
    ]
    rank_zero_info("\n".join(lines))
