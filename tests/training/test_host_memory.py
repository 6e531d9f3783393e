"""keep_freed_memory(): freed large tensors are reused instead of page-faulted in again each step."""

import json
import os
import subprocess
import sys

import pytest

from loopnet.training.host_memory import _glibc

pytestmark = pytest.mark.skipif(_glibc() is None, reason="glibc only")

CHILD = """
import json, resource, sys, torch
from loopnet.training.host_memory import keep_freed_memory
applied = keep_freed_memory()
faults = []
for _ in range(12):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = torch.ones(16 * 2**20)  # 64 MiB: above glibc's largest mmap threshold
    del t
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"applied": applied, "faults": faults}))
"""


def run_child(mode: str) -> dict:
    env = dict(os.environ, LOOPNET_MALLOC=mode)
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_freed_memory_is_reused_without_page_faults():
    pages = 64 * 2**20 // os.sysconf("SC_PAGE_SIZE")
    keep = run_child("keep")
    system = run_child("system")
    assert keep["applied"] and not system["applied"]
    # glibc's default: every allocation is a fresh mmap, faulted in page by page.
    assert all(f > 0.9 * pages for f in system["faults"]), system
    # Kept: the first allocations grow the heap (new pages); once it holds the block, later ones reuse it.
    assert keep["faults"][0] > 0.9 * pages and all(f < 0.01 * pages for f in keep["faults"][6:]), keep
