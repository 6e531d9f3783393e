"""Which checkpoint a Trainer command loads (`--ckpt_path FILE`, or `last`), checked before anything is
built: readable plain data, the same model config and, to resume a fit, the same data stream. Unlike
LightningCLI's default, a checkpoint's hyperparameters never silently replace the given config: the
model config must match (else a clear error), and evaluation settings (eval_rounds, generate) stay
those of the command line."""

from __future__ import annotations

import os
import sys

import torch
from jsonargparse import Namespace
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from loopnet import checkpoints
from loopnet.data import TokenStreamDataModule
from loopnet.env import error_line
from loopnet.training.errors import Reported
from loopnet.training.precheck import ckpt_path_problem


def check_ckpt_path(subcommand: str, cfg: Namespace) -> None:
    """`--ckpt_path` as given: an evaluation needs one, and one that names a file in this process
    (`best`, `hpc`) only a fit has; a file is checked (`check_for_command`)."""
    path = cfg.get("ckpt_path")
    problem = ckpt_path_problem(subcommand, path, cfg.model.get("init_weights") if cfg.get("model") else None)
    if problem:
        raise ValueError(problem)
    if not path or path in checkpoints.SENTINELS:
        return
    checkpoints.check_checkpoint_file(path)
    check_for_command(path, cfg, subcommand)


def check_for_command(path: str, cfg: Namespace, subcommand: str) -> None:
    """The checks a checkpoint passes before anything is built: readable plain data, the same model
    config and, to resume a fit, the same data stream."""
    ckpt = checkpoints.check_checkpoint(path, cfg.model.config.as_dict())
    if subcommand == "fit":
        check_steps_left(path, ckpt, cfg.trainer.get("max_steps"))
    saved = TokenStreamDataModule.saved_config(ckpt)
    if subcommand == "fit" and saved is not None:
        TokenStreamDataModule(**cfg.data.as_dict()).check_resume(saved, f"the checkpoint {path}")


def check_steps_left(path: str, ckpt: dict, max_steps) -> None:
    """A resume whose --trainer.max_steps is below the checkpoint's step is refused: the fit would run no step
    and record a completed run at max_steps that no checkpoint holds."""
    step = ckpt.get("global_step")
    if isinstance(max_steps, int) and isinstance(step, int) and 0 <= max_steps < step:
        raise ValueError(
            f"--trainer.max_steps {max_steps} is below step {step}, which the checkpoint {path} "
            f"already reached; fix: give --trainer.max_steps {step} or more to continue it, or evaluate "
            f"it with `loopnet test --ckpt_path {path}`"
        )


def resolve_fit_last(cfg: Namespace) -> tuple[str | None, str]:
    """`fit --ckpt_path last`: continue in the version folder of this run that holds a checkpoint, check
    the checkpoint Lightning will pick as a given path is checked, and name it in `cfg.ckpt_path`.
    Returns what this rank found (None: none, a fresh start) and where it looked, which the ranks
    compare once the process group is up (`ResumeOnEveryRank`)."""
    logger = cfg.trainer.logger
    if isinstance(logger, Namespace):
        checkpoints.resume_in_last_version(logger.init_args)
    folder = checkpoints.pinned_checkpoint_folder(cfg)
    last = checkpoints.newest_last_checkpoint(folder) if folder is not None else None
    if last is not None:
        check_for_command(str(last), cfg, "fit")
        cfg.ckpt_path = str(last)
        if rank_zero_only.rank == 0:
            print(f"loopnet: resuming from {last}", file=sys.stderr)
    folder = checkpoints.pinned_checkpoint_folder(cfg)
    where = (
        str(folder)
        if folder is not None
        else (
            f"{logger.init_args.save_dir}/{logger.init_args.get('name') or ''}"
            if isinstance(logger, Namespace)
            else "the checkpoint folder"
        )
    )
    return (None if cfg.ckpt_path == checkpoints.LAST else cfg.ckpt_path), where


def newest_run_checkpoint(cfg: Namespace, subcommand: str) -> str:
    """`test`/`validate`/`predict --ckpt_path last`: the newest last*.ckpt of this config's run, in
    --checkpoint.dirpath or the logger's pinned version when given, else in its one version that
    holds checkpoints (several: refused as ambiguous)
    (Lightning's own 'last' would look in this evaluation's new folder, find none and quietly
    use the random initial weights)."""
    found, where = checkpoints.last_checkpoint(cfg)
    if found is None:
        raise FileNotFoundError(
            f"--ckpt_path last: no {where}; fix: give the .ckpt file with --ckpt_path, "
            f"or use the config (and run name) the model was trained with"
        )
    check_for_command(str(found), cfg, subcommand)
    if rank_zero_only.rank == 0:
        print(f"loopnet: evaluating {found}", file=sys.stderr)
    return str(found)


# ----------------------------------------------------------------------------- a shared run folder
# Several nodes, one run folder: every rank reads and writes the same run folder, so it must lie on a
# filesystem that every node mounts (a shared filesystem: NFS, Lustre, GPFS, ...).
#
# `loopnet fit` resolves the logger's `save_dir` (and `--checkpoint.dirpath`) to absolute paths before
# anything runs, so the run folder is the same path on every node and config.yaml / summary.json name it.
# `--ckpt_path last` is looked up by each rank on the disk it sees; `ResumeOnEveryRank` compares what the
# ranks found once the process group is up, and ends the fit with one line on every rank when some found a
# checkpoint and others did not (else those would start afresh beside ranks that resume, and hang or
# diverge silently).

SHARED_FS = (
    "every node must see the same run folder; fix: put --trainer.logger.init_args.save_dir (and "
    "--checkpoint.dirpath, if given) on a filesystem that all nodes mount (a shared filesystem), "
    "e.g. /shared/runs"
)


def absolute(path: str | os.PathLike) -> str:
    """`path` as an absolute path (normalised, symlinks kept), the same string on every node."""
    return os.path.abspath(os.path.expanduser(path))


class ResumeOnEveryRank(Callback):
    """`fit --ckpt_path last`: all ranks resume, or none (one all-gather in `setup`).

    Args:
        found: The checkpoint this rank found for 'last', None when it found none.
        where: Where it was looked for (named in the error).
    """

    def __init__(self, found: str | None, where: str):
        self.found, self.where = found, where

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit" or trainer.world_size == 1:
            return
        flags = trainer.strategy.all_gather(torch.tensor(int(self.found is not None), device=pl_module.device))
        found = [rank for rank, flag in enumerate(flags.flatten().tolist()) if flag]
        if found and len(found) < trainer.world_size:
            missing = [rank for rank in range(trainer.world_size) if rank not in found]
            message = (
                f"--ckpt_path last: rank(s) {found} found a checkpoint to resume from and rank(s) {missing} did not "
                f"(rank {trainer.global_rank} looked in {self.where}: {self.found or 'none'}): {SHARED_FS}"
            )
            if os.environ.get("LOOPNET_DEBUG"):
                raise ValueError(message)
            # Written here, then a barrier: the first rank to exit has torchrun stop the others, which could
            # cut a rank still in Lightning's teardown off before its line.
            error_line("loopnet", f"{message} (set LOOPNET_DEBUG=1 for the traceback)")
            trainer.strategy.barrier("resume_on_every_rank")
            raise Reported(message)
