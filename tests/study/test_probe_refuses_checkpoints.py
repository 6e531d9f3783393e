"""`loopnet probe --groups --checkpoints` reads a checkpoint through loopnet.checkpoints: one that would
run code when unpickled is refused in one line (no traceback), nothing runs and nothing is written."""

from __future__ import annotations

import sys

import torch

from tests.helpers import run_command
from tests.reliability.helpers import env


class Evil:
    def __reduce__(self):
        import os

        return os.system, ("touch pwned.txt",)


def test_the_probe_refuses_a_code_carrying_checkpoint_in_one_line(tmp_path):
    torch.save({"state_dict": {}, "x": Evil()}, tmp_path / "evil.ckpt")
    proc = run_command(
        [sys.executable, "-m", "loopnet", "probe", "--groups", "--checkpoints", "evil.ckpt", "--out", "out"],
        env=env(),
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "loopnet probe: error: refused to load evil.ckpt: unpickling it would import or run code (posix.system), "
        "which loopnet's restricted (weights_only) loader does not allow; fix: use a checkpoint written by "
        "`loopnet fit`, and never load files from untrusted sources"
    ]
    assert not (tmp_path / "pwned.txt").exists() and not (tmp_path / "out").exists()
