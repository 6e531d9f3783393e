"""DivergenceGuard: stop a diverging run cleanly, keep its last good checkpoint, write its summary.

A run diverges when, at some step S,
- the global gradient norm (before clipping; under FSDP over every rank's shard) is not finite —
  checked in `on_before_optimizer_step`, and that step's update is skipped (all gradients set to
  None), so the weights in memory stay those of step S; or
- the training loss is not finite, or above `max_loss` once S ≥ `after_step` — checked in
  `on_train_batch_end`, after the update.

Then the guard sets ``trainer.should_stop`` and turns every `ModelCheckpoint` off (``save_top_k =
0``, ``save_last = False``, ``save_on_exception = False``): Lightning still runs the validation it
runs on a stop and calls its end-of-fit hooks, but no checkpoint is written or removed from then
on, so ``last.ckpt`` (and the best one) stay those saved before step S. (``save_last="link"`` is
covered too: the link is not touched.) Checkpoint callbacks always run after the other callbacks
(Lightning moves them last), so a divergence found in ``on_train_batch_end`` precedes that step's save.

When fit ends — completed, diverged, or interrupted by an exception — the guard writes the run
summary (`loopnet.diagnostics.summary.RunSummary`, which it feeds) to ``<trainer.log_dir>/summary.json``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any, Optional

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn

from .callback import global_norm
from .summary import SUMMARY_NAME, RunSummary, log_dir, quiet_event_writer_errors


class DivergenceGuard(Callback):
    """Detects a diverging run (non-finite loss or gradient, or a loss above a bound after warm-up),
    stops it cleanly keeping the last good checkpoint, and records the outcome (completed, or
    diverged at step S) with the final validation loss in a JSON run summary beside the logs.

    Args:
        max_loss: After `after_step`, a training loss above this counts as divergence (a uniform
            guess over GPT-2's vocabulary scores ln 50257 ≈ 10.8).
        after_step: Warm-up: before this global step only a non-finite loss or gradient counts.
        check_grads: Check at every step that the global gradient norm (before clipping) is finite,
            and skip the update when it is not. Skipped under 16-bit mixed precision, whose gradient
            scaler meets non-finite gradients by design and skips those updates itself.
        val_metric: The validation loss recorded in the summary.
        summary_name: File name of the run summary, written in the trainer's log_dir (an absolute
            path is used as it is).
    """

    def __init__(
        self,
        max_loss: float = 20.0,
        after_step: int = 100,
        check_grads: bool = True,
        val_metric: str = "val/loss",
        summary_name: str = SUMMARY_NAME,
    ):
        if not max_loss > 0:
            raise ValueError(f"divergence.max_loss must be > 0, got {max_loss}")
        if after_step < 0:
            raise ValueError(f"divergence.after_step must be >= 0, got {after_step}")
        self.max_loss = max_loss
        self.after_step = after_step
        self.check_grads = check_grads
        self.val_metric = val_metric
        self.summary_name = summary_name
        self._start_fit()
        quiet_event_writer_errors()  # before the logger's first write, in Lightning's setup

    def _start_fit(self, record: Optional[RunSummary] = None) -> None:
        self.record = record or RunSummary()
        self.summary_path: Optional[str] = None
        self._step = 0
        self._stepped = False  # whether this process ran a training step (see on_exception)

    # The history of a run resumed from a checkpoint continues that of the run it resumes.
    def state_dict(self) -> dict[str, Any]:
        return self.record.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.record.load_state_dict(state_dict)

    @property
    def diverged_at_step(self) -> Optional[int]:
        return self.record.diverged_at_step

    @property
    def last_good_checkpoint(self) -> Optional[str]:
        return self.record.last_good_checkpoint

    @property
    def diverged(self) -> bool:
        return self.diverged_at_step is not None

    # ------------------------------------------------------------------------------ detection
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":  # before a checkpoint's state is loaded into this callback
            self._start_fit(RunSummary.start(trainer))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._step = trainer.global_step
        self._stepped = True

    @torch.no_grad()
    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if not self.check_grads or self.diverged or getattr(trainer.precision_plugin, "scaler", None) is not None:
            return
        params = [p for p in pl_module.parameters() if p.grad is not None]
        # Under DDP every rank holds the all-reduced gradients and the ranks agree; under FSDP each holds a
        # shard, so the norm is reduced over the ranks (one all-reduce), and every rank decides the same.
        norm = global_norm(trainer, [p.grad for p in params], pl_module.device)
        if not bool(torch.isfinite(norm)):  # one host sync per step
            self._diverge(trainer, f"non-finite gradient norm ({float(norm)})")
            for p in params:  # skip this update: the optimiser ignores parameters without a gradient
                p.grad = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if self.diverged or not isinstance(loss, torch.Tensor):
            return
        if pl_module.automatic_optimization:  # Lightning hands back loss / accumulate_grad_batches
            loss = loss * trainer.accumulate_grad_batches
        value = float(loss.detach().float())
        self.record.train_loss = value
        reason = None
        if not math.isfinite(value):
            reason = f"non-finite training loss ({value})"
        elif self._step >= self.after_step and value > self.max_loss:
            reason = f"training loss {value:.4g} > max_loss {self.max_loss:g} after step {self.after_step}"
        bad = reason is not None
        if trainer.world_size > 1:  # losses differ between ranks; stop all of them together
            bad = trainer.strategy.reduce_boolean_decision(bad, all=False)
            reason = reason or "divergence on another rank"
        if bad:
            self._diverge(trainer, reason)

    def _diverge(self, trainer: pl.Trainer, reason: str) -> None:
        trainer.should_stop = True
        last_good = None
        for cb in trainer.checkpoint_callbacks:
            if isinstance(cb, ModelCheckpoint):
                last_good = cb.last_model_path or cb.best_model_path or last_good
                # No save, no removal from now on: the files on disk stay those of the last good step.
                cb.save_top_k, cb.save_last, cb.save_on_exception = 0, False, False
        self.record.record_divergence(self._step, reason, last_good)
        rank_zero_warn(
            f"loopnet: the run diverged at step {self._step}: {reason}. Stopping; the last good checkpoint "
            f"({last_good or 'none was saved'}) is kept.",
            category=RuntimeWarning,
        )

    # ------------------------------------------------------------------------------ summary
    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or self.val_metric not in trainer.callback_metrics:
            return
        value = float(trainer.callback_metrics[self.val_metric].detach().float())
        self.record.record_validation(trainer.global_step, value)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._write(trainer, pl_module, "diverged" if self.diverged else "completed")

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if trainer.state.fn != TrainerFn.FITTING:  # a failing `test` must not overwrite the fit's summary
            return
        try:  # never let the summary replace the exception that ended the run
            path = os.path.join(log_dir(trainer), self.summary_name)
            if not self._stepped and os.path.exists(path):
                # A resume that failed before its first step (also before Lightning sets trainer.ckpt_path, e.g. the
                # ranks disagreeing on --ckpt_path last): the run's record stays as it was. The summary is written
                # only when a fit ends, so one that exists now is an earlier fit's.
                rank_zero_warn(
                    f"loopnet: the resumed run stopped before its first step ({exception!r}); {path} is kept as it was"
                )
                return
            status = self.record.record_failure(exception)  # "failed" for a full disk, its file named
            self._write(trainer, pl_module, "diverged" if self.diverged else status, error=repr(exception))
        except Exception as err:
            rank_zero_warn(f"could not write the run summary: {err!r}")

    def _write(self, trainer, pl_module, status: str, error: Optional[str] = None) -> None:
        if not trainer.is_global_zero:
            return
        path = os.path.join(log_dir(trainer), self.summary_name)  # an absolute summary_name wins
        self.summary_path = str(self.record.write(path, trainer, pl_module, status, error))
