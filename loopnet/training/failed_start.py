"""A fit that passes loopnet's start-up checks and then fails before its first step completes (an
exception in the first training step or the sanity check, out of memory) leaves no run folder behind:
the `version_N` it created holds nothing worth keeping (no checkpoint, no training step), and each
such failure would add one more empty run to TensorBoard. Only a folder this process created is
removed, only when it holds nothing but the files a fit writes at its start, and only on rank 0;
a resumed run, a pinned existing folder or anything an earlier run wrote is never touched."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

# What a fit writes into its run folder before its first step ends.
START_FILES = re.compile(r"^(config\.yaml|hparams\.yaml|summary\.json|events\.out\.tfevents\..*|checkpoints/\..+\.tmp"
                         r"|\.loopnet\.lock)$")  # the lock of a fit pinned to its version (loopnet.checkpoints)


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
        print(f"loopnet: the fit failed before its first step completed ({what}); removed the run folder it "
              f"had created, {where} (no checkpoint, no step)", file=sys.stderr)
    return removed


def _relative(path: Path) -> Path:
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path
