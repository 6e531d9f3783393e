"""A run's checkpoints: read one with torch's restricted unpickler, find the one `--ckpt_path last`
means, check that one fits the run that loads it. Light to import (torch only where a checkpoint is
read), for every command's checks (`loopnet fit/test/...` and `loopnet eval`); the Trainer's writer,
`AtomicCheckpointIO`, is built on first use (it subclasses Lightning's).

The layout `loopnet fit` writes: ``<save_dir>/<run name>/<version>/checkpoints/{last,best-*}.ckpt``,
beside the version's ``summary.json`` and ``config.yaml``. What a checkpoint's data loader saved is
the data module's to read (`TokenStreamDataModule.saved_config`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pickle
import re
from pathlib import Path
from typing import Any

# ----------------------------------------------------------------------------------------- reading
SHARDED_META = "meta.pt"  # in a sharded (FSDP, state_dict_type: sharded) checkpoint folder: all but the tensors


def is_sharded_checkpoint(path: str | Path) -> bool:
    """A sharded checkpoint: Lightning's FSDP writes `last.ckpt` as a folder of per-rank shards and meta.pt."""
    return Path(path).is_dir() and (Path(path) / SHARDED_META).is_file()


def check_checkpoint_file(path: str, option: str = "--ckpt_path") -> None:
    """`path` names a checkpoint file that holds bytes: a folder, a missing or an empty (0-byte) file is
    refused in one line that says what to pass instead (without reading it: no torch)."""
    where = Path(path)
    if is_sharded_checkpoint(where):  # FSDP's sharded checkpoint: a folder by design
        return
    if where.is_dir():
        found = [
            p
            for pattern in ("last*.ckpt", "checkpoints/last*.ckpt", "version_*/checkpoints/last*.ckpt")
            for p in where.glob(pattern)
        ]  # a checkpoints/, version or run folder: its newest last*.ckpt
        found = sorted(found, key=lambda p: p.stat().st_mtime)[-1:] or [where / "last.ckpt"]
        raise ValueError(
            f"{option} {path} is a folder, not a checkpoint file; fix: give a .ckpt file in it, e.g. {found[0]}"
        )
    if not where.is_file():
        raise FileNotFoundError(
            f"{option} {path} does not exist; fix: give a .ckpt file "
            f"(e.g. runs/<run>/version_N/checkpoints/last.ckpt) or 'last'"
        )
    if where.stat().st_size == 0:
        raise ValueError(
            f"{path} is empty (0 bytes), not a checkpoint: its write never completed; fix: pass another "
            f"one with {option}, e.g. best-*.ckpt or an earlier copy of last.ckpt"
        )


def load_checkpoint_meta(path: str) -> dict:
    """A checkpoint read with torch's restricted (weights_only) unpickler, its tensors left on disk. For a
    sharded checkpoint folder, its meta.pt: everything but the weights and optimiser state."""
    import torch

    sharded = is_sharded_checkpoint(path)
    if sharded:
        path = str(Path(path) / SHARDED_META)
    if Path(path).is_file() and Path(path).stat().st_size == 0:  # torch would say "cannot mmap an empty file"
        check_checkpoint_file(path)
    try:
        # mmap: only the pickled metadata is read; the tensors stay on disk (this is a check, not the load)
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError:
        try:  # names what the file would import, without running anything (torch's list is in set order)
            found = sorted(torch.serialization.get_unsafe_globals_in_checkpoint(path))
            unsafe = ", ".join(found[:5]) or "unknown objects"
        except Exception:
            unsafe = "unknown objects"
        raise ValueError(
            f"refused to load {path}: unpickling it would import or run code ({unsafe}), which "
            "loopnet's restricted (weights_only) loader does not allow; fix: use a checkpoint written "
            "by `loopnet fit`, and never load files from untrusted sources"
        ) from None
    except Exception as err:  # truncated or not a torch file
        why = (str(err).splitlines() or [""])[0]
        why = re.split(r"(?<=\.) ", why, maxsplit=1)[0].rstrip(".")[:200]  # torch's first sentence only
        raise ValueError(
            f"{path} is not a readable checkpoint, it is corrupt or truncated ({type(err).__name__}: {why}); "
            f"fix: pass another one with --ckpt_path, e.g. best-*.ckpt or an earlier copy of last.ckpt"
        ) from None
    if not isinstance(ckpt, dict) or ("state_dict" not in ckpt and not sharded):
        raise ValueError(f"{path} is not a Lightning checkpoint (no state_dict); give a .ckpt written by loopnet fit")
    return ckpt


def build_network(config, weights: dict, device="cpu", dtype=None):
    """The `LoopedTransformer` of `config` holding `weights` (its state dict), in eval mode on `device` (and
    `dtype`, default: the weights'). Built on the meta device (no initialisation, no memory), then the weights
    become the parameters themselves (`assign`): tensors read from disk by memory-mapping (a .ckpt read with
    mmap, safetensors files) are not copied unless the device or dtype asks for it, and then each is converted
    once, so that no two full copies of the weights are ever held. The one builder of `loopnet.load`,
    `loopnet eval`, `loopnet export` and a model folder's `load_model`."""
    import torch

    from loopnet.model import LoopConfig, LoopedTransformer
    from loopnet.model.layers import Rotary

    config = config if isinstance(config, LoopConfig) else LoopConfig(**config)
    device = torch.device(device)
    with torch.device("meta"):
        model = LoopedTransformer(config)
    if config.tie_embeddings and "lm_head.weight" not in weights:  # a format that stores a shared tensor once
        weights = {**weights, "lm_head.weight": weights.get("wte.weight")}
    converted: dict[int, torch.Tensor] = {}  # by id: a tied head converts once, with its embedding

    def place(t):
        if not isinstance(t, torch.Tensor):
            return t
        return converted.setdefault(id(t), t.to(device=device, dtype=dtype if t.is_floating_point() else None))

    model.load_state_dict({k: place(v) for k, v in weights.items()}, assign=True)
    if config.tie_embeddings:  # assigned one by one, the two names became two parameters: one again
        model.lm_head.weight = model.wte.weight
    if model.rotary is not None:  # its tables are buffers outside the state dict: computed here, in fp32
        model.rotary = Rotary(config.head_dim, config.seq_len, config.rope_base).to(device)
    return model.eval()


def newer_than_kept(path: str | None, trainer) -> bool:
    """Whether the checkpoint at `path` (the interruption checkpoint) holds a later step than every
    checkpoint the fit `trainer` keeps (its ModelCheckpoints' last and best): then removing it would lose
    the newest weights (a resume with max_steps at or below the stopped step runs no step past it)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    def step(p) -> int | None:
        try:
            return int(load_checkpoint_meta(str(p))["global_step"]) if p and os.path.exists(p) else None
        except (ValueError, KeyError, TypeError):
            return None

    own = step(path)
    if own is None:
        return False
    kept = [
        step(p)
        for cb in trainer.checkpoint_callbacks
        if isinstance(cb, ModelCheckpoint)
        for p in (cb.last_model_path, cb.best_model_path)
    ]
    return all(s is None or s < own for s in kept)


# ----------------------------------------------------------------------------------------- compatibility
def check_model_config(saved: Any, current: dict) -> None:
    """Raise a clear error when a checkpoint's model config (a dict or a LoopConfig) differs from the current one."""
    if saved is None:
        return
    from loopnet.model.config import RUN_SETTINGS, LoopConfig

    if dataclasses.is_dataclass(saved):
        saved = dataclasses.asdict(saved)
    # A field the checkpoint lacks was added after it was written: it trained with that field's default.
    defaults = {f.name: f.default for f in dataclasses.fields(LoopConfig)}
    diff = [
        f"{k}: checkpoint {saved.get(k, defaults.get(k))!r} vs config {v!r}"
        for k, v in current.items()
        if k not in RUN_SETTINGS and saved.get(k, defaults.get(k)) != v
    ]
    if diff:
        raise ValueError(
            "the checkpoint was trained with another model config (" + "; ".join(diff) + "); "
            "run with the config saved beside it (runs/<run>/version_N/config.yaml), and use "
            "--model.eval_rounds to evaluate other round counts"
        )


def check_checkpoint(path: str, model_config: dict) -> dict:
    """Read `path` (readable, plain data) and check it was trained with `model_config`; the error names
    the file (with `--ckpt_path last` the user did not). Returns the checkpoint, its tensors on disk."""
    ckpt = load_checkpoint_meta(path)
    try:
        check_model_config(ckpt.get("hyper_parameters", {}).get("config"), model_config)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    return ckpt


def model_weights(ckpt: dict, path, gpt2_ids: bool = True) -> tuple[dict, dict]:
    """A loopnet checkpoint's model config and the `LoopedTransformer`'s weights (LoopedLM keeps the
    network under `model.`; other entries, such as metrics, are not weights), for use outside
    Lightning (`loopnet eval`, `loopnet.load`). Refused: a checkpoint that is not loopnet's, and with
    `gpt2_ids` (what the harness feeds) one trained on other token ids (data.vocab compact or bytes)."""
    if is_sharded_checkpoint(path):
        raise ValueError(
            f"{path} is a sharded (FSDP) checkpoint folder; fix: consolidate it into one file first: "
            f"python -m lightning.pytorch.utilities.consolidate_checkpoint {path}"
        )
    try:
        config, state = ckpt["hyper_parameters"]["config"], ckpt["state_dict"]
    except (KeyError, TypeError):
        raise ValueError(
            f"{path} is not a loopnet checkpoint (expected hyper_parameters.config and state_dict, "
            f"as saved by loopnet fit)"
        ) from None
    vocab = (ckpt.get("datamodule_hyper_parameters") or {}).get("vocab", "gpt2")
    if gpt2_ids and vocab != "gpt2":
        raise ValueError(
            f"{path} was trained with data.vocab: {vocab} (its own token ids), but the harness "
            f"feeds GPT-2 ids; fix: evaluate a model trained with data.vocab: gpt2"
        )
    return config, {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}


# ----------------------------------------------------------------------------------------- finding
# `--ckpt_path` values that name no file: Lightning resolves them. `last`: the newest last*.ckpt (loopnet
# looks it up itself, `last_checkpoint`); `best`, `hpc`: a checkpoint of a fit in this same process.
IN_PROCESS = ("best", "hpc")
LAST = "last"
SENTINELS = (LAST, *IN_PROCESS)


def resume_hint() -> str:
    """How to resume a stopped fit, for its last line: the command `LOOPNET_RESUME` names where the launcher
    knows it (`make fit` sets it), else the same command with `--ckpt_path last`."""
    return os.environ.get("LOOPNET_RESUME") or "the same command and --ckpt_path last"


def version_folder(logger_args) -> Path:
    """The TensorBoard logger's version folder (`logger_args`: its init_args, version pinned);
    version "" for sweep cells: no version level."""
    version = logger_args.version if isinstance(logger_args.version, str) else f"version_{logger_args.version}"
    return Path(logger_args.save_dir) / (logger_args.get("name") or "") / version


def newest_last_checkpoint(folder: Path) -> Path | None:
    """The checkpoint Lightning resumes from with `ckpt_path="last"` in `folder`: the newest `last*.ckpt`."""
    found = sorted(folder.glob("last*.ckpt"), key=lambda p: p.stat().st_mtime) if folder.is_dir() else []
    return found[-1] if found else None


def run_checkpoint(root: Path) -> Path | None:
    """The newest `last*.ckpt` of the one `version_*` folder of the run folder `root` that holds any.
    When several versions do, 'last' is ambiguous (file times would let a later short fit silently
    stand in for the run meant): refused, naming them and how to pick one."""
    versions: dict[Path, list[Path]] = {}
    for ckpt in root.glob("version_*/checkpoints/last*.ckpt"):
        versions.setdefault(ckpt.parent.parent, []).append(ckpt)
    if len(versions) > 1:
        names = sorted((v.name for v in versions), key=lambda n: (len(n), n))
        listed = ", ".join(f"{n} ({_run_state(root / n)})" for n in names)
        raise ValueError(
            f"--ckpt_path last is ambiguous: {len(names)} versions of {root} hold a last*.ckpt: {listed}; "
            f"fix: pick one with --trainer.logger.init_args.version N (e.g. {names[-1].split('_')[-1]}), "
            f"or give the .ckpt file with --ckpt_path"
        )
    return newest_last_checkpoint(next(iter(versions)) / "checkpoints") if versions else None


def _run_state(version: Path) -> str:
    """'completed at step 8' (from the version's summary.json), or 'no summary'."""
    try:
        summary = json.loads((version / "summary.json").read_text())
        return f"{summary['status']} at step {summary['global_step']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "no summary"


def pinned_checkpoint_folder(cfg) -> Path | None:
    """Where a run's checkpoints are when the command (its parsed config `cfg`) pins them:
    --checkpoint.dirpath, or the checkpoints/ of the logger's pinned version."""
    folder = cfg.checkpoint.get("dirpath") if cfg.get("checkpoint") else None
    logger = cfg.trainer.logger
    if folder is None and _tensorboard_args(logger) is not None and logger.init_args.get("version") is not None:
        folder = version_folder(logger.init_args) / "checkpoints"
    return Path(folder) if folder is not None else None


def last_checkpoint(cfg) -> tuple[Path | None, str]:
    """What `--ckpt_path last` means for the command `cfg`, and where it was looked for: the newest
    last*.ckpt in --checkpoint.dirpath or the logger's pinned version when given, else in the one
    version of this config's run that holds checkpoints (several: refused as ambiguous)."""
    folder = pinned_checkpoint_folder(cfg)
    if folder is not None:
        return newest_last_checkpoint(folder), f"{folder}/last*.ckpt"
    args = _tensorboard_args(cfg.trainer.logger)
    if args is None or args.get("save_dir") is None:
        raise ValueError(
            "--ckpt_path last needs the TensorBoard logger's run folder or --checkpoint.dirpath "
            "to look in; fix: give the .ckpt file with --ckpt_path"
        )
    root = Path(args.save_dir) / (args.get("name") or "")
    return run_checkpoint(root), f"{root}/version_*/checkpoints/last*.ckpt"


def resume_in_last_version(logger_args) -> None:
    """For `fit --ckpt_path last`: continue in the version folder of this run name that holds a
    checkpoint, so Lightning finds its last.ckpt (or last-interrupted.ckpt) and the TensorBoard
    curves continue in the same folder. With none, training starts afresh; with several, the
    choice is the user's (`run_checkpoint`)."""
    if logger_args.get("version") is not None:
        return
    found = run_checkpoint(Path(logger_args.save_dir) / logger_args.name)
    if found is not None:
        logger_args.version = found.parent.parent.name


def _tensorboard_args(logger):
    """A logger given as class_path/init_args (jsonargparse's Namespace): its init_args, else None."""
    return logger.init_args if hasattr(logger, "init_args") else None


# ----------------------------------------------------------------------------------------- one writer
LOCK_NAME = ".loopnet.lock"
_held: list[tuple[int, Path, list[Path]]] = []  # the version locks held: (descriptor, path, folders made for it)


def lock_version(folder: Path) -> None:
    """Take the exclusive lock of run folder `folder` (a fit pinned to a version, or resuming one) for
    this command, so that two fits never write into one folder: the second is refused in one line.
    An flock on `<folder>/.loopnet.lock`: released when the process ends however it ends (no stale lock
    after a kill -9); the file is removed by `release_version_locks` at the command's end."""
    import fcntl

    made = [p for p in (folder, *folder.parents) if not p.exists()]  # removed again if left empty
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise ValueError(
                f"{folder} is in use by another loopnet fit (pid {holder}) pinned to the same version; "
                f"fix: wait for it to end (then resume it with --ckpt_path last), or pin another version "
                f"with --trainer.logger.init_args.version"
            ) from None
        try:  # the holder may have removed the file between our open and our lock: take the new one
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    _held.append((fd, path, made))


def release_version_locks() -> None:
    """Remove and release the version locks this process holds (a command's end), and the folders
    made for a lock that nothing else was written into (a fit refused by a later check)."""
    while _held:
        fd, path, made = _held.pop()
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                os.unlink(path)  # before the unlock: a waiter then finds the file gone and takes a new one
        except OSError:
            pass
        os.close(fd)
        for folder in made:  # deepest first
            try:
                folder.rmdir()
            except OSError:  # not empty (the run's files), or gone
                break


# ----------------------------------------------------------------------------------------- writing
@functools.cache
def _atomic_checkpoint_io() -> type:
    import torch
    from lightning.fabric.plugins import TorchCheckpointIO

    from loopnet.files import atomic_write

    class AtomicCheckpointIO(TorchCheckpointIO):
        """Write a checkpoint so that a crash or kill at any moment leaves either the previous file or
        the complete new one, never a partial one: into a temporary file in the same folder, flushed
        and fsynced, then renamed over the target (`os.replace`), then the folder fsynced.

        Lightning's default goes through fsspec, which writes the temporary file in the system's temp
        folder; when that is another filesystem than the checkpoint folder (tmpfs, a local disk under
        network storage), the final move is a copy, and a kill during it leaves a truncated checkpoint.
        Remote paths (s3://, gs://, ...) still go through Lightning's default.
        """

        def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any = None) -> None:
            if storage_options is not None or "://" in str(path):
                return super().save_checkpoint(checkpoint, path, storage_options)
            atomic_write(path, lambda f: torch.save(checkpoint, f))

    AtomicCheckpointIO.__module__, AtomicCheckpointIO.__qualname__ = __name__, "AtomicCheckpointIO"  # pickles by name
    return AtomicCheckpointIO


def __getattr__(name: str):
    # `AtomicCheckpointIO` subclasses Lightning's TorchCheckpointIO: built when first asked for, so that
    # the checks that import this module (before Lightning loads) stay light.
    if name == "AtomicCheckpointIO":
        return _atomic_checkpoint_io()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
