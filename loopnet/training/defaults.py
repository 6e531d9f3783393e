"""What `loopnet fit` runs with unless told otherwise: the Trainer's defaults and the callbacks the
CLI adds, each under its option group with the CLI's defaults. The CLI builds its options from
`callbacks()`, the benchmark's Lightning rows their callbacks (`default_callbacks`), so that the
"Lightning overhead" row keeps measuring what `loopnet fit` runs."""

from __future__ import annotations

# ModelCheckpoint's settings for `loopnet fit`.
CHECKPOINT_DEFAULTS = {
    "monitor": "val/loss",
    "mode": "min",
    "save_last": True,
    "save_top_k": 1,
    "filename": "best-step{step:06d}",
    "auto_insert_metric_name": False,
    # A resumed run that validates at a step a crashed segment already saved (best-step000004.ckpt from
    # after its last.ckpt) rewrites that file rather than adding best-step000004-v1.ckpt beside the
    # orphan: the step is in the name, so no two checkpoints of one run share a name otherwise.
    "enable_version_counter": False,
}

TRAINER_DEFAULTS = {
    "logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger", "init_args": {"save_dir": "runs"}},
    "max_steps": 5000,
    "gradient_clip_val": 1.0,
    "val_check_interval": 250,
    "check_val_every_n_epoch": None,
    "log_every_n_steps": 10,
}


# The option groups of the callbacks `loopnet fit` adds, in the CLI's order (`callbacks`).
CALLBACK_GROUPS = ("checkpoint", "interrupt", "lr_monitor", "throughput", "diagnostics", "divergence", "host_memory")


def callbacks() -> dict[str, tuple[type, dict]]:
    """Option group -> (the callback class, the CLI's defaults for it), in the CLI's order."""
    from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint

    from loopnet.diagnostics import DivergenceGuard, VisitDiagnostics
    from loopnet.training.callbacks import GracefulInterrupt, HostMemory, TokenThroughput

    return dict(
        zip(
            CALLBACK_GROUPS,
            [
                (ModelCheckpoint, CHECKPOINT_DEFAULTS),
                (GracefulInterrupt, {}),  # after "checkpoint": uses its folder
                (LearningRateMonitor, {"logging_interval": "step"}),
                (TokenThroughput, {}),
                (VisitDiagnostics, {}),
                (DivergenceGuard, {}),
                (HostMemory, {}),
            ],
            strict=True,
        )
    )


def default_callbacks(**overrides: dict | None) -> list:
    """The callbacks `loopnet fit` adds, with the CLI's defaults updated by `overrides` per option
    group (``checkpoint={"dirpath": ...}``); a group given None is left out."""
    return [
        cls(**(defaults | overrides.get(group, {})))
        for group, (cls, defaults) in callbacks().items()
        if overrides.get(group, {}) is not None
    ]
