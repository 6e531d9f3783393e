"""Which checkpoint a Trainer command loads (`--ckpt_path FILE`, or `last`), checked before anything is
built: readable plain data, the same model config and, to resume a fit, the same data stream. Unlike
LightningCLI's default, a checkpoint's hyperparameters never silently replace the given config: the
model config must match (else a clear error), and evaluation settings (eval_rounds, generate) stay
those of the command line."""

from __future__ import annotations

import sys

from jsonargparse import Namespace
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from loopnet import checkpoints
from loopnet.data import TokenStreamDataModule
from loopnet.training.precheck import ckpt_path_problem


def check_ckpt_path(subcommand: str, cfg: Namespace) -> None:
    """`--ckpt_path` as given: an evaluation needs one, and one that names a file in this process
    (`best`, `hpc`) only a fit has; a file is checked (`check_checkpoint`)."""
    path = cfg.get("ckpt_path")
    problem = ckpt_path_problem(subcommand, path, cfg.model.get("init_weights") if cfg.get("model") else None)
    if problem:
        raise ValueError(problem)
    if not path or path in checkpoints.SENTINELS:
        return
    checkpoints.check_checkpoint_file(path)
    check_checkpoint(path, cfg, subcommand)


def check_checkpoint(path: str, cfg: Namespace, subcommand: str) -> None:
    """The checks a checkpoint passes before anything is built: readable plain data, the same model
    config and, to resume a fit, the same data stream."""
    ckpt = checkpoints.check_checkpoint(path, cfg.model.config.as_dict())
    saved = TokenStreamDataModule.saved_config(ckpt)
    if subcommand == "fit" and saved is not None:
        TokenStreamDataModule(**cfg.data.as_dict()).check_resume(saved, f"the checkpoint {path}")


def resolve_fit_last(cfg: Namespace) -> tuple[str | None, str]:
    """`fit --ckpt_path last`: continue in the version folder of this run that holds a checkpoint, check
    the checkpoint Lightning will pick as a given path is checked, and name it in `cfg.ckpt_path`.
    Returns what this rank found (None: none, a fresh start) and where it looked, which the ranks
    compare once the process group is up (`shared_folder.ResumeOnEveryRank`)."""
    logger = cfg.trainer.logger
    if isinstance(logger, Namespace):
        checkpoints.resume_in_last_version(logger.init_args)
    folder = checkpoints.pinned_checkpoint_folder(cfg)
    last = checkpoints.newest_last_checkpoint(folder) if folder is not None else None
    if last is not None:
        check_checkpoint(str(last), cfg, "fit")
        cfg.ckpt_path = str(last)
        if rank_zero_only.rank == 0:
            print(f"loopnet: resuming from {last}", file=sys.stderr)
    folder = checkpoints.pinned_checkpoint_folder(cfg)
    where = str(folder) if folder is not None else (
        f"{logger.init_args.save_dir}/{logger.init_args.get('name') or ''}" if isinstance(logger, Namespace)
        else "the checkpoint folder")
    return (None if cfg.ckpt_path == checkpoints.LAST else cfg.ckpt_path), where


def newest_run_checkpoint(cfg: Namespace, subcommand: str) -> str:
    """`test`/`validate`/`predict --ckpt_path last`: the newest last*.ckpt of this config's run, in
    --checkpoint.dirpath or the logger's pinned version when given, else in its one version that
    holds checkpoints (several: refused as ambiguous)
    (Lightning's own 'last' would look in this evaluation's new folder, find none and quietly
    use the random initial weights)."""
    found, where = checkpoints.last_checkpoint(cfg)
    if found is None:
        raise FileNotFoundError(f"--ckpt_path last: no {where}; fix: give the .ckpt file with --ckpt_path, "
                                f"or use the config (and run name) the model was trained with")
    check_checkpoint(str(found), cfg, subcommand)
    if rank_zero_only.rank == 0:
        print(f"loopnet: evaluating {found}", file=sys.stderr)
    return str(found)
