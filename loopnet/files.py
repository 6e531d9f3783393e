"""Files of a run: writing one so that a crash or kill at any moment leaves either the previous file or
the complete new one, never a partial one (checkpoints, run summaries); checking a folder can be
written before anything is. Light to import, for every command's checks (reading a checkpoint:
`loopnet.checkpoints`)."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO


# atomic_write's temporary files: `.<name>.<mkstemp's 8 characters>.tmp`
TEMPORARY = re.compile(r"^\..+\.[a-z0-9_]{8}\.tmp$")


class _WriteErrors:
    """A file whose write errors are kept: torch.save reports a failed write (disk full) as its own
    `unexpected pos` RuntimeError, hiding the OSError that says what happened."""

    def __init__(self, f: IO):
        self._f, self.error = f, None

    def write(self, data):
        try:
            return self._f.write(data)
        except OSError as err:
            self.error = err
            raise

    def __getattr__(self, name: str):
        return getattr(self._f, name)


def atomic_write(path: str | os.PathLike, write: Callable[[IO], None], binary: bool = True) -> Path:
    """Call `write(f)` on a temporary file in `path`'s folder, flush and fsync it, give it the mode
    a plain `open` would (mkstemp's is 0600), rename it over `path` (`os.replace`), then fsync the
    folder so that the rename itself is durable. The same folder keeps the rename atomic: a
    temporary file on another filesystem would make the final move a copy. A failed write (disk
    full, quota) raises its OSError, naming `path`, whatever `write` made of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    out = None
    try:
        with os.fdopen(fd, "wb" if binary else "w") as f:
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(f.fileno(), 0o666 & ~umask)
            out = _WriteErrors(f)
            write(out)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        cause = out.error if out is not None and out.error is not None else err
        if isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT):
            raise OSError(
                cause.errno,
                f"{os.strerror(cause.errno)} while writing {path} (nothing was replaced); "
                f"fix: free space there, or write to another disk",
            ) from None
        raise
    with contextlib.suppress(OSError):
        dirfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dirfd)
        finally:
            os.close(dirfd)
    return path


def remove_stale_temporaries(folder: str | os.PathLike) -> list[Path]:
    """Remove the temporary files `atomic_write` left in `folder` when its process was killed (kill -9,
    power loss) in the middle of a write; call it where one process writes that folder, before it does."""
    removed = []
    for p in Path(folder).glob(".*.tmp") if Path(folder).is_dir() else []:
        if TEMPORARY.match(p.name) and p.is_file():
            with contextlib.suppress(OSError):
                p.unlink()
                removed.append(p)
    return removed


def check_writable(folder: str, option: str) -> None:
    """Fail before anything is built when a log or checkpoint folder cannot be created or written.
    Nothing is created: the folder, or its nearest existing parent, must be a writable folder."""
    if "://" in str(folder):  # remote (s3://, gs://): left to fsspec
        return
    existing = Path(folder).absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        raise ValueError(
            f"cannot write to the folder {folder} given by {option} ({err.strerror or err}); "
            f"fix: pass a writable folder with {option} <dir>"
        ) from None


def check_run_folder(
    save_dir: str | os.PathLike | None,
    name: str | None,
    version: str | int | None,
    sub_dir: str | None = None,
    option: str = "--trainer.logger.init_args",
) -> None:
    """Fail before anything is written when a logger's run folder, save_dir/name/version[/sub_dir], would lie
    outside save_dir: a name, version or sub_dir that is absolute or climbs out with `..` (a config from
    someone else can otherwise write anywhere the user can). Subfolders that stay inside (`study/a`) are fine."""
    root = os.path.normpath(os.path.abspath(os.path.expanduser(str(save_dir if save_dir is not None else "."))))
    for key, value in (("name", name), ("version", version), ("sub_dir", sub_dir)):
        if value is None or isinstance(value, int) or value == "":
            continue
        text = str(value)
        inside = os.path.normpath(os.path.join(root, text))
        if os.path.isabs(text) or ".." in Path(text).parts or os.path.commonpath([root, inside]) != root:
            raise ValueError(
                f"{option}.{key} {text!r} puts the run folder outside its save_dir {root}; fix: give a "
                f"plain {key} (no '..', not absolute), and choose where runs go with "
                f"{option}.save_dir <dir>"
            )
