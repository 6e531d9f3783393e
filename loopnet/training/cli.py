"""The `loopnet` command: LightningCLI over `LoopedLM` and `TokenStreamDataModule`.

    loopnet fit  --config configs/deeploop_r6.yaml [--config configs/cpu.yaml]
    loopnet test --config ... --ckpt_path runs/<run>/version_0/checkpoints/last.ckpt
    loopnet predict --config ... --ckpt_path ... --model.generate.prompt "To be"

The Trainer subcommands only; `loopnet` itself (and its other tools) is `loopnet.commands`, which
imports this module when a Trainer subcommand is called; this module never imports it back. Beside it:
the checks run before Lightning loads (`precheck`), the run folders (`run_folders`), the checkpoint a
command loads (`resume`) and how errors are said (`errors`).
"""

from __future__ import annotations

import errno
import logging
import os
import sys
import warnings
from pathlib import Path

from jsonargparse import Namespace

from loopnet import compat

# Before Lightning's import of torchmetrics: without its optional back-ends, a `loopnet` process starts
# ~3 s sooner (the imports below follow this call: ruff's E402 is off for this file).
compat.lean_torchmetrics()

from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from loopnet import checkpoints
from loopnet.data import TokenStreamDataModule
from loopnet.data.hub_reachable import check_hub
from loopnet.data.token_ids import DEFAULT as DEFAULT_VOCAB
from loopnet.diagnostics import DivergenceGuard
from loopnet.env import error_line, one_line_errors
from loopnet.files import atomic_write, check_run_folder, check_writable
from loopnet.model import LoopConfig
from loopnet.training import resume, trust
from loopnet.training.console import guard_console
from loopnet.training.defaults import TRAINER_DEFAULTS, callbacks
from loopnet.training.errors import OneLineErrors, PeerLost, Reported, dead_ranks, peer_lost
from loopnet.training.module import LoopedLM
from loopnet.training.precheck import LINKS, check_settings, normalize_argv, precheck
from loopnet.training.resume import ResumeOnEveryRank, absolute
from loopnet.training.run_folders import SaveConfigOnStart, check_fresh_version, evaluate_in_run_folder, run_name
from loopnet.training.subcommands import EVALUATION, READ_DATA, SUBCOMMANDS


class _NoAdvert(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip")


def quiet_dependencies() -> None:
    """What the libraries print on every command that says nothing about the user's run: Lightning's
    litlogger advert, its own use of APIs that torch and jsonargparse deprecated (warnings meant for
    Lightning's developers). Lightning's messages about the run itself stay."""
    os.environ.setdefault("JSONARGPARSE_DEPRECATION_WARNINGS", "off")  # inherited by DDP's worker processes
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_NoAdvert())


quiet_dependencies()

# The fit running in this process, for `_summary_before_termination` (which runs on Lightning's thread).
_FITTING: dict = {}


def _summary_before_termination() -> None:
    """Lightning's launcher (rank 0) watches the ranks it started; when one dies it SIGKILLs every process,
    itself included, within seconds: at start-up or during a collective that has not yet failed, rank 0
    would end without a summary.json. First the summary (status "interrupted", the dead rank named) and
    one line; then Lightning's termination of the other ranks, and rank 0 exits 1 (`compat.on_rank_death`)."""
    trainer = _FITTING.get("trainer")
    if trainer is not None and trainer.is_global_zero:
        dead = dead_ranks(trainer) or ["a rank"]
        lost = PeerLost(f"{' and '.join(dead)} of this DDP run ended at step {trainer.global_step}")
        for callback in trainer.callbacks:
            if isinstance(callback, DivergenceGuard) and trainer.lightning_module is not None:
                callback.on_exception(trainer, trainer.lightning_module, lost)
        error_line(
            "loopnet",
            f"{lost}; every process of the run stops now; fix: see that rank's output "
            f"for why it ended, then run the same command with --ckpt_path last",
        )


compat.on_rank_death(_summary_before_termination)


class OneLineErrorParser(OneLineErrors, LightningArgumentParser):
    """LightningCLI's parser; a command-line or config error is one line with the fix (`OneLineErrors`)."""


class LoopnetCLI(compat.CkptPathHook, LightningCLI):
    def __init__(self, *args, **kwargs):
        argv = kwargs.get("args")
        argv = sys.argv[1:] if argv is None else argv
        # `loopnet fit ...` builds fit's parser alone: each subcommand's costs ~0.3 s of every start-up.
        self._only = argv[0] if isinstance(argv, (list, tuple)) and argv and argv[0] in SUBCOMMANDS else None
        trust.apply()  # the parse imports only what a config may name (loopnet.training.trust)
        super().__init__(*args, **kwargs)

    def subcommands(self) -> dict[str, set[str]]:
        every = LightningCLI.subcommands()
        return {self._only: every[self._only]} if getattr(self, "_only", None) else every

    def instantiate_classes(self) -> None:
        """Before anything is built: a fit pinned to a version folder (or resuming one) takes its lock,
        and checks again, now alone, that a fresh fit finds the folder free (`check_fresh_version`)."""
        cfg = self.config[self.subcommand] if self.subcommand else self.config
        logger = cfg.trainer.logger
        if (
            self.subcommand == "fit"
            and rank_zero_only.rank == 0
            and isinstance(logger, Namespace)
            and logger.init_args.get("version") not in (None, "")
        ):
            checkpoints.lock_version(checkpoints.version_folder(logger.init_args))
            if not cfg.ckpt_path:
                check_fresh_version(cfg)
        super().instantiate_classes()

    def instantiate_trainer(self, **kwargs):
        trainer = super().instantiate_trainer(**kwargs)
        # Checkpoints are written atomically (temporary file in the same folder, fsync, rename),
        # unless a CheckpointIO plugin was configured.
        strategy = trainer.strategy
        configured = compat.configured_checkpoint_io(strategy)
        if configured is None or type(configured) is TorchCheckpointIO:
            strategy.checkpoint_io = checkpoints.AtomicCheckpointIO()
        return trainer

    def add_arguments_to_parser(self, parser) -> None:
        for source, target in LINKS:
            parser.link_arguments(source, target)
        for group, (cls, defaults) in callbacks().items():
            parser.add_lightning_class_args(cls, group)
            parser.set_defaults({f"{group}.{k}": v for k, v in defaults.items()})

    def check_ckpt_path(self) -> None:
        """Check `--ckpt_path` before anything is built. Unlike LightningCLI's default, the
        checkpoint's hyperparameters do not silently replace the given config: the model config
        must match (else a clear error), and evaluation settings (eval_rounds, generate) stay
        those of the command line."""
        if not self.config.get("subcommand"):
            return
        resume.check_ckpt_path(self.config.subcommand, self.config[self.config.subcommand])

    def before_fit(self) -> None:
        self._check_data(train=True)
        if self.config.fit.get("ckpt_path"):  # a resume continues in its own checkpoint folder, as it should
            warnings.filterwarnings("ignore", r"Checkpoint directory .* exists and is not empty")

    def fit(self, **kwargs) -> None:
        """`trainer.fit`; one that fails before its first step completes removes the empty run folder it
        created, saying so in one line (`run_folders.remove_failed_start`), and the error goes on as before."""
        from loopnet.training.run_folders import existing_log_folders, remove_failed_start

        existed = existing_log_folders(self.trainer)
        if getattr(self, "_resume_last", None) is not None:  # --ckpt_path last: every rank resumes, or none
            self.trainer.callbacks.insert(0, ResumeOnEveryRank(*self._resume_last))  # its setup first
        _FITTING["trainer"] = self.trainer
        try:
            self.trainer.fit(**kwargs)
        except Exception as err:
            try:
                remove_failed_start(self.trainer, existed, err)
            except Exception as cleanup:  # the fit's own error is the one to show
                print(f"loopnet: could not remove the failed start's run folder ({cleanup})", file=sys.stderr)
            lost = peer_lost(self.trainer, err)
            if lost:
                raise PeerLost(lost) from err
            raise
        finally:
            _FITTING.pop("trainer", None)

    def after_fit(self) -> None:
        """Where the run went: one line each for its folder, checkpoints and summary (rank 0)."""
        trainer = self.trainer
        if not trainer.is_global_zero:
            return
        ckpt, guard = (
            trainer.checkpoint_callback,
            next((cb for cb in trainer.callbacks if isinstance(cb, DivergenceGuard)), None),
        )
        logger = trainer.loggers[0] if trainer.loggers else None
        lines = []
        if logger is not None and logger.log_dir:
            lines.append(f"run folder: {logger.log_dir} (curves: tensorboard --logdir {logger.save_dir})")
        if isinstance(ckpt, ModelCheckpoint) and (ckpt.last_model_path or ckpt.best_model_path):
            last = ckpt.last_model_path or "none"
            lines.append(f"checkpoints: last {last}, best {ckpt.best_model_path or 'none'}")
        if guard is not None and guard.summary_path:
            lines.append(f"summary: {guard.summary_path}")
        for line in lines:
            print(f"loopnet: {line}", file=sys.stderr)

    def before_validate(self) -> None:
        self._check_data(train=False)

    def before_test(self) -> None:
        self._check_data(train=False)

    def _check_data(self, train: bool) -> None:
        """Built, not yet run, nothing written: read the corpus as the first steps would (empty, binary,
        too small, hub out of reach: a one-line error now instead of a run folder with an 'interrupted'
        summary), and check a compact vocabulary's size against the model's (known only now)."""
        self.datamodule.check(self.trainer.global_rank, self.trainer.world_size, train=train)
        self.datamodule.vocabulary.check_fits(self.model.config.vocab_size)

    def predict(self, **kwargs) -> None:
        """`loopnet predict`: the generated text on stdout once the progress bar is gone, and saved as
        `predictions.txt` in the run's log folder (rank 0)."""
        texts = [
            t for batch in self.trainer.predict(**kwargs) or [] for t in ([batch] if isinstance(batch, str) else batch)
        ]
        if not self.trainer.is_global_zero:
            return
        for text in texts:
            print(text)
        log_dir = self.trainer.loggers[0].log_dir if self.trainer.loggers else None
        if log_dir:
            path = atomic_write(
                Path(log_dir) / "predictions.txt", lambda f: f.write("\n".join(texts) + "\n"), binary=False
            )
            print(f"loopnet: saved the generated text to {path}", file=sys.stderr)

    def before_predict(self) -> None:
        # The prompt comes from LoopedLM.predict_dataloader (model.generate), not from the corpus. A model
        # trained on a compact vocabulary (the corpus's own ids) maps text to ids and back through it.
        dm, self.datamodule = self.datamodule, None
        ckpt_path = self.config.predict.ckpt_path  # None: the weights of model.init_weights, no data recorded
        trained = (
            (checkpoints.load_checkpoint_meta(ckpt_path).get("datamodule_hyper_parameters") or {})
            if ckpt_path
            else None
        )
        if (trained or {}).get("vocab", DEFAULT_VOCAB) != DEFAULT_VOCAB or (
            dm is not None and dm.vocab != DEFAULT_VOCAB
        ):
            keys = ("vocab", "source", "path", "name", "split", "text_column")
            saved, given = ({k: hp.get(k) for k in keys} for hp in (trained or {}, dict(dm.hparams) if dm else {}))
            if trained is not None and saved != given:
                diff = "; ".join(
                    f"{k}: checkpoint {saved[k]!r} vs config {given[k]!r}" for k in keys if saved[k] != given[k]
                )
                raise ValueError(
                    f"{self.config.predict.ckpt_path} was trained on a compact vocabulary (the token ids "
                    f"of its corpus), which this command's data settings do not rebuild ({diff}); fix: "
                    f"give the data settings it was trained with (its config.yaml, e.g. "
                    f"--config configs/study_cpu.yaml)"
                )
            dm.vocabulary.check_fits(self.model.config.vocab_size)
            self.model.vocabulary = dm.vocabulary  # LoopedLM._vocabulary: text <-> the corpus's ids

    @staticmethod
    def roots() -> dict[str, type]:
        """The classes whose signatures a subcommand's settings follow: key -> class (`trust.check_config`)."""
        from lightning.pytorch import Trainer

        return {
            "trainer": Trainer,
            "model": LoopedLM,
            "data": TokenStreamDataModule,
            **{group: cls for group, (cls, _) in callbacks().items()},
        }

    def before_instantiate_classes(self) -> None:
        cfg = self.config[self.subcommand] if self.subcommand else self.config  # run=False: no subcommand
        trust.check_config(cfg, self.roots())  # every class named fits its slot; nothing named is built yet
        LoopConfig(**cfg.model.config.as_dict())  # a bad model config fails here with its own message
        check_settings(self.subcommand, cfg)
        logger = cfg.trainer.logger
        if isinstance(logger, Namespace) and logger.class_path.endswith("TensorBoardLogger"):
            if logger.init_args.get("name") in (None, "lightning_logs"):
                logger.init_args.name = run_name(cfg.model.config)
        if isinstance(logger, Namespace) and logger.class_path.endswith(("TensorBoardLogger", "CSVLogger")):
            check_run_folder(*(logger.init_args.get(k) for k in ("save_dir", "name", "version", "sub_dir")))
        if isinstance(logger, Namespace) and logger.init_args.get("save_dir") is not None:
            check_writable(logger.init_args.save_dir, "--trainer.logger.init_args.save_dir")
            # Absolute: the same run folder on every node (shared filesystem), and so recorded in config.yaml.
            logger.init_args.save_dir = absolute(logger.init_args.save_dir)
        elif logger is not False and cfg.trainer.get("default_root_dir"):
            check_writable(cfg.trainer.default_root_dir, "--trainer.default_root_dir")
        if self.subcommand == "fit" and cfg.get("checkpoint") and cfg.checkpoint.get("dirpath"):
            check_writable(cfg.checkpoint.dirpath, "--checkpoint.dirpath")
            cfg.checkpoint.dirpath = absolute(cfg.checkpoint.dirpath)
        if self.subcommand == "fit" and cfg.ckpt_path == checkpoints.LAST:
            self._resume_last = resume.resolve_fit_last(cfg)  # what this rank found, compared in ResumeOnEveryRank
        if self.subcommand in EVALUATION and cfg.ckpt_path == checkpoints.LAST:
            cfg.ckpt_path = resume.newest_run_checkpoint(cfg, self.subcommand)
        if self.subcommand in EVALUATION:
            evaluate_in_run_folder(cfg, self.subcommand)
        if self.subcommand == "fit" and not cfg.ckpt_path:
            check_fresh_version(cfg)
        # Checkpoints are loaded with torch's restricted (weights_only) unpickler unless asked otherwise.
        if "weights_only" in cfg and cfg.weights_only is None:
            cfg.weights_only = True


def build(args: list[str] | None, cli_class: type[LoopnetCLI] = LoopnetCLI) -> LoopnetCLI:
    """LightningCLI over loopnet's model and data module with loopnet's settings, on `args` (None: the
    command line); a `cli_class` that runs nothing (`dry_run.CheckOnly`) only parses and checks."""
    return cli_class(
        LoopedLM,
        TokenStreamDataModule,
        subclass_mode_model=False,
        subclass_mode_data=False,
        trainer_defaults=TRAINER_DEFAULTS,
        save_config_callback=SaveConfigOnStart,
        save_config_kwargs={"overwrite": True},
        auto_configure_optimizers=False,  # LoopedLM.configure_optimizers owns AdamW and the schedule
        parser_class=OneLineErrorParser,
        args=args,
    )


def flush_denormals() -> None:
    """CPU arithmetic flushes subnormal floats (|x| < 1.2e-38) to zero, as GPUs' fast paths do. A loop whose
    gradients vanish through the rounds (a collapsed DeepNorm at R = 12) otherwise carries its backward
    through the subnormal range, which x86 runs ~10-100x slower: steps of 0.5 s became 8-11 s. A gradient
    that small moves no weight (Adam divides it by √v + ε, ε = 1e-8), but a softmax whose exp underflows
    into that range sums a 0 instead: a loss can differ in its last bits from a run without it.
    LOOPNET_FLUSH_DENORMAL=0 keeps subnormals (to reproduce such a run to the bit). Set before the first
    parallel region, so that the intra-op threads, which copy the creating thread's float state, flush too."""
    import torch

    torch.set_flush_denormal(os.environ.get("LOOPNET_FLUSH_DENORMAL", "1") != "0")


def main(args: list[str] | None = None, cli_class: type[LoopnetCLI] = LoopnetCLI, prechecked: bool = False) -> None:
    """The Trainer subcommands (fit, validate, test, predict) on `args` (default: the command line).
    `prechecked`: `loopnet` (loopnet.commands) already ran the checks that need no Lightning (precheck, the
    hub), so they are not run (nor the hub asked) twice."""
    argv = trust.take_flag(normalize_argv(sys.argv[1:] if args is None else list(args)))
    if args is None:
        sys.argv[1:] = argv  # LightningCLI reads sys.argv itself
    guard_console()  # a pipe whose reader goes away (`| tee`, Ctrl-C) never breaks the run
    flush_denormals()
    try:
        settings = None
        if not prechecked:  # `python -m loopnet.training.cli` (sweep cells); `loopnet` ran these already
            with one_line_errors("loopnet", (ValueError, FileNotFoundError)):
                settings = precheck(argv)
        with one_line_errors("loopnet", (ValueError, FileNotFoundError, PermissionError), debug=True):
            if settings is not None and cli_class is LoopnetCLI and argv[0] in READ_DATA:
                check_hub(settings.data, argv)  # `loopnet` itself did before importing Lightning
            build(None if args is None else argv, cli_class)
    except Reported:  # its line is out already (ResumeOnEveryRank)
        sys.exit(2)
    except PeerLost as err:  # a DDP rank died: one line, not gloo's multi-line traceback
        if os.environ.get("LOOPNET_DEBUG"):
            raise
        error_line("loopnet", str(err))
        sys.exit(1)
    except OSError as err:  # disk full or over quota while writing a checkpoint or the run summary
        if err.errno not in (errno.ENOSPC, errno.EDQUOT) or os.environ.get("LOOPNET_DEBUG"):
            raise
        error_line("loopnet", str(err))
        sys.exit(1)
    except KeyboardInterrupt:  # Ctrl-C before training started (during training GracefulInterrupt handles it)
        print("loopnet: interrupted", file=sys.stderr)
        sys.exit(130)
    finally:
        checkpoints.release_version_locks()


if __name__ == "__main__":  # `python -m loopnet.training.cli fit ...`: the Trainer subcommands (sweep cells run it)
    main()
