"""scripts/gpu_check.py's plumbing, in its CPU dry run: a step's check lands in the one table, a failing
check makes the exit status 1. (Every step's --cpu-dry-run was run by hand: README, "GPU check".)"""

import subprocess
import sys

from .helpers import ROOT, env


def gpu_check(tmp_path, *steps: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts/gpu_check.py"), "--cpu-dry-run", "--out", str(tmp_path),
                           "--only", *steps], cwd=ROOT, env=env() | {"OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=300)


def test_a_passing_check_is_a_row_of_the_table_and_exit_0(tmp_path):
    res = gpu_check(tmp_path, "custom_loss")
    assert res.returncode == 0, res.stdout + res.stderr
    rows = [line for line in res.stdout.splitlines() if line.startswith("| fp32 custom loss")]
    assert len(rows) == 1 and "| ok |" in rows[0] and "rel. errors" in rows[0]
    assert (tmp_path / "table.md").read_text().count("| fp32 custom loss") == 1


def test_a_failing_check_exits_1(tmp_path):
    res = gpu_check(tmp_path, "custom_loss", "no_such_step")
    assert res.returncode == 1
    assert "| no_such_step | FAIL |" in res.stdout and "| fp32 custom loss vs F.cross_entropy | ok |" in res.stdout
