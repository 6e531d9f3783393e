"""The rival rule's readings (docs/results/rival/README.md, section 1): the verdict rule as stated, on ranges
worked out by hand; the whole command on synthetic rival maps whose answers are known by construction (exact
quadratic losses, so the vertex is exact; each group's trains-pattern a translate of one pattern, so its
50%-trains rate moves by exactly the translation); and DeepNorm's and DeepLoop's Δ on the committed map."""

import csv
import json
import math
from pathlib import Path

import pytest

from loopnet.study import measures
from experiments import sources
from experiments.rival import readings as rival

MAP = Path(__file__).resolve().parents[2] / "docs" / "results" / "map"
PLATEAU = 3.275707171288669  # the map's (docs/results/map/grid/plateau.json)
STEP = math.log10(2)  # one ×2 grid step in decades
HEADER = [
    "cell",
    "method",
    "scheme",
    "p",
    "R",
    "seed",
    "status",
    "final_val_loss",
    "best_val_loss",
    "final_train_loss",
    "diverged_at_step",
    "global_step",
    "wall_time_s",
    "kappa_model",
    "escaped",
]
SLUG = {"one": "one", "sqrt_depth": "sqrtdepth", "wang": "wang"}


# ---------------------------------------------------------------------------------------- the rule
def test_span_turns_censored_ends_into_bounds():
    assert rival.span(-3.0, 0, -3.5, 0) == (-0.5, -0.5)
    assert rival.span(-3.0, 0, -3.25, -1) == (-math.inf, -0.25)  # R = 12's vertex at its lowest edge: Δ ≤ −0.25
    assert rival.span(-3.0, 0, -3.25, 1) == (-0.25, math.inf)  # at its highest edge: Δ ≥ −0.25
    assert rival.span(-3.0, 1, -3.25, 1) == (-math.inf, math.inf)  # both ends censored upward: Δ unknown


def test_a_censored_shift_counts_only_where_its_bound_meets_the_threshold():
    # the README's own examples: Δ ≤ −0.25 meets "Δ ≤ −0.2", Δ ≥ −0.25 does not
    assert rival.meets((-math.inf, -0.25), "shifts")
    assert not rival.meets((-0.25, math.inf), "shifts")
    assert rival.meets((0.31, math.inf), "breaks") and rival.meets((-math.inf, -0.3), "breaks")
    assert not rival.meets((-math.inf, 0.1), "transfers")  # a bound never establishes a transfer
    assert rival.meets((0.15, 0.15), "transfers") and not rival.meets((0.16, 0.16), "transfers")
    assert rival.meets((0.149999, 0.149999), "transfers")  # read at the two decimals printed: 0.15
    assert not rival.meets(None, "shifts")


@pytest.mark.parametrize(
    "wang, sqrt_depth, word",
    [
        ((0.0, 0.0), (-0.5, -0.5), "supported"),
        ((-0.15, -0.15), (-0.2, -0.2), "supported"),  # both thresholds inclusive
        ((-0.5, -0.5), (-0.5, -0.5), "contradicted"),  # Wang's arm shifts
        ((0.3, 0.3), (-0.5, -0.5), "contradicted"),
        ((0.0, 0.0), (-0.1, -0.1), "contradicted"),  # the 1/√depth arm transfers too
        ((-0.2, -0.2), (-0.5, -0.5), "not resolved"),  # Wang's arm between 0.15 and 0.3
        ((0.0, 0.0), (-0.18, -0.18), "not resolved"),  # 1/√depth between −0.2 and −0.15
        ((0.0, 0.0), (-math.inf, -0.25), "supported"),  # a censored 1/√depth shift whose bound meets −0.2
        ((0.0, 0.0), (-0.25, math.inf), "not resolved"),  # one whose bound does not
        (None, (-0.5, -0.5), "not resolved"),  # Wang's Δ not computable
    ],
)
def test_measure_word(wang, sqrt_depth, word):
    assert rival.measure_word(wang, sqrt_depth)[0] == word


def test_both_measures_must_agree():
    assert rival.verdict({"Δ": "supported", "Δ50": "supported"}) == "supported"
    assert rival.verdict({"Δ": "contradicted", "Δ50": "contradicted"}) == "contradicted"
    assert rival.verdict({"Δ": "supported", "Δ50": "contradicted"}) == "not resolved"
    assert rival.verdict({"Δ": "supported", "Δ50": "not resolved"}) == "not resolved"


def test_weak_when_an_interval_reaches_the_opposite_zone():
    ok = ["wang transfers", "sqrt_depth shifts"]
    assert not rival.weak("supported", ok, (-0.1, 0.1), (-0.7, -0.3))
    assert rival.weak("supported", ok, (-0.1, 0.3), (-0.7, -0.3))  # Wang's interval reaches |Δ| ≥ 0.3
    assert rival.weak("supported", ok, (-0.1, 0.1), (-0.7, -0.15))  # 1/√depth's reaches |Δ| ≤ 0.15
    assert rival.weak("supported", ok, (None, 0.1), (-0.7, -0.3))  # an open end reaches everything
    assert not rival.weak("contradicted", ["wang breaks"], (-0.8, -0.4), (0, 0))
    assert rival.weak("contradicted", ["wang breaks"], (-0.8, -0.15), (0, 0))
    # two clauses: weak only if both are
    assert not rival.weak("contradicted", ["wang breaks", "sqrt_depth transfers"], (-0.8, -0.1), (-0.1, 0.1))
    assert rival.weak("contradicted", ["wang breaks", "sqrt_depth transfers"], (-0.8, -0.1), (-0.3, 0.1))


# ---------------------------------------------------------------------------------------- synthetic maps
def rate(i: float) -> float:
    return 1.25e-4 * 2**i


def group_cells(arm, rounds, center, k, indices, seeds=(1, 2, 3)):
    """One (arm, R) on grid indices: final loss 2.6 + 0.3·(log10 η − log10 η_c)² + 0.01·seed (an exact
    quadratic in log10 η, so its vertex is η_c exactly); every seed trains below index k, seeds 1 and 2 at k,
    seed 1 at k + 1, none above (each run that does not train diverged)."""
    rows = []
    for i in indices:
        for s in seeds:
            ok = i < k or (i == k and s <= 2) or (i == k + 1 and s == 1)
            loss = 2.6 + 0.3 * ((i - center) * STEP) ** 2 + 0.01 * s
            lr = f"{rate(i):g}"
            rows.append(
                [
                    f"preln-eps_{SLUG[arm]}-r{rounds}-lr{lr}-s{s}",
                    f"preln-carry-eps_{SLUG[arm]}-lr{lr}",
                    "preln",
                    "",
                    rounds,
                    s,
                    "completed" if ok else "diverged",
                    repr(loss) if ok else "",
                ]
            )
    return rows


def write_folder(folder: Path, rows) -> Path:
    folder.mkdir(parents=True)
    with open(folder / "cells.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEADER)
        for r in rows:
            w.writerow(r + [""] * (len(HEADER) - len(r)))
    (folder / "plateau.json").write_text(json.dumps({"plateau": PLATEAU}))
    return folder


TRANSFER = {r: (3.3, 6, range(0, 9)) for r in (2, 6, 12)}  # the same curve and boundary at every R
SHIFTED = {
    2: (3.3, 6, range(0, 9)),
    6: (2.5, 5, range(-1, 8)),
    12: (3.3 - 0.5 / STEP, 4, range(-2, 7)),
}  # R = 12: vertex 0.5 decades lower, boundary 2 steps lower


def rival_grid(tmp_path, wang):
    rows = []
    for arm, spec in (("one", TRANSFER), ("sqrt_depth", SHIFTED), ("wang", wang)):
        for r, (c, k, idx) in spec.items():
            rows += group_cells(arm, r, c, k, idx)
    return write_folder(tmp_path / "grid", rows)


DEEPLOOP_MAP = {4: 2.5756325721740723, 5: 2.5871334075927734}  # docs/results/map/confirm: DeepLoop, R = 12, 2e-3


def rival_confirm(tmp_path):
    deeploop = {**DEEPLOOP_MAP, 6: 2.60}
    wang = {s: deeploop[s] + d for s, d in zip((4, 5, 6), (-0.05, -0.06, -0.04))}
    sqrt_depth = {s: wang[s] - d for s, d in zip((4, 5, 6), (-0.01, -0.03, -0.02))}
    rows = [
        [f"preln-eps_{SLUG[a]}-r12-lr{lr}-s{s}", "", "preln", "", 12, s, "completed", repr(v)]
        for a, lr, losses in (("wang", "0.002", wang), ("sqrt_depth", "0.0005", sqrt_depth))
        for s, v in losses.items()
    ]
    rows.append(["deeploop-r12-lr0.002-s6", "", "deeploop", "", 12, 6, "completed", repr(deeploop[6])])
    return write_folder(tmp_path / "confirm", rows)


def run(tmp_path, wang, capsys):
    out = tmp_path / "docs" / "readings.md"
    rival.main(
        [
            "--grid",
            str(rival_grid(tmp_path, wang)),
            "--confirm",
            str(rival_confirm(tmp_path)),
            "--map",
            str(MAP),
            "--out",
            str(out),
            "--boots",
            "50",
        ]
    )
    assert out.is_file() and (tmp_path / "docs" / "readings_loss_vs_lr.png").stat().st_size > 0
    return out.read_text(), capsys.readouterr().out


def shifts(tmp_path):
    cells = sources.merge(sources.read(tmp_path / "grid"))
    return rival.reading(cells, PLATEAU, boots=50)


# Δ50 of identical groups and of translates: Firth's fit moves x50 by exactly the translation (the shear
# (a, b) -> (a − b·δ, b) has unit determinant, so det I and the likelihood are unchanged); what remains is the
# fit's convergence (modified score < 1e-7 on O(100) runs).
TOL50 = 1e-4


def test_wang_transfers_and_sqrt_depth_shifts_is_supported(tmp_path, capsys):
    md, printed = run(tmp_path, TRANSFER, capsys)
    res = shifts(tmp_path)
    assert res["shifts"]["wang"]["delta"] == pytest.approx(0.0, abs=1e-9)
    assert res["shifts"]["sqrt_depth"]["delta"] == pytest.approx(-0.5, abs=1e-9)
    assert (res["shifts"]["sqrt_depth"]["lo"], res["shifts"]["sqrt_depth"]["hi"]) == pytest.approx(
        (-0.5, -0.5), abs=1e-9
    )
    assert res["logit"]["wang"]["delta"] == pytest.approx(0.0, abs=TOL50)
    assert res["logit"]["sqrt_depth"]["delta"] == pytest.approx(-2 * STEP, abs=TOL50)
    assert res["words"] == {"Δ": "supported", "Δ50": "supported"} and res["verdict"] == "supported"
    # weak: with 3 seeds a rate, Wang's Δ50 profile interval is about ±0.35 decades, past |Δ| = 0.3
    lo, hi = res["logit"]["wang"]["ci"]
    assert lo < -rival.BREAKS and hi > rival.BREAKS and res["weak"]
    assert "Verdict: supported (weak) (Δ: supported; Δ50: supported)" in printed
    assert "**Verdict: supported (weak) (Δ: supported; Δ50: supported)**" in md
    # the secondary reading, by hand: Wang − DeepLoop −0.05 ± 4.303·0.01/√3; Wang − 1/√depth −0.02 ± the same
    half = measures.t_quantile(0.975, 2) * 0.01 / math.sqrt(3)
    assert f"| −0.0500 | [{-0.05 - half:+.4f}, {-0.05 + half:+.4f}] | ahead |".replace("−", "-") in md
    assert f"| −0.0200 | [{-0.02 - half:+.4f}, {-0.02 + half:+.4f}] | not distinguished |".replace("−", "-") in md


def test_wang_shifting_is_contradicted(tmp_path, capsys):
    md, printed = run(tmp_path, SHIFTED, capsys)
    res = shifts(tmp_path)
    assert res["shifts"]["wang"]["delta"] == pytest.approx(-0.5, abs=1e-9)
    assert res["logit"]["wang"]["delta"] == pytest.approx(-2 * STEP, abs=TOL50)
    assert res["verdict"] == "contradicted" and not res["weak"]
    assert "Verdict: contradicted (Δ: contradicted; Δ50: contradicted)" in printed


def test_borderline_is_not_resolved(tmp_path, capsys):
    # Wang's vertex falls 0.22 decades (between 0.15 and 0.3), its boundary does not move
    border = {**TRANSFER, 12: (3.3 - 0.22 / STEP, 6, range(0, 9))}
    md, printed = run(tmp_path, border, capsys)
    res = shifts(tmp_path)
    assert res["shifts"]["wang"]["delta"] == pytest.approx(-0.22, abs=1e-9)
    assert res["logit"]["wang"]["delta"] == pytest.approx(0.0, abs=TOL50)
    assert res["words"] == {"Δ": "not resolved", "Δ50": "supported"}
    assert "Verdict: not resolved (Δ: not resolved; Δ50: supported)" in printed


def test_bad_input_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit):
        rival.main(["--grid", str(tmp_path), "--map", str(MAP), "--out", str(tmp_path / "x.md")])
    assert "fix:" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------- the map
def test_map_deltas_equal_best_rate_shift_on_the_committed_cells():
    """DeepNorm's and DeepLoop's Δ through the reading's path equal `best_rate_shift` on the cells read straight
    from cells.csv, and match the README's figures, computed before this code: −0.12 [−0.24, −0.05] and +0.02
    [−0.01, +0.02]."""
    grid = sources.merge(sources.read(MAP / "grid"))
    rows = list(csv.DictReader((MAP / "grid" / "cells.csv").open()))
    want = {"deepnorm": (-0.12, -0.24, -0.05), "deeploop": (0.02, -0.01, 0.02)}
    for scheme, (delta, lo, hi) in want.items():
        direct = {}
        for r in (2, 12):
            curve = {}
            for row in rows:
                if row["scheme"] == scheme and int(row["R"]) == r:
                    lr = float(row["cell"].split("-lr")[1].split("-s")[0])
                    curve.setdefault(lr, {})[int(row["seed"])] = (
                        float(row["final_val_loss"]) if row["status"] == "completed" else None
                    )
            direct[r] = curve
        ref = measures.best_rate_shift(direct[2], direct[12], PLATEAU, boots=2000, seed=0)
        got = rival.vertex_shift(grid, scheme, PLATEAU, boots=2000)
        for key in ("delta", "lo", "hi", "x_lo", "x_hi", "censored_lo", "censored_hi", "seeds"):
            assert got[key] == ref[key], key
        assert (round(got["delta"], 2), round(got["lo"], 2), round(got["hi"], 2)) == pytest.approx(
            (delta, lo, hi), abs=1e-9
        )


def test_a_sweep_run_folder_reads_as_its_cells_csv(tmp_path):
    """The same cells as a sweep's run folder (manifest + summaries, `runs.load_runs`) and as cells.csv
    (`sources.read_cells`) give the same cells, arms and losses."""
    from tests.study.test_rival_sweeps import _write_sweep

    csv_cells = sources.merge(sources.read(rival_grid(tmp_path, SHIFTED)))
    runs = []
    for (arm, r, lr, seed), c in csv_cells.items():
        params = {
            "model.config.residual": "preln",
            "model.config.branch_scale": arm,
            "model.config.n_rounds": r,
            "model.optim.lr": lr,
            "seed_everything": seed,
        }
        runs.append((params, {"residual": "preln", "branch_scale": arm, "n_rounds": r}, c["loss"]))
    _write_sweep(tmp_path / "run_folder", runs)
    run_cells = sources.merge(sources.read(tmp_path / "run_folder"))
    assert set(run_cells) == set(csv_cells)
    for key, c in csv_cells.items():
        assert (run_cells[key]["status"], run_cells[key]["loss"], run_cells[key]["arm"]) == (
            c["status"],
            c["loss"],
            key[0],
        )
    assert rival.reading(run_cells, PLATEAU, boots=20)["words"] == rival.reading(csv_cells, PLATEAU, boots=20)["words"]


def test_an_unfinished_grid_reads_not_resolved_without_failing(tmp_path, capsys):
    """Only R = 12 finished, and at R = 2 one arm with no rate where every seed trains: no Δ, so no condition is met."""
    rows = group_cells("wang", 12, 3.3, 6, range(0, 9)) + group_cells("sqrt_depth", 12, 3.3, 6, range(0, 9))
    rows += group_cells("one", 2, 3.3, 0, range(0, 9))  # k = 0: seeds 1 and 2 at the lowest rate, none above
    cells = sources.merge(sources.read(write_folder(tmp_path / "grid", rows)))
    res = rival.reading(cells, PLATEAU, boots=20)
    assert all(res["shifts"][a] is None for a in rival.ARMS)
    assert res["verdict"] == "not resolved"


# ------------------------------------------------------------------------ per seed (what each interval is)
def test_seed_shifts_are_each_seeds_own_vertex_shift(tmp_path):
    """In the synthetic maps every seed's loss is the same exact quadratic plus 0.01·seed, so every seed's own
    vertex is the curve's: Δ_s = −0.5 for each seed of the shifted arm, 0 for the transferring one."""
    cells = sources.merge(sources.read(rival_grid(tmp_path, TRANSFER)))
    assert rival.seed_shifts(cells, "sqrt_depth", PLATEAU) == pytest.approx({1: -0.5, 2: -0.5, 3: -0.5}, abs=1e-9)
    assert rival.seed_shifts(cells, "wang", PLATEAU) == pytest.approx({1: 0.0, 2: 0.0, 3: 0.0}, abs=1e-9)
    rows = {r["pair"]: r for r in rival.pairwise({a: rival.seed_shifts(cells, a, PLATEAU) for a in rival.ARMS})}
    assert rows[("wang", "sqrt_depth")]["diffs"] == pytest.approx([0.5] * 3, abs=1e-9)
    assert rows[("wang", "sqrt_depth")]["positive"] == 3


def test_a_bootstrap_over_n_seeds_has_few_resamples():
    assert [rival.resamples(n) for n in (2, 3, 8)] == [3, 10, 6435]


GRID = MAP.parent / "rival" / "grid"


def test_the_committed_grid_backs_only_part_of_the_ordering():
    """From the committed cells: each seed's own Δ, and the pairs of arms per seed. ε = 1 → Wang is positive on
    every seed with a t interval above 0; 1/√depth → Wang is +0.19, +0.03, −0.00 (2 of 3 seeds, t interval
    across 0); ε = 1 → 1/√depth is positive on 3 of 3 seeds with a t interval that reaches below 0."""
    grid = sources.merge(sources.read(GRID))
    per = {a: rival.seed_shifts(grid, a, PLATEAU) for a in rival.ARMS}
    assert [round(v, 3) for v in per["sqrt_depth"].values()] == [-0.242, -0.063, -0.171]
    assert [round(v, 3) for v in per["wang"].values()] == [-0.055, -0.031, -0.172]
    rows = {r["pair"]: r for r in rival.pairwise(per)}
    w_s, s_o, w_o = rows[("wang", "sqrt_depth")], rows[("sqrt_depth", "one")], rows[("wang", "one")]
    assert [round(d, 2) for d in w_s["diffs"]] == [0.19, 0.03, -0.0] and w_s["positive"] == 2
    assert w_s["t"]["lo"] < 0 < w_s["t"]["hi"]
    assert s_o["positive"] == 3 and s_o["t"]["lo"] < 0 < s_o["t"]["hi"]
    assert w_o["positive"] == 3 and w_o["t"]["lo"] > 0


def test_the_post_hoc_best_loss_rests_on_a_near_tie():
    """Wang − 1/√depth at R = 12 on the grid's seeds: 3 of 3 seeds negative at each arm's lowest grid mean, where
    the 1/√depth arm's two lowest means (5e-4, 1e-3) differ by 0.00013 nat; 2 of 3 at the confirmation's rate."""
    grid = sources.merge(sources.read(GRID))
    rows = {r["how"]: r for r in rival.best_loss_check(grid, {"wang": 1e-3, "sqrt_depth": 1e-3}, PLATEAU)}
    low, conf = rows["lowest grid mean"], rows["the confirmation's rate"]
    assert low["rates"] == (1e-3, 5e-4) and low["negative"] == 3
    assert conf["rates"] == (1e-3, 1e-3) and conf["negative"] == 2
    assert round(low["margin"], 5) == 0.00013
    assert round(low["t"]["mean"], 3) == -0.021 and round(conf["t"]["mean"], 3) == -0.021


def test_two_seed_map_deltas_per_seed():
    """DeepLoop on the map's 2 seeds: Δ_s +0.0175 and −0.0062, while the two-seed curve's vertex gives +0.024,
    outside both; its bootstrap interval [−0.006, +0.024] has the estimate as its upper end (3 possible draws)."""
    grid = sources.merge(sources.read(MAP / "grid"))
    per = rival.seed_shifts(grid, "deeploop", PLATEAU)
    assert list(per.values()) == pytest.approx([0.0175, -0.0062], abs=1e-4)
    out = rival.vertex_shift(grid, "deeploop", PLATEAU, boots=2000)
    assert round(out["delta"], 3) == 0.024 and round(out["hi"], 3) == 0.024 and round(out["lo"], 3) == -0.006


def test_the_committed_readings_are_what_the_code_computes_from_the_committed_cells(tmp_path):
    """docs/results/rival/readings.md, recomputed from the committed reports with `make rival`'s last step (2,000
    bootstrap draws, seeded): the same text, figure for figure."""
    results = MAP.parent
    out = tmp_path / "readings.md"
    rival.main(
        [
            "--grid",
            f"{results}/rival/grid",
            "--confirm",
            f"{results}/rival/confirm",
            "--map",
            str(MAP),
            "--out",
            str(out),
        ]
    )
    committed = (results / "rival" / "readings.md").read_text()
    assert (
        out.read_text()
        .replace(f"{results}/", "docs/results/")
        .replace(str(MAP), "docs/results/map")
        .replace(str(out), "docs/results/rival/readings.md")
        == committed
    )
