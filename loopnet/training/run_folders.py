"""Where a Trainer command writes: the run folder's name, a fit that must not overwrite a run, an
evaluation that logs beside its checkpoint's fit, the config.yaml saved beside the logs.

    <save_dir>/<run name>/<version>/{config.yaml, summary.json, checkpoints/, <subcommand>/}

TensorBoard shows one run per folder of event files: `test` and `predict` write their events into the
fit's version folder (their scalars are `test/...`, the fit's are not), so their values appear in the fit's
run; `validate` logs the fit's own `val/...` tags, which would add a second point at the checkpoint's step
to the fit's curves, so its events stay in `<version>/validate/`, a run of their own.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
import shutil
import sys
from pathlib import Path

from jsonargparse import Namespace
from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import TensorBoardLogger

from loopnet import checkpoints
from loopnet.model import RUN_SETTINGS, LoopConfig
from loopnet.model.scales import scheme_label

# How run_name writes a model field that differs from LoopConfig's default ({} is its value); fields
# not listed read `<field>-<value>`. Run settings (model.config.RUN_SETTINGS) never name a run.
RUN_NAME_FIELDS = {
    "n_heads": "h{}",
    "seq_len": "ctx{}",
    "vocab_size": "v{}",
    "mlp_ratio": "mlp{}",
    "positions": "{}",
    "norm": "{}",
    "bias": "bias",
    "tie_embeddings": "untied",
    "input_norm": "input_norm",
    "sandwich": "sandwich",
    "parametrization": "{}",
    "mup_base_width": "d0-{}",
    "completep_base_depth": "n0-{}",
    "completep_alpha": "a{}",
    "mlp": "{}",
    "ffn_width": "ff{}",
    "rope_base": "rope{}",
    "qk_bias": "qk_bias",
    "embed_scale": "embed_scale",
    "loop_norm": "loop_norm",
    "round_norm": "round_norm",
    "exit_gate": "exit_gate",
    "norm_eps": "eps{}",
    "n_kv_heads": "kv{}",
}


def run_name(config) -> str:
    """The run folder's name: the scheme, wiring, K, R and width, then every other model field that is not
    LoopConfig's default, e.g. ``deeploop_carry_k2_r6_d128_h4_ctx128`` (configs/cpu.yaml). Models that
    cannot resume each other's checkpoints (`checkpoints.check_model_config`) never share a folder,
    so `--ckpt_path last` finds only this model's runs. `config`: the model config (a Namespace or dict)."""
    config = config.as_dict() if hasattr(config, "as_dict") else dict(config)
    name = [
        scheme_label(config["residual"], config.get("p")),
        config["wiring"],
        f"k{config['n_blocks']}",
        f"r{config['n_rounds']}",
        f"d{config['d_model']}",
    ]
    named = {"residual", "p", "wiring", "n_blocks", "n_rounds", "d_model", *RUN_SETTINGS}
    order = list(RUN_NAME_FIELDS)
    for field in sorted(
        dataclasses.fields(LoopConfig), key=lambda f: order.index(f.name) if f.name in order else len(order)
    ):
        value = config.get(field.name, field.default)
        if field.name not in named and value != field.default:
            text = f"{value:g}" if isinstance(value, float) else str(value)
            name.append(RUN_NAME_FIELDS.get(field.name, f"{field.name}-{{}}").format(text))
    return "_".join(name)


class SaveConfigOnStart(SaveConfigCallback):
    """LightningCLI's config.yaml beside the logs, with guards for what is already there:
    a `fit` from a checkpoint writes it when training starts, after the checkpoint's state was
    restored, so a resume refused at the restore leaves the run's config.yaml as it was (Lightning
    writes it in `setup`, before the restore); `validate`/`test`/`predict` write `<stage>_config.yaml`,
    so one pinned to a fit's folder (--trainer.logger.init_args.version) never replaces its config;
    a symbolic link in the file's place is replaced, never written through."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit":
            self.config_filename = f"{getattr(stage, 'value', stage)}_config.yaml"  # TrainerFn is a str enum
            self._save(trainer, pl_module, stage)
        elif not self.config.get("ckpt_path"):  # the CLI's config: is this fit a resume?
            self._save(trainer, pl_module, stage)

    def on_train_start(self, trainer, pl_module) -> None:
        self._save(trainer, pl_module, "fit")  # a no-op when setup already wrote it

    def _save(self, trainer, pl_module, stage: str) -> None:
        if not self.already_saved:
            path = os.path.join(trainer.log_dir, self.config_filename)  # log_dir: every rank calls it
            if trainer.is_global_zero and os.path.islink(path):
                os.unlink(path)
        super().setup(trainer, pl_module, stage)


def check_fresh_version(cfg: Namespace) -> None:
    """A fit without --ckpt_path pinned (--trainer.logger.init_args.version) to a folder that holds a
    run would overwrite that run's config.yaml and summary.json: refused before anything is written."""
    logger = cfg.trainer.logger
    if not isinstance(logger, Namespace) or logger.init_args.get("version") in (None, ""):
        return
    folder = checkpoints.version_folder(logger.init_args)
    held = [name for name in ("config.yaml", "summary.json") if (folder / name).exists()]
    held += ["checkpoints"] if any(folder.glob("checkpoints/*.ckpt")) else []
    if held:
        raise ValueError(
            f"{folder} already holds a run ({', '.join(held)}), which a new fit there would overwrite; "
            f"fix: resume it with --ckpt_path last, pin another version, or leave out "
            f"--trainer.logger.init_args.version for a new one"
        )


def evaluate_in_run_folder(cfg: Namespace, subcommand: str) -> None:
    """`validate`/`test`/`predict` log into the checkpoint's own version folder when it is in one
    (`<version>/<subcommand>/`, beside the fit's curves, no new `version_N`), whatever the run name and
    save_dir given, or into a `<subcommand>/` sub-folder of the version pinned; never over the fit's own files."""
    logger = cfg.trainer.logger
    if not isinstance(logger, Namespace) or not logger.class_path.endswith("TensorBoardLogger"):
        return
    args = logger.init_args
    if args.get("version") is None and cfg.get("ckpt_path"):
        version = fit_folder(Path(cfg.ckpt_path))
        if version is not None:  # the run's save_dir, name and version, from where the checkpoint lies
            args.save_dir, args.name, args.version = str(version.parent.parent), version.parent.name, version.name
    if args.get("version") is not None and args.get("sub_dir") is None:
        args.sub_dir = subcommand
        if subcommand in JOIN_THE_FIT and _names(logger.class_path, TensorBoardLogger):
            logger.class_path = f"{EvaluationLogger.__module__}.{EvaluationLogger.__name__}"


def fit_folder(ckpt: Path) -> Path | None:
    """The version folder of a fit that holds checkpoint `ckpt` (`<version>/checkpoints/<file>`, beside the
    fit's config.yaml or summary.json), or None for a checkpoint outside a run folder."""
    folder = ckpt.absolute().parent
    if folder.name != "checkpoints" or not any((folder.parent / f).is_file() for f in ("config.yaml", "summary.json")):
        return None
    if not os.access(folder.parent, os.W_OK):  # a run of someone else's, read-only: the evaluation logs as given
        return None
    return folder.parent


def _names(class_path: str, cls: type) -> bool:
    """Whether `class_path` imports as `cls` itself (a subclass of the user's stays as it is)."""
    module, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name, None) is cls
    except ImportError:
        return False


JOIN_THE_FIT = ("test", "predict")  # evaluations whose TensorBoard events go into the fit's run (module docstring)


class EvaluationLogger(TensorBoardLogger):
    """TensorBoardLogger of a `test` or `predict` in a fit's version folder: its files (`<stage>_config.yaml`,
    summary.json, predictions.txt, frontier.png) go to `log_dir`, `<version>/<subcommand>/`, as the plain
    logger's do; its TensorBoard events go to `<version>/` itself, so TensorBoard shows them in the fit's run
    instead of listing `<subcommand>/` as a run of its own. The fit's event file is never written: each
    writer opens a new file."""

    @property
    def events_dir(self) -> str:
        return os.path.dirname(os.path.normpath(self.log_dir)) if self.sub_dir else self.log_dir

    @property
    @rank_zero_experiment
    def experiment(self):
        if self._experiment is None:
            from torch.utils.tensorboard import SummaryWriter

            self._fs.makedirs(self.events_dir, exist_ok=True)
            self._experiment = SummaryWriter(log_dir=self.events_dir, **self._kwargs)
        return self._experiment


# ----------------------------------------------------------------------------- a failed start
# A fit that passes loopnet's start-up checks and then fails before its first step completes (an
# exception in the first training step or the sanity check, out of memory) leaves no run folder behind:
# the `version_N` it created holds nothing worth keeping (no checkpoint, no training step), and each
# such failure would add one more empty run to TensorBoard. Only a folder this process created is
# removed, only when it holds nothing but the files a fit writes at its start, and only on rank 0;
# a resumed run, a pinned existing folder or anything an earlier run wrote is never touched.

# What a fit writes into its run folder before its first step ends.
START_FILES = re.compile(
    r"^(config\.yaml|hparams\.yaml|summary\.json|events\.out\.tfevents\..*|checkpoints/\..+\.tmp"
    r"|\.loopnet\.lock)$"
)  # the lock of a fit pinned to its version (loopnet.checkpoints)


def _run_loggers(trainer) -> list:
    """The trainer's loggers that own a run folder (TensorBoard's, CSV's: `root_dir` + `log_dir`)."""
    return [lg for lg in trainer.loggers if hasattr(lg, "root_dir") and hasattr(lg, "log_dir")]


def existing_log_folders(trainer) -> set[Path]:
    """Before a fit: every folder at or directly under its loggers' run-name folders that already exists,
    and their save folders (`runs/`)."""
    found: set[Path] = set()
    for logger in _run_loggers(trainer):
        root = Path(logger.root_dir)
        if getattr(logger, "save_dir", None) and Path(logger.save_dir).is_dir():
            found.add(Path(logger.save_dir).absolute())  # `runs/` itself
        if root.is_dir():
            found.add(root.absolute())
            found.update(p.absolute() for p in root.iterdir())
    return found


def remove_failed_start(trainer, existed: set[Path], error: BaseException) -> list[Path]:
    """After `trainer.fit` raised `error`: remove the run folders this process created when no training
    step completed and they hold only start-of-fit files (no checkpoint), with one line on stderr naming
    the error. `existed`: `existing_log_folders` taken before the fit. Returns the folders removed."""
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    if rank_zero_only.rank != 0 or trainer.global_step != 0:
        return []
    removed = []
    for logger in _run_loggers(trainer):
        try:
            folder, root = Path(logger.log_dir).absolute(), Path(logger.root_dir).absolute()
        except Exception:  # a logger that cannot name its folder now
            continue
        if folder in existed or not folder.is_dir() or not (folder == root or folder.parent == root):
            continue
        files = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if not p.is_dir()]
        if not all(START_FILES.match(f) for f in files):
            continue  # something more (a checkpoint, a user's file): kept
        shutil.rmtree(folder, ignore_errors=True)
        save_dir = Path(logger.save_dir).absolute() if getattr(logger, "save_dir", None) else None
        for parent in (root, save_dir):  # the run-name folder, then `runs/`, when this fit made them
            if parent and parent != folder and parent not in existed and parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()
        removed.append(folder)
    if removed:
        where = ", ".join(str(_relative(p)) for p in removed)
        what = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:300]}"
        print(
            f"loopnet: the fit failed before its first step completed ({what}); removed the run folder it "
            f"had created, {where} (no checkpoint, no step)",
            file=sys.stderr,
        )
    return removed


def _relative(path: Path) -> Path:
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path
