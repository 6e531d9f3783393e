"""The `loopnet` command: LightningCLI over `LoopedLM` and `TokenStreamDataModule`.

    loopnet fit  --config configs/deeploop_r6.yaml [--config configs/cpu.yaml]
    loopnet test --config ... --ckpt_path runs/<run>/version_0/checkpoints/last.ckpt
    loopnet predict --config ... --ckpt_path ... --model.generate.prompt "To be"
"""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

import torch
from jsonargparse import Namespace
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.cli import LightningCLI

from loopnet.data import TokenStreamDataModule
from loopnet.diagnostics import DivergenceGuard, VisitDiagnostics
from loopnet.training.callbacks import GracefulInterrupt, TokenThroughput
from loopnet.training.module import LoopedLM, check_checkpoint_config


def load_hparams(path: str) -> dict:
    """A checkpoint's hyperparameters, read with torch's restricted (weights_only) unpickler."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise ValueError(f"refused to load {path}: it holds pickled objects that are not plain data "
                         f"({str(err).splitlines()[0][:200]}); only load checkpoints you trust, written by loopnet") from None
    except Exception as err:  # truncated or not a torch file
        raise ValueError(f"{path} is not a readable checkpoint ({type(err).__name__}: {str(err).splitlines()[0][:200]}); "
                         f"it may be corrupt or partially written: use another one, e.g. last.ckpt or best-*.ckpt") from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise ValueError(f"{path} is not a Lightning checkpoint (no state_dict); give a .ckpt written by loopnet fit")
    return ckpt.get("hyper_parameters", {})

TRAINER_DEFAULTS = {
    "logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger", "init_args": {"save_dir": "runs"}},
    "max_steps": 5000,
    "gradient_clip_val": 1.0,
    "val_check_interval": 250,
    "check_val_every_n_epoch": None,
    "log_every_n_steps": 10,
}


def run_name(config: Namespace) -> str:
    """One log folder per run, named after the scheme, wiring and R, e.g. ``deeploop_lt_k2_r6``."""
    residual = config.residual if config.residual != "scaled" else f"p{config.p:g}"
    return f"{residual}_{config.wiring}_k{config.n_blocks}_r{config.n_rounds}"


def resume_in_last_version(logger_args: Namespace) -> None:
    """For `fit --ckpt_path last`: continue in the newest version folder of this run name that
    holds a checkpoint, so Lightning finds its last.ckpt (or last-interrupted.ckpt) and the
    TensorBoard curves continue in the same folder. With none, training starts afresh."""
    if logger_args.get("version") is not None:
        return
    root = Path(logger_args.save_dir) / logger_args.name
    found = sorted(root.glob("version_*/checkpoints/last*.ckpt"), key=lambda p: p.stat().st_mtime)
    if found:
        logger_args.version = found[-1].parent.parent.name


class LoopnetCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("model.config.seq_len", "data.seq_len")
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults({
            "checkpoint.monitor": "val/loss",
            "checkpoint.mode": "min",
            "checkpoint.save_last": True,
            "checkpoint.save_top_k": 1,
            "checkpoint.filename": "best-step{step:06d}",
            "checkpoint.auto_insert_metric_name": False,
        })
        parser.add_lightning_class_args(GracefulInterrupt, "interrupt")  # after "checkpoint": uses its folder
        parser.add_lightning_class_args(LearningRateMonitor, "lr_monitor")
        parser.set_defaults({"lr_monitor.logging_interval": "step"})
        parser.add_lightning_class_args(TokenThroughput, "throughput")
        parser.add_lightning_class_args(VisitDiagnostics, "diagnostics")
        parser.add_lightning_class_args(DivergenceGuard, "divergence")

    def _parse_ckpt_path(self) -> None:
        """Check `--ckpt_path` before anything is built. Unlike LightningCLI's default, the
        checkpoint's hyperparameters do not silently replace the given config: the model config
        must match (else a clear error), and evaluation settings (eval_rounds, generate) stay
        those of the command line."""
        if not self.config.get("subcommand"):
            return
        cfg = self.config[self.config.subcommand]
        path = cfg.get("ckpt_path")
        if not path or path in ("last", "best", "hpc"):
            return
        if not Path(path).is_file():
            raise FileNotFoundError(f"--ckpt_path {path} does not exist; give a .ckpt file (e.g. runs/<run>/version_N/checkpoints/last.ckpt) or 'last'")
        check_checkpoint_config(load_hparams(path).get("config"), cfg.model.config.as_dict())

    def before_instantiate_classes(self) -> None:
        cfg = self.config[self.subcommand]
        logger = cfg.trainer.logger
        if isinstance(logger, Namespace) and logger.class_path.endswith("TensorBoardLogger"):
            if logger.init_args.get("name") in (None, "lightning_logs"):
                logger.init_args.name = run_name(cfg.model.config)
        if self.subcommand == "fit" and cfg.ckpt_path == "last" and isinstance(logger, Namespace):
            resume_in_last_version(logger.init_args)
        # Checkpoints are loaded with torch's restricted (weights_only) unpickler unless asked otherwise.
        if "weights_only" in cfg and cfg.weights_only is None:
            cfg.weights_only = True


# Subcommands that are not Trainer entry points, each with its own parser.
TOOLS = {
    "sweep": ("loopnet.study.sweep", "run a grid of fits (resumable)"),
    "report": ("loopnet.study.report", "turn a sweep folder into a markdown report with plots"),
    "eval": ("loopnet.eval.cli", "downstream tasks through lm-evaluation-harness at several R'"),
    "bench": ("loopnet.bench.run", "training throughput, MFU and memory benchmarks"),
}


def main(args: list[str] | None = None) -> None:
    argv = sys.argv[1:] if args is None else list(args)
    if argv and argv[0] in TOOLS:
        import importlib

        return importlib.import_module(TOOLS[argv[0]][0]).main(argv[1:])
    if argv and argv[0] in ("-h", "--help"):
        print("loopnet tools: " + "; ".join(f"{name}: {help}" for name, (_, help) in TOOLS.items()))
    try:
        LoopnetCLI(
            LoopedLM,
            TokenStreamDataModule,
            subclass_mode_model=False,
            subclass_mode_data=False,
            trainer_defaults=TRAINER_DEFAULTS,
            save_config_kwargs={"overwrite": True},
            auto_configure_optimizers=False,  # LoopedLM.configure_optimizers owns AdamW and the schedule
            args=None if args is None else argv,
        )
    except (ValueError, FileNotFoundError, PermissionError) as err:
        if os.environ.get("LOOPNET_DEBUG"):
            raise
        print(f"loopnet: error: {err} (set LOOPNET_DEBUG=1 for the traceback)", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
