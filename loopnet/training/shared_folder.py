"""Several nodes, one run folder: every rank reads and writes the same run folder, so it must lie on a
filesystem that every node mounts (a shared filesystem: NFS, Lustre, GPFS, ...).

`loopnet fit` resolves the logger's `save_dir` (and `--checkpoint.dirpath`) to absolute paths before
anything runs, so the run folder is the same path on every node and config.yaml / summary.json name it.
`--ckpt_path last` is looked up by each rank on the disk it sees; `ResumeOnEveryRank` compares what the
ranks found once the process group is up, and ends the fit with one line on every rank when some found a
checkpoint and others did not (else those would start afresh beside ranks that resume, and hang or
diverge silently)."""

from __future__ import annotations

import os

import torch
from lightning.pytorch.callbacks import Callback

from loopnet.env import error_line
from loopnet.training.errors import Reported

SHARED_FS = ("every node must see the same run folder; fix: put --trainer.logger.init_args.save_dir (and "
             "--checkpoint.dirpath, if given) on a filesystem that all nodes mount (a shared filesystem), "
             "e.g. /shared/runs")


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
                f"(rank {trainer.global_rank} looked in {self.where}: {self.found or 'none'}): {SHARED_FS}")
            if os.environ.get("LOOPNET_DEBUG"):
                raise ValueError(message)
            # Written here, then a barrier: the first rank to exit has torchrun stop the others, which could
            # cut a rank still in Lightning's teardown off before its line.
            error_line("loopnet", f"{message} (set LOOPNET_DEBUG=1 for the traceback)")
            trainer.strategy.barrier("resume_on_every_rank")
            raise Reported(message)
