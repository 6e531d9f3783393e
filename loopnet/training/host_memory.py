"""Host (CPU) memory allocator settings for CPU training.

glibc's malloc serves every allocation above its mmap threshold (at most 32 MiB) with a fresh
`mmap` and gives it back to the kernel on `free`. A training step allocates and frees the same
large activations every step (the logits alone are batch·seq·vocab floats: 32 MiB at the CPU
benchmark size, 196 MiB at `make fit`'s), so each step page-faults them in again: on CPU that
is 15-30% of a step. Keeping freed memory in the process, as PyTorch's CUDA caching allocator
does on the GPU, removes it: `keep_freed_memory()` turns glibc's mmap path off and raises its
trim threshold, so freed blocks are reused by the next step. Resident memory then stays at the
run's peak instead of shrinking between steps.

Limits (glibc's): the trim threshold is a C int, so a free block of 2 GiB or more at the top of
the heap is still returned; threads other than the main one allocate from their own arenas,
where blocks over 64 MiB still go through mmap. Autograd's CPU backward runs on the main thread.

The `HostMemory` callback (a default of the `loopnet` CLI) applies it when a Trainer runs on CPU;
`--host_memory.keep_freed false` keeps glibc's defaults. A no-op on C libraries other than glibc.
"""

from __future__ import annotations

import ctypes
import functools

# mallopt(3) parameters (malloc.h)
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX = -1, -2, -4
KEEP = {M_MMAP_MAX: 0, M_TRIM_THRESHOLD: 2**31 - 1, M_TOP_PAD: 64 * 2**20}


@functools.cache
def _glibc():
    libc = ctypes.CDLL(None)  # the C library this process already uses
    if not hasattr(libc, "gnu_get_libc_version"):  # musl, macOS: mallopt's parameters differ or are absent
        return None
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return libc


def glibc_available() -> bool:
    return _glibc() is not None


def keep_freed_memory() -> bool:
    """Make glibc keep freed memory for reuse (see the module docstring). True if applied.

    glibc stops adapting its mmap threshold after any mallopt call, so its default behaviour
    cannot be restored in the same process afterwards."""
    if not glibc_available():
        return False
    return all(_glibc().mallopt(k, v) == 1 for k, v in KEEP.items())
