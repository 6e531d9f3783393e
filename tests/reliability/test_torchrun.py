"""Several nodes, simulated: the Trainer entry point under `torchrun --nproc_per_node 2` on CPU (gloo),
launched by scripts/torchrun.sh (scripts/slurm.sbatch starts the same entry point with srun). The run folder is an absolute path,
recorded in config.yaml and summary.json; and when a rank cannot see the run folder (a node without the shared
filesystem, simulated by a working folder per rank), `--ckpt_path last` ends on every rank with one line
naming the shared-filesystem requirement, the run's files untouched."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tests.helpers import run_command

from .helpers import ROOT, RUN, TINY, env

FIT = [*TINY, "--trainer.max_steps", "2", "--trainer.val_check_interval", "2", "--data.batch_size", "2"]


def torchrun(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *args]
    return run_command(cmd, cwd=cwd, env=env() | {"OMP_NUM_THREADS": "1"})


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A 2-step fit launched by scripts/torchrun.sh as its header says for CPU, in a fresh folder (RUNS: ./runs)."""
    cwd = tmp_path_factory.mktemp("node0")
    res = run_command(["bash", str(ROOT / "scripts/torchrun.sh"), *FIT], cwd=cwd,
                      env=env() | {"NPROC": "2", "ACCELERATOR": "cpu", "STRATEGY": "ddp", "PYTHON": sys.executable,
                                   "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, (res.stdout + res.stderr)[-5000:]
    return cwd


def test_fit_under_torchrun_records_the_absolute_run_folder(run):
    version = run / "runs" / RUN / "version_0"
    assert (version / "checkpoints" / "last.ckpt").is_file()
    config = yaml.safe_load((version / "config.yaml").read_text())
    assert config["trainer"]["logger"]["init_args"]["save_dir"] == str(run / "runs")
    summary = json.loads((version / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["global_step"] == 2
    assert summary["log_dir"] == str(version)


def test_resume_where_one_rank_cannot_see_the_run_folder_fails_on_every_rank_in_one_line(run, tmp_path):
    version = run / "runs" / RUN / "version_0"
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in version.rglob("*") if p.is_file()}
    node1 = tmp_path / "node1"  # rank 1's disk: no run folder
    node1.mkdir()
    res = torchrun("-m", "tests.reliability.node_local", str(run), str(node1), "fit", *FIT, "--trainer.max_steps", "4",
                   "--trainer.accelerator", "cpu", "--trainer.strategy", "ddp", "--trainer.devices", "2",
                   "--ckpt_path", "last", cwd=ROOT)
    assert res.returncode != 0
    errors = [line for line in res.stderr.splitlines() if "loopnet: error:" in line]
    assert len(errors) == 2, res.stderr[-5000:]  # one line per rank
    for line in errors:
        assert "--ckpt_path last: rank(s) [0] found a checkpoint to resume from and rank(s) [1] did not" in line
        assert "every node must see the same run folder; fix:" in line and "shared filesystem" in line
    # No traceback from loopnet's processes; torchrun's launcher prints its own (ChildFailedError, exit code 2).
    assert res.stderr.count("Traceback") == 1 and "ChildFailedError" in res.stderr and "exitcode  : 2" in res.stderr
    after = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in version.rglob("*") if p.is_file()}
    assert {p: after.get(p) for p in before} == before  # the run's checkpoints, events, config and summary untouched
    # Lightning opens the TensorBoard writer before any setup hook: at most a header-only events file is new.
    assert all(p.name.startswith("events.out.tfevents.") and p.stat().st_size < 200 for p in after.keys() - before.keys())
    assert not (node1 / "runs").exists() or not any((node1 / "runs").rglob("*.ckpt"))
