"""scripts/slurm.sbatch read as a cluster admin would (its #SBATCH directives and its srun line), then run by
bash with fake `srun` and `scontrol` executables on PATH and SLURM's variables set: the CPUs reach srun, the
environment is activated, the caches land under the submit directory, and an interrupted run is requeued
(`scontrol requeue`) while a completed or crashed one is not. The last test runs a real `loopnet fit` under
the fake srun, stopped by SIGTERM as SLURM's --signal would, then resumed by the "requeued" job."""

from __future__ import annotations

import json
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import ROOT, RUN, TINY, env

SCRIPT = ROOT / "scripts" / "slurm.sbatch"
STOP_LINE = "loopnet: stopped at step {step}, saved {ckpt}; resume with the same command and --ckpt_path last"

# srun as a stand-in: records its argv and the environment the tasks would get, then acts as the mode says.
FAKE_SRUN = f"""#!{sys.executable}
import json, os, signal, subprocess, sys, time
from pathlib import Path
fake = Path(os.environ["FAKE"])
argv = sys.argv[1:]
(fake / "srun.json").write_text(json.dumps({{"argv": argv, "env": {{k: os.environ.get(k) for k in (
    "SRUN_CPUS_PER_TASK", "VIRTUAL_ENV", "LOOPNET_CACHE_DIR", "HF_HOME", "OMP_NUM_THREADS")}},
    "python": subprocess.run(["sh", "-c", "command -v python"], capture_output=True, text=True).stdout.strip()}}))
command = argv[next(i for i, a in enumerate(argv) if not a.startswith("--")):]  # after srun's options
runs = Path(command[command.index("--trainer.logger.init_args.save_dir") + 1])
version = runs / "run" / "version_0"
mode = os.environ["FAKE_MODE"]
if mode == "real":  # the command itself, as task 0 of 1; SIGTERM once past its first checkpoint when asked
    task = dict(os.environ, SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0", SLURM_NTASKS="1",
                SLURM_NNODES="1", SLURM_NODELIST="127.0.0.1")
    proc = subprocess.Popen(command, env=task)
    if os.environ.get("FAKE_STOP"):
        while proc.poll() is None and not list(runs.glob("*/version_*/checkpoints/last.ckpt")):
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
    sys.exit(proc.wait())
if mode in ("completed", "interrupted"):
    version.mkdir(parents=True)
    (version / "summary.json").write_text(json.dumps({{"status": mode, "global_step": 7}}))
if mode == "interrupted":
    ckpt = version / "checkpoints" / "last-interrupted.ckpt"
    ckpt.parent.mkdir()
    ckpt.write_bytes(b"")
    print({STOP_LINE!r}.format(step=7, ckpt=ckpt), file=sys.stderr)
sys.exit(1 if mode == "crash" else 0)
"""
FAKE_SCONTROL = """#!/bin/sh
echo "$@" >> "$FAKE/scontrol.log"
"""


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _venv(folder: Path) -> Path:
    """A stand-in environment: bin/activate as venv writes it (VIRTUAL_ENV, PATH), bin/python this interpreter."""
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "activate").write_text(f'export VIRTUAL_ENV="{folder}"\nexport PATH="$VIRTUAL_ENV/bin:$PATH"\n')
    _executable(folder / "bin" / "python", f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    return folder


def sbatch(
    tmp_path: Path, mode: str, *args: str, cpus: str = "6", extra_env: dict | None = None, venv: bool = True
) -> tuple[subprocess.CompletedProcess, Path]:
    """Run the script as SLURM's batch step would: in the submit directory, SLURM's variables set."""
    fake, submit = tmp_path / "fake", tmp_path / "submit"
    (fake / "bin").mkdir(parents=True, exist_ok=True)
    submit.mkdir(exist_ok=True)
    _executable(fake / "bin" / "srun", FAKE_SRUN)
    _executable(fake / "bin" / "scontrol", FAKE_SCONTROL)
    if venv and not (submit / ".venv").exists():
        _venv(submit / ".venv")
    base = {k: v for k, v in env().items() if not k.startswith(("SLURM_", "LOOPNET_", "VIRTUAL_ENV", "HF_HOME"))}
    slurm = {
        "SLURM_SUBMIT_DIR": str(submit),
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_NTASKS_PER_NODE": "1",
        "SLURM_CPUS_PER_TASK": cpus,
        "SLURM_JOB_NAME": "loopnet",
        "TMPDIR": str(tmp_path),
    }
    run_env = (
        base
        | slurm
        | {"FAKE": str(fake), "FAKE_MODE": mode, "PATH": f"{fake / 'bin'}:/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
        | (extra_env or {})
    )
    res = subprocess.run(
        ["bash", str(SCRIPT), *args], cwd=submit, env=run_env, capture_output=True, text=True, timeout=900
    )
    return res, fake


def requeues(fake: Path) -> list[str]:
    log = fake / "scontrol.log"
    return log.read_text().splitlines() if log.exists() else []


# ------------------------------------------------------------------------------------------ as an admin reads it
def directives() -> dict[str, str]:
    found = {}
    for line in SCRIPT.read_text().splitlines():
        if line.startswith("#SBATCH "):
            key, _, value = line.removeprefix("#SBATCH ").strip().partition("=")
            found[key] = value
    return found


def srun_line() -> list[str]:
    text = SCRIPT.read_text().replace("\\\n", " ")
    line = next(line for line in text.splitlines() if line.lstrip().startswith("srun "))
    return shlex.split(line.split("2>&1")[0])


def test_the_directives_ask_for_cpus_requeue_and_a_signal_before_the_time_limit():
    d = directives()
    assert d["--cpus-per-task"] == "8" and d["--nodes"] and d["--ntasks-per-node"] == d["--gpus-per-node"]
    assert "--requeue" in d
    signal_, _, lead = d["--signal"].partition("@")
    assert signal_ == "TERM" and int(lead) >= 60  # to the tasks (no B:), time to stop and save


def test_the_srun_line_passes_the_cpus_and_runs_the_environments_python():
    argv = srun_line()
    assert argv[0] == "srun" and "--cpus-per-task=$CPUS" in argv[: argv.index("python")]
    assert argv[argv.index("python") :][:4] == ["python", "-m", "loopnet.training.cli", "fit"]
    text = SCRIPT.read_text()
    assert re.search(r"^CPUS=\$\{SLURM_CPUS_PER_TASK", text, re.M)
    assert re.search(r"^export SRUN_CPUS_PER_TASK=\$CPUS", text, re.M)
    assert re.search(r'^source "\$LOOPNET_VENV/bin/activate"', text, re.M)
    assert re.search(r"^export LOOPNET_CACHE_DIR=\$\{LOOPNET_CACHE_DIR:-\$SUBMIT/", text, re.M)
    assert "scontrol requeue" in text


# ------------------------------------------------------------------------------------------ run with fake srun
def test_cpus_environment_and_caches_reach_the_tasks(tmp_path):
    res, fake = sbatch(tmp_path, "completed", "--config", "configs/deeploop_r6.yaml")
    assert res.returncode == 0, res.stdout + res.stderr
    srun = json.loads((fake / "srun.json").read_text())
    submit = tmp_path / "submit"
    assert "--cpus-per-task=6" in srun["argv"]  # SLURM_CPUS_PER_TASK, not the directive's default
    assert srun["env"] == {
        "SRUN_CPUS_PER_TASK": "6",
        "VIRTUAL_ENV": str(submit / ".venv"),
        "LOOPNET_CACHE_DIR": str(submit / ".cache" / "loopnet"),
        "HF_HOME": str(submit / ".cache" / "huggingface"),
        "OMP_NUM_THREADS": "6",
    }
    assert srun["python"] == str(submit / ".venv" / "bin" / "python")
    command = srun["argv"][srun["argv"].index("python") :]
    assert command[:5] == ["python", "-m", "loopnet.training.cli", "fit", "--config"]
    assert command[-2:] == ["--ckpt_path", "last"]
    assert command[command.index("--trainer.logger.init_args.save_dir") + 1] == str(submit / "runs")
    assert requeues(fake) == []


def test_a_named_environment_and_cache_win(tmp_path):
    venv = _venv(tmp_path / "elsewhere" / "env")
    res, fake = sbatch(
        tmp_path,
        "completed",
        venv=False,
        extra_env={"LOOPNET_VENV": str(venv), "LOOPNET_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert res.returncode == 0, res.stdout + res.stderr
    srun = json.loads((fake / "srun.json").read_text())
    assert srun["env"]["VIRTUAL_ENV"] == str(venv) and srun["env"]["LOOPNET_CACHE_DIR"] == str(tmp_path / "cache")


def test_a_missing_environment_is_one_line_before_srun(tmp_path):
    res, fake = sbatch(tmp_path, "completed", venv=False)
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "no Python environment at" in lines[0] and "make setup" in lines[0]
    assert "LOOPNET_VENV" in lines[0]
    assert not (fake / "srun.json").exists()


def test_an_interrupted_run_is_requeued(tmp_path):
    res, fake = sbatch(tmp_path, "interrupted")
    assert res.returncode == 0, res.stdout + res.stderr
    assert requeues(fake) == ["requeue 4242"]
    assert "loopnet: stopped at step 7" in res.stdout  # loopnet's output still reaches the job's log
    assert "requeueing job 4242" in res.stdout


@pytest.mark.parametrize("mode, code", [("completed", 0), ("crash", 1)])
def test_a_completed_or_crashed_run_is_not_requeued(tmp_path, mode, code):
    res, fake = sbatch(tmp_path, mode)
    assert res.returncode == code, res.stdout + res.stderr
    assert requeues(fake) == []


# ------------------------------------------------------------------------------------------ a real fit
@pytest.mark.slow
def test_a_real_fit_stopped_by_sigterm_is_requeued_and_the_requeued_job_completes(tmp_path):
    args = [*TINY, "--trainer.max_steps", "100000"]
    res, fake = sbatch(tmp_path, "real", *args, extra_env={"FAKE_STOP": "1", "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    assert requeues(fake) == ["requeue 4242"], res.stdout[-4000:]
    version = tmp_path / "submit" / "runs" / RUN / "version_0"
    summary = json.loads((version / "summary.json").read_text())
    assert summary["status"] == "interrupted" and (version / "checkpoints" / "last-interrupted.ckpt").is_file()
    stopped = summary["global_step"]

    # The requeued job: the same script and arguments (here with an end in reach), no signal.
    (fake / "scontrol.log").unlink()
    res, fake = sbatch(
        tmp_path, "real", *args, "--trainer.max_steps", str(stopped + 2), extra_env={"PYTHONPATH": str(ROOT)}
    )
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    assert f"resuming from {version / 'checkpoints' / 'last-interrupted.ckpt'}" in res.stdout
    summary = json.loads((version / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["global_step"] == stopped + 2
    assert requeues(fake) == []
