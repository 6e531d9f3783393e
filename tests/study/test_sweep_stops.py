"""`loopnet sweep` stops durably: a stop signal at any moment logs every running cell as "stopped" and
leaves no fit running after the sweep exits; the rerun finishes every cell, one fit per cell folder.

The cells are `tests.study.fake_fit` (a fit's lock, signal handling and summary, 0.4 s of "training"),
so that 32 stops at random moments take a minute or two. Both ways of starting fits (fresh processes,
forks of a server) are covered.
"""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from loopnet.study.sweep import LOG, is_finished
from tests.helpers import communicate, wait_until

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # sweeps of many fits (fake ones, a fraction of a second each)

# `loopnet sweep` with the fake fit as every cell's command, no Lightning check of the cells, a fork server
# that preloads only what the fake imports, and a manifest without torch's version (`machine` imports torch:
# seconds of CPU per sweep, all before the first cell starts).
DRIVER = """
import sys
import loopnet.study.grid as grid, loopnet.study.launch as launch, loopnet.study.sweep as sweep
grid.CLI[:] = [sys.executable, "-m", "tests.study.fake_fit"]
launch.PRELOAD[:] = ["loopnet.checkpoints", "loopnet.diagnostics"]
sweep.check_cells = lambda *args: None
sweep.machine = lambda: {"host": "test"}
sweep.main(sys.argv[1:])
"""
END_EVENTS = ("finished", "failed", "stopped")


def write_sweep(folder: Path, cells: int) -> Path:
    spec = {
        "base": [str(REPO / "configs/deeploop_r6.yaml")],
        "grid": {"seed_everything": list(range(1, cells + 1))},
        "out": str(folder / "sweep"),
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "fake.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def sweep_process(
    sweep_file: Path,
    *args: str,
    fit_seconds: float = 0.4,
    crash: str = "",
    ignore_hup: bool = False,
    semaphore: bool = False,
    new_session: bool = False,
    linger: float = 0.0,
):
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        FAKE_FIT_SECONDS=str(fit_seconds),
        FAKE_FIT_CRASH=crash,
        FAKE_FIT_SEMAPHORE="1" if semaphore else "",
        FAKE_FIT_LINGER=str(linger),
    )
    # SIGHUP ignored as under nohup, else its default as from a terminal (set either way: the test runner
    # itself may run under nohup, whose SIG_IGN a child would inherit)
    hup = signal.SIG_IGN if ignore_hup else signal.SIG_DFL
    return subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(sweep_file), *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=new_session,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, hup),
    )


def events(out: Path) -> list[dict]:
    path = out / LOG
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def fits_alive(out: Path) -> list[int]:
    pids = [int(p) for p in (out / "pids").read_text().split()] if (out / "pids").is_file() else []
    return [p for p in pids if alive(p)]


def check_record(out: Path) -> dict[str, list[str]]:
    """Each cell's events; every start of a fit is followed by exactly one end (finished, failed, stopped)
    before the cell starts again, and a cell that did not finish ends with "stopped" or "failed"."""
    by_cell: dict[str, list[str]] = {}
    for e in events(out):
        if e["cell"] is not None:
            by_cell.setdefault(e["cell"], []).append(e["event"])
    for cell, seq in by_cell.items():
        assert seq[0::2] == ["started"] * len(seq[0::2]) and all(e in END_EVENTS for e in seq[1::2]), (cell, seq)
        assert len(seq) % 2 == 0, f"{cell}: a start without its end: {seq}"
        assert is_finished(out / cell) == (seq[-1] == "finished"), (cell, seq)
    return by_cell


def stop_at_random(tmp: Path, seed: int, start: str, signum: int = signal.SIGTERM, rerun: bool = False) -> dict:
    """One sweep of 8 fake cells, 2 at a time, sent `signum` at a random moment after its first start
    (now and then twice); checks the record and that no fit outlives it. Returns what happened."""
    rng = random.Random(seed)
    sweep_file, out = write_sweep(tmp, cells=8), tmp / "sweep"
    proc = sweep_process(sweep_file, "--jobs", "2", "--start", start)
    wait_until(lambda: any(e["event"] == "started" for e in events(out)), proc, "the first cell started", poll=0.005)
    delay = rng.choice([rng.uniform(0, 0.05), rng.uniform(0, 1.5)])  # half of them in the first start's window
    second = rng.uniform(0, 0.3) if rng.random() < 0.3 else None
    time.sleep(delay)
    proc.send_signal(signum)
    if second is not None:
        time.sleep(second)
        if proc.poll() is None:
            proc.send_signal(signum)
    output = communicate(proc)[0]
    # (-signum: the second signal came after the sweep had stopped everything and restored the handler)
    assert proc.returncode in (0, 130) or (second is not None and proc.returncode == -signum), output[-3000:]
    assert not fits_alive(out), f"fits outlived the sweep: {fits_alive(out)}\n{output[-3000:]}"
    by_cell = check_record(out)
    stopped = [c for c, seq in by_cell.items() if seq[-1] == "stopped"]
    if proc.returncode != 0:
        (sig,) = [e for e in events(out) if e["event"] == "signal"]
        assert sig["signal"] == signal.Signals(signum).name and sorted(stopped) == sorted(
            c for c in sig["running"] if not is_finished(out / c)
        ), (sig, by_cell)
        assert "stopped by " + signal.Signals(signum).name in output
    if rerun:
        again = sweep_process(sweep_file, "--jobs", "2", "--start", start)
        output = communicate(again)[0]
        assert again.returncode == 0, output[-3000:]
        assert all(is_finished(out / f"s{i}") for i in range(1, 9)) and not fits_alive(out)
        check_record(out)
    return {"rc": proc.returncode, "stopped": len(stopped), "delay": delay}


@pytest.mark.parametrize("start", ["fresh", "forkserver"])
def test_a_stop_at_any_moment_is_logged_and_leaves_no_fit_running(tmp_path, start):
    """16 stops for each way of starting fits: 32 random moments in all."""
    trials = [stop_at_random(tmp_path / f"t{seed}", seed, start, rerun=seed % 8 == 0) for seed in range(16)]
    # The signal reached the sweep while cells ran (not after the sweep's end) in all but a few.
    assert sum(t["rc"] != 0 and t["stopped"] > 0 for t in trials) >= 12, trials


def test_a_fit_killed_by_the_stop_after_its_finished_summary_counts_as_finished(tmp_path):
    """The window the random stops hit now and then: the fit wrote its completed summary, and the sweep's
    SIGTERM reaches it while its interpreter exits with the default handler back (-SIGTERM)."""
    sweep_file, out = write_sweep(tmp_path, cells=1), tmp_path / "sweep"
    proc = sweep_process(sweep_file, fit_seconds=0.2, linger=60)
    wait_until(lambda: is_finished(out / "s1"), proc, "the cell's completed summary", poll=0.05)
    proc.send_signal(signal.SIGTERM)
    output = communicate(proc)[0]
    assert proc.returncode == 130 and not fits_alive(out), output[-3000:]
    ends = [e for e in events(out) if e["event"] in END_EVENTS]
    assert [(e["event"], e["cell"]) for e in ends] == [("finished", "s1")], ends


@pytest.mark.parametrize("start", ["fresh", "forkserver"])
def test_sighup_stops_a_sweep_like_sigterm(tmp_path, start):
    result = stop_at_random(tmp_path, 7, start, signum=signal.SIGHUP, rerun=True)
    assert result["rc"] != 0 and result["stopped"] > 0


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGTERM])
def test_a_stop_signal_to_the_process_group_stops_every_fit_cleanly(tmp_path, signum):
    """A closed terminal signals the sweep's whole process group: the fork server and multiprocessing's resource
    tracker too. The fits stop as from the sweep (exit status 0, recorded), their logs without a traceback."""
    sweep_file, out = write_sweep(tmp_path, cells=4), tmp_path / "sweep"
    proc = sweep_process(sweep_file, "--jobs", "2", fit_seconds=30, semaphore=True, new_session=True)
    wait_until(
        lambda: (
            sum(e["event"] == "started" for e in events(out)) == 2
            and all((out / f"s{i}" / "fit.log").is_file() for i in (1, 2))
        ),
        proc,
        "two cells started",
        poll=0.05,
    )
    time.sleep(1.0)  # the fits hold their semaphores
    os.killpg(proc.pid, signum)
    output = communicate(proc)[0]
    assert proc.returncode == 130 and not fits_alive(out), output[-3000:]
    stopped = [e for e in events(out) if e["event"] == "stopped"]
    assert sorted(e["cell"] for e in stopped) == ["s1", "s2"] and all(e["rc"] == 0 for e in stopped), stopped
    for cell in ("s1", "s2"):
        log = (out / cell / "fit.log").read_text()
        assert "fake fit: stopped at step" in log and "Traceback" not in log and "resource_tracker" not in log, log


def test_under_nohup_sighup_is_ignored(tmp_path):
    sweep_file, out = write_sweep(tmp_path, cells=3), tmp_path / "sweep"
    proc = sweep_process(sweep_file, "--start", "fresh", ignore_hup=True)
    wait_until(lambda: any(e["event"] == "started" for e in events(out)), proc, "the first cell started")
    proc.send_signal(signal.SIGHUP)
    output = communicate(proc)[0]
    assert proc.returncode == 0 and all(is_finished(out / f"s{i}") for i in (1, 2, 3)), output[-3000:]
    assert [e["event"] for e in events(out)].count("finished") == 3


@pytest.mark.parametrize("start", ["fresh", "forkserver"])
def test_a_crashed_or_killed_cell_leaves_the_sweep_running(tmp_path, start):
    sweep_file, out = write_sweep(tmp_path, cells=4), tmp_path / "sweep"
    proc = sweep_process(sweep_file, "--start", start, crash="s2:abort,s3:exit,s4:kill")
    output = communicate(proc)[0]
    assert proc.returncode == 1, output[-3000:]
    ends = {e["cell"]: (e["event"], e.get("rc")) for e in events(out) if e["event"] in END_EVENTS}
    assert ends == {
        "s1": ("finished", 0),
        "s2": ("failed", -signal.SIGABRT),
        "s3": ("failed", 3),
        "s4": ("failed", -signal.SIGKILL),
    }, output
    assert "failed: s2, s3, s4" in output


def test_a_cell_whose_fit_outlived_its_sweep_is_left_to_it(tmp_path):
    """A fit that still holds its folder's lock: the rerun neither deletes the folder nor starts a second fit."""
    from loopnet.checkpoints import LOCK_NAME

    sweep_file, out = write_sweep(tmp_path, cells=2), tmp_path / "sweep"
    (out / "s1").mkdir(parents=True)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time; fd = os.open(sys.argv[1], "
            "os.O_RDWR | os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, str(os.getpid())"
            ".encode()); print('locked', flush=True); time.sleep(600)",
            str(out / "s1" / LOCK_NAME),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        proc = sweep_process(sweep_file, "--start", "fresh")
        output = communicate(proc)[0]
        assert proc.returncode == 0, output
        assert f"s1 is still being run by an earlier fit (pid {holder.pid})" in output
        assert (out / "s1" / LOCK_NAME).is_file() and not (out / "s1" / "summary.json").exists()
        assert is_finished(out / "s2") and [e["cell"] for e in events(out) if e["event"] == "started"] == ["s2"]
    finally:
        holder.kill()
        holder.wait()


def test_a_stop_after_the_output_reader_went_away_still_stops_every_fit(tmp_path):
    """`loopnet sweep | tee log`, then Ctrl-C: tee ends first, and the sweep's next line meets a broken pipe.
    Its bookkeeping goes on: the running fits are stopped and logged, none outlives the sweep."""
    sweep_file, out = write_sweep(tmp_path, cells=4), tmp_path / "sweep"
    proc = sweep_process(sweep_file, "--start", "fresh", fit_seconds=30)
    wait_until(lambda: any(e["event"] == "started" for e in events(out)), proc, "the first cell started")
    proc.stdout.close()  # the reader goes away
    proc.send_signal(signal.SIGTERM)
    wait_until(lambda: proc.poll() is not None, proc, "the sweep ended")
    assert not fits_alive(out)
    assert [e["event"] for e in events(out)] == ["started", "signal", "stopped"]


def test_the_stop_is_said_before_the_default_handler_is_back(tmp_path, monkeypatch):
    """A second signal right after the sweep restores the handlers kills it (-SIGTERM): the "stopped by"
    line is already out by then, said while the sweep's own handler still holds."""
    import loopnet.study.sweep as sweep

    def stopped_run(runner):
        runner.stop_signal = signal.SIGTERM
        return {}

    monkeypatch.setattr(sweep, "check_cells", lambda *args: None)
    monkeypatch.setattr(sweep, "machine", lambda: {"host": "test"})
    monkeypatch.setattr(sweep.SweepRunner, "run", stopped_run)
    said = []
    with pytest.raises(KeyboardInterrupt):
        sweep.run(
            [str(write_sweep(tmp_path, cells=2))],
            echo=lambda line: said.append((line, signal.getsignal(signal.SIGTERM))),
        )
    (handler,) = [h for line, h in said if line == "loopnet sweep: stopped by SIGTERM"]
    assert getattr(handler, "__func__", None) is sweep.SweepRunner.on_signal
    assert signal.getsignal(signal.SIGTERM) is not handler
