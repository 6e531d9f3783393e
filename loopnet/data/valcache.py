"""The held-out windows of a large corpus, built once and kept on disk, shared by the ranks and by later runs.

The file is named by a digest of everything its contents depend on (`key`: the corpus's identity,
e.g. the hub commit and files, or local files' sizes and modification times; the split rule; the
tokenizer; seq_len and val_max_tokens), so a changed input never reads a stale file. Ranks need no
barrier (the process group does not exist yet when the data is checked): each takes an exclusive
file lock; the first to get it builds and writes the file atomically (temporary file, fsync,
rename), the others wait on the lock and then read it. A rank that fails while building releases
the lock, and the next one tries and fails with the same error itself, so nobody waits forever.

Where: `data.cache_dir`, else $LOOPNET_CACHE_DIR, else $XDG_CACHE_HOME/loopnet (~/.cache/loopnet).
A cache that cannot be written (an unwritable folder, a full disk, a quota) costs the cache, not the
run: one warning, the windows built in memory, and nothing of the attempt left behind (no partial
file, no key file, no lock file).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from loopnet.files import atomic_write

KEY_VERSION = 1


def cache_root(configured: str | None = None) -> Path:
    if configured:
        return Path(configured).expanduser()
    if os.environ.get("LOOPNET_CACHE_DIR"):
        return Path(os.environ["LOOPNET_CACHE_DIR"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "loopnet"


def cache_path(key: dict, root: Path) -> Path:
    digest = hashlib.sha256(json.dumps({"v": KEY_VERSION, **key}, sort_keys=True, default=str).encode()).hexdigest()
    return root / "val" / f"val-{digest[:24]}.npy"


def cached_windows(key: dict, build: Callable[[], np.ndarray], root: Path) -> tuple[np.ndarray, Path | None]:
    """(windows, the file they are kept in): read from the cache, or built by `build()` and written
    there under a lock (see the module's docstring). The file is None when it could not be written."""
    from filelock import FileLock

    path = cache_path(key, root)
    if path.is_file():
        return np.load(path), path
    made = [d for d in (path.parent, *path.parent.parents) if not d.exists()]  # folders this call creates
    lock_file = Path(str(path) + ".lock")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(lock_file))
        lock.acquire()
    except OSError as e:
        _forget(lock_file, made)
        _warn(path, e)
        return build(), None
    written = False
    try:
        if path.is_file():  # another rank built it while this one waited
            return np.load(path), path
        windows = build()
        try:
            atomic_write(
                path.with_suffix(".json"), lambda f: f.write(json.dumps(key, indent=1, default=str)), binary=False
            )
            atomic_write(path, lambda f: np.save(f, windows))
        except OSError as e:  # atomic_write left no temporary file; its key file goes too
            with contextlib.suppress(OSError):
                path.with_suffix(".json").unlink()
            _warn(path, e)
            return windows, None
        written = True
        return windows, path
    finally:
        lock.release()
        if not written and not path.is_file():
            # A rank still waiting on this lock file holds it open and takes it next; removing the name
            # at worst lets two ranks build at once, each writing its file atomically.
            _forget(lock_file, made)


def _warn(path: Path, err: OSError) -> None:
    print(
        f"loopnet: warning: cannot use the validation cache {path.parent} ({err}); building the held-out "
        f"windows in memory (set data.cache_dir to a writable folder with free space to keep them)",
        file=sys.stderr,
    )


def _forget(lock_file: Path, made: list[Path]) -> None:
    """Remove what a failed cache write made: the lock file, and the folders it created (innermost first)."""
    with contextlib.suppress(OSError):
        lock_file.unlink()
    for folder in made:
        with contextlib.suppress(OSError):
            folder.rmdir()  # only when empty
