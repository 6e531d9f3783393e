"""The stability map over the recipe's settings: `loopnet sweep` over round_sampling × learning rate (real
fits of a tiny model), then `loopnet report`, whose map rows equal what the runs' summaries say."""

from __future__ import annotations

import statistics

import pytest
import yaml

from loopnet.diagnostics import read_summary
from loopnet.study import report as report_mod
from loopnet.study.measures import param_label
from loopnet.study.sweep import MANIFEST, run
from tests.study.test_map import _map_rows
from tests.study.test_sweep_report import REPO, TINY

pytestmark = pytest.mark.slow

RULES, RATES = ["fixed", "poisson_truncated"], [1e-3, 4e-3]


def test_the_map_over_round_sampling_and_learning_rate(tmp_path):
    spec = {
        "base": [str(REPO / "configs/deeploop_r6.yaml"), str(REPO / "configs/cpu.yaml")],
        "overrides": {**TINY, "model.config.n_rounds": 2, "model.config.max_rounds": 4, "trainer.max_steps": 4},
        "grid": {"model.config.round_sampling": RULES, "model.optim.lr": RATES, "seed_everything": [1]},
        "out": str(tmp_path / "sweep"),
    }
    (tmp_path / "map.yaml").write_text(yaml.safe_dump(spec))
    echo = []  # the sweep in this process (its fits are real processes): what is tested is the map, not the sweep's
    assert run([str(tmp_path / "map.yaml")], echo=echo.append) == 0, "\n".join(echo)[-3000:]
    sweep = tmp_path / "sweep"
    manifest = yaml.safe_load((sweep / MANIFEST).read_text())
    cells = {c["id"]: c["params"] for c in manifest["cells"]}
    assert len(cells) == 4
    summaries = {cid: read_summary(sweep / cid) for cid in cells}
    assert all(s["status"] == "completed" for s in summaries.values())

    plateau = max(s["final_val_loss"] for s in summaries.values()) + 1.0  # every cell trains
    report_mod.main([str(sweep), "--out", str(tmp_path / "report"), "--plateau", str(plateau)])
    rows = _map_rows((tmp_path / "report" / "report.md").read_text())
    method = {rule: "deeploop-carry-" + param_label("model.config.round_sampling", rule) for rule in RULES}
    assert set(rows) == {(method[rule], 2) for rule in RULES}
    for rule in RULES:  # the best rate of each rule: the one with the lower final validation loss (one seed)
        by_lr = {
            p["model.optim.lr"]: summaries[cid]["final_val_loss"]
            for cid, p in cells.items()
            if p["model.config.round_sampling"] == rule
        }
        best = min(by_lr, key=by_lr.get)
        row = rows[(method[rule], 2)]
        assert row[2] == "1" and float(row[4]) == best
        assert row[5] == report_mod.fmt(statistics.fmean([by_lr[best]]))
    # The sampled cells drew their rounds: their summaries record the last step's visits of the rounds run.
    for cid, p in cells.items():
        visits = summaries[cid]["last_visit_stats"]
        rounds = {int(t[1:3]) for t in visits}
        assert rounds == set(range(1, max(rounds) + 1)) and (
            p["model.config.round_sampling"] != "fixed" or max(rounds) == 2
        )
