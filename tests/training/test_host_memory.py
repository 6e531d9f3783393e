"""keep_freed_memory() and the HostMemory callback: freed large tensors are reused instead of
page-faulted in again every step."""

import json
import subprocess
import sys

import pytest

from loopnet.training.host_memory import glibc_available
from tests.helpers import communicate

pytestmark = pytest.mark.skipif(not glibc_available(), reason="glibc only")

# Lightning is loaded first, as in `loopnet fit` (its HostMemory callback applies the setting then): without it
# (loopnet.training.host_memory alone no longer imports it) the heap's first blocks were faulted in again for up
# to 8 allocations in about half the runs on this machine, instead of 2.
CHILD = """
import json, resource, sys, torch
import lightning
from loopnet.training.host_memory import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else False
faults = []
for _ in range(12):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = torch.ones(16 * 2**20)  # 64 MiB: above glibc's largest mmap threshold
    del t
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"applied": applied, "faults": faults}))
"""


def run_children(*modes: str) -> list[dict]:
    """CHILD in one process per mode, started together (their start-up dominates); what each printed."""
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, m], stdout=subprocess.PIPE, text=True) for m in modes]
    outs = [communicate(proc)[0] for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), outs
    return [json.loads(out.strip().splitlines()[-1]) for out in outs]


def test_freed_memory_is_reused_without_page_faults():
    keep, system = run_children("keep", "system")
    assert keep["applied"] and not system["applied"]
    # glibc's default: every allocation is a fresh mmap, faulted in again (page by page, or by huge
    # pages where transparent huge pages back it: fewer faults, so compare the two runs).
    if min(system["faults"]) < 100:
        pytest.skip(f"too few page faults to compare on this machine: {system['faults']}")
    # Kept: the first allocations grow the heap; once it holds the block, later ones reuse it.
    assert max(keep["faults"][6:]) < 0.05 * min(system["faults"]), (keep, system)


def test_callback_applies_only_on_cpu_and_can_be_turned_off(tmp_path):
    import lightning as L

    from loopnet.training.callbacks import HostMemory

    on, off = HostMemory(), HostMemory(keep_freed=False)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
        callbacks=[on, off],
    )
    for cb in (on, off):
        cb.setup(trainer, None, "fit")
    assert on.applied and not off.applied


def test_cli_exposes_the_switch(tmp_path):
    from tests.reliability.helpers import loopnet

    res = loopnet("fit", "--help", cwd=tmp_path)  # the parser's help, in this process
    assert res.code == 0 and "--host_memory.keep_freed" in res.out, res.err[-2000:]
