"""`loopnet sweep` and `loopnet report` end to end on a tiny grid (2 cells of 4 steps each).

The fits are real `loopnet fit` subprocesses (about 10-25 s each on 2 cores, mostly imports), so
the finished sweep is shared by the tests of this module. Tests that only exercise the runner's
bookkeeping replace the subprocess with `FakeFit`.
"""

import csv
import json
import re
import signal
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from loopnet.diagnostics import read_summary
from loopnet.study import report as report_mod
from loopnet.study.sweep import LOG, MANIFEST, is_finished, run
from loopnet.study.unigram import cross_entropy, entropy, unigram_counts, val_limit
from tests.helpers import communicate, wait_until

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TINY = {
    "model.config.d_model": 32,
    "model.config.n_heads": 2,
    "model.config.seq_len": 32,
    "model.config.n_blocks": 1,
    "data.batch_size": 4,
    "trainer.max_steps": 4,
    "trainer.val_check_interval": 2,
    "trainer.limit_val_batches": 2,
    "trainer.log_every_n_steps": 1,
    "diagnostics.every_n_steps": 3,
    "diagnostics.histograms": False,
    "model.optim.warmup_steps": 2,
}


def write_sweep(folder: Path, grid: dict, overrides: dict = TINY) -> Path:
    spec = {
        "base": [str(REPO / "configs/deeploop_r6.yaml"), str(REPO / "configs/cpu.yaml")],
        "overrides": overrides,
        "grid": grid,
        "out": str(folder / "sweep"),
    }
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def log_events(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / LOG).read_text().splitlines()]


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """A 2-cell sweep, killed (SIGTERM to the sweep process) just after the second cell started,
    then rerun: the rerun must run only the second cell."""
    root = tmp_path_factory.mktemp("study")
    sweep_file = write_sweep(root, {"model.config.n_rounds": [2], "seed_everything": [1, 2]})
    out = root / "sweep"
    proc = subprocess.Popen(
        [sys.executable, "-m", "loopnet", "sweep", str(sweep_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_until(
            lambda: (
                (out / LOG).is_file()
                and ["r2-s1", "r2-s2"] == [e["cell"] for e in log_events(out) if e["event"] == "started"]
            ),
            proc,
            "the second cell started",
        )
    except AssertionError as err:
        proc.kill()
        raise AssertionError(f"{err}\n{proc.communicate()[0][-3000:]}") from None
    proc.send_signal(signal.SIGTERM)  # the sweep stops its running fit and exits
    assert communicate(proc)[0] is not None and proc.returncode != 0
    first = out / "r2-s1"
    assert is_finished(first) and not is_finished(out / "r2-s2")
    mtime = (first / "summary.json").stat().st_mtime_ns
    (out / "r2-s2" / "stale.txt").write_text("left by the killed run")
    echo = []
    assert run([str(sweep_file)], echo=echo.append) == 0
    return {"out": out, "file": sweep_file, "mtime": mtime, "echo": echo}


def test_resume_runs_only_the_unfinished_cell(swept):
    out = swept["out"]
    events = log_events(out)
    assert [e["cell"] for e in events if e["event"] == "started"] == ["r2-s1", "r2-s2", "r2-s2"]
    assert [e["cell"] for e in events if e["event"] == "stopped"] == ["r2-s2"]  # by the kill
    assert [e["cell"] for e in events if e["event"] == "finished"] == ["r2-s1", "r2-s2"]
    assert (out / "r2-s1" / "summary.json").stat().st_mtime_ns == swept["mtime"]  # not rerun
    assert not (out / "r2-s2" / "stale.txt").exists()  # killed before its first checkpoint: restarted afresh
    # the check of the unfinished commands is said before it runs (minutes for hundreds of cells), then the plan
    assert swept["echo"][0] == "loopnet sweep: checking the fit commands of 1 unfinished cell(s) before any starts"
    assert "1 finished (skipped), 1 to run" in swept["echo"][1]
    manifest = json.loads((out / MANIFEST).read_text())
    assert [c["id"] for c in manifest["cells"]] == ["r2-s1", "r2-s2"]
    assert len(manifest["invocations"]) == 2
    for cell in ("r2-s1", "r2-s2"):
        s = read_summary(out / cell)
        assert s["status"] == "completed" and s["global_step"] == 4 and s["config"]["n_rounds"] == 2
        assert s["last_visit_stats"] and s["kappa"]
    # A third go has nothing to do.
    echo = []
    assert run([str(swept["file"]), "--dry_run"], echo=echo.append) == 0
    assert all("[finished]" in line for line in echo[:-1])


def _table_after(md: str, heading: str) -> list[list[str]]:
    """The first markdown table after `heading`: its header row, then its data rows."""
    lines = md.split(heading, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return [rows[0], *rows[2:]]  # without the |---| separator


def test_report_tables_equal_the_summaries(swept, tmp_path):
    out = swept["out"]
    report_dir = tmp_path / "report"
    report_mod.main([str(out), "--out", str(report_dir), "--plateau", "10.9"])
    md = (report_dir / "report.md").read_text()
    summaries = {c: read_summary(out / c) for c in ("r2-s1", "r2-s2")}

    # Every run: the values are the summaries', as the report formats them.
    rows = {r[0]: r for r in _table_after(md, "## Every run")[1:]}
    assert set(rows) == set(summaries)
    for cell, s in summaries.items():
        row = rows[cell]
        assert row[4] == s["status"]
        assert float(row[5]) == pytest.approx(s["final_val_loss"], abs=5e-5)
        assert row[5] == report_mod.fmt(s["final_val_loss"])
        assert row[6] == report_mod.fmt(s["best_val_loss"])
        assert row[10] == report_mod.fmt(s["kappa"]["model"], 3)

    # Per method x R: mean ± std over the two seeds.
    losses = [s["final_val_loss"] for s in summaries.values()]
    (loss_row,) = _table_after(md, "## Final validation loss")[1:]
    assert loss_row[0] == "deeploop-carry"
    mean, std = re.match(r"([\d.]+) ± ([\d.]+)$", loss_row[1]).groups()
    assert mean == report_mod.fmt(statistics.fmean(losses)) and std == report_mod.fmt(statistics.stdev(losses))
    # Loss ~10.8 after 4 steps: below the given 10.9-nat plateau, so both escaped.
    (escape_row,) = _table_after(md, "## Escape from the unigram plateau")[1:]
    assert escape_row[1] == f"{sum(v < 10.9 for v in losses)}/2"

    # cells.csv: full precision, exactly the summaries' numbers.
    with open(report_dir / "cells.csv") as f:
        for row in csv.DictReader(f):
            s = summaries[row["cell"]]
            assert float(row["final_val_loss"]) == s["final_val_loss"]
            assert float(row["kappa_model"]) == s["kappa"]["model"]

    # Plots: written, non-empty PNGs, linked from the report.
    for name in (
        "val_loss_vs_R.png",
        "resid_norm_per_visit.png",
        "grad_norm_per_visit.png",
        "kappa_vs_R.png",
        "loss_curves.png",
        "kappa_curves.png",
    ):
        data = (report_dir / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name
        assert f"]({name})" in md
    assert "loopnet sweep " in md and "loopnet report " in md


def test_report_curves_come_from_tensorboard(swept):
    curves = report_mod.read_curves(swept["out"] / "r2-s1")
    s = read_summary(swept["out"] / "r2-s1")
    # Lightning logs at the 0-based step index, the summary at the global step count: 1, 3 vs 2, 4.
    assert [v for _, v in curves["val/loss"]] == pytest.approx([v for _, v in s["val_history"]], rel=1e-6)
    assert len(curves["train/loss"]) == 4


def test_a_failing_cell_is_reported_not_finished(tmp_path):
    # A corpus of whitespace: the command line is valid, the fit fails when it reads the data.
    (tmp_path / "empty.txt").write_text("  \n\n")
    sweep_file = write_sweep(tmp_path, {"data.path": [str(tmp_path / "empty.txt")]}, {**TINY, "data.source": "files"})
    echo = []
    assert run([str(sweep_file)], echo=echo.append) == 1
    out = tmp_path / "sweep"
    (cell,) = [d for d in out.iterdir() if d.is_dir() and not d.name.startswith(".")]
    assert not is_finished(cell)
    assert any("FAILED" in line for line in echo)
    assert [e["event"] for e in log_events(out)] == ["started", "failed"]


def test_cells_that_would_fail_at_once_stop_the_sweep_before_any_runs(tmp_path):
    """A typo in a grid key or a bad value is found by the CLI's own checks before any cell starts."""
    from loopnet.study.grid import SweepError

    overrides = {k: v for k, v in TINY.items() if k != "model.config.n_heads"}
    sweep_file = write_sweep(
        tmp_path, {"model.config.n_heads": [2, 3], "model.config.residul": ["deeploop"]}, overrides
    )
    with pytest.raises(
        SweepError,
        match=r"2 of 2 cells would fail at once, so none was started; fix the sweep "
        r"file: 2 cell\(s\) .*--model.config.residul deeploop; "
        r"fix: did you mean 'model.config.residual'",
    ):
        run([str(sweep_file)], echo=lambda line: None)
    sweep_file = write_sweep(tmp_path, {"model.config.n_heads": [2, 3]}, overrides)
    with pytest.raises(SweepError, match=r"1 of 2 cells would fail at once.*n_heads3\): .*not divisible by n_heads=3"):
        run([str(sweep_file)], echo=lambda line: None)
    assert not (tmp_path / "sweep" / "sweep.json").exists()  # nothing ran


def unigram_entropy(token_arrays, vocab_size: int) -> tuple[float, int]:
    """(entropy in nats, number of tokens) of the unigram distribution of all tokens given."""
    counts = unigram_counts(token_arrays, vocab_size)
    return entropy(counts), int(counts.sum())


def test_unigram_entropy():
    assert entropy(np.array([1, 1, 1, 1])) == pytest.approx(np.log(4))
    h, n = unigram_entropy([np.array([0, 1]), np.array([2, 3])], vocab_size=8)
    assert n == 4 and h == pytest.approx(np.log(4))


def test_plateau_helpers():
    counts = np.array([3, 1, 0, 0])  # add-one smoothed: 4/8, 2/8, 1/8, 1/8
    assert cross_entropy(np.array([0, 1]), counts) == pytest.approx(-(np.log(0.5) + np.log(0.25)) / 2)
    assert val_limit(None, 10) == 10 and val_limit(4.0, 10) == 4 and val_limit(0.5, 10) == 5
    assert val_limit(1.0, 10) == 10 and val_limit(20, 10) == 10


def _fake_summary(status, val, p=None, rounds=3, diverged_at=None):
    visits = {
        f"r{r:02d}_k1_{s}": {
            "resid_norm": 1.0 + r,
            "state_norm": 1.0,
            "branch_ratio": 0.1,
            "act_grad_norm": 0.1,
            "param_grad_norm": 0.1,
        }
        for r in range(1, rounds + 1)
        for s in ("attn", "ffn")
    }
    return {
        "status": status,
        "diverged_at_step": diverged_at,
        "final_val_loss": val,
        "best_val_loss": val,
        "final_train_loss": val,
        "global_step": 10,
        "val_history": [[10, val]] if val is not None else [],
        "config": {
            "residual": "scaled" if p else "deepnorm",
            "p": p,
            "wiring": "lt",
            "n_rounds": rounds,
            "n_blocks": 1,
        },
        "last_visit_stats": visits,
        "kappa": {"model": 1.5},
        "wall_time_s": 1.0,
    }


def test_report_marks_diverged_seeds_and_draws_the_exponent_sweep(tmp_path):
    """A hand-written sweep folder (no fits): diverged seeds are left out of the mean and counted,
    a method whose seeds all diverged says so, and a sweep of p gets its escape plot."""
    from loopnet.diagnostics import write_summary

    sweep = tmp_path / "sw"
    cells = {
        "deepnorm-s1": (_fake_summary("completed", 6.0), {"seed_everything": 1}),
        "deepnorm-s2": (_fake_summary("diverged", None, diverged_at=7), {"seed_everything": 2}),
        "deepnorm-s3": (_fake_summary("completed", 5.0), {"seed_everything": 3}),
        "p0.3-s1": (
            _fake_summary("diverged", 9.0, p=0.3, diverged_at=4),
            {"model.config.p": 0.3, "seed_everything": 1},
        ),
        "p0.3-s2": (
            _fake_summary("diverged", None, p=0.3, diverged_at=5),
            {"model.config.p": 0.3, "seed_everything": 2},
        ),
        "p0.5-s1": (_fake_summary("completed", 6.5, p=0.5), {"model.config.p": 0.5, "seed_everything": 1}),
        "p0.5-s2": (_fake_summary("completed", 7.5, p=0.5), {"model.config.p": 0.5, "seed_everything": 2}),
    }
    for cid, (summary, _) in cells.items():
        write_summary(sweep / cid / "summary.json", summary)
    manifest = {"cells": [{"id": cid, "params": params} for cid, (_, params) in cells.items()], "out": str(sweep)}
    manifest["cells"].insert(3, {"id": "deepnorm-s4", "params": {"seed_everything": 4}})  # never ran
    (sweep / MANIFEST).write_text(json.dumps(manifest))

    report_mod.main([str(sweep), "--out", str(tmp_path / "rep"), "--plateau", "7.0"])
    md = (tmp_path / "rep" / "report.md").read_text()
    loss = {r[0]: r[1] for r in _table_after(md, "## Final validation loss")[1:]}
    assert (
        loss["deepnorm-lt"]
        == f"{report_mod.fmt(5.5)} ± {report_mod.fmt(statistics.stdev([6.0, 5.0]))} († 1/4 diverged, 1 not run, n=2)"
    )
    assert loss["p0.3-lt"] == "diverged (2/2, step 4)"
    assert loss["p0.5-lt"].startswith(f"{report_mod.fmt(7.0)} ± ")
    escape = {r[0]: r[1] for r in _table_after(md, "## Escape from the unigram plateau")[1:]}
    assert escape == {"deepnorm-lt": "2/3", "p0.3-lt": "0/2", "p0.5-lt": "1/2"}
    rows = {r[0]: r for r in _table_after(md, "## Every run")[1:]}
    assert rows["deepnorm-s4"][4] == "not run" and rows["p0.3-s1"][8] == "4"
    assert (tmp_path / "rep" / "exponent.png").stat().st_size > 5000 and "](exponent.png)" in md


class FakeFit:
    """Stands in for the `loopnet fit` subprocess: records its command and environment and writes
    a completed summary where the real fit would."""

    calls: list = []

    def __init__(self, cmd, stdout=None, stderr=None, env=None, preexec_fn=None):
        from loopnet.diagnostics import write_summary

        FakeFit.calls.append((cmd, env))
        folder = (
            Path(cmd[cmd.index("--trainer.logger.init_args.save_dir") + 1])
            / cmd[cmd.index("--trainer.logger.init_args.name") + 1]
        )
        write_summary(folder / "summary.json", {"status": "completed", "final_val_loss": 1.0})
        self.returncode = 0

    def poll(self):
        return 0


def test_resume_from_checkpoint_and_threads_per_job(tmp_path, monkeypatch):
    import loopnet.study.sweep as sweep_mod

    monkeypatch.setattr(sweep_mod, "spawn", FakeFit)
    FakeFit.calls = []
    sweep_file = write_sweep(tmp_path, {"seed_everything": [1, 2, 3]})
    out = tmp_path / "sweep"
    (out / "s2" / "checkpoints").mkdir(parents=True)
    (out / "s2" / "checkpoints" / "last.ckpt").write_bytes(b"x")  # an interrupted cell with a checkpoint
    assert (
        run(
            [str(sweep_file), "--jobs", "3", "--threads", "1", "--resume", "ckpt", "--start", "fresh"],
            echo=lambda _: None,
        )
        == 0
    )
    by_cell = {c[c.index("--trainer.logger.init_args.name") + 1]: (c, env) for c, env in FakeFit.calls}
    assert set(by_cell) == {"s1", "s2", "s3"}
    assert by_cell["s2"][0][-2:] == ["--ckpt_path", "last"] and "--ckpt_path" not in by_cell["s1"][0]
    assert (out / "s2" / "checkpoints" / "last.ckpt").exists()  # kept for the resume
    assert all(env["OMP_NUM_THREADS"] == "1" for _, env in FakeFit.calls)


def test_a_rerun_resumes_a_stopped_cell_from_its_checkpoint_by_default(tmp_path, monkeypatch):
    """What the stop saved is kept and resumed, as "rerun the same command to continue" promises; only
    `--resume restart` deletes it."""
    import loopnet.study.sweep as sweep_mod

    monkeypatch.setattr(sweep_mod, "spawn", FakeFit)
    sweep_file = write_sweep(tmp_path, {"seed_everything": [1, 2]})
    stopped = tmp_path / "sweep" / "s2" / "checkpoints" / "last-interrupted.ckpt"
    for resume in ([], ["--resume", "restart"]):
        FakeFit.calls = []
        stopped.parent.mkdir(parents=True, exist_ok=True)
        stopped.write_bytes(b"saved by a stop")
        (tmp_path / "sweep" / "s2" / "summary.json").unlink(missing_ok=True)
        assert run([str(sweep_file), "--start", "fresh", *resume], echo=lambda _: None) == 0
        ((cmd, _),) = [c for c in FakeFit.calls if c[0][c[0].index("--trainer.logger.init_args.name") + 1] == "s2"]
        if not resume:
            assert cmd[-2:] == ["--ckpt_path", "last"] and stopped.read_bytes() == b"saved by a stop"
        else:
            assert "--ckpt_path" not in cmd and not stopped.exists()


def test_max_cells_stops_after_that_many(tmp_path, monkeypatch):
    import loopnet.study.sweep as sweep_mod

    monkeypatch.setattr(sweep_mod, "spawn", FakeFit)
    FakeFit.calls = []
    sweep_file = write_sweep(tmp_path, {"seed_everything": [1, 2, 3]})
    assert run([str(sweep_file), "--max_cells", "1", "--start", "fresh"], echo=lambda _: None) == 0
    assert run([str(sweep_file), "--max_cells", "1", "--start", "fresh"], echo=lambda _: None) == 0
    names = [c[c.index("--trainer.logger.init_args.name") + 1] for c, _ in FakeFit.calls]
    assert names == ["s1", "s2"]


def test_window_reads_the_end_of_loop_state_logged_as_its_deviation_from_one():
    """Runs log the state RMS as `state_norm_dev` (RMS − 1); the report's window adds the 1 back, and
    still reads runs that logged `state_norm` itself."""
    from loopnet.study.report.runs import final_state_curve, final_state_tags

    dev, old = final_state_tags(n_blocks=2, n_rounds=3)
    assert dev == "visits/state_norm_dev/r03_k2_ffn" and old == "visits/state_norm/r03_k2_ffn"
    assert final_state_curve({dev: [(10, -0.25), (20, 0.5)]}, 2, 3) == [(10, 0.75), (20, 1.5)]
    assert final_state_curve({old: [(10, 0.9)]}, 2, 3) == [(10, 0.9)]
    assert final_state_curve({}, 2, 3) is None
