"""`loopnet report` on folders that are not a sweep's: `runs/` (fit's own layout) gets a true message with
the fix, and two versions of one run are refused instead of averaged as two seeds."""

from __future__ import annotations

import pytest
import yaml

from loopnet.diagnostics.summary import write_summary
from loopnet.study.report.build import build_report

CONFIG = {"residual": "deeploop", "n_rounds": 2, "n_blocks": 2, "d_model": 32}


def _run(folder, steps: int, seed: int = 1337) -> None:
    folder.mkdir(parents=True)
    write_summary(
        folder / "summary.json",
        {"status": "completed", "global_step": steps, "config": CONFIG, "final_val_loss": 5.0, "best_val_loss": 5.0},
    )
    (folder / "config.yaml").write_text(yaml.safe_dump({"seed_everything": seed}))


def test_a_runs_folder_is_named_for_what_it_is(tmp_path):
    _run(tmp_path / "runs" / "deeploop_carry_k2_r2_d32" / "version_0", 300)
    with pytest.raises(ValueError) as err:
        build_report(tmp_path / "runs", tmp_path / "out")
    message = str(err.value)
    assert "is not a sweep folder" in message and "1 run summaries lie two levels down" in message
    assert "fix:" in message and "holds no sweep manifest (sweep.json) and no run summar" not in message


def test_two_versions_of_one_run_are_not_averaged_as_seeds(tmp_path):
    run = tmp_path / "deeploop_carry_k2_r2_d32"
    _run(run / "version_0", 300)
    _run(run / "version_1", 100)
    with pytest.raises(ValueError, match=r"version_0, version_1 are the same run \(.*R = 2, seed 1337\), not seeds"):
        build_report(run, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _sweep(folder, ids: list[str]) -> None:
    """A sweep folder whose manifest lists `ids`, of which only the first has run."""
    import json

    from loopnet.study.sweep import MANIFEST

    folder.mkdir(parents=True)
    (folder / MANIFEST).write_text(json.dumps({"cells": [{"id": i, "params": {"seed_everything": 1}} for i in ids]}))
    write_summary(
        folder / ids[0] / "summary.json",
        {"status": "completed", "global_step": 300, "config": CONFIG, "final_val_loss": 5.0, "best_val_loss": 5.0},
    )


def test_only_reports_the_cells_a_sweep_ran_with_only(tmp_path):
    """A sweep run with --only leaves the grid's other cells unrun; `--only` keeps them out of the report instead
    of listing them as "not run", and a glob that matches nothing is refused with the fix."""
    _sweep(tmp_path / "sweep", ["postln-r2-s1", "deepnorm-r2-s1"])
    report = build_report(tmp_path / "sweep", tmp_path / "all", plateau_arg="none").read_text()
    assert "cells: 2, finished 1" in report and "not run" in report
    report = build_report(tmp_path / "sweep", tmp_path / "only", plateau_arg="none", only=["postln*"]).read_text()
    assert "cells: 1, finished 1" in report and "not run" not in report
    with pytest.raises(ValueError, match=r"no cell of .* matches --only pre\*; fix:"):
        build_report(tmp_path / "sweep", tmp_path / "none", plateau_arg="none", only=["pre*"])
