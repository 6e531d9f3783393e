"""The depth exponent's readings (docs/results/gamma/PREREGISTRATION.md) on synthetic cells whose answers are known by
construction: exact quadratic losses in log10 η (so each seed's vertex is exact and Δ_s is what was put in), the
t intervals recomputed here from the textbook formula with a table quantile, Fieller's interval checked against its
defining equation, each group's trains-pattern a translate of one pattern (so its 50%-trains rate moves by exactly
the translation), and the 1,000-step check's sweep file expanded by the sweep's own reader."""

import csv
import json
import math
import statistics
from pathlib import Path

import pytest

from loopnet.study import grid
from experiments.gamma import readings as gamma

PLATEAU = 3.275707171288669  # the map's
T7 = 2.364624251592785  # Student's t, 0.975 quantile, 7 degrees of freedom (tables)
SEEDS = range(1, 9)
X2 = math.log10(1.3e-3)  # every arm's vertex at R = 2 before the per-seed offsets
# per-seed offsets (decades), fixed so the intervals are known; mean 0, sd ≈ 0.025
JITTER = [0.03, -0.02, 0.01, -0.04, 0.025, 0.0, -0.015, 0.01]
LADDER = [2.5e-4 * 2 ** (k / 2) for k in range(11)]  # exact ×√2 steps (the sweeps round to 3 digits)


def quad_cells(shift: dict[str, list[float]], rounds=(2, 24), rates=LADDER) -> dict:
    """Cells of `gamma.read`'s form with loss = 2.6 + 0.2·(log10 η − x)² (every run trains on the ladder),
    x = X2 + jitter at R = 2 and that plus the arm's per-seed shift at the other R."""
    cells = {}
    for arm, deltas in shift.items():
        for s, d in zip(SEEDS, deltas):
            for r in rounds:
                x = X2 + JITTER[s - 1] + (d if r != 2 else 0.0)
                for lr in rates:
                    cells[(arm, r, lr, s)] = {
                        "cell": f"{arm}-r{r}-lr{lr:g}-s{s}",
                        "scheme": arm,
                        "R": r,
                        "lr": lr,
                        "seed": s,
                        "status": "completed",
                        "loss": 2.6 + 0.2 * (math.log10(lr) - x) ** 2,
                    }
    return cells


def t_interval(values):
    m, se = statistics.fmean(values), statistics.stdev(values) / math.sqrt(len(values))
    return m, m - T7 * se, m + T7 * se


WANG = [0.02 + j for j in JITTER]  # Δ_s around +0.02: transfers
SQRT = [-0.30 + 0.5 * j for j in JITTER]  # around −0.30: falls


def test_each_seed_vertex_and_shift_are_exact():
    res = gamma.seed_shifts(quad_cells({"wang": WANG}), "wang", PLATEAU)
    assert sorted(res) == list(SEEDS)
    for s, v in res.items():
        assert v["delta"] == pytest.approx(WANG[s - 1], abs=1e-9) and v["side"] is None


def test_arm_means_estimands_and_t_intervals_are_the_textbook_ones():
    res = gamma.reading(quad_cells({"wang": WANG, "sqrt_depth": SQRT}), PLATEAU)
    for key, values in (("wang", WANG), ("sqrt_depth", SQRT), ("D_W", [w - q for w, q in zip(WANG, SQRT)])):
        est = res["rows"][key]["est"]
        m, lo, hi = t_interval(values)
        assert (est["mean"], est["lo"], est["hi"]) == pytest.approx((m, lo, hi), abs=1e-6)
        assert est["n"] == 8 and est["censored"] == 0
    assert res["rows"]["wang"]["word"][0] == "transfers"
    assert res["rows"]["sqrt_depth"]["word"][0] == "falls"
    assert res["rows"]["D_W"]["word"][0] == "greater than 0"
    assert res["verdict"] == "γ = 1 (Wang) supported"


@pytest.mark.parametrize(
    "wang, sqrt_depth, verdict",
    [
        ([0.3 + j for j in JITTER], SQRT, "γ between ½ and 1"),
        ([-0.5 + j for j in JITTER], [-0.9 + j for j in JITTER], "γ above 1"),
        ([0.5 + j for j in JITTER], [0.3 + j for j in JITTER], "γ below ½"),
        ([0.0 + j for j in JITTER], [0.0 + j for j in JITTER], "γ not identified within ½ … 1 (both transfer)"),
        ([0.4 + j for j in JITTER], [0.0 + j for j in JITTER], "γ = ½ supported"),  # Wang's best rate rises
        ([-0.1 + 4 * j for j in JITTER], SQRT, "not resolved"),  # Wang's interval too wide to transfer or fall
    ],
)
def test_verdict_rules_in_order(wang, sqrt_depth, verdict):
    assert gamma.reading(quad_cells({"wang": wang, "sqrt_depth": sqrt_depth}), PLATEAU)["verdict"] == verdict


def test_a_censored_seed_vertex_leaves_the_verdict_unresolved():
    # seed 1's vertex at R = 24 lies 0.5 decades below the ladder: its Δ_s is only a bound (≤), open downward
    sqrt = list(SQRT)
    sqrt[0] = math.log10(LADDER[0]) - 0.5 - X2 - JITTER[0]
    res = gamma.reading(quad_cells({"wang": WANG, "sqrt_depth": sqrt}), PLATEAU)
    assert res["shifts"]["sqrt_depth"][1]["side"] == -1
    assert res["rows"]["sqrt_depth"]["word"] == ("not resolved (censored)", 1)
    assert res["verdict"] == "not resolved (censored)"
    # D_W = Δ_Wang − Δ_1/√depth: the subtracted arm's downward bound opens D_W upward
    assert gamma.combine(res["shifts"], {"wang": 1, "sqrt_depth": -1})[1]["side"] == 1


def test_gamma_star_and_fieller_interval():
    wang = [0.3 + j for j in JITTER]
    sqrt = [-0.3 + 0.5 * j for j in JITTER]
    shifts = gamma.reading(quad_cells({"wang": wang, "sqrt_depth": sqrt}), PLATEAU)["shifts"]
    gs = gamma.gamma_star(shifts)
    a = [-x for x in sqrt]
    b = [w - x for w, x in zip(wang, sqrt)]
    assert gs["gamma"] == pytest.approx(0.5 + 0.5 * statistics.fmean(a) / statistics.fmean(b), abs=1e-9)
    assert gs["gamma"] == pytest.approx(0.75, abs=0.01)  # built symmetric about γ = ¾
    n, ma, mb = 8, statistics.fmean(a), statistics.fmean(b)
    vaa, vbb = statistics.variance(a) / n, statistics.variance(b) / n
    vab = sum((x - ma) * (y - mb) for x, y in zip(a, b)) / (n - 1) / n
    for g in (gs["lo"], gs["hi"]):  # each end solves Fieller's equation
        th = 2 * (g - 0.5)
        assert (ma - th * mb) ** 2 == pytest.approx(T7**2 * (vaa - 2 * th * vab + th * th * vbb), rel=1e-6)
    assert gs["lo"] < gs["gamma"] < gs["hi"]
    # a denominator not distinguished from 0: Fieller's set is unbounded
    assert gamma.fieller([0.1, 0.2, 0.15], [0.1, -0.1, 0.02])["lo"] is None


def test_linearity_check_is_zero_when_the_three_quarter_arm_lies_on_the_line():
    wang, sqrt = [0.3 + j for j in JITTER], [-0.3 + j for j in JITTER]
    mid = [(w + q) / 2 for w, q in zip(wang, sqrt)]
    res = gamma.reading(quad_cells({"wang": wang, "sqrt_depth": sqrt, "threequarter": mid}), PLATEAU)
    est = res["rows"]["linearity"]["est"]
    assert est["mean"] == pytest.approx(0.0, abs=1e-9) and est["hi"] - est["lo"] == pytest.approx(0.0, abs=1e-9)


def pattern_cells(offsets: dict[tuple[str, int], int]) -> dict:
    """Three seeds per rate; one trains-pattern (3, 3, 3, 2, 1, 1, 0, 0 seeds of 3 train) starting `offset` steps up
    the ×√2 ladder: the groups' 50% rates differ by exactly their offsets' steps."""
    counts = [3, 3, 3, 2, 1, 1, 0, 0]
    cells = {}
    for (arm, r), off in offsets.items():
        for i, k in enumerate(counts):
            lr = 2.5e-4 * 2 ** ((off + i) / 2)
            for s in (1, 2, 3):
                loss = 2.6 if s <= k else 3.3
                cells[(arm, r, lr, s)] = {
                    "cell": "x",
                    "scheme": arm,
                    "R": r,
                    "lr": lr,
                    "seed": s,
                    "status": "completed",
                    "loss": loss,
                }
    return cells


def test_delta50_moves_by_exactly_the_translation():
    half = math.log10(2) / 2
    offsets = {
        ("sqrt_depth", 2): 6,
        ("sqrt_depth", 24): 3,
        ("wang", 2): 6,
        ("wang", 24): 5,
        ("deeploop", 2): 7,
        ("deeploop", 24): 7,
    }
    out = gamma.logistic(pattern_cells(offsets), PLATEAU)
    assert out[f"Δ50 {gamma.ARM_NAMES['sqrt_depth']}"][0] == pytest.approx(-3 * half, abs=1e-6)
    assert out[f"Δ50 {gamma.ARM_NAMES['wang']}"][0] == pytest.approx(-1 * half, abs=1e-6)
    assert out["D50_W"][0] == pytest.approx(2 * half, abs=1e-6)
    assert out["D50_L"][0] == pytest.approx(1 * half, abs=1e-6)
    lo, hi = out["D50_W"][1:]
    assert lo < 2 * half < hi


def test_long_check_rates_follow_the_rule_and_expand_to_120_cells():
    cells = quad_cells({a: [0.0] * 8 for a in gamma.ARMS}, rounds=(2, 12), rates=gamma.LADDER)
    rates = gamma.long_rates(cells, PLATEAU)
    # every seed-mean vertex is at 1.3e-3·10^mean(jitter) ≈ 1.33e-3: nearest ladder rate 1.41e-3 (index 5)
    assert all(lrs == list(gamma.LADDER[3:8]) for lrs in rates.values()) and len(rates) == 8
    # a vertex at the ladder's bottom is clipped: the five lowest rates
    low = {k: v for k, v in quad_cells({"wang": [0.0] * 8}, rounds=(2,), rates=gamma.LADDER).items()}
    for k in list(low):
        low[k] = dict(low[k], loss=2.6 + 0.2 * (math.log10(k[2]) - math.log10(2.5e-4)) ** 2)
    assert gamma.long_rates(low, PLATEAU)[("wang", 2)] == list(gamma.LADDER[:5])
    spec = __import__("yaml").safe_load(gamma.long_sweep(rates, PLATEAU))
    cells_run = grid.expand(grid.sweep_from_dict(spec))
    assert len(cells_run) == 4 * 2 * 5 * 3 and len({c.id for c in cells_run}) == 120
    three = [c for c in cells_run if "branch_lambda" in c.id]
    assert {round(c.params["model.config.branch_lambda"] ** 4, 3) for c in three} == {2.0, 12.0}
    assert all("--trainer.max_steps" in c.command and "1000" in c.command for c in cells_run)


def test_reproducibility_counts_bitwise_equal_cells():
    a = {
        ("wang", 2, 1e-3, 1): {"loss": 2.7},
        ("wang", 2, 1e-3, 2): {"loss": 2.71},
        ("wang", 24, 1e-3, 1): {"loss": 2.8},
    }
    b = {("wang", 2, 1e-3, 1): {"loss": 2.7}, ("wang", 2, 1e-3, 2): {"loss": 2.7105}}
    out = gamma.reproducibility(a, b)
    assert out["shared"] == 2 and out["equal"] == 1 and out["max_diff"] == pytest.approx(0.0005, abs=1e-12)
    assert list(out["by_rate"]) == [1e-3]
    n, equal, largest = out["by_rate"][1e-3]
    assert (n, equal) == (2, 1) and largest == pytest.approx(0.0005, abs=1e-12)


def test_a_fifty_percent_rate_the_runs_do_not_bracket_is_not_measured():
    """Δ50 of a group whose runs all train (or all fail) is the Firth penalty's, not the data's: named, not read."""
    cov = {
        ("wang", 2): {"runs": 88, "fails": 0},
        ("wang", 24): {"runs": 88, "fails": 3},
        ("sqrt_depth", 2): {"runs": 24, "fails": 24},
        ("sqrt_depth", 24): {"runs": 88, "fails": 7},
    }
    assert gamma.one_sided(cov, {("wang", 24): 1, ("wang", 2): -1}) == ["Wang (γ = 1), R = 2: every run trains"]
    assert gamma.one_sided(cov, {("sqrt_depth", 24): 1, ("sqrt_depth", 2): -1}) == [
        "1/√depth (γ = ½), R = 2: no run trains"
    ]
    assert gamma.one_sided(cov, {("wang", 24): 1, ("sqrt_depth", 24): -1}) == []


def test_an_arm_whose_ladder_is_not_whole_is_counted_not_read(tmp_path):
    """A sweep read before it has finished: the γ = ¾ arm has 5 of the 11 ladder rates at R = 24 and one run there
    does not train, and Wang's seed 2 lacks its top rate at R = 24. The runs-read table counts them; neither arm is
    read (no row, no estimand, no verdict), and the line that says so gives each gap; the whole 1/√depth arm is read."""
    cells = quad_cells({"wang": WANG, "sqrt_depth": SQRT})
    del cells[("wang", 24, LADDER[-1], 2)]
    cells.update(quad_cells({"threequarter": [-0.1 + j for j in JITTER]}, rounds=(2,)))
    cells.update(quad_cells({"threequarter": [-0.1 + j for j in JITTER]}, rounds=(24,), rates=LADDER[:5]))
    cells[("threequarter", 24, LADDER[0], 3)]["loss"] = PLATEAU  # at the plateau: does not train
    cov = gamma.coverage(cells, PLATEAU)
    assert cov[("threequarter", 24)]["runs"] == 40 and cov[("threequarter", 24)]["fails"] == 1
    assert gamma.ladder_count(cov, "threequarter", 24) == 5 and gamma.ladder_count(cov, "wang", 24) == 10
    assert gamma.ladder_count(cov, "wang", 2) == 11 and gamma.ladder_count(cov, "deeploop", 24) == 0
    assert gamma.unread(cov) == {"threequarter": "R = 24: 40 of 88 ladder runs", "wang": "R = 24: 87 of 88 ladder runs"}
    write_report(tmp_path / "part", cells)
    out = tmp_path / "readings.md"
    gamma.main(["readings", "--cells", str(tmp_path / "part"), "--out", str(out)])
    lines = out.read_text().splitlines()
    assert "**Verdict (R = 2 → 24): not read (a core arm's ladder is not whole)**" in lines
    assert "γ = ¾ (R = 24: 40 of 88 ladder runs); Wang (γ = 1) (R = 24: 87 of 88 ladder runs)." in lines[6]
    rows = [line.split(" | ")[0] for line in lines if line.startswith("| ") and " | [" in line]
    assert rows == ["| 1/√depth (γ = ½)"]
    assert "| γ = ¾ | 24 | 40 | 1-8 | 5 | 0 | 1 |" in lines
    assert "| Wang (γ = 1) | 24 | 87 | 1-8 | 10–11 | 0 | 0 |" in lines


def test_a_deeploop_ladder_not_yet_whole_leaves_the_pre_ln_readings_as_they_were(tmp_path):
    """DeepLoop whole at R = 2 and part-run at R = 24: the other arms' readings, the verdict and the Δ50 fit are those
    without DeepLoop, to the last digit; D_L is not printed until DeepLoop's ladder is whole."""
    base = quad_cells({"wang": WANG, "sqrt_depth": SQRT})
    base[("sqrt_depth", 24, LADDER[-1], 1)]["loss"] = PLATEAU  # one failing run, so Δ50 has a fit
    deep = quad_cells({"deeploop": [0.05 + j for j in JITTER]})
    part = {k: c for k, c in deep.items() if k[1] == 2 or k[3] <= 3}
    texts = []
    for name, cells in (("without", base), ("part", {**base, **part})):
        write_report(tmp_path / name, cells)
        gamma.main(["readings", "--cells", str(tmp_path / name), "--out", str(tmp_path / f"{name}.md")])
        texts.append((tmp_path / f"{name}.md").read_text().replace(name, "X"))
    without, partial = texts
    assert "DeepLoop (R = 24: 33 of 88 ladder runs)" in partial and "D_L" not in partial
    kept = [line for line in partial.splitlines() if not line.startswith(("Not read", "| DeepLoop |"))]
    assert [line for line in kept if line] == [line for line in without.splitlines() if line]
    write_report(tmp_path / "whole", {**base, **deep})
    gamma.main(["readings", "--cells", str(tmp_path / "whole"), "--out", str(tmp_path / "whole.md")])
    assert "| D_L = Δ_DeepLoop − Δ_Wang |" in (tmp_path / "whole.md").read_text()


def test_an_arm_whose_tail_is_not_whole_enters_no_vertex_and_no_delta50_fit(tmp_path, capsys):
    """The tail read before it has finished: Wang's tail is whole, 1/√depth's lacks one run (89 of 90). 1/√depth's
    tail runs enter nothing: every line of the readings is that without them, to the last digit, but the line that
    names the gap and the runs-read rows that count them. Whole, they enter (the Δ50 fit changes)."""
    base = quad_cells({"wang": WANG, "sqrt_depth": SQRT}, rounds=(2, 12, 24))
    base[("sqrt_depth", 24, LADDER[-1], 1)]["loss"] = PLATEAU  # one failing ladder run, so Δ50 has a fit
    tail = {
        (a, r, lr, s): {"cell": "x", "scheme": a, "R": r, "lr": lr, "seed": s, "status": "completed", "loss": 3.5}
        for a in ("wang", "sqrt_depth")
        for r in (2, 12, 24)
        for lr in gamma.TAIL
        for s in gamma.TAIL_SEEDS
    }
    wang_tail = {k: c for k, c in tail.items() if k[0] == "wang"}
    part = {k: c for k, c in tail.items() if k != ("sqrt_depth", 24, gamma.TAIL[-1], 1)}
    assert gamma.tail_unread(gamma.coverage({**base, **part}, PLATEAU)) == {"sqrt_depth": "89 of 90 tail runs"}
    assert gamma.tail_unread(gamma.coverage({**base, **tail}, PLATEAU)) == {}
    texts = {}
    for name, cells in (("without", {**base, **wang_tail}), ("part", {**base, **part}), ("whole", {**base, **tail})):
        write_report(tmp_path / name, cells)
        gamma.main(["readings", "--cells", str(tmp_path / name), "--out", str(tmp_path / f"{name}.md")])
        texts[name] = (tmp_path / f"{name}.md").read_text().replace(name, "X").splitlines()
    assert "the tail not read, not whole: 1/√depth (γ = ½) (89 of 90 tail runs)" in capsys.readouterr().out
    gap = "R = 2, 12 and 24; until then its tail runs enter no vertex and no Δ50 fit): 1/√depth (γ = ½) (89 of 90 tail"
    assert sum(gap in line for line in texts["part"]) == 1
    counted = (
        "The tail not read",
        "| 1/√depth (γ = ½) | 2 |",
        "| 1/√depth (γ = ½) | 12 |",
        "| 1/√depth (γ = ½) | 24 |",
    )
    kept = [line for line in texts["part"] if line and not line.startswith(counted)]
    assert kept == [line for line in texts["without"] if line and not line.startswith(counted)]
    assert "| 1/√depth (γ = ½) | 24 | 117 | 1-8 | 11 | 10 | 30 |" in texts["part"]  # counted: 88 + 29 runs
    d50 = lambda lines: [line for line in lines if line.startswith("| Δ50 1/√depth")]
    assert d50(texts["whole"]) != d50(texts["without"]) and not any(gap in line for line in texts["whole"])


def test_the_long_check_waits_for_whole_ladders(tmp_path, capsys):
    """The 1,000-step rates come from whole ladders: a part-run arm is refused, with the fix."""
    cells = quad_cells({"wang": WANG, "sqrt_depth": SQRT})
    del cells[("wang", 24, LADDER[-1], 2)]
    write_report(tmp_path / "part", cells)
    with pytest.raises(SystemExit) as err:
        gamma.main(["long-sweep", "--cells", str(tmp_path / "part"), "--out", str(tmp_path / "long.yaml")])
    assert not (tmp_path / "long.yaml").exists() and err.value.code != 0
    assert "not whole: Wang (γ = 1) (R = 24: 87 of 88 ladder runs); fix: finish the ladder" in capsys.readouterr().err


T2 = 4.302652729911275  # Student's t, 0.975 quantile, 2 degrees of freedom (tables)


def test_the_long_check_reads_each_change_exactly_and_only_whole_arms(tmp_path, capsys):
    """The 1,000-step check on cells whose answers are known: at 1,000 steps each seed's Δ₁₂ is its 200-step Δ₁₂ plus
    a known change (Wang: C; 1/√depth: C, and seed 3's vertex pushed past its five rates, so censored), on exactly
    the cells the rule's sweep file names. The change's mean and t interval on 2 degrees of freedom are the
    textbook ones; an arm missing one check run is counted, not read; a 200-step folder passed as --long is refused."""
    C = [0.05, 0.07, 0.06]
    short = quad_cells({"wang": WANG, "sqrt_depth": SQRT}, rounds=(2, 12), rates=gamma.LADDER)
    design = gamma.long_design(short, PLATEAU)
    assert {a: len(v) for a, v in design.items()} == {"sqrt_depth": 30, "wang": 30}
    shifted = {
        "wang": [WANG[i] + C[i] for i in range(3)],
        "sqrt_depth": [SQRT[i] + C[i] for i in range(2)] + [SQRT[2] + 0.5],
    }
    every = quad_cells(shifted, rounds=(2, 12), rates=gamma.LADDER)
    long = {k: c for k, c in every.items() if (k[1], k[2], k[3]) in design[k[0]]}
    assert len(long) == 60
    res = gamma.long_check(short, long, PLATEAU)
    assert res["held"] == {} and list(res["rows"]) == ["sqrt_depth", "wang"]
    wang = res["rows"]["wang"]
    m, se = statistics.fmean(C), statistics.stdev(C) / math.sqrt(3)
    assert wang["change"]["seeds"] == [1, 2, 3] and wang["change"]["n"] == 3
    assert (wang["change"]["mean"], wang["change"]["lo"], wang["change"]["hi"]) == pytest.approx(
        (m, m - T2 * se, m + T2 * se), abs=1e-9
    )
    assert wang["word"] == ("holds", 0)  # [0.035, 0.085]: inside ±0.15
    assert wang["long"]["mean"] == pytest.approx(statistics.fmean(WANG[:3]) + m, abs=1e-9)
    assert res["rows"]["sqrt_depth"]["word"][1] == 1  # seed 3's vertex at its top rate: censored, counted
    del long[("sqrt_depth", 12, max(lr for r, lr, s in design["sqrt_depth"] if r == 12), 2)]
    res = gamma.long_check(short, long, PLATEAU)
    assert res["held"] == {"sqrt_depth": "29 of 30 check runs"} and list(res["rows"]) == ["wang"]
    write_report(tmp_path / "short", short)
    write_report(tmp_path / "long", long, steps=gamma.LONG_STEPS)
    out = tmp_path / "readings.md"
    gamma.main(["readings", "--cells", str(tmp_path / "short"), "--long", str(tmp_path / "long"), "--out", str(out)])
    lines = out.read_text().splitlines()
    assert "five rates × seeds 1-3 × R = 2 and 12): 1/√depth (γ = ½) (29 of 30 check runs)." in "\n".join(lines)
    row = [line for line in lines if line.startswith("| Wang (γ = 1) | [1, 2, 3] (3) |")]
    assert len(row) == 1 and row[0].endswith(f"| {m:+.2f} | [{m - T2 * se:+.2f}, {m + T2 * se:+.2f}] | holds | 0 |")
    with pytest.raises(SystemExit):
        gamma.main(
            ["readings", "--cells", str(tmp_path / "short"), "--long", str(tmp_path / "short"), "--out", str(out)]
        )
    assert "did not run 1000 steps" in capsys.readouterr().err


def test_one_seed_gives_no_interval_and_no_verdict(tmp_path):
    """Seed 1 alone (the start of a sweep): no t interval (it needs 2 seeds), said in the row and the verdict."""
    cells = {k: c for k, c in quad_cells({"wang": WANG, "sqrt_depth": SQRT}).items() if k[3] == 1}
    write_report(tmp_path / "one", cells)
    out = tmp_path / "readings.md"
    gamma.main(["readings", "--cells", str(tmp_path / "one"), "--out", str(out)])
    text = out.read_text()
    assert "**Verdict (R = 2 → 24): not resolved (too few seeds: a t interval needs 2)**" in text
    assert "| Wang (γ = 1) | — (under 2 seeds) | — | — | too few seeds | 0 |" in text


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


def write_report(folder, cells, steps=200):
    folder.mkdir(parents=True)
    (folder / "plateau.json").write_text(json.dumps({"plateau": PLATEAU}))
    with (folder / "cells.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEADER)
        for (arm, r, lr, s), c in cells.items():
            if arm == "deeploop":
                cid, scheme = f"deeploop-r{r}-lr{lr:g}-s{s}", "deeploop"
            else:
                slug = {
                    "sqrt_depth": "eps_sqrtdepth",
                    "wang": "eps_wang",
                    "threequarter": f"eps_wang-branch_lambda{r**0.25:g}",
                }[arm]
                cid, scheme = f"preln-{slug}-r{r}-lr{lr:g}-s{s}", "preln"
            w.writerow(
                [cid, "m", scheme, "", r, s, "completed", c["loss"], c["loss"], c["loss"], "", steps, 1, 1, True]
            )


def test_the_command_reads_report_folders_and_writes_the_verdict(tmp_path, capsys):
    cells = quad_cells({"wang": WANG, "sqrt_depth": SQRT, "threequarter": [-0.1 + j for j in JITTER]})
    write_report(tmp_path / "core", cells)
    read = gamma.read([tmp_path / "core"])
    assert {k[0] for k in read} == {"wang", "sqrt_depth", "threequarter"}
    out = tmp_path / "readings.md"
    gamma.main(["readings", "--cells", str(tmp_path / "core"), "--out", str(out)])
    text = out.read_text()
    assert "**Verdict (R = 2 → 24): γ = 1 (Wang) supported**" in text
    assert "verdict: γ = 1 (Wang) supported" in capsys.readouterr().out
    assert "No logistic fit: every run trains" in text  # the ladder alone has no boundary: Δ50 needs the tail


def test_a_branch_lambda_that_is_not_the_three_quarter_arm_is_refused(tmp_path):
    write_report(tmp_path / "bad", quad_cells({"threequarter": [0.0] * 8}, rounds=(2,), rates=[1e-3]))
    csv_path = tmp_path / "bad" / "cells.csv"
    csv_path.write_text(csv_path.read_text().replace("branch_lambda1.18921", "branch_lambda1.5"))
    with pytest.raises(ValueError, match="is not the γ = ¾ arm"):
        gamma.read([tmp_path / "bad"])


def test_the_sweep_files_hold_the_preregistered_design():
    """configs/sweeps/gamma/: the core is 1/√depth and Wang × R ∈ {2, 24} × the ladder's first 9 rates × seeds 1-8
    (288); the ladder and the tail complete the design (768 and 360); no cell is in two sweeps; the γ = ¾ arm's λ
    is R^¼; every cell is the map's proxy (the rival grid's base configs), 200 steps."""
    sweeps = {n: grid.load_sweep(f"configs/sweeps/gamma/{n}.yaml") for n in ("core", "ladder", "tail")}
    cells = {n: grid.expand(s) for n, s in sweeps.items()}
    assert {n: len(c) for n, c in cells.items()} == {"core": 288, "ladder": 768, "tail": 360}
    ids = [c.id for cs in cells.values() for c in cs]
    assert len(ids) == len(set(ids)) and len({s.out for s in sweeps.values()}) == 3
    assert all(s.base == grid.load_sweep("configs/sweeps/rival/grid.yaml").base for s in sweeps.values())
    arm = lambda p: (
        "deeploop"
        if p["model.config.residual"] == "deeploop"
        else "threequarter"
        if "model.config.branch_lambda" in p
        else p["model.config.branch_scale"]
    )
    core = {
        (arm(c.params), c.params["model.config.n_rounds"], c.params["model.optim.lr"], c.params["seed_everything"])
        for c in cells["core"]
    }
    assert core == {
        (a, r, lr, s) for a in ("sqrt_depth", "wang") for r in (2, 24) for lr in gamma.LADDER[:9] for s in range(1, 9)
    }
    both = {
        (arm(c.params), c.params["model.config.n_rounds"], c.params["model.optim.lr"], c.params["seed_everything"])
        for n in ("core", "ladder")
        for c in cells[n]
    }
    assert both == {(a, r, lr, s) for a in gamma.ARMS for r in (2, 12, 24) for lr in gamma.LADDER for s in range(1, 9)}
    for c in (c for cs in cells.values() for c in cs if "model.config.branch_lambda" in c.params):
        assert c.params["model.config.branch_lambda"] == pytest.approx(
            c.params["model.config.n_rounds"] ** 0.25, abs=1e-6
        )
        assert c.params["model.config.branch_scale"] == "wang"
    tail = {c.params["model.optim.lr"] for c in cells["tail"]}
    assert max(tail) == 0.256 and min(tail) == pytest.approx(gamma.LADDER[-1] * 2**0.5, rel=0.01)
    assert sorted(tail) == list(gamma.TAIL)  # the rates `tail_unread` counts
    assert {c.params["seed_everything"] for c in cells["tail"]} == set(gamma.TAIL_SEEDS)
    assert all("trainer.max_steps" not in s.overrides for s in sweeps.values())  # study_map.yaml's 200 steps


def test_the_committed_readings_are_what_the_code_computes_from_the_committed_cells(tmp_path):
    """docs/results/gamma/readings.md, recomputed from the committed core report with `make gamma-core`'s arguments:
    the same text, figure for figure (the record cannot drift from its cells)."""
    results = Path(__file__).resolve().parents[2] / "docs" / "results"
    out = tmp_path / "readings.md"
    gamma.main(["readings", "--rival", f"{results}/rival/grid", "--out", str(out), "--cells", f"{results}/gamma/core"])
    text = out.read_text().replace(str(out), "docs/results/gamma/readings.md").replace(f"{results}/", "docs/results/")
    assert text == (results / "gamma" / "readings.md").read_text()


def unpack_committed_runs(tmp_path: Path, *names: str) -> Path:
    """docs/results/gamma/<name>_runs.tar.gz, each unpacked under tmp_path/runs/sweeps (returned), as docs/studies.md
    unpacks them to go on."""
    import tarfile

    runs = tmp_path / "runs" / "sweeps"
    runs.mkdir(parents=True, exist_ok=True)
    for name in names:
        with tarfile.open(Path(__file__).resolve().parents[2] / "docs/results/gamma" / f"{name}_runs.tar.gz") as tar:
            tar.extractall(runs, filter="data")
    return runs


def test_the_committed_ladder_readings_are_what_the_code_computes_from_the_committed_runs(tmp_path):
    """docs/results/gamma/ladder_readings.md (the whole ladder beside the core, and the 1,000-step check), recomputed
    from the committed run folders (ladder_runs.tar.gz and long_runs.tar.gz, unpacked under `runs/sweeps/`) with the
    command its header names: the same text, figure for figure. The committed check's sweep file is the one the
    pre-registered rule writes from the committed core and ladder."""
    results = Path(__file__).resolve().parents[2] / "docs" / "results"
    runs = unpack_committed_runs(tmp_path, "ladder", "long")
    sweep = tmp_path / "long.yaml"
    gamma.main(["long-sweep", "--cells", f"{results}/gamma/core", str(runs / "gamma_ladder"), "--out", str(sweep)])
    assert sweep.read_text() == (results.parents[1] / "configs" / "sweeps" / "gamma" / "long.yaml").read_text()
    out = tmp_path / "ladder_readings.md"
    gamma.main(
        [
            "readings",
            "--cells",
            f"{results}/gamma/core",
            str(runs / "gamma_ladder"),
            "--long",
            str(runs / "gamma_long"),
            "--rival",
            f"{results}/rival/grid",
            "--out",
            str(out),
        ]
    )
    text = (
        out.read_text()
        .replace(str(out), "docs/results/gamma/ladder_readings.md")
        .replace(f"{results}/", "docs/results/")
        .replace(f"{runs}/", "runs/sweeps/")
    )
    assert text == (results / "gamma" / "ladder_readings.md").read_text()


def test_the_committed_tail_holds_finished_cells_of_the_tail_sweep(tmp_path):
    """docs/results/gamma/tail_runs.tar.gz (the tail's finished cells, whole or in part): each cell folder is a cell of
    configs/sweeps/gamma/tail.yaml with that cell's grid values, finished, so that `loopnet sweep` on the unpacked
    folder skips it and runs only the rest (the resume docs/studies.md gives)."""
    from loopnet.study.sweep import CELL_FILE, MANIFEST, is_finished

    runs = unpack_committed_runs(tmp_path, "tail")
    sweep = grid.load_sweep("configs/sweeps/gamma/tail.yaml", out=runs / "gamma_tail")
    cells = {c.id: c for c in grid.expand(sweep)}
    folders = sorted(p for p in sweep.out.iterdir() if p.is_dir())
    assert folders and {p.name for p in folders} <= set(cells)
    for p in folders:
        assert is_finished(p), p.name
        assert json.loads((p / CELL_FILE).read_text())["params"] == cells[p.name].params
    assert json.loads((sweep.out / MANIFEST).read_text())["spec"] == sweep.spec
