"""Writing a file so that a crash or kill at any moment leaves either the previous file or the
complete new one, never a partial one (checkpoints, run summaries)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO


def atomic_write(path: str | os.PathLike, write: Callable[[IO], None], binary: bool = True) -> Path:
    """Call `write(f)` on a temporary file in `path`'s folder, flush and fsync it, give it the mode
    a plain `open` would (mkstemp's is 0600), rename it over `path` (`os.replace`), then fsync the
    folder so that the rename itself is durable. The same folder keeps the rename atomic: a
    temporary file on another filesystem would make the final move a copy."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb" if binary else "w") as f:
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(f.fileno(), 0o666 & ~umask)
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):
        dirfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dirfd)
        finally:
            os.close(dirfd)
    return path
