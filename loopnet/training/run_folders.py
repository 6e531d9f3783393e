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
RUN_NAME_FIELDS = {"n_heads": "h{}", "seq_len": "ctx{}", "vocab_size": "v{}", "mlp_ratio": "mlp{}",
                   "positions": "{}", "norm": "{}", "bias": "bias", "tie_embeddings": "untied",
                   "input_norm": "input_norm", "sandwich": "sandwich", "mlp": "{}", "ffn_width": "ff{}",
                   "rope_base": "rope{}", "qk_bias": "qk_bias", "embed_scale": "embed_scale", "loop_norm": "loop_norm",
                   "norm_eps": "eps{}", "n_kv_heads": "kv{}"}


def run_name(config) -> str:
    """The run folder's name: the scheme, wiring, K, R and width, then every other model field that is not
    LoopConfig's default, e.g. ``deeploop_carry_k2_r6_d128_h4_ctx128`` (configs/cpu.yaml). Models that
    cannot resume each other's checkpoints (`checkpoints.check_checkpoint_config`) never share a folder,
    so `--ckpt_path last` finds only this model's runs. `config`: the model config (a Namespace or dict)."""
    config = config.as_dict() if hasattr(config, "as_dict") else dict(config)
    name = [scheme_label(config["residual"], config.get("p")), config["wiring"], f"k{config['n_blocks']}",
            f"r{config['n_rounds']}", f"d{config['d_model']}"]
    named = {"residual", "p", "wiring", "n_blocks", "n_rounds", "d_model", *RUN_SETTINGS}
    order = list(RUN_NAME_FIELDS)
    for field in sorted(dataclasses.fields(LoopConfig), key=lambda f: order.index(f.name) if f.name in order else len(order)):
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
        raise ValueError(f"{folder} already holds a run ({', '.join(held)}), which a new fit there would overwrite; "
                         f"fix: resume it with --ckpt_path last, pin another version, or leave out "
                         f"--trainer.logger.init_args.version for a new one")


def evaluate_in_run_folder(cfg: Namespace, subcommand: str) -> None:
    """`validate`/`test`/`predict` log into the checkpoint's own version folder when it is one of
    this run name's (`<version>/<subcommand>/`, beside the fit's curves, no new `version_N`), or into a
    `<subcommand>/` sub-folder of the version pinned; never over the fit's own files."""
    logger = cfg.trainer.logger
    if not isinstance(logger, Namespace) or not logger.class_path.endswith("TensorBoardLogger"):
        return
    args = logger.init_args
    if args.get("version") is None and cfg.get("ckpt_path"):
        ckpt, root = Path(cfg.ckpt_path).absolute(), (Path(args.save_dir) / (args.get("name") or "")).absolute()
        if ckpt.parent.name == "checkpoints" and ckpt.parent.parent.parent == root:
            args.version = ckpt.parent.parent.name
    if args.get("version") is not None and args.get("sub_dir") is None:
        args.sub_dir = subcommand
        if subcommand in JOIN_THE_FIT and _names(logger.class_path, TensorBoardLogger):
            logger.class_path = f"{EvaluationLogger.__module__}.{EvaluationLogger.__name__}"


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
