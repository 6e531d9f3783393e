"""The stability map's measures, checked by hand on synthetic run summaries (no fits)."""

import json
import math
import statistics

import pytest

from loopnet.study import measures
from loopnet.study import report as report_mod
from loopnet.study.sweep import MANIFEST


def test_trains_needs_completion_and_the_margin_below_the_plateau():
    assert measures.trains("completed", 5.89, 6.0)
    assert not measures.trains("completed", 5.91, 6.0)  # below the plateau, but within 0.1 nat of it
    assert not measures.trains("diverged", 1.0, 6.0)
    assert not measures.trains("completed", None, 6.0) and not measures.trains("completed", math.nan, 6.0)


def test_capped_loss_and_lr_sensitivity_by_hand():
    assert measures.capped_loss("completed", 5.0, 6.0) == 5.0
    assert measures.capped_loss("completed", 7.0, 6.0) == 6.0  # worse than init: capped at ℓ₀
    assert measures.capped_loss("diverged", None, 6.0) == 6.0
    # ℓ* = 4; gaps 1, 0, 2 -> mean 1
    assert measures.lr_sensitivity({1e-3: 5.0, 2e-3: 4.0, 4e-3: 6.0}) == pytest.approx(1.0)
    assert measures.lr_sensitivity({1e-3: 4.0, 2e-3: 4.0}) == 0.0
    assert measures.lr_sensitivity({}) is None


def test_trainable_band_edges_width_censoring_and_gaps():
    band = measures.trainable_band({1e-3: False, 2e-3: True, 4e-3: True, 8e-3: False})
    assert (band["smallest"], band["largest"]) == (2e-3, 4e-3)
    assert band["width"] == pytest.approx(math.log10(2))
    assert not band["censored_high"] and not band["censored_low"] and band["contiguous"]
    band = measures.trainable_band({1e-3: True, 2e-3: False, 4e-3: True})
    assert band["censored_high"] and band["censored_low"] and not band["contiguous"]
    assert band["width"] == pytest.approx(math.log10(4))
    assert measures.trainable_band({1e-3: False})["largest"] is None


def test_steps_to_escape_is_the_first_validation_below_the_plateau_without_lag():
    history = [[100, 6.5], [200, 6.05], [300, 5.9], [400, 5.5]]
    assert measures.escape_step(history, 6.0) == 300
    assert measures.escape_step(history, 5.0) is None
    run = report_mod.Run("c", {}, {"status": "completed", "val_history": history})
    run.plateau, run.escaped = 6.0, True
    assert run.escape_step == 300
    run.escaped = False
    assert run.escape_step is None


def test_a_sweep_seed_sets_the_data_order_too(tmp_path):
    from loopnet.study.grid import expand, sweep_from_dict

    (tmp_path / "b.yaml").write_text("{}\n")
    cells = expand(
        sweep_from_dict({"base": [str(tmp_path / "b.yaml")], "grid": {"seed_everything": [3]}, "out": str(tmp_path)})
    )
    cmd = cells[0].command
    assert cmd[cmd.index("--data.seed") + 1] == "3"
    pinned = expand(
        sweep_from_dict(
            {
                "base": [str(tmp_path / "b.yaml")],
                "overrides": {"data.seed": 1337},
                "grid": {"seed_everything": [3]},
                "out": str(tmp_path),
            }
        )
    )[0].command
    assert pinned[pinned.index("--data.seed") + 1] == "1337" and pinned.count("--data.seed") == 1


VOCAB = 400  # ℓ₀ = ln 400 = 5.99 (no TensorBoard curves here, so no step-0 loss)
PLATEAU = 5.5
# (scheme, R) -> lr -> final val loss per seed (None: diverged)
LOSSES = {
    ("deepnorm", 2): {1e-3: [5.0, 5.2], 2e-3: [4.8, 4.9], 4e-3: [5.45, 5.3], 8e-3: [None, 5.0]},
    ("deepnorm", 6): {1e-3: [5.1, 5.1], 2e-3: [5.6, 5.0], 4e-3: [None, None], 8e-3: [None, None]},
    ("deeploop", 2): {1e-3: [5.3, 5.3], 2e-3: [5.0, 5.1], 4e-3: [4.9, 4.9], 8e-3: [5.2, 5.3]},
    ("deeploop", 6): {1e-3: [5.35, 5.3], 2e-3: [5.1, 5.0], 4e-3: [5.0, 4.8], 8e-3: [7.0, 5.2]},
}


def _summary(scheme, rounds, lr, loss):
    return {
        "status": "diverged" if loss is None else "completed",
        "diverged_at_step": 50 if loss is None else None,
        "final_val_loss": loss,
        "best_val_loss": loss,
        "final_train_loss": loss,
        "global_step": 400,
        "val_history": [] if loss is None else [[400, loss]],
        "config": {
            "residual": scheme,
            "p": None,
            "wiring": "carry",
            "n_rounds": rounds,
            "n_blocks": 2,
            "vocab_size": VOCAB,
        },
        "hparams": {"optim": {"lr": lr}},
        "last_visit_stats": None,
        "kappa": None,
        "wall_time_s": 1.0,
    }


@pytest.fixture(scope="module")
def map_report(tmp_path_factory):
    from loopnet.diagnostics import write_summary

    root = tmp_path_factory.mktemp("map")
    sweep, cells = root / "sw", []
    for (scheme, rounds), by_lr in LOSSES.items():
        for lr, seeds in by_lr.items():
            for seed, loss in enumerate(seeds, start=1):
                params = {
                    "model.config.residual": scheme,
                    "model.config.n_rounds": rounds,
                    "model.optim.lr": lr,
                    "seed_everything": seed,
                }
                cid = f"{scheme}-r{rounds}-lr{lr:g}-s{seed}"
                write_summary(sweep / cid / "summary.json", _summary(scheme, rounds, lr, loss))
                cells.append({"id": cid, "params": params})
    (sweep / MANIFEST).write_text(json.dumps({"cells": cells, "out": str(sweep)}))
    report_mod.main([str(sweep), "--out", str(root / "rep"), "--plateau", str(PLATEAU)])
    return root / "rep"


def _map_rows(md):
    lines = md.split("## Stability map", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| method | R | seeds"))
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[(cells[0], int(cells[1]))] = cells
    return rows


def test_map_table_by_hand(map_report):
    md = (map_report / "report.md").read_text()
    rows = _map_rows(md)
    l0 = math.log(VOCAB)
    # deepnorm R = 2: ℓ(η) = 5.1, 4.85, 5.375, (ℓ₀ + 5.0)/2 -> best 2e-3; trains at 1e-3, 2e-3 (4e-3: 5.45 is within
    # the margin of 5.5; 8e-3: a seed diverged): band 1e-3 (the grid's lowest: ≤) … 2e-3
    capped = [5.1, 4.85, 5.375, (l0 + 5.0) / 2]
    row = rows[("deepnorm-carry", 2)]
    assert row[2] == "2" and row[3] == report_mod.fmt(l0, 3) and row[4] == "0.002"
    assert row[5] == f"{report_mod.fmt(4.85)} ± {report_mod.fmt(statistics.stdev([4.8, 4.9]))}"
    assert row[6] == report_mod.fmt(statistics.fmean(v - 4.85 for v in capped), 3)
    assert row[7:10] == ["0.002", "≤ 0.001 … 0.002", f"≥ {math.log10(2):.2f}"]
    # deepnorm R = 6: 2e-3 has a seed on the plateau (5.6): only 1e-3 trains; 4e-3 and 8e-3 diverge (ℓ₀)
    capped = [5.1, 5.3, l0, l0]
    row = rows[("deepnorm-carry", 6)]
    assert row[4] == "0.001" and row[6] == report_mod.fmt(statistics.fmean(v - 5.1 for v in capped), 3)
    assert row[7:10] == ["0.001", "≤ 0.001 … 0.001", "≥ 0.00"]
    # deeploop R = 2 trains everywhere: censored both ways, width log10(8)
    row = rows[("deeploop-carry", 2)]
    assert row[4] == "0.004" and row[7:10] == ["≥ 0.008", "≤ 0.001 … ≥ 0.008", f"≥ {math.log10(8):.2f}"]
    # deeploop R = 6: 8e-3 ends above the plateau on one seed (7.0, capped at ℓ₀ for the sensitivity)
    capped = [5.325, 5.05, 4.9, (min(7.0, l0) + 5.2) / 2]
    row = rows[("deeploop-carry", 6)]
    assert row[4] == "0.004" and row[7] == "0.004"
    assert row[6] == report_mod.fmt(statistics.fmean(v - 4.9 for v in capped), 3)


def test_map_decisive_readings_and_plots(map_report):
    md = (map_report / "report.md").read_text()
    # DeepNorm's largest trainable lr falls 2e-3 -> 1e-3 (0.30 decades); DeepLoop's 8e-3 (censored) -> 4e-3 (0.30)
    assert "deepnorm-carry: largest trainable lr 0.002 at R = 2, 0.001 at R = 6: falls by 0.30 decades" in md
    # DeepLoop's R = 2 edge is the grid's top (censored), so +0.00 is not resolved rather than contradicted
    assert "DeepNorm's fall minus DeepLoop's = +0.00 decades: **not resolved** by the rule" in md
    assert f"predicts +{0.5 * math.log10(3):.2f}" in md
    # Reading 2 at R = 2: DeepLoop 4.9 ± 0 at 4e-3 vs DeepNorm 4.85 ± 0.0707 at 2e-3
    assert f"R = 2: {4.9 - 4.85:+.3f} ± {statistics.stdev([4.8, 4.9]):.3f} nat: DeepLoop **not distinguished**" in md
    # Welch: DeepLoop's two seeds agree, so df = 1 and the half-width is t(0.975, 1) · √(0.005 / 2), t(0.975, 1)
    # = tan(0.475π) = 12.706 (Cauchy)
    t1 = math.tan(0.475 * math.pi)
    assert f"[{0.05 - t1 * 0.05:+.3f}, {0.05 + t1 * 0.05:+.3f}] (Welch, df 1.0)" in md
    # paired by seed: differences 4.9 - 4.8 and 4.9 - 4.9, mean 0.05, half-width t(0.975, 1) · sd / √2
    assert f"paired by seed +0.050 [{0.05 - t1 * 0.05:+.3f}, {0.05 + t1 * 0.05:+.3f}] (2 seeds)" in md
    # R = 6: DeepLoop 4.9 ± 0.141 at 4e-3 vs DeepNorm 5.1 ± 0 at 1e-3: -0.2 beyond the spread, ahead
    assert f"R = 6: {-0.2:+.3f} ± {statistics.stdev([5.0, 4.8]):.3f} nat: DeepLoop **ahead**" in md
    for name in ("map_loss_vs_lr.png", "map_heatmap.png", "map_best_lr_vs_R.png"):
        assert (map_report / name).stat().st_size > 5000 and f"]({name})" in md
    assert "LR sensitivity** = mean over the grid" in md  # the definitions are written out


def test_logistic_fit_solves_the_score_equations_and_refuses_separated_data():
    xs = [0.25, 0.25, 0.35, 0.35, 0.45, 0.45, 0.55, 0.55]
    ys = [False, False, True, False, False, True, True, True]
    fit = measures.logistic_fit(xs, ys)
    ps = [1 / (1 + math.exp(-(fit["a"] + fit["b"] * x))) for x in xs]
    assert sum(y - p for y, p in zip(ys, ps)) == pytest.approx(0, abs=1e-9)  # the MLE's score equations
    assert sum((y - p) * x for x, y, p in zip(xs, ys, ps)) == pytest.approx(0, abs=1e-9)
    assert fit["b"] > 0 and fit["x50"] == pytest.approx(-fit["a"] / fit["b"])
    # Wald SE from the Fisher information at the fit
    w = [p * (1 - p) for p in ps]
    i_aa, i_ab, i_bb = sum(w), sum(wi * x for wi, x in zip(w, xs)), sum(wi * x * x for wi, x in zip(w, xs))
    assert fit["se_b"] == pytest.approx(math.sqrt(i_aa / (i_aa * i_bb - i_ab**2)))
    assert measures.logistic_fit([0.25, 0.35, 0.45], [False, True, True]) is None  # separated
    assert measures.logistic_fit([0.25, 0.35, 0.35], [False, False, True]) is None  # quasi-separated
    assert measures.logistic_fit([0.25, 0.35], [True, True]) is None


def test_followup_sweeps_follow_their_rules(map_report, tmp_path):
    from experiments import followup
    from loopnet.study.grid import expand, load_sweep

    sweep = map_report.parent / "sw"
    followup.main(["boundary", str(sweep), "--plateau", str(PLATEAU), "--out", str(tmp_path / "boundary.yaml")])
    cells = expand(load_sweep(tmp_path / "boundary.yaml"))
    rates = {
        s: sorted(
            {
                c.params["model.optim.lr"]
                for c in cells
                if c.params["model.config.residual"] == s and c.params["model.config.n_rounds"] == 6
            }
        )
        for s in ("deepnorm", "deeploop")
    }
    # R = 6 (the largest): DeepNorm trains on every seed up to 1e-3, DeepLoop up to 4e-3
    assert rates["deepnorm"] == [7.07e-4, 1e-3, 1.41e-3, 2e-3] and rates["deeploop"] == [2.83e-3, 4e-3, 5.66e-3, 8e-3]
    # and the smallest R as well, each (R, scheme) at 4 rates x 3 seeds
    assert len(cells) == 48 and {c.params["model.config.n_rounds"] for c in cells} == {2, 6}
    r2 = sorted(
        {
            c.params["model.optim.lr"]
            for c in cells
            if c.params["model.config.residual"] == "deepnorm" and c.params["model.config.n_rounds"] == 2
        }
    )
    assert r2 == [1.41e-3, 2e-3, 2.83e-3, 4e-3]  # DeepNorm at R = 2 trains on every seed up to 2e-3
    assert (
        "deepnorm at R = 6: seeds that train per rate 0.001: 2/2, 0.002: 1/2, 0.004: 0/2, 0.008: 0/2"
        in (tmp_path / "boundary.yaml").read_text()
    )
    followup.main(["exponent", str(sweep), "--plateau", str(PLATEAU), "--out", str(tmp_path / "exponent.yaml")])
    cells = expand(load_sweep(tmp_path / "exponent.yaml"))
    assert len(cells) == 40  # 4 p x 2 rates x 5 seeds
    assert sorted({c.params["model.optim.lr"] for c in cells}) == [2e-3, 4e-3]  # DeepNorm 1/2 trains at 2e-3


def test_confirm_sweep_reruns_each_best_rate_on_fresh_seeds(map_report, tmp_path):
    from experiments import followup
    from loopnet.study.grid import expand, load_sweep

    followup.main(
        ["confirm", str(map_report.parent / "sw"), "--plateau", str(PLATEAU), "--out", str(tmp_path / "c.yaml")]
    )
    cells = expand(load_sweep(tmp_path / "c.yaml"))
    got = {
        (
            c.params["model.config.residual"],
            c.params["model.config.n_rounds"],
            c.params["model.optim.lr"],
            c.params["seed_everything"],
        )
        for c in cells
    }
    # the best rates by hand (ℓ(η), a diverged seed counting ℓ₀): DeepNorm 2e-3 at R = 2 (4.85), 1e-3 at R = 6
    # (5.1); DeepLoop 4e-3 at both (4.9 and 4.9)
    best = {("deepnorm", 2): 2e-3, ("deepnorm", 6): 1e-3, ("deeploop", 2): 4e-3, ("deeploop", 6): 4e-3}
    assert got == {(s, r, lr, seed) for (s, r), lr in best.items() for seed in (3, 4, 5)} and len(cells) == 12


def test_welch_interval_by_hand_and_against_scipy():
    xs, ys = [1.0, 2.0, 3.0], [2.0, 4.0, 6.0, 8.0]
    w = measures.welch_interval(xs, ys)
    vx, vy = 1.0 / 3, (20 / 3) / 4  # sample variances over n
    df = (vx + vy) ** 2 / (vx**2 / 2 + vy**2 / 3)
    assert w["diff"] == pytest.approx(3.0) and w["df"] == pytest.approx(df)
    half = measures.t_quantile(0.975, df) * math.sqrt(vx + vy)  # the real df, not rounded down
    assert (w["lo"], w["hi"]) == pytest.approx((3.0 - half, 3.0 + half))
    assert measures.welch_interval([1.0], ys) is None
    # paired: differences 1, 2, 6 -> mean 3, sd √7, half-width t(0.975, 2) · √7 / √3; t(0.975, 2) in closed form
    pi = measures.paired_interval([1.0, 2.0, 6.0])
    t2 = 0.95 / math.sqrt(2 * 0.975 * 0.025)
    half = t2 * math.sqrt(7) / math.sqrt(3)
    assert (pi["mean"], pi["lo"], pi["hi"], pi["n"]) == pytest.approx((3.0, 3.0 - half, 3.0 + half, 3))
    assert pi["t"] == pytest.approx(3.0 / (math.sqrt(7) / math.sqrt(3)))
    assert measures.paired_interval([1.0]) is None


def test_t_quantile_for_real_degrees_of_freedom():
    # closed forms: df 1 is Cauchy, tan(π(q − ½)); df 2 is (2q − 1) / √(2q(1 − q)); large df tends to the normal's
    for q in (0.9, 0.975, 0.995):
        assert measures.t_quantile(q, 1) == pytest.approx(math.tan(math.pi * (q - 0.5)), rel=1e-9)
        assert measures.t_quantile(q, 2) == pytest.approx((2 * q - 1) / math.sqrt(2 * q * (1 - q)), rel=1e-9)
    assert measures.t_quantile(0.975, 1e7) == pytest.approx(1.959964, abs=1e-5)
    assert measures.t_quantile(0.025, 3) == pytest.approx(-measures.t_quantile(0.975, 3))
    # between 1 and 2 the quantile lies between theirs: df 1.98 is near t(2) = 4.30, not t(1) = 12.71
    assert 4.303 < measures.t_quantile(0.975, 1.98) < 4.5
    stats = pytest.importorskip("scipy.stats")
    for df in (1.0, 1.5, 1.98, 2.0, 2.7, 4.0, 7.3, 30.0, 200.0):
        assert measures.t_quantile(0.975, df) == pytest.approx(stats.t.ppf(0.975, df), rel=1e-9)


def test_welch_uses_fractional_df_so_df_198_is_not_rounded_to_1():
    # two pairs of seeds with nearly equal spreads: Welch df just under 2
    xs, ys = [2.6851, 2.6649], [2.6679, 2.6481]
    w = measures.welch_interval(xs, ys)
    assert 1.9 < w["df"] < 2.0
    se = math.sqrt(statistics.variance(xs) / 2 + statistics.variance(ys) / 2)
    assert w["hi"] - w["diff"] == pytest.approx(measures.t_quantile(0.975, w["df"]) * se)
    assert (w["hi"] - w["diff"]) / se < 4.5  # t(0.975, 1) = 12.7 would give ~3x the width


def test_reading1_verdict_follows_the_rule_stated_before_running():
    assert measures.reading1_verdict(0.0, censored=False) == "contradicted"  # ≤ 0: the grid's +0.00
    assert measures.reading1_verdict(-0.0003, censored=False) == "contradicted"  # rounding of 3-digit rates
    assert measures.reading1_verdict(-0.15, censored=False) == "contradicted"
    assert measures.reading1_verdict(math.log10(1.13e-2 / 8e-3), censored=False) == "not resolved"  # +0.15
    assert measures.reading1_verdict(math.log10(2), censored=False) == "supported"  # one ×2 step
    assert measures.reading1_verdict(math.log10(4), censored=True) == "not resolved"
    assert measures.reading1_verdict(0.0, censored=True) == "not resolved"


def test_quadratic_vertex_recovers_a_known_vertex_and_censors_at_the_edge():
    # ℓ(u) = 2.6 + 0.3·(u − log10 1.5e-3)², exact on a ×2 grid: the vertex is 1.5e-3 (between grid rates)
    x0 = math.log10(1.5e-3)
    grid = [5e-4 * 2**i for i in range(7)]
    loss = {lr: 2.6 + 0.3 * (math.log10(lr) - x0) ** 2 for lr in grid}
    v = measures.quadratic_vertex(loss)
    assert v["x"] == pytest.approx(x0, abs=1e-9) and v["censored"] == 0
    assert v["rates"] == [lr for lr in grid if abs(math.log10(lr / 2e-3)) <= 0.61]  # two ×2 steps each side
    # the cliff far away does not enter the window
    loss[grid[-1]] = 3.3
    assert measures.quadratic_vertex(loss)["x"] == pytest.approx(x0, abs=1e-9)
    # monotone: the vertex lies below the grid, read as the lowest fitted rate, censored −1
    mono = {lr: 2.6 + 0.1 * math.log10(lr / 5e-4) for lr in grid}
    v = measures.quadratic_vertex(mono)
    assert v["censored"] == -1 and v["x"] == pytest.approx(math.log10(5e-4))


def test_best_rate_shift_bootstraps_over_seeds_and_recovers_a_known_shift():
    # per seed: ℓ = 2.6 + s_off + 0.3·(u − x(R))², x(2) = log10 2e-3, x(12) = log10 1e-3: Δ = −0.30 exactly, as
    # a seed's offset is common to all rates (the vertex of a mean of shifted parabolas is the same)
    grid = [5e-4 * 2**i for i in range(7)]
    offsets = {1: 0.03, 2: -0.01, 3: 0.0, 4: 0.05}

    def curve(x):
        return {lr: {s: 2.6 + o + 0.3 * (math.log10(lr) - x) ** 2 for s, o in offsets.items()} for lr in grid}

    out = measures.best_rate_shift(curve(math.log10(2e-3)), curve(math.log10(1e-3)), plateau=3.3, boots=200)
    assert out["delta"] == pytest.approx(-math.log10(2), abs=1e-9) and out["seeds"] == [1, 2, 3, 4]
    assert out["lo"] == pytest.approx(out["delta"], abs=1e-9) and out["hi"] == pytest.approx(out["delta"], abs=1e-9)
    # seed-dependent curvature noise: the interval is not degenerate and contains the estimate
    noisy = curve(math.log10(1e-3))
    for lr in grid:
        noisy[lr][2] += 0.05 * math.log10(lr / 1e-3)
    out = measures.best_rate_shift(curve(math.log10(2e-3)), noisy, plateau=3.3, boots=300)
    assert out["lo"] <= out["delta"] <= out["hi"] and out["lo"] < out["hi"]
    # a rate where a seed does not train is left out of the fit
    off = curve(math.log10(1e-3))
    off[grid[0]][1] = 3.29  # above plateau − 0.1 = 3.2
    out = measures.best_rate_shift(curve(math.log10(2e-3)), off, plateau=3.3, boots=50)
    assert grid[0] not in out["rates_hi"] and grid[0] in out["rates_lo"]
    assert out["delta"] == pytest.approx(-math.log10(2), abs=1e-9)  # the parabola is exact on the other rates


def test_a_subset_run_keeps_every_cell_in_the_manifest(tmp_path, monkeypatch):
    import yaml

    import loopnet.study.sweep as sweep_mod
    from tests.study.test_sweep_report import FakeFit

    monkeypatch.setattr(sweep_mod, "spawn", FakeFit)
    (tmp_path / "b.yaml").write_text("{}\n")
    spec = {
        "base": [str(tmp_path / "b.yaml")],
        "grid": {"model.config.residual": ["deepnorm", "preln"]},
        "out": str(tmp_path / "sw"),
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    monkeypatch.setattr("loopnet.study.sweep.check_cells", lambda sweep, cells: None)
    assert sweep_mod.run([str(tmp_path / "s.yaml"), "--only", "deep*", "--start", "fresh"], echo=lambda _: None) == 0
    manifest = json.loads((tmp_path / "sw" / MANIFEST).read_text())
    assert [c["id"] for c in manifest["cells"]] == ["deepnorm", "preln"]
    assert (tmp_path / "sw" / "deepnorm" / "summary.json").is_file() and not (tmp_path / "sw" / "preln").exists()


def test_exponent_table_counts_training_seeds_and_fits_p(tmp_path):
    from loopnet.diagnostics import write_summary

    sweep, cells = tmp_path / "sw", []
    outcome = {0.25: [5.0, 5.6, 5.6, 5.6], 0.35: [5.0, 5.0, 5.6, 5.6], 0.45: [5.0, 5.0, 5.0, 5.6], 0.55: [5.0] * 4}
    for p, losses in outcome.items():
        for seed, loss in enumerate(losses, start=1):
            summary = _summary("scaled", 6, 2e-3, loss)
            summary["config"]["p"] = p
            cid = f"p{p}-s{seed}"
            write_summary(sweep / cid / "summary.json", summary)
            cells.append({"id": cid, "params": {"model.config.p": p, "seed_everything": seed, "model.optim.lr": 2e-3}})
    (sweep / MANIFEST).write_text(json.dumps({"cells": cells, "out": str(sweep)}))
    report_mod.main([str(sweep), "--out", str(tmp_path / "rep"), "--plateau", str(PLATEAU)])
    md = (tmp_path / "rep" / "report.md").read_text()
    row = next(
        line for line in md.split("## Exponent sweep: training vs p", 1)[1].splitlines() if line.startswith("| 6 |")
    )
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:6] == ["6", "0.002", "1/4", "2/4", "3/4", "4/4"]
    fit = measures.logistic_fit(
        [p for p in outcome for _ in range(4)], [l < PLATEAU - 0.1 for ls in outcome.values() for l in ls]
    )
    assert cells[6] == f"{fit['b']:.1f} ± {fit['se_b']:.1f}" and cells[7] == f"{fit['x50']:.2f}"


def test_auto_plateau_is_computed_from_a_cells_config_in_its_own_ids(tmp_path):
    """`--plateau auto` (the default) reads the first cell's config.yaml: here the byte-level proxy's data."""
    import yaml

    from loopnet.study.report.runs import Run, sweep_plateau
    from loopnet.study.unigram import run_plateau

    config = {
        "data": {"source": "shakespeare", "vocab": "bytes", "batch_size": 4},
        "model": {"config": {"seq_len": 64}},
        "trainer": {"limit_val_batches": 2},
    }
    (tmp_path / "c1").mkdir()
    (tmp_path / "c1" / "config.yaml").write_text(yaml.safe_dump(config))
    value, how = sweep_plateau([Run("c1", {}, None)], tmp_path, tmp_path / "rep")
    assert value == run_plateau(config)[0] and "validation target tokens" in how
    assert 2.5 < value < math.log(257)  # nats per byte, not per GPT-2 token
    assert json.loads((tmp_path / "rep" / "plateau.json").read_text())["plateau"] == value  # cached


def test_a_curve_whose_cells_were_not_run_reads_not_run_not_none():
    from loopnet.study.report.map import Curve, summary_table

    pending = Curve("preln-carry", 12, {1e-3: [report_mod.Run("preln-r12", {}, None)]})
    assert not pending.ran
    row = summary_table([pending], PLATEAU).splitlines()[-1]
    assert "not run" in row and "none" not in row


def test_reading1_prints_contradicted_for_a_zero_difference_of_falls(tmp_path):
    """The grid's case: both schemes' largest trainable rates equal at the smallest and largest R, neither at
    the grid's top: +0.00 is ≤ 0, contradicted by the rule (the report once printed "not resolved")."""
    from loopnet.diagnostics import write_summary

    trained, stalled = [5.0, 5.0], [5.45, 5.45]
    losses = {
        ("deepnorm", 2): {1e-3: trained, 2e-3: trained, 4e-3: stalled},
        ("deepnorm", 6): {1e-3: trained, 2e-3: trained, 4e-3: stalled},
        ("deeploop", 2): {1e-3: trained, 2e-3: trained, 4e-3: stalled},
        ("deeploop", 6): {1e-3: trained, 2e-3: trained, 4e-3: stalled},
    }
    sweep, cells = tmp_path / "sw", []
    for (scheme, rounds), by_lr in losses.items():
        for lr, seeds in by_lr.items():
            for seed, loss in enumerate(seeds, start=1):
                cid = f"{scheme}-r{rounds}-lr{lr:g}-s{seed}"
                write_summary(sweep / cid / "summary.json", _summary(scheme, rounds, lr, loss))
                cells.append(
                    {
                        "id": cid,
                        "params": {
                            "model.config.residual": scheme,
                            "model.config.n_rounds": rounds,
                            "model.optim.lr": lr,
                            "seed_everything": seed,
                        },
                    }
                )
    (sweep / MANIFEST).write_text(json.dumps({"cells": cells, "out": str(sweep)}))
    report_mod.main([str(sweep), "--out", str(tmp_path / "rep"), "--plateau", str(PLATEAU)])
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "DeepNorm's fall minus DeepLoop's = +0.00 decades: **contradicted** by the rule" in md
    assert "not resolved" not in md.split("**Reading 1**", 1)[1].split("\n", 1)[0].split("by the rule", 1)[0]
