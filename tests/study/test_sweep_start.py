"""A cell's fit gives the same per-step losses whether it starts as a fresh process or as a fork of the
sweep's fit server (`loopnet.study.launch`), at more than one thread."""

import pytest

from loopnet.diagnostics import read_summary
from loopnet.study.report import read_curves
from loopnet.study.sweep import run

from .test_sweep_stops import events
from .test_sweep_report import TINY, write_sweep

pytestmark = pytest.mark.slow  # real fits


def test_a_cell_gives_the_same_losses_either_way(tmp_path):
    runs = {}
    for start in ("fresh", "forkserver"):
        folder = tmp_path / start
        folder.mkdir()
        sweep_file = write_sweep(
            folder, {"model.config.n_rounds": [2], "seed_everything": [3]}, {**TINY, "model.config.dropout": 0.1}
        )  # dropout: the RNG streams matter too
        assert run([str(sweep_file), "--start", start, "--threads", "2"], echo=lambda _: None) == 0
        cell = folder / "sweep" / "r2-s3"
        runs[start] = (read_curves(cell), read_summary(cell))
        assert [e["event"] for e in events(folder / "sweep")] == ["started", "finished"]
    (fresh, fresh_summary), (forked, forked_summary) = runs["fresh"], runs["forkserver"]
    assert len(fresh["train/loss"]) == 4
    assert forked["train/loss"] == fresh["train/loss"]  # every step, exactly
    assert forked["val/loss"] == fresh["val/loss"]
    assert forked_summary["val_history"] == fresh_summary["val_history"]
    assert forked_summary["kappa"] == fresh_summary["kappa"]
