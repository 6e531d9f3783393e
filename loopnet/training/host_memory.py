"""Host (CPU) memory allocator settings for training.

glibc's malloc serves every allocation above its mmap threshold (at most 32 MiB) with a fresh
`mmap` and gives it back to the kernel on `free`. A training step allocates and frees the same
large activations every step (the logits alone are batch·seq·vocab floats: 32 MiB at the CPU
benchmark size, 206 MiB at `make fit`'s), so each step page-faults them in again: on CPU that
is 20-30% of a step. Keeping freed memory in the process, as PyTorch's CUDA caching allocator
does on the GPU, removes it: `keep_freed_memory()` turns glibc's mmap path off and raises its
trim threshold, so freed blocks are reused by the next step. Resident memory then stays at the
run's peak instead of shrinking between steps.

`loopnet` applies it at start-up; set `LOOPNET_MALLOC=system` to keep glibc's defaults. It is a
no-op on C libraries other than glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

# mallopt(3) parameters (malloc.h)
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX = -1, -2, -4
# glibc's defaults, to restore (the benchmark compares both in one process)
GLIBC_DEFAULTS = {M_TRIM_THRESHOLD: 128 * 1024, M_TOP_PAD: 128 * 1024, M_MMAP_MAX: 65536}
KEEP = {M_MMAP_MAX: 0, M_TRIM_THRESHOLD: 2**31 - 1, M_TOP_PAD: 64 * 2**20}


@functools.cache
def _glibc():
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version  # only glibc has it (and mallopt's parameters above)
    except (OSError, AttributeError):
        return None
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    return libc


def _set(params: dict[int, int]) -> bool:
    libc = _glibc()
    return libc is not None and all(libc.mallopt(k, v) == 1 for k, v in params.items())


def keep_freed_memory() -> bool:
    """Make glibc keep freed memory for reuse (see the module docstring). True if applied."""
    if os.environ.get("LOOPNET_MALLOC", "keep") == "system":
        return False
    return _set(KEEP)


def system_malloc() -> bool:
    """Restore glibc's default settings and hand the retained free memory back. True if applied."""
    ok = _set(GLIBC_DEFAULTS)
    if ok:
        _glibc().malloc_trim(0)
    return ok
