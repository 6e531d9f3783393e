"""The rival rule's readings (docs/results/rival/README.md, section 1), by the rule stated there before the run:

    python -m experiments.rival.readings --grid docs/results/rival/grid --confirm docs/results/rival/confirm \\
        --map docs/results/map --out docs/results/rival/readings.md

--grid and --confirm take report folders (cells.csv) or sweep run folders (runs/sweeps/rival_grid); --map is
the map's results folder (its grid/ gives DeepNorm's and DeepLoop's Δ, its confirm/ DeepLoop's seeds 4 and 5).

Per Pre-LN arm (`model.config.branch_scale`: one, sqrt_depth, wang), on the grid's seeds:
- Δ = log10 η*(12) − log10 η*(2), η* the vertex of a quadratic in log10 η (`measures.best_rate_shift`), with
  its 95% seed bootstrap;
- Δ50 = log10 η50(12) − log10 η50(2), from one Firth common-slope logistic fit over the arms' runs, one
  intercept per (arm, R) (`boundary.fit`), with its profile-likelihood 95% interval.

The verdict, on each measure's estimate rounded to the two decimals printed:
- supported: Wang's arm |Δ| ≤ 0.15 and the 1/√depth arm Δ ≤ −0.2;
- contradicted: Wang's arm |Δ| ≥ 0.3, or the 1/√depth arm |Δ| ≤ 0.15;
- not resolved otherwise.
The verdict is supported or contradicted only when Δ and Δ50 give the same word. A censored end (a vertex
or 50% rate at or beyond its fitted rates' edge) makes Δ a bound, and a condition counts only where every
value the bound allows meets it (`span`, `meets`). A verdict is weak when an interval behind it reaches the
opposite zone (`weak`). Secondary: the best loss at R = 12 on the fresh seeds, paired by seed, Wang's arm
against the 1/√depth arm and against DeepLoop.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

from loopnet.env import one_line_errors

from loopnet.study import boundary
from loopnet.study.measures import best_rate_shift, paired_interval, quadratic_vertex, trains
from experiments import sources

ARMS = ("one", "sqrt_depth", "wang")
ARM_NAMES = {"one": "ε = 1", "sqrt_depth": "ε = 1/√(K·R)", "wang": "ε = 1/(R·√K) (Wang)"}
ROUNDS = (2, 6, 12)
R_LO, R_HI = 2, 12
TRANSFERS = 0.15  # |Δ| ≤ this: the best rate transfers from R = 2 to 12
SHIFTS = -0.2  # Δ ≤ this: the best rate falls with R
BREAKS = 0.3  # |Δ| ≥ this: the best rate does not transfer
FRESH_SEEDS = (4, 5, 6)
MAP_SCHEMES = ("deepnorm", "deeploop")
INF = math.inf


# ---------------------------------------------------------------------------------------- the rule
def span(x_lo: float, c_lo: int, x_hi: float, c_hi: int) -> tuple[float, float]:
    """The values Δ = x_hi − x_lo may take when each end is a point (c = 0), an upper bound (c = −1: the
    true value lies at or below x) or a lower bound (c = +1): (least, greatest), ±inf where open."""
    least = (-INF if c_hi < 0 else x_hi) - (INF if c_lo > 0 else x_lo)
    greatest = (INF if c_hi > 0 else x_hi) - (-INF if c_lo < 0 else x_lo)
    return least, greatest


def _shown(v: float) -> float:
    return round(v, 2) if math.isfinite(v) else v


def meets(rng: tuple[float, float] | None, condition: str) -> bool:
    """Whether every value of Δ's range (rounded to the two decimals printed) meets the condition: "transfers"
    |Δ| ≤ 0.15, "shifts" Δ ≤ −0.2, "breaks" |Δ| ≥ 0.3. No range (the measure could not be computed): never."""
    if rng is None:
        return False
    least, greatest = map(_shown, rng)
    if condition == "transfers":
        return -TRANSFERS <= least and greatest <= TRANSFERS
    if condition == "shifts":
        return greatest <= SHIFTS
    if condition == "breaks":
        return least >= BREAKS or greatest <= -BREAKS
    raise ValueError(f"unknown condition {condition!r}")


def measure_word(wang: tuple | None, sqrt_depth: tuple | None) -> tuple[str, list[str]]:
    """One measure's word from the two arms' ranges of Δ, and the clauses that decided it."""
    if meets(wang, "transfers") and meets(sqrt_depth, "shifts"):
        return "supported", ["wang transfers", "sqrt_depth shifts"]
    clauses = [
        c
        for c, ok in (("wang breaks", meets(wang, "breaks")), ("sqrt_depth transfers", meets(sqrt_depth, "transfers")))
        if ok
    ]
    return ("contradicted", clauses) if clauses else ("not resolved", [])


def weak(word: str, clauses: list[str], wang_ci: tuple, sqrt_ci: tuple) -> bool:
    """Whether the intervals behind a word reach its opposite zone (threshold included; an open end reaches
    everything). Supported: Wang's interval reaches |Δ| ≥ 0.3, or the 1/√depth arm's reaches |Δ| ≤ 0.15.
    Contradicted: every clause that holds is weak, "wang breaks" when Wang's interval reaches |Δ| ≤ 0.15,
    "sqrt_depth transfers" when the 1/√depth arm's reaches Δ ≤ −0.2."""

    def ends(ci):
        lo, hi = ci
        return (-INF if lo is None else _shown(lo)), (INF if hi is None else _shown(hi))

    (wl, wh), (sl, sh) = ends(wang_ci), ends(sqrt_ci)
    reaches_transfer = lambda lo, hi: lo <= TRANSFERS and hi >= -TRANSFERS
    if word == "supported":
        return wl <= -BREAKS or wh >= BREAKS or reaches_transfer(sl, sh)
    if word == "contradicted":
        tests = {"wang breaks": reaches_transfer(wl, wh), "sqrt_depth transfers": sl <= SHIFTS}
        return all(tests[c] for c in clauses)
    return False


def verdict(words: dict[str, str]) -> str:
    """Both measures must give the same word for supported or contradicted."""
    first, *rest = words.values()
    return first if first != "not resolved" and all(w == first for w in rest) else "not resolved"


# ---------------------------------------------------------------------------------------- the measures
def curve(cells: dict, group: str, rounds: int) -> dict[float, dict]:
    """rate -> {seed: final validation loss, None where the run did not complete} (`best_rate_shift`'s input)."""
    return {
        lr: {c["seed"]: c["loss"] if c["status"] == "completed" else None for c in cs}
        for lr, cs in sources.by_rate(cells, group, rounds).items()
    }


def vertex_shift(cells: dict, group: str, plateau: float, boots: int = 2000) -> dict | None:
    """Δ of one group (a Pre-LN arm or a map scheme): `best_rate_shift` from R = 2 to 12, bootstrap seed 0;
    with `range`, what Δ may be given censoring. None where an R has no run or no rate where every seed trains
    (a rate where every seed trains is one where every drawn seed does, so the draws need no such check)."""
    lo, hi = curve(cells, group, R_LO), curve(cells, group, R_HI)
    if not lo or not hi:
        return None
    try:
        out = best_rate_shift(lo, hi, plateau, boots=boots, seed=0)
    except ValueError:  # no rate where every seed trains at one R: no vertex (`quadratic_vertex` of nothing)
        return None
    if out is not None:
        out["range"] = span(out["x_lo"], out["censored_lo"], out["x_hi"], out["censored_hi"])
    return out


def logistic_shifts(cells: dict, plateau: float, groups=ARMS) -> dict:
    """One Firth common-slope fit over the groups' runs at every R, one intercept per (group, R): per group,
    Δ50 with its profile interval and its range given censoring (an η50 at or beyond the group's rates run
    is clipped to that edge and counts as a bound, as the vertex does)."""
    keys = [(g, r) for g in groups for r in ROUNDS if sources.by_rate(cells, g, r)]
    rows = [
        ((g, r), lr, sources.trains_cell(c, plateau)) for (g, r, lr, _), c in sorted(cells.items()) if (g, r) in keys
    ]
    fit = boundary.fit(boundary.Data.from_rows(rows))
    out = {"fit": fit}
    ends = {}
    for key in keys:
        rates = [math.log10(lr) for lr in sources.by_rate(cells, *key)]
        x = fit.x50(key)
        c = -1 if x <= min(rates) else (1 if x >= max(rates) else 0)
        ends[key] = (min(max(x, min(rates)), max(rates)), c, x)
    for g in groups:
        if (g, R_LO) not in ends or (g, R_HI) not in ends:
            continue
        (a, ca, _), (b, cb, _) = ends[(g, R_LO)], ends[(g, R_HI)]
        w = {(g, R_HI): 1, (g, R_LO): -1}
        out[g] = {
            "delta": b - a,
            "range": span(a, ca, b, cb),
            "ci": fit.interval(w),
            "x_lo": a,
            "x_hi": b,
            "censored_lo": ca,
            "censored_hi": cb,
        }
    out["ends"] = ends
    return out


def reading(cells: dict, plateau: float, boots: int = 2000) -> dict:
    """The decisive reading on the rival grid's cells (merged): both measures per arm, each measure's word,
    the verdict and whether it is weak."""
    shifts = {g: vertex_shift(cells, g, plateau, boots) for g in ARMS}
    try:
        logit = logistic_shifts(cells, plateau)
    except ValueError as err:  # every run trains (or none): no 50% rate
        logit = {"error": str(err)}
    ci = lambda d: (None, None) if d is None else (d["lo"], d["hi"]) if "lo" in d else d["ci"]
    words, weakness = {}, {}
    for name, by in (("Δ", shifts), ("Δ50", {g: logit.get(g) for g in ARMS})):
        rng = {g: None if by[g] is None else by[g]["range"] for g in ARMS}
        word, clauses = measure_word(rng["wang"], rng["sqrt_depth"])
        words[name] = word
        weakness[name] = weak(word, clauses, ci(by["wang"]), ci(by["sqrt_depth"]))
    word = verdict(words)
    return {
        "shifts": shifts,
        "logit": logit,
        "words": words,
        "verdict": word,
        "weak": word != "not resolved" and any(weakness.values()),
    }


def secondary(confirm: dict, plateau: float) -> list[dict]:
    """At R = 12 on the fresh seeds: (Wang's arm − each rival) final loss at each one's confirmed rate,
    paired by seed, with the 95% t interval and its word."""

    def at(group):
        rates = sources.by_rate(confirm, group, R_HI)
        if not rates:
            return None
        if len(rates) > 1:
            raise ValueError(
                f"the confirmation holds {group} at R = {R_HI} at {len(rates)} rates; fix: pass one "
                "confirmation (each arm's one best rate)"
            )
        ((lr, cs),) = rates.items()
        return lr, {c["seed"]: c["loss"] for c in cs if c["seed"] in FRESH_SEEDS and c["status"] == "completed"}

    out = []
    wang = at("wang")
    for rival in ("sqrt_depth", "deeploop"):
        other = at(rival)
        row = {"rival": rival, "wang": wang, "other": other, "pair": None, "word": "not yet run"}
        if wang and other:
            seeds = sorted(set(wang[1]) & set(other[1]))
            row["seeds"] = seeds
            row["pair"] = paired_interval([wang[1][s] - other[1][s] for s in seeds])
            if row["pair"]:
                p = row["pair"]
                row["word"] = "ahead" if p["hi"] < 0 else "behind" if p["lo"] > 0 else "not distinguished"
            else:
                row["word"] = "too few paired seeds"
        out.append(row)
    return out


# ---------------------------------------------------------------------------------------- added 2026-12-04
def seed_shifts(cells: dict, group: str, plateau: float) -> dict[int, float]:
    """seed -> Δ_s = log10 η*(12) − log10 η*(2) from that seed's own vertices (each over the rates where it trains,
    `quadratic_vertex`); seeds without a vertex at either R are left out."""
    out = {}
    lo, hi = curve(cells, group, R_LO), curve(cells, group, R_HI)
    for s in sorted({s for by in (*lo.values(), *hi.values()) for s in by}):
        xs = []
        for c in (lo, hi):
            ok = {lr: by[s] for lr, by in c.items() if s in by and trains("completed", by[s], plateau)}
            v = quadratic_vertex(ok) if len(ok) >= 3 else None
            xs.append(None if v is None else v["x"])
        if None not in xs:
            out[s] = xs[1] - xs[0]
    return out


def resamples(n: int) -> int:
    """How many different draws a bootstrap of n seeds can make (multisets of size n from n seeds)."""
    return math.comb(2 * n - 1, n)


PAIRS = (("sqrt_depth", "one"), ("wang", "sqrt_depth"), ("wang", "one"))


def pairwise(per: dict[str, dict[int, float]]) -> list[dict]:
    """Per pair of arms (a, b): Δ_a − Δ_b per seed, the mean with its 95% t interval (n − 1 degrees of freedom) and
    how many seeds are positive: which of "ε = 1 < 1/√depth < Wang" the seeds back."""
    out = []
    for a, b in PAIRS:
        seeds = sorted(set(per.get(a, {})) & set(per.get(b, {})))
        diffs = [per[a][s] - per[b][s] for s in seeds]
        out.append(
            {
                "pair": (a, b),
                "seeds": seeds,
                "diffs": diffs,
                "t": paired_interval(diffs),
                "positive": sum(d > 0 for d in diffs),
            }
        )
    return out


def best_loss_check(cells: dict, confirm_rates: dict[str, float], plateau: float) -> list[dict]:
    """At R = 12 on the grid's seeds, Wang's arm − the 1/√depth arm per seed, each at (a) its lowest seed-mean loss
    on the grid and (b) the rate the confirmation ran; with the 1/√depth arm's margin between its two lowest means
    (an argmin decided by less than the seeds' spread makes (a) a choice, not a measurement)."""

    def by_rate(group):
        return {
            lr: {c["seed"]: c["loss"] for c in cs if c["status"] == "completed"}
            for lr, cs in sources.by_rate(cells, group, R_HI).items()
        }

    rows, curves = [], {g: by_rate(g) for g in ("wang", "sqrt_depth")}
    means = {g: {lr: statistics.fmean(v.values()) for lr, v in c.items() if v} for g, c in curves.items()}
    ranked = sorted(means["sqrt_depth"].items(), key=lambda kv: kv[1])
    margin = ranked[1][1] - ranked[0][1] if len(ranked) > 1 else math.nan
    for how, rate in (
        ("lowest grid mean", {g: min(m, key=m.get) for g, m in means.items() if m}),
        ("the confirmation's rate", confirm_rates),
    ):
        if not all(g in rate and rate[g] in curves[g] for g in curves):
            continue
        a, b = curves["wang"][rate["wang"]], curves["sqrt_depth"][rate["sqrt_depth"]]
        seeds = sorted(set(a) & set(b))
        diffs = [a[s] - b[s] for s in seeds]
        rows.append(
            {
                "how": how,
                "rates": (rate["wang"], rate["sqrt_depth"]),
                "seeds": seeds,
                "diffs": diffs,
                "t": paired_interval(diffs),
                "negative": sum(d < 0 for d in diffs),
                "margin": margin,
            }
        )
    return rows


def added_section(grid: dict, shifts: dict, maps: dict, map_grid: dict, confirm: dict, plateau: float) -> list[str]:
    """The per-seed readings added on 2026-12-04, beside the stated ones, so that each interval says what it is."""
    per = {g: seed_shifts(grid, g, plateau) for g in ARMS}
    md = [
        "## Per seed, and what each interval is (added 2026-12-04)",
        "",
        "Δ_s: Δ from one seed's own vertices at R = 2 and 12 (each over the rates where that seed trains). The "
        "stated Δ is the vertex of the seed-mean curve, which need not lie inside the seeds' own values (a "
        "vertex is not linear in the losses).",
        "",
        "| group | seeds | Δ_s per seed | mean of Δ_s | 95% t interval (n − 1 df) | stated Δ | stated interval "
        "(seed bootstrap) | possible resamples |",
        "|---|---|---|---:|---|---:|---|---:|",
    ]
    rows = [(ARM_NAMES[g], per[g], shifts.get(g)) for g in ARMS]
    rows += [(s, seed_shifts(map_grid, s, plateau), maps.get(s)) for s in MAP_SCHEMES]
    for name, values, st in rows:
        t = paired_interval(list(values.values()))
        md.append(
            f"| {name} | {sorted(values)} | "
            + ", ".join(f"{v:+.3f}" for v in values.values())
            + " | "
            + (f"{t['mean']:+.3f} | [{t['lo']:+.3f}, {t['hi']:+.3f}]" if t else "— | —")
            + " | "
            + ("" if st is None else f"{st['delta']:+.3f}")
            + " | "
            + ("" if st is None else f"[{st['lo']:+.3f}, {st['hi']:+.3f}]")
            + f" | {resamples(len(values))} |"
        )
    md += [
        "",
        "A percentile bootstrap over n seeds can draw only C(2n − 1, n) different resamples: 10 for 3 seeds, 3 "
        "for 2. Each seed drawn n times has probability n^−n (1/27 for 3 seeds, 1/4 for 2), more than the 2.5% a "
        "95% interval leaves in each tail, so the percentile ends are close to the extreme resamples: the stated "
        "intervals over the grid's 3 seeds and the map's 2 are ranges of a handful of outcomes, not 95% intervals, "
        "and their coverage is unknown. The t intervals above assume normal per-seed values; with 3 seeds (2 df) "
        "they are wide, and with 2 (1 df) wider still.",
        "",
        "Which of the ordering ε = 1 < 1/√depth < Wang (in how little the best rate moves) the seeds back: Δ_s of "
        "the first arm minus the second, per seed.",
        "",
        "| pair | per seed | seeds positive | mean | 95% t interval |",
        "|---|---|---:|---:|---|",
    ]
    for row in pairwise(per):
        a, b = row["pair"]
        t = row["t"]
        md.append(
            f"| {ARM_NAMES[a]} − {ARM_NAMES[b]} | "
            + ", ".join(f"{d:+.3f}" for d in row["diffs"])
            + f" | {row['positive']} of {len(row['diffs'])} | "
            + (f"{t['mean']:+.3f} | [{t['lo']:+.3f}, {t['hi']:+.3f}]" if t else "— | —")
            + " |"
        )
    conf = {g: next(iter(sources.by_rate(confirm, g, R_HI)), None) for g in ("wang", "sqrt_depth")}
    md += [
        "",
        "The best loss at R = 12 on the grid's seeds, Wang's arm − the 1/√depth arm, by how each arm's rate is chosen:",
        "",
        "| each arm's rate | rates (Wang, 1/√depth) | per seed (nat/byte) | seeds negative | mean | "
        "95% t interval (n − 1 df) |",
        "|---|---|---|---:|---:|---|",
    ]
    checks = best_loss_check(grid, {g: r for g, r in conf.items() if r is not None}, plateau)
    for row in checks:
        t = row["t"]
        md.append(
            f"| {row['how']} | {row['rates'][0]:.3g}, {row['rates'][1]:.3g} | "
            + ", ".join(f"{d:+.4f}" for d in row["diffs"])
            + f" | {row['negative']} of {len(row['diffs'])} | "
            + (f"{t['mean']:+.4f} | [{t['lo']:+.4f}, {t['hi']:+.4f}]" if t else "— | —")
            + " |"
        )
    if checks:
        md += [
            "",
            f"The 1/√depth arm's two lowest seed-mean losses at R = 12 differ by {checks[0]['margin']:.5f} "
            "nat/byte: its lowest grid mean is a near tie.",
        ]
    return md


# ---------------------------------------------------------------------------------------- the report
def show_range(rng: tuple[float, float], spec: str = "{:+.2f}") -> str:
    least, greatest = rng
    if least == greatest:
        return spec.format(least)
    if math.isinf(least) and math.isinf(greatest):
        return "any (both ends censored the same way)"
    return "≤ " + spec.format(greatest) if math.isinf(least) else "≥ " + spec.format(least)


def edge(x: float, c: int) -> str:
    return ("≤ " if c < 0 else "≥ " if c > 0 else "") + f"{10**x:.3g}"


def ci_text(lo, hi) -> str:
    return sources.fmt_ci(lo, hi, spec="{:+.2f}")


def markdown(
    result: dict,
    grid: dict,
    maps: dict,
    second: list[dict],
    plateau: float,
    argv: list[str],
    plot: str | None,
    added: list[str] | None = None,
) -> list[str]:
    shifts, logit = result["shifts"], result["logit"]
    line = verdict_line(result)
    md = [
        "# The rival rule on the map: the readings stated before the run, computed",
        "",
        f"Written by `python -m experiments.rival.readings {' '.join(argv)}`; the rule is in "
        "`docs/results/rival/README.md` (section 1) and coded in `experiments/rival/readings.py`. A seed trains when "
        f"it completed with its final validation loss below the plateau {plateau:.4f} − 0.1 nat.",
        "",
        f"**{line}**",
        "",
        "## The decisive reading",
        "",
        "| arm | η*(R = 2) | η*(R = 12) | Δ | Δ given censoring | seed bootstrap (stated as 95%; see the per-seed "
        "section) | η50(R = 2) | η50(R = 12) | Δ50 | "
        "Δ50 given censoring | 95% profile |",
        "|---|---:|---:|---:|---|---|---:|---:|---:|---|---|",
    ]
    for g in ARMS:
        s, l = shifts[g], logit.get(g)
        vs = (
            "— | — | — | — | —"
            if s is None
            else f"{edge(s['x_lo'], s['censored_lo'])} | {edge(s['x_hi'], s['censored_hi'])} | {s['delta']:+.2f} | "
            f"{show_range(s['range'])} | {ci_text(s['lo'], s['hi'])}"
        )
        ls = (
            "— | — | — | — | —"
            if l is None
            else f"{edge(l['x_lo'], l['censored_lo'])} | {edge(l['x_hi'], l['censored_hi'])} | {l['delta']:+.2f} | "
            f"{show_range(l['range'])} | {ci_text(*l['ci'])}"
        )
        md.append(f"| {ARM_NAMES[g]} | {vs} | {ls} |")
    md += [
        "",
        f"Words by measure: Δ **{result['words']['Δ']}**, Δ50 **{result['words']['Δ50']}** (the verdict is "
        "supported or contradicted only when both agree). Rule: supported when Wang's arm |Δ| ≤ 0.15 and the "
        "1/√depth arm Δ ≤ −0.2; contradicted when Wang's arm |Δ| ≥ 0.3 or the 1/√depth arm |Δ| ≤ 0.15; not "
        "resolved otherwise; each on the estimate rounded to two decimals, a censored Δ counting only where its "
        "bound meets the threshold. Weak: an interval behind the word reaches the opposite zone.",
        "",
    ]
    if "error" in logit:
        md += [f"Δ50: no logistic fit ({logit['error']}).", ""]
    else:
        fit = logit["fit"]
        md += [
            f"Logistic fit: Firth, common slope b = {fit.slope:.2f} per decade"
            + (
                " (**positive: training rises with the rate, so η50 is a lower edge, not a stability boundary**)"
                if fit.slope > 0
                else ""
            )
            + f"; the plain maximum-likelihood fit {'is separated (no finite maximum)' if fit.separated else 'exists'}.",
            "",
        ]
    md += [
        "η* is the vertex over the rates where every seed trains (a ≤ or ≥ marks an end at the fitted rates' "
        "edge: censored). Bootstrap: the grid's seeds resampled jointly at both R "
        f"({', '.join(str(s['boots']) for s in shifts.values() if s)} usable draws per arm; share of draws with a "
        f"censored end: {', '.join('%.2f' % s['censored_share'] for s in shifts.values() if s)}).",
        "",
        "## Seeds that train per rate (the rival grid)",
        "",
        "| arm | R | seeds that train per rate | ×√2 rule: largest rate where every seed trains | η50 (Firth) | "
        "exact trend test P (falls) |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for g in ARMS:
        for r in ROUNDS:
            rates = sources.by_rate(grid, g, r)
            if not rates:
                continue
            counts = {lr: (sum(sources.trains_cell(c, plateau) for c in cs), len(cs)) for lr, cs in rates.items()}
            ladder = sorted(counts)
            test = boundary.exact_trend_test(
                [[(round(2 * math.log2(lr / ladder[0])), k, n) for lr, (k, n) in counts.items()]]
            )
            band = sources.largest_trainable(grid, g, r, plateau)
            x50 = logit.get("ends", {}).get((g, r))
            md.append(
                f"| {ARM_NAMES[g]} | {r} | "
                + ", ".join(f"{lr:.3g}: {k}/{n}" for lr, (k, n) in counts.items())
                + f" | {sources.fmt_lr(band['largest'])} | "
                f"{'—' if x50 is None else f'{10 ** x50[2]:.3g}'} | "
                f"{test['p_falls']:.2g} |"
            )
    md += [
        "",
        "A group where seeds fail at low rates as well as high ones (slow training, not instability) makes "
        "the monotone logistic a poor description: its exact trend test P is then large.",
        "",
        "## The map's own schemes (the comparison, not part of the verdict)",
        "",
        "Δ on the map's ×2 grid (`docs/results/map/grid`), computed the same way.",
        "",
        "| scheme | η*(R = 2) | η*(R = 12) | Δ | seed bootstrap over 2 seeds (3 possible resamples; not a 95% "
        "interval) |",
        "|---|---:|---:|---:|---|",
    ]
    for s, out in maps.items():
        md.append(
            f"| {s} | — | — | — | — |"
            if out is None
            else f"| {s} | {edge(out['x_lo'], out['censored_lo'])} | {edge(out['x_hi'], out['censored_hi'])} | "
            f"{out['delta']:+.2f} | {ci_text(out['lo'], out['hi'])} |"
        )
    md += [
        "",
        "## The secondary reading: best loss at R = 12 on the fresh seeds",
        "",
        "Per seed of 4, 5, 6: Wang's arm's final loss minus the rival's, each at its confirmed rate; the mean with "
        "its 95% t interval. Ahead: the interval lies below 0; behind: above; not distinguished: it contains 0.",
        "",
        "| Wang's arm − | rates (Wang, rival) | seeds | mean (nat/byte) | 95% t interval | word |",
        "|---|---|---|---:|---|---|",
    ]
    for row in second:
        p = row["pair"]
        rates = "—" if not (row["wang"] and row["other"]) else f"{row['wang'][0]:.3g}, {row['other'][0]:.3g}"
        md.append(
            f"| {ARM_NAMES.get(row['rival'], row['rival'])} | {rates} | {row.get('seeds', '—')} | "
            + (f"{p['mean']:+.4f} | [{p['lo']:+.4f}, {p['hi']:+.4f}]" if p else "— | —")
            + f" | {row['word']} |"
        )
    if added:
        md += [""] + added
    if plot:
        md += ["", f"![final loss vs rate per arm and R]({plot})"]
    return md + [""]


def verdict_line(result: dict) -> str:
    word = result["verdict"] + (" (weak)" if result["weak"] else "")
    return f"Verdict: {word} (Δ: {result['words']['Δ']}; Δ50: {result['words']['Δ50']})"


def plot_loss_vs_lr(grid: dict, result: dict, plateau: float, path: Path) -> None:
    """Final loss against the rate, one panel per arm, one line (the mean over the seeds that completed) per R,
    each seed a point, each diverged run an x on the plateau line; the vertex η* at R = 2 and 12 marked."""
    from loopnet.study.plotting import colors, legend, pyplot, save

    plt = pyplot()
    fig, axes = plt.subplots(1, len(ARMS), figsize=(5 * len(ARMS), 4), sharey=True)
    col = colors(ROUNDS)
    for ax, g in zip(axes, ARMS):
        for r in ROUNDS:
            rates = sources.by_rate(grid, g, r)
            if not rates:
                continue
            losses = {
                lr: [
                    c["loss"]
                    for c in cs
                    if c["status"] == "completed" and c["loss"] is not None and math.isfinite(c["loss"])
                ]
                for lr, cs in rates.items()
            }
            pts = [(lr, v) for lr, vs in losses.items() for v in vs]
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=10, color=col[r], alpha=0.5)
            mean = [(lr, statistics.fmean(vs)) for lr, vs in sorted(losses.items()) if vs]
            ax.plot([m[0] for m in mean], [m[1] for m in mean], "-o", ms=3, color=col[r], label=f"R = {r}")
            failed = [lr for lr, cs in rates.items() for c in cs if c["status"] != "completed"]
            ax.scatter(
                failed, [plateau] * len(failed), marker="x", color=col[r], s=20
            )  # diverged: drawn on the plateau
        s = result["shifts"][g]
        if s:
            for x, r in ((s["x_lo"], R_LO), (s["x_hi"], R_HI)):
                ax.axvline(10**x, color=col[r], ls=":", lw=1)
        ax.axhline(plateau, color="grey", ls="--", lw=1, label="unigram plateau")
        ax.axhline(plateau - 0.1, color="grey", ls=":", lw=1, label="trains below")
        ax.set_xscale("log")
        ax.set_xlabel("learning rate")
        ax.set_title(f"Pre-LN, {ARM_NAMES[g]}")
        legend(ax, fontsize=7)
    axes[0].set_ylabel("final validation loss (nat/byte)")
    save(plt, fig, path)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(
        prog="python -m experiments.rival.readings",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--grid", nargs="+", required=True, help="the rival grid: report folder(s) or sweep run folder(s)")
    p.add_argument("--confirm", nargs="*", default=[], help="the rival confirmation (report or run folder)")
    p.add_argument("--map", default="docs/results/map", help="the map's results folder (grid/, confirm/)")
    p.add_argument("--out", required=True, help="the markdown file to write; the plot goes beside it")
    p.add_argument("--boots", type=int, default=2000, help="bootstrap draws (the reading states 2,000)")
    p.add_argument("--plateau", default="auto", help="the unigram plateau in nats, or auto (the grid's plateau.json)")
    args = p.parse_args(argv)
    with one_line_errors("loopnet rival", (ValueError, FileNotFoundError)):
        root = Path(args.map)
        for sub in ("grid", "confirm"):
            if not (root / sub / "cells.csv").is_file():
                raise ValueError(
                    f"{root / sub / 'cells.csv'} is missing; fix: pass the map's results folder with --map"
                )
        plateau = sources.plateau(args.grid, args.plateau)
        map_plateau = sources.plateau([root / "grid"])
        if abs(map_plateau - plateau) > 1e-9:
            raise ValueError(
                f"the rival grid's plateau {plateau:.6f} differs from the map's {map_plateau:.6f}: not the "
                "same data; fix: run the rival grid on configs/study_map.yaml, or pass --plateau"
            )
        grid = sources.merge(*(sources.read(f) for f in args.grid))
        if not any(c["scheme"] in ARMS for c in grid.values()):
            raise ValueError(
                f"no finished Pre-LN run in {', '.join(args.grid)}; fix: run configs/sweeps/rival/grid.yaml"
            )
        confirm = sources.merge(*(sources.read(f) for f in args.confirm), sources.read(root / "confirm"))
        map_grid = sources.merge(sources.read(root / "grid"))
        result = reading(grid, plateau, args.boots)
        maps = {s: vertex_shift(map_grid, s, plateau, args.boots) for s in MAP_SCHEMES}
        second = secondary(confirm, plateau)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    plot = out.with_name(out.stem + "_loss_vs_lr.png")
    plot_loss_vs_lr(grid, result, plateau, plot)
    added = added_section(grid, result["shifts"], maps, map_grid, confirm, plateau)
    out.write_text("\n".join(markdown(result, grid, maps, second, plateau, argv, plot.name, added)))
    print(f"loopnet rival: {verdict_line(result)}")
    print(f"loopnet rival: wrote {out} and {plot}")


if __name__ == "__main__":
    main()
