"""The transfer readings (docs/results/transfer/PREREGISTRATION.md) on synthetic runs whose answers are known by
construction: exact quadratic losses in log10 η (each seed's vertex is what was put in), Welch and t intervals
recomputed from the textbook formulas with table quantiles, each cell's trains-pattern a translate of one pattern
(its 50%-trains rate moves by exactly the translation), the joint profile interval checked against its defining
equation, and the command run end to end on a cells.csv and on a sweep folder of summaries."""

import json
import math
import statistics
from pathlib import Path

import pytest

from experiments.transfer import readings as tr

PLATEAU = 3.275707171288669  # the map's
T10 = 2.228138851986274  # Student's t, 0.975 quantile, 10 degrees of freedom (tables)
T5 = 2.570581835636314  # 5 degrees of freedom
SEEDS = range(1, 7)
LADDER = [2.5e-4 * 2 ** (k / 2) for k in range(19)]
JITTER = [0.03, -0.02, 0.01, -0.04, 0.025, -0.005]  # per-seed vertex offsets (decades)


def quad_runs(x: dict[tuple[str, str], float], jitter=JITTER) -> dict:
    """Runs of `tr.read`'s form, loss = 2.6 + 0.2·(log10 η − x_seed)², every one completed and training."""
    runs = {}
    for (arm, cell), x0 in x.items():
        for s in SEEDS:
            for lr in LADDER:
                loss = 2.6 + 0.2 * (math.log10(lr) - x0 - jitter[s - 1]) ** 2
                runs[(arm, cell, lr, s)] = {
                    "arm": arm,
                    "cell": cell,
                    "d": 64 if cell == "source" else 256,
                    "R": 12 if cell == "target" else 2,
                    "lr": lr,
                    "seed": s,
                    "status": "completed",
                    "loss": min(loss, 3.0),  # every rate trains (below the plateau − 0.1)
                    "init_loss": 5.77,
                }
    return runs


def test_each_seed_vertex_is_exact_and_the_shift_has_welchs_interval():
    runs = quad_runs({("standard", "source"): -2.5, ("standard", "target"): -2.9})
    b = {c: tr.best_rate(runs, "standard", c, PLATEAU) for c in ("source", "target")}
    for s in SEEDS:
        assert b["source"]["xs"][s - 1] == pytest.approx(-2.5 + JITTER[s - 1], abs=1e-9)
    assert b["source"]["censored"] == 0 and b["source"]["decided"]
    d = tr.shift(b, "source", "target")
    # equal variances and n = 6 in both cells: the Welch–Satterthwaite df is exactly 10
    se = math.sqrt(2 * statistics.variance(JITTER) / 6)
    assert d["df"] == pytest.approx(10, rel=1e-9)
    assert d["est"] == pytest.approx(-0.4, abs=1e-9)
    assert (d["lo"], d["hi"]) == pytest.approx((-0.4 - T10 * se, -0.4 + T10 * se), abs=1e-9)
    assert tr.transfer_word(d) == "does not transfer"


@pytest.mark.parametrize(
    "lo, hi, word",
    [
        (-0.149, 0.149, "transfers"),
        (-0.154, 0.1, "transfers"),
        (-0.16, 0.1, "undecided"),
        (0.16, 0.3, "does not transfer"),
        (-0.5, -0.16, "does not transfer"),
    ],
)
def test_transfer_words_use_the_printed_decimals(lo, hi, word):
    assert tr.transfer_word({"est": (lo + hi) / 2, "lo": lo, "hi": hi}) == word


def test_two_censored_seeds_leave_a_cell_without_a_best_rate():
    runs = quad_runs({("standard", "source"): -2.5, ("standard", "target"): -2.9})
    for s in (1, 2):  # these seeds' losses fall toward the ladder's top: vertex censored there
        for lr in LADDER:
            runs[("standard", "target", lr, s)]["loss"] = 3.0 - 0.01 * math.log10(lr / LADDER[0])
    b = {c: tr.best_rate(runs, "standard", c, PLATEAU) for c in ("source", "target")}
    assert b["target"]["censored"] == 2 and not b["target"]["decided"]
    assert tr.transfer_word(tr.shift(b, "source", "target")).startswith("undecided (target: 2 of 6")


def pattern_runs(centres: dict[tuple[str, str], float]) -> dict:
    """Per (arm, cell): seed s trains below log10 η = centre + offset_s, the same offsets in every cell."""
    offsets = [-0.3, -0.15, 0.0, 0.0, 0.15, 0.3]
    runs = {}
    for (arm, cell), c in centres.items():
        for s in SEEDS:
            for k in range(40):
                lr = 10 ** (c - 1.0 + k * 0.05 + 0.025)
                ok = math.log10(lr) < c + offsets[s - 1]
                runs[(arm, cell, lr, s)] = {
                    "arm": arm,
                    "cell": cell,
                    "d": 64,
                    "R": 2,
                    "lr": lr,
                    "seed": s,
                    "status": "completed" if ok else "diverged",
                    "loss": 2.7 if ok else None,
                    "init_loss": 5.77,
                }
    return runs


def test_delta50_moves_by_exactly_the_translation():
    runs = pattern_runs({("standard", "source"): -1.5, ("standard", "width"): -2.15})
    d = tr.delta50(runs, "standard", "source", "width", PLATEAU)
    assert d["est"] == pytest.approx(-0.65, abs=1e-6)
    assert d["lo"] < -0.65 < d["hi"]
    assert tr.replicates_word(d) == "replicates the width study"


def test_joint_drift_difference_meets_its_defining_equation():
    runs = pattern_runs({("standard", "source"): -1.5, ("standard", "width"): -2.15, ("mup", "width"): -1.6})
    e = tr.joint_drift_difference(runs, PLATEAU)
    std, mup = e["fits"]
    assert e["est"] == pytest.approx(mup.x50("width") - std.x50("width"), abs=1e-12)
    top = std.value + mup.value
    assert tr.joint_profile(std, mup, e["est"]) == pytest.approx(top, abs=1e-6)  # the maximum is at the estimate
    for end in (e["lo"], e["hi"]):  # the ends: twice the drop is χ²₁(0.95), to the search's tolerance
        assert 2 * (top - tr.joint_profile(std, mup, end)) == pytest.approx(3.841458820694124, abs=2e-3)
    assert e["lo"] < e["est"] < e["hi"] and e["lo"] > 0  # μP's width cell lies 0.55 decades above standard's
    assert tr.drift_word({"est": 0.4, "lo": 0.2, "hi": 0.6}, e) == "reduces the drift"
    assert tr.drift_word({"est": 0.0, "lo": -0.1, "hi": 0.1}, e) == "removes the drift"


def test_loss_lost_is_paired_and_a_diverged_seed_costs_its_initial_loss():
    runs = quad_runs({("standard", "target"): math.log10(2e-3)}, jitter=[0.0] * 6)
    source_x = math.log10(5.66e-3)  # the source's best rate: three ×√2 steps above the target's
    e = tr.loss_lost(runs, "standard", "target", source_x, PLATEAU)
    g = min(LADDER, key=lambda lr: abs(math.log10(lr) - source_x))
    b = min(LADDER, key=lambda lr: abs(math.log10(lr) - math.log10(2e-3)))
    assert (e["eta_g"], e["eta_b"]) == (g, b)
    expected = 0.2 * (math.log10(g) - math.log10(2e-3)) ** 2 - 0.2 * (math.log10(b) - math.log10(2e-3)) ** 2
    assert e["mean"] == pytest.approx(expected, abs=1e-12) and e["lo"] == pytest.approx(e["hi"], abs=1e-12)
    assert tr.cost_word(e) == ("negligible" if expected < 0.02 else "material")
    runs[("standard", "target", g, 3)].update(status="diverged", loss=None)  # one seed diverges at η_g
    e = tr.loss_lost(runs, "standard", "target", source_x, PLATEAU)
    diffs = [expected] * 6
    diffs[2] = 5.77 - runs[("standard", "target", b, 3)]["loss"]
    m, se = statistics.fmean(diffs), statistics.stdev(diffs) / math.sqrt(6)
    assert e["diverged"] == 1
    assert (e["mean"], e["lo"], e["hi"]) == pytest.approx((m, m - T5 * se, m + T5 * se), abs=1e-9)


def test_the_command_writes_cells_and_readings_and_reads_its_own_csv(tmp_path, capsys):
    x = {("standard", "source"): -2.5, ("standard", "width"): -2.9, ("standard", "target"): -3.1}
    x.update({("mup", "width"): -2.55, ("mup", "target"): -2.6})
    x.update({("completep", "source"): -2.2, ("completep", "width"): -2.25, ("completep", "target"): -2.3})
    runs = quad_runs(x)
    first = tmp_path / "first"
    first.mkdir()
    tr.write_csv(runs, first / "cells.csv")
    (first / "plateau.json").write_text(json.dumps({"plateau": PLATEAU}))
    out = tmp_path / "out"
    tr.main(["--cells", str(first), "--out", str(out)])
    printed = capsys.readouterr().out
    assert "standard + DeepLoop: does not transfer (Δ*)" in printed
    assert "μP + CompleteP (Pre-LN): transfers (Δ*)" in printed
    again = tr.read([out])  # the written cells.csv reads back to the same runs, μP's source included
    assert again == tr.read([first])
    assert len(again) == len(runs) + 19 * 6
    md = (out / "readings.md").read_text()
    assert "## 1. Transfer, source → target" in md and "Welch's 95% t interval" in md


def test_a_sweep_folder_is_read_from_its_summaries(tmp_path):
    cells = []
    for arm, res in (("standard", "deeploop"), ("completep", "preln"), ("mup", "deeploop")):
        for lr in (1e-3, 2e-3):
            cid = f"{arm}-lr{lr}-s1"
            cells.append({"id": cid, "params": {"model.optim.lr": lr, "seed_everything": 1}})
            (tmp_path / cid).mkdir()
            cfg = {"parametrization": arm, "residual": res, "d_model": 64, "n_rounds": 2, "vocab_size": 320}
            summary = {"status": "completed", "final_val_loss": 2.7, "config": cfg}
            (tmp_path / cid / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "sweep.json").write_text(json.dumps({"cells": cells}))
    runs = tr.read([tmp_path])
    # μP at the source is the standard arm's runs (the same model at d = d₀); its own source runs are not read
    assert sorted({(a, c) for a, c, _, _ in runs}) == [
        ("completep", "source"),
        ("mup", "source"),
        ("standard", "source"),
    ]
    assert runs[("mup", "source", 1e-3, 1)]["init_loss"] == pytest.approx(math.log(320))  # no event file: ln V


def test_a_cell_with_a_run_not_yet_finished_is_left_out_whole(tmp_path, capsys):
    """A sweep stopped part-way: the standard arm's cell has a run that has not finished (no summary yet), so none
    of its runs is read, and stderr says so; the CompleteP cell, whole, is read."""
    cells = []
    for arm, res in (("completep", "preln"), ("standard", "deeploop")):  # an included arm listed first
        for lr in (1e-3, 2e-3, 4e-3):
            cid = f"{arm}-lr{lr}-s1"
            params = {"model.optim.lr": lr, "seed_everything": 1}
            if arm == "completep":
                params |= {"model.config.parametrization": arm, "model.config.residual": res}
            cells.append({"id": cid, "params": params})
            if arm == "standard" and lr == 4e-3:
                continue  # not run yet
            (tmp_path / cid).mkdir()
            cfg = {"parametrization": arm, "residual": res, "d_model": 64, "n_rounds": 2, "vocab_size": 320}
            summary = {"status": "completed", "final_val_loss": 2.7, "config": cfg}
            (tmp_path / cid / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "sweep.json").write_text(json.dumps({"cells": cells}))
    runs = tr.read([tmp_path])
    assert sorted({(a, c) for a, c, _, _ in runs}) == [("completep", "source")]
    assert "standard + DeepLoop, source cell: 2 of 3 runs finished; the cell is left out" in capsys.readouterr().err


def test_a_folder_without_runs_is_refused_in_one_line(tmp_path):
    with pytest.raises(SystemExit) as err:
        tr.main(["--cells", str(tmp_path), "--out", str(tmp_path / "o"), "--plateau", "3.2"])
    assert err.value.code != 0


def test_the_committed_readings_are_what_the_code_computes_from_the_committed_cells(tmp_path, capsys):
    """docs/results/transfer/readings.md, recomputed from the committed cells.csv: the same text, figure for figure
    (the record cannot drift from its cells)."""
    results = Path(__file__).resolve().parents[2] / "docs" / "results" / "transfer"
    committed = (results / "readings.md").read_text()
    argv = committed.split("Written by `python -m experiments.transfer.readings ", 1)[1].split("`", 1)[0].split()
    tr.main(["--cells", str(results), "--out", str(tmp_path)])  # its cells.csv and plateau.json
    text = (tmp_path / "readings.md").read_text()
    ours = text.split("Written by `python -m experiments.transfer.readings ", 1)[1].split("`", 1)[0]
    assert text.replace(ours, " ".join(argv)) == committed
