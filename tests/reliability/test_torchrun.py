"""Several nodes, simulated: the Trainer entry point under `torchrun --nproc_per_node 2` on CPU (gloo),
launched by scripts/torchrun.sh (scripts/slurm.sbatch starts the same entry point with srun). The launcher
takes its own options (not passed on to loopnet) and, on a machine without GPUs, says in one line what it needs. The run folder is an absolute path,
recorded in config.yaml and summary.json; and when a rank cannot see the run folder (a node without the shared
filesystem, simulated by a working folder per rank), `--ckpt_path last` ends on every rank with one line
naming the shared-filesystem requirement, the run's files untouched."""

from __future__ import annotations

import hashlib
import json
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tests.helpers import run_command

from .helpers import ROOT, RUN, TINY, env, TWO_CPU_RANKS

pytestmark = pytest.mark.slow

BASH = shutil.which("bash")
FIT = [*TINY, "--trainer.max_steps", "2", "--trainer.val_check_interval", "2", "--data.batch_size", "2"]


def torchrun(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *args]
    return run_command(cmd, cwd=cwd, env=env() | {"OMP_NUM_THREADS": "1"})


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A 2-step fit launched by scripts/torchrun.sh as its header says for CPU, in a fresh folder (RUNS: ./runs)
    (accelerator and strategy given: the same on a machine with GPUs)."""
    cwd = tmp_path_factory.mktemp("node0")
    res = run_command(
        [
            BASH,
            str(ROOT / "scripts/torchrun.sh"),
            "--nproc_per_node",
            "2",
            "--accelerator",
            "cpu",
            "--strategy",
            "ddp",
            *FIT,
        ],
        cwd=cwd,
        env=env() | {"PYTHON": sys.executable, "OMP_NUM_THREADS": "1"},
    )
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
    res = torchrun(
        "-m",
        "tests.reliability.node_local",
        str(run),
        str(node1),
        "fit",
        *FIT,
        "--trainer.max_steps",
        "4",
        *TWO_CPU_RANKS,
        "--ckpt_path",
        "last",
        cwd=ROOT,
    )
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
    assert all(
        p.name.startswith("events.out.tfevents.") and p.stat().st_size < 200 for p in after.keys() - before.keys()
    )
    assert not (node1 / "runs").exists() or not any((node1 / "runs").rglob("*.ckpt"))


# ------------------------------------------------------------------------------------------ the launcher's options
def _tools(folder: Path, gpus: int | None = None) -> Path:
    """A PATH folder with what torchrun.sh uses besides bash's builtins (realpath, grep), a stand-in python3 that
    prints its argv one per line, and with `gpus`, a stand-in nvidia-smi listing that many GPUs (else none)."""
    for tool in ("realpath", "grep"):
        (folder / tool).symlink_to(shutil.which(tool))
    _executable(folder / "python3", "#!/bin/sh\nprintf '%s\\n' \"$@\"\n")
    if gpus is not None:
        _executable(
            folder / "nvidia-smi",
            "#!/bin/sh\n" + "".join(f"echo 'GPU {i}: NVIDIA H200 (UUID: GPU-{i})'\n" for i in range(gpus)),
        )
    return folder


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def launch(tmp_path: Path, *args: str, gpus: int | None = None, **extra: str) -> subprocess.CompletedProcess:
    """scripts/torchrun.sh with the stand-in python3 (so torchrun's argv is printed, nothing launched)."""
    path = str(_tools(tmp_path, gpus))
    return subprocess.run(
        [BASH, str(ROOT / "scripts/torchrun.sh"), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PATH": path, "HOME": str(tmp_path), **extra},
        timeout=60,
    )


def loopnet_argv(res: subprocess.CompletedProcess) -> tuple[list[str], list[str]]:
    """(torchrun's own arguments, loopnet's) from the stand-in's printed argv."""
    argv = res.stdout.splitlines()
    assert argv[:2] == ["-m", "torch.distributed.run"], res.stdout + res.stderr
    split = argv.index("loopnet.training.cli")
    return argv[2 : split - 1], argv[split + 1 :]


def test_without_a_gpu_or_a_count_it_says_what_it_needs_in_one_line(tmp_path):
    res = launch(tmp_path, "--config", "configs/deeploop_r6.yaml")
    assert res.returncode == 2 and res.stdout == ""
    (line,) = res.stderr.splitlines()
    assert line.startswith("torchrun.sh: needs GPUs") and "nvidia-smi is not on PATH" in line
    assert "--nproc_per_node N" in line and "CPU" in line


def test_on_the_cpu_its_options_stay_its_own(tmp_path):
    res = launch(tmp_path, "--nproc_per_node", "2", "--config", "c.yaml", "--nnodes=1", "--trainer.max_steps", "3")
    assert res.returncode == 0, res.stderr
    torchrun, loopnet = loopnet_argv(res)
    assert torchrun == ["--standalone", "--nproc_per_node", "2"]
    assert loopnet == [
        "fit",
        "--config",
        "c.yaml",
        "--trainer.max_steps",
        "3",
        "--trainer.num_nodes",
        "1",
        "--trainer.devices",
        "2",
        "--trainer.accelerator",
        "cpu",
        "--trainer.strategy",
        "ddp",
        "--trainer.logger.init_args.save_dir",
        str(tmp_path / "runs"),
    ]
    assert not any(a.startswith(("--nproc", "--nnodes", "--rdzv")) for a in loopnet)


def test_on_gpus_one_process_per_gpu_and_several_nodes_meet_at_the_host(tmp_path):
    res = launch(tmp_path, "--nnodes", "2", "--rdzv_host", "node0", "--config", "c.yaml", "--", "--nnodes", gpus=4)
    assert res.returncode == 0, res.stderr
    torchrun, loopnet = loopnet_argv(res)
    assert torchrun == [
        "--nnodes",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "node0:29400",
        "--rdzv-id",
        "loopnet",
        "--nproc_per_node",
        "4",
    ]
    assert loopnet[:4] == ["fit", "--config", "c.yaml", "--nnodes"]  # after `--`: loopnet's, as given
    assert loopnet[4:8] == ["--trainer.num_nodes", "2", "--trainer.devices", "4"]
    assert "--trainer.accelerator" not in loopnet  # GPUs: the config's accelerator


@pytest.mark.parametrize(
    "args, message",
    [
        (["--nproc_per_node", "two"], "--nproc_per_node must be a positive integer (got 'two')"),
        (["--nnodes", "2", "--nproc_per_node", "1"], "--nnodes 2 needs --rdzv_host HOST"),
        (["--nproc_per_node"], "--nproc_per_node needs a value"),
    ],
)
def test_bad_launcher_options_are_one_line(tmp_path, args, message):
    res = launch(tmp_path, *args)
    assert res.returncode == 2 and res.stdout == ""
    (line,) = res.stderr.splitlines()
    assert line.startswith("torchrun.sh: ") and message in line
