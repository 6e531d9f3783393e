"""The run summary: one JSON file beside a run's logs that says how the run ended.

`DivergenceGuard` writes ``<trainer.log_dir>/summary.json`` when fit ends, whether it completed,
diverged or was interrupted; the stability sweep and the report read it with `read_summary`.

Schema (`SCHEMA_VERSION` 1; values that are not finite are written as null):

    {
      "schema": 1,
      "status": "completed" | "diverged" | "interrupted",
      "diverged_at_step": S | null,      # trainer.global_step of the step whose loss or
                                          # gradient diverged (0-based; the step TensorBoard
                                          # shows that step's train/loss at)
      "reason": str | null,              # e.g. "non-finite gradient norm (nan)"
      "global_step": int,                # optimiser steps taken when fit ended
      "max_steps": int | null,
      "final_train_loss": float | null,  # last training loss seen
      "final_val_loss": float | null,    # val/loss of the last validation run (for a diverged
                                          # run, the one Lightning runs at the stop)
      "best_val_loss": float | null,     # lowest finite val/loss seen
      "val_history": [[step, val_loss], ...],
      "last_checkpoint": str | null,     # last.ckpt; for a diverged run the last good one, saved
                                          # before step S (paths as ModelCheckpoint reports them)
      "best_checkpoint": str | null,     # the best checkpoint by the monitored metric
      "config": {...},                   # the model's LoopConfig fields (hparams["config"])
      "hparams": {...},                  # every hyperparameter of the LightningModule
      "last_visit_stats": {visit_tag: {quantity: value}},   # last logging step of VisitDiagnostics
      "kappa": {physical | "model": value},                 # κ̂_R of that step
      "diagnostics_step": int | null,    # the step those two were measured at
      "log_dir": str,
      "error": str | null,               # the exception, for status "interrupted"
      "wall_time_s": float               # of the fit, resumed segments included (each up to its last checkpoint)
    }
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

from loopnet.files import atomic_write

SUMMARY_NAME = "summary.json"
SCHEMA_VERSION = 1
STATUSES = ("completed", "diverged", "interrupted")


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
