"""The run summary: one JSON file beside a run's logs that says how the run ended.

`RunSummary` is the record it is written from, one per fit: `DivergenceGuard` feeds it the run's
course (losses, validations, divergence, wall time) and writes ``<trainer.log_dir>/summary.json``
when fit ends, whether it completed, diverged or was interrupted; `VisitDiagnostics` feeds it its
last measured step. The stability sweep and the report read the file with `read_summary`.

Schema (`SCHEMA_VERSION` 1; values that are not finite are written as null):

    {
      "schema": 1,
      "status": "completed" | "diverged" | "interrupted" | "failed",   # failed: the disk (or quota)
                                          # was full; "reason" names the file
      "diverged_at_step": S | null,      # trainer.global_step of the step whose loss or
                                          # gradient diverged (0-based; the step TensorBoard
                                          # shows that step's train/loss at)
      "reason": str | null,              # e.g. "non-finite gradient norm (nan)"; for a failed run the
                                          # error's line (the file that could not be written, the fix)
      "global_step": int,                # optimiser steps taken when fit ended
      "max_steps": int | null,
      "final_train_loss": float | null,  # last training loss seen
      "final_val_loss": float | null,    # val/loss of the last validation run (for a diverged
                                          # run, the one Lightning runs at the stop)
      "best_val_loss": float | null,     # lowest finite val/loss seen
      "val_history": [[step, val_loss], ...],
      "last_checkpoint": str | null,     # last.ckpt; for a diverged run the last good one, saved
                                          # before step S; for an interrupted one last-interrupted.ckpt
                                          # (paths as ModelCheckpoint reports them)
      "best_checkpoint": str | null,     # the best checkpoint by the monitored metric
                                          # (both name only files that exist; else null)
      "config": {...},                   # the model's LoopConfig fields (hparams["config"])
      "hparams": {...},                  # every hyperparameter of the LightningModule
      "last_visit_stats": {visit_tag: {quantity: value}},   # last logging step of VisitDiagnostics
                                          # (tags.visit_quantities: attention visits add attn_logit_max,
                                          # attn_logit_absmax, attn_log_z)
      "last_output_stats": {"log_z": v, "logit_absmax": v} | null,  # the output logits, same step
      "kappa": {physical | "model": value},                 # κ̂_R of that step
      "diagnostics_step": int | null,    # the step those two were measured at
      "log_dir": str,
      "data": {...} | null,              # what was read (TokenStreamDataModule.summary): source, hub commit,
                                          # files, documents, the split rule, the held-out cache, and for a
                                          # partial parquet conversion "partial": true with its note
      "error": str | null,               # the exception, for status "interrupted" or "failed"
      "wall_time_s": float               # of the fit, resumed segments included (each up to its last checkpoint)
    }
"""

from __future__ import annotations

import dataclasses
import errno
import io
import json
import math
import os
import threading
import time
import traceback
import weakref
from pathlib import Path
from typing import Any

from loopnet.files import atomic_write

SUMMARY_NAME = "summary.json"
SCHEMA_VERSION = 1
STATUSES = ("completed", "diverged", "interrupted", "failed")
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def jsonable(value: Any) -> Any:
    """Plain JSON data: dataclasses and mappings become dicts, tuples lists, tensors and numbers
    floats, non-finite floats None; anything else its str()."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if hasattr(value, "item") and getattr(value, "numel", lambda: 1)() == 1:
        value = value.item()
    if isinstance(value, (int, bool)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return str(value)


def write_summary(path: str | os.PathLike, summary: dict) -> Path:
    """Write `summary` as JSON atomically (a temporary file in the same folder, then os.replace),
    so a reader never sees half a file."""
    data = {"schema": SCHEMA_VERSION, **jsonable(summary)}
    return atomic_write(path, lambda f: f.write(json.dumps(data, indent=2, allow_nan=False) + "\n"), binary=False)


def read_summary(path: str | os.PathLike) -> dict:
    """Read a run summary; `path` is the file or the run's log folder that holds it."""
    path = Path(path)
    if path.is_dir():
        path = path / SUMMARY_NAME
    with open(path) as f:
        summary = json.load(f)
    if summary.get("status") not in STATUSES:
        raise ValueError(f"{path} is not a loopnet run summary (status={summary.get('status')!r})")
    return summary


def existing(path: str | None) -> str | None:
    """`path` when it names a file that exists (remote paths, s3://..., as given), else None: a summary
    never names a checkpoint whose write failed (disk full) or that was removed."""
    if path is None or "://" in str(path) or os.path.isfile(path):
        return path
    return None


def _float(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value.detach().float() if hasattr(value, "detach") else value)
    return value if math.isfinite(value) else None


def log_dir(trainer) -> str:
    """The run's log folder, read on rank 0 alone: `trainer.log_dir` is a collective broadcast,
    which would hang or fail when only rank 0 calls it under DDP."""
    return (trainer.loggers[0].log_dir if trainer.loggers else None) or trainer.default_root_dir


def _data_summary(trainer) -> dict | None:
    data = getattr(trainer, "datamodule", None)
    return data.summary() if callable(getattr(data, "summary", None)) else None


def _written_file(exception: BaseException) -> str | None:
    """The file being written when `exception` was raised, found in its traceback: a TensorBoard event file
    (its writer thread's error, raised again in the main thread at the next write or flush), else the
    innermost open file a frame holds (e.g. hparams.yaml); None if there is none."""
    frames = [frame for frame, _ in traceback.walk_tb(exception.__traceback__)]
    for frame in frames:
        writer = frame.f_locals.get("self")
        if hasattr(writer, "add_event") and isinstance(getattr(writer, "_file_name", None), str):
            return writer._file_name
    for frame in reversed(frames):
        for value in frame.f_locals.values():
            if isinstance(value, io.IOBase) and isinstance(getattr(value, "name", None), str):
                return value.name
    return None


def name_disk_full(exception: BaseException) -> bool:
    """For an exception that is a full disk or quota: make its line name the file and the fix (TensorBoard's
    writer thread reports a bare `[Errno 28] No space left on device`), and say True."""
    if not isinstance(exception, OSError) or exception.errno not in DISK_FULL:
        return False
    # An error with a filename names it already (`[Errno 28] ...: 'path'`), as do atomic_write's.
    file = None if exception.filename is not None else _written_file(exception)
    if file is not None:
        exception.strerror = (
            f"{os.strerror(exception.errno)} while writing {file}; fix: free space there (or log "
            f"to another disk with --trainer.logger.init_args.save_dir), then run it again "
            f"(`--ckpt_path last` continues from its last checkpoint)"
        )
        exception.args = (exception.errno, exception.strerror)
    return True


_previous_hook = None


def quiet_event_writer_errors() -> None:
    """TensorBoard's writer thread prints its own traceback of a failed write, and the main thread raises
    the same error at its next write or flush (`name_disk_full` names the file there): print it once, there."""
    global _previous_hook
    if _previous_hook is not None:
        return
    _previous_hook = threading.excepthook

    def hook(args):
        if isinstance(args.exc_value, OSError) and type(args.thread).__name__ == "_AsyncWriterThread":
            return
        _previous_hook(args)

    threading.excepthook = hook


class RunSummary:
    """What a fit's summary.json says, gathered while the fit runs (one record per trainer and fit:
    `RunSummary.of(trainer)`). Its history (validations, last loss, wall time) is kept in checkpoints
    by `DivergenceGuard`, so that a resumed run continues the record of the run it resumes."""

    _records: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __init__(self) -> None:
        self.diverged_at_step: int | None = None
        self.reason: str | None = None
        self.last_good_checkpoint: str | None = None
        self.train_loss: float | None = None
        self.val_history: list[list[float]] = []
        self.diagnostics: dict[str, Any] | None = None  # the last logging step: {"step", "visits", "kappa"}
        self._earlier_wall_s = 0.0  # wall time of the run's earlier segments (resumed from a checkpoint)
        self._t0 = time.monotonic()
        self.path: Path | None = None  # where `write` last wrote it

    @classmethod
    def of(cls, trainer) -> RunSummary:
        """The record of `trainer`'s fit."""
        if trainer not in cls._records:
            cls._records[trainer] = cls()
        return cls._records[trainer]

    @classmethod
    def start(cls, trainer) -> RunSummary:
        """A fresh record for a fit of `trainer` that starts now."""
        cls._records[trainer] = cls()
        return cls._records[trainer]

    # ------------------------------------------------------------------------------ fed while the fit runs
    def record_diagnostics(self, step: int, visits: dict, kappa: dict, output: dict | None = None) -> None:
        self.diagnostics = {"step": step, "visits": visits, "kappa": kappa, "output": output}

    def record_validation(self, step: int, value: float) -> None:
        self.val_history.append([step, value])

    def record_divergence(self, step: int, reason: str, last_good_checkpoint: str | None) -> None:
        self.diverged_at_step, self.reason, self.last_good_checkpoint = step, reason, last_good_checkpoint

    def record_failure(self, exception: BaseException) -> str:
        """The status of a fit ended by `exception`: "failed" for a full disk or quota (its line, naming the
        file and the fix, becomes the reason), else "interrupted"."""
        if not name_disk_full(exception):
            return "interrupted"
        self.reason = str(exception)
        return "failed"

    @property
    def wall_time_s(self) -> float:
        return self._earlier_wall_s + time.monotonic() - self._t0

    def state_dict(self) -> dict[str, Any]:
        return {
            "val_history": [list(v) for v in self.val_history],
            "train_loss": self.train_loss,
            "wall_time_s": self.wall_time_s,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.val_history = [list(v) for v in state_dict.get("val_history", [])]
        self.train_loss = state_dict.get("train_loss")
        self._earlier_wall_s = float(state_dict.get("wall_time_s", 0.0))
        self._t0 = time.monotonic()

    # ------------------------------------------------------------------------------ written when it ends
    def as_dict(self, trainer, pl_module, status: str, error: str | None = None) -> dict:
        """The run summary as a dict (the schema above)."""
        from lightning.pytorch.callbacks import ModelCheckpoint

        finite = [v for _, v in self.val_history if math.isfinite(v)]
        ckpt = next((cb for cb in trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint)), None)
        stats = self.diagnostics
        hparams = dict(pl_module.hparams)
        diverged = self.diverged_at_step is not None
        last = self.last_good_checkpoint if diverged else (ckpt.last_model_path or None) if ckpt else None
        best = (ckpt.best_model_path or None) if ckpt else None
        return {
            "status": status,
            "diverged_at_step": self.diverged_at_step,
            "reason": self.reason,
            "global_step": trainer.global_step,
            "max_steps": trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None,
            "final_train_loss": _float(self.train_loss),
            "final_val_loss": _float(self.val_history[-1][1]) if self.val_history else None,
            "best_val_loss": min(finite) if finite else None,
            "val_history": self.val_history,
            "last_checkpoint": existing(last),
            "best_checkpoint": existing(best),
            "config": hparams.get("config"),
            "hparams": hparams,
            "last_visit_stats": stats["visits"] if stats else None,
            "last_output_stats": stats.get("output") if stats else None,
            "kappa": stats["kappa"] if stats else None,
            "fixed_point": getattr(getattr(pl_module, "depth_eval", None), "last_profile", None),
            "diagnostics_step": stats["step"] if stats else None,
            "log_dir": log_dir(trainer),
            "data": _data_summary(trainer),
            "error": error,
            "wall_time_s": round(self.wall_time_s, 3),
        }

    def write(self, path: str | os.PathLike, trainer, pl_module, status: str, error: str | None = None) -> Path:
        self.path = write_summary(path, self.as_dict(trainer, pl_module, status, error))
        return self.path

    def name_last_checkpoint(self, checkpoint: str) -> None:
        """A checkpoint written after the summary (the interruption checkpoint: Lightning runs checkpoint
        callbacks last, after the summary was written) becomes its `last_checkpoint`."""
        path = self.path
        if path is None or existing(checkpoint) is None or not os.path.isfile(path):
            return
        with open(path) as f:
            summary = json.load(f)
        write_summary(path, {k: v for k, v in summary.items() if k != "schema"} | {"last_checkpoint": str(checkpoint)})
