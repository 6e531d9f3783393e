"""The depth exponent's readings (docs/results/gamma/PREREGISTRATION.md), by the rules stated there before any fit:

    python -m experiments.gamma.readings readings --cells docs/results/gamma/core [docs/results/gamma/ladder ...] \\
        [--long docs/results/gamma/long] [--rival docs/results/rival/grid] --out docs/results/gamma/readings.md
    python -m experiments.gamma.readings long-sweep --cells docs/results/gamma/core docs/results/gamma/ladder \\
        --out configs/sweeps/gamma/long.yaml

--cells, --long and --rival take report folders (cells.csv) or sweep run folders (runs/sweeps/gamma_core).

Per arm (1/√depth, γ = ¾, Wang, DeepLoop) and seed: η*(R) the vertex of a quadratic in log10 η fitted to that
seed's final losses (`measures.quadratic_vertex`: the rates within 0.61 decades of its lowest loss, among the
rates where it trains), Δ_s = log10 η*(24) − log10 η*(2). Each estimate is the mean over the seeds with its 95%
Student t interval on n − 1 degrees of freedom (`measures.paired_interval`); the estimands D_W = Δ_Wang −
Δ_{1/√depth} and D_L = Δ_DeepLoop − Δ_Wang are paired by seed. γ*, where Δ = 0 by linear interpolation between
γ = ½ and 1, has Fieller's interval. Δ50 (the 50%-trains rate's shift) comes from one Firth common-slope
logistic fit over every run (`loopnet.study.boundary`), with profile-likelihood intervals. An arm is read when
its ladder is whole (`unread`), its tail runs when its tail is whole (`tail_unread`); until then they are counted.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
from pathlib import Path

from loopnet.env import one_line_errors

from loopnet.study import boundary
from loopnet.study.measures import paired_interval, quadratic_vertex, t_quantile
from experiments import sources

ARMS = ("sqrt_depth", "threequarter", "wang", "deeploop")
ARM_NAMES = {"sqrt_depth": "1/√depth (γ = ½)", "threequarter": "γ = ¾", "wang": "Wang (γ = 1)", "deeploop": "DeepLoop"}
GAMMAS = {"sqrt_depth": 0.5, "threequarter": 0.75, "wang": 1.0}
R_LO, R_HI, R_MID = 2, 24, 12
LADDER = (2.5e-4, 3.54e-4, 5.0e-4, 7.07e-4, 1.0e-3, 1.41e-3, 2.0e-3, 2.83e-3, 4.0e-3, 5.66e-3, 8.0e-3)
TRANSFER = 0.15  # decades: one ×√2 ladder step (the rival study's transfer threshold)
STRESS = 10.0  # decades a censored per-seed Δ is moved toward its open side to test whether a word survives it
LONG_STEPS = 1000
LONG_SEEDS = (1, 2, 3)
TAIL = (1.13e-2, 1.6e-2, 2.26e-2, 3.2e-2, 4.53e-2, 6.4e-2, 9.05e-2, 0.128, 0.181, 0.256)  # the ladder on at ×√2
TAIL_SEEDS = (1, 2, 3)
# the estimands as weights on the arms' per-seed Δ_s (the linearity check is halved: Δ_¾ − (Δ_½ + Δ_1)/2)
ESTIMANDS = {
    "D_W": {"wang": 1, "sqrt_depth": -1},
    "D_L": {"deeploop": 1, "wang": -1},
    "linearity": {"threequarter": 2, "sqrt_depth": -1, "wang": -1},
}


# ---------------------------------------------------------------------------------------- cells
def read(folders) -> dict:
    """(arm, R, lr, seed) -> cell over the folders given (the first finished cell wins, `sources.merge`); the
    γ = ¾ arm is Wang's rule with `branch_lambda` R^¼ in the cell id, checked against R."""
    cells = []
    for folder in folders:
        for c in sources.read(folder):
            lam = re.search(r"(?:^|-)branch_lambda([0-9.]+)(?:-|$)", c["cell"])
            if lam:
                if c["scheme"] != "wang" or abs(float(lam.group(1)) - c["R"] ** 0.25) > 1e-4:
                    raise ValueError(
                        f"cell {c['cell']}: branch_lambda {lam.group(1)} with {c['scheme']} at R = "
                        f"{c['R']} is not the γ = ¾ arm (wang, λ = R^¼ = {c['R'] ** 0.25:.6f}); fix: "
                        "run configs/sweeps/gamma/*.yaml unchanged"
                    )
                c = dict(c, scheme="threequarter")
            cells.append(c)
    return sources.merge(cells)


def seed_curves(cells: dict, arm: str, plateau: float) -> dict[tuple[int, int], dict[float, float]]:
    """(R, seed) -> that seed's final loss per rate at one arm, over the rates where the seed trains."""
    out: dict = {}
    for (a, r, lr, s), c in cells.items():
        if a == arm:
            out.setdefault((r, s), {})
            if sources.trains_cell(c, plateau):
                out[(r, s)][lr] = c["loss"]
    return out


def seeds_of(cells: dict, arm: str) -> list[int]:
    return sorted({s for (a, r, _, s) in cells if a == arm and r in (R_LO, R_HI)})


# ---------------------------------------------------------------------------------------- per-seed shifts
def seed_shifts(cells: dict, arm: str, plateau: float, r_lo: int = R_LO, r_hi: int = R_HI) -> dict[int, dict]:
    """seed -> {delta, x_lo, x_hi, side}: Δ_s = x_hi − x_lo from that seed's own vertices; side is where a censored
    Δ_s is open (−1: the true Δ_s lies at or below it, +1: at or above, 0: either way) and None when uncensored.
    A seed with under 3 trainable rates at either R has no vertex and is left out."""
    out, curves = {}, seed_curves(cells, arm, plateau)
    for seed in seeds_of(cells, arm):
        a, b = (quadratic_vertex(c) if c else None for c in (curves.get((r, seed)) for r in (r_lo, r_hi)))
        if a is None or b is None:
            continue
        low = b["censored"] < 0 or a["censored"] > 0  # the true Δ_s may be lower
        high = b["censored"] > 0 or a["censored"] < 0
        side = None if not (low or high) else (0 if low and high else (-1 if low else 1))
        out[seed] = {"delta": b["x"] - a["x"], "x_lo": a["x"], "x_hi": b["x"], "side": side}
    return out


def combine(shifts: dict[str, dict], weights: dict[str, int]) -> dict[int, dict]:
    """Per seed present in every arm of `weights`: Σ w·Δ_s, with its open side: each censored term's side times
    the sign of its weight; terms open in opposite directions, or a term open both ways, leave it open both ways."""
    out = {}
    for s in sorted(set.intersection(*(set(shifts[a]) for a in weights))):
        sides = {
            shifts[a][s]["side"] * (1 if w > 0 else -1) for a, w in weights.items() if shifts[a][s]["side"] is not None
        }
        side = None if not sides else (sides.pop() if len(sides) == 1 else 0)
        out[s] = {"delta": sum(w * shifts[a][s]["delta"] for a, w in weights.items()), "side": side}
    return out


def t_estimate(per_seed: dict[int, dict]) -> dict | None:
    """The mean over the seeds with its 95% t interval (n − 1 degrees of freedom); None under 2 seeds."""
    p = paired_interval([v["delta"] for v in per_seed.values()])
    if p is None:
        return None
    return dict(p, seeds=sorted(per_seed), censored=sum(v["side"] is not None for v in per_seed.values()))


def arm_word(lo: float, hi: float) -> str:
    """Per arm, on the interval's two printed decimals: transfers (inside ±0.15), falls (hi < 0), rises (lo > 0);
    "falls" and "transfers" may both hold; not resolved when none does."""
    lo, hi = round(lo, 2), round(hi, 2)
    words = [
        w for w, ok in (("transfers", -TRANSFER <= lo and hi <= TRANSFER), ("falls", hi < 0), ("rises", lo > 0)) if ok
    ]
    return ", ".join(words) or "not resolved"


def estimand_word(lo: float, hi: float) -> str:
    """An estimand (D_W, D_L): greater than 0, less than 0, equivalent within ±0.15, else not distinguished."""
    lo, hi = round(lo, 2), round(hi, 2)
    if lo > 0:
        return "greater than 0"
    if hi < 0:
        return "less than 0"
    if -TRANSFER <= lo and hi <= TRANSFER:
        return "equivalent within ±0.15"
    return f"not distinguished (±{(hi - lo) / 2:.2f} decades)"


def robust_word(per_seed: dict[int, dict], word_of) -> tuple[str, int]:
    """The word of the t interval, kept only if it survives moving every censored per-seed value STRESS decades
    toward its open side (both ways for one open both ways); else "not resolved (censored)". Returns (word,
    number of censored seeds)."""
    est = t_estimate(per_seed)
    if est is None:
        return "too few seeds", 0
    word = word_of(est["lo"], est["hi"])
    if not est["censored"]:
        return word, 0
    for both in (-1, 1):
        moved = {
            s: {
                "delta": v["delta"] + STRESS * (v["side"] or both) if v["side"] is not None else v["delta"],
                "side": None,
            }
            for s, v in per_seed.items()
        }
        e = t_estimate(moved)
        if word_of(e["lo"], e["hi"]) != word:
            return "not resolved (censored)", est["censored"]
    return word, est["censored"]


def fieller(a: list[float], b: list[float], level: float = 0.95) -> dict | None:
    """The ratio θ = mean(a) / mean(b) of paired means with Fieller's interval: the θ where
    (m_a − θ·m_b)² ≤ t²·(v_aa − 2θ·v_ab + θ²·v_bb), v the variances and covariance of the means, t Student's
    on n − 1 degrees of freedom. {theta, lo, hi}; lo and hi None when the set is not a bounded interval (m_b not
    distinguished from 0)."""
    n = len(a)
    if n < 2 or len(b) != n:
        return None
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    vaa = statistics.variance(a) / n
    vbb = statistics.variance(b) / n
    vab = sum((x - ma) * (y - mb) for x, y in zip(a, b)) / (n - 1) / n
    t2 = t_quantile(0.5 + level / 2, n - 1) ** 2
    theta = ma / mb if mb else math.nan
    qa, qb, qc = mb * mb - t2 * vbb, -2 * (ma * mb - t2 * vab), ma * ma - t2 * vaa
    disc = qb * qb - 4 * qa * qc
    if qa <= 0 or disc < 0:
        return {"theta": theta, "lo": None, "hi": None}
    r = math.sqrt(disc)
    return {"theta": theta, "lo": (-qb - r) / (2 * qa), "hi": (-qb + r) / (2 * qa)}


def gamma_star(shifts: dict[str, dict]) -> dict | None:
    """γ* = ½ + ½·θ, θ = −mean(Δ_{1/√depth}) / mean(D_W): where Δ crosses 0 on the line through γ = ½
    and 1, with Fieller's interval mapped the same way."""
    seeds = sorted(set(shifts["sqrt_depth"]) & set(shifts["wang"]))
    a = [-shifts["sqrt_depth"][s]["delta"] for s in seeds]
    b = [shifts["wang"][s]["delta"] - shifts["sqrt_depth"][s]["delta"] for s in seeds]
    f = fieller(a, b)
    if f is None:
        return None
    g = lambda t: None if t is None else 0.5 + 0.5 * t
    return {"gamma": g(f["theta"]), "lo": g(f["lo"]), "hi": g(f["hi"]), "seeds": seeds}


def verdict(words: dict[str, str], d_w: str, est: dict[str, dict]) -> str:
    """The pre-registered verdict on γ (with its amendment made before any fit), the first rule that holds, from
    the two core arms' words and intervals and D_W's word."""
    sq, wa = words["sqrt_depth"], words["wang"]
    if est["sqrt_depth"] is None or est["wang"] is None:
        return "not resolved (too few seeds: a t interval needs 2)"
    if "censored" in sq or "censored" in wa:
        return "not resolved (censored)"
    if "transfers" in sq and "transfers" in wa:
        return "γ not identified within ½ … 1 (both transfer)"
    if "transfers" in wa and d_w == "greater than 0":
        return "γ = 1 (Wang) supported"
    if "transfers" in sq and d_w == "greater than 0":
        return "γ = ½ supported"
    if "falls" in sq and "rises" in wa:
        return "γ between ½ and 1"
    if round(est["wang"]["hi"], 2) < -TRANSFER:
        return "γ above 1"
    if round(est["sqrt_depth"]["lo"], 2) > TRANSFER:
        return "γ below ½"
    return "not resolved"


def reading(cells: dict, plateau: float, r_lo: int = R_LO, r_hi: int = R_HI) -> dict:
    """Every per-seed reading: per arm Δ, the estimands D_W and D_L, the linearity check, γ* and the verdict."""
    shifts = {a: seed_shifts(cells, a, plateau, r_lo, r_hi) for a in ARMS}
    present = [a for a in ARMS if shifts[a]]
    rows = {}
    for a in present:
        rows[a] = {"est": t_estimate(shifts[a]), "word": robust_word(shifts[a], arm_word), "kind": "arm"}
    for name, w in ESTIMANDS.items():
        if all(a in present for a in w):
            per = combine(shifts, w)
            if name == "linearity":  # Δ_¾ − (Δ_½ + Δ_1)/2
                per = {s: {"delta": v["delta"] / 2, "side": v["side"]} for s, v in per.items()}
            rows[name] = {"est": t_estimate(per), "word": robust_word(per, estimand_word), "kind": "estimand"}
    words = {a: rows[a]["word"][0] for a in present}
    out = {"shifts": shifts, "rows": rows, "r": (r_lo, r_hi)}
    if "sqrt_depth" in present and "wang" in present and "D_W" in rows:
        out["verdict"] = verdict(words, rows["D_W"]["word"][0], {a: rows[a]["est"] for a in present})
        out["gamma_star"] = gamma_star(shifts)
    return out


def seed_mean_shift(cells: dict, arm: str, plateau: float, r_lo: int = R_LO, r_hi: int = R_HI) -> float | None:
    """The rival study's form, for comparison: Δ from the vertices of the seed-mean loss curves (the rates where
    every seed trains)."""
    xs = []
    for r in (r_lo, r_hi):
        rates = sources.by_rate(cells, arm, r)
        ok = {
            lr: statistics.fmean(c["loss"] for c in cs)
            for lr, cs in rates.items()
            if cs and all(sources.trains_cell(c, plateau) for c in cs)
        }
        v = quadratic_vertex(ok) if len(ok) >= 3 else None
        if v is None:
            return None
        xs.append(v["x"])
    return xs[1] - xs[0]


# ---------------------------------------------------------------------------------------- the 50% rate
def logistic(cells: dict, plateau: float) -> dict:
    """One Firth common-slope fit over every run, one intercept per (arm, R); Δ50 per arm and D50_W, D50_L with
    their profile intervals. {"error": ...} when every run trains (or none)."""
    rows = [
        ((a, r), lr, sources.trains_cell(c, plateau))
        for (a, r, lr, _), c in sorted(cells.items())
        if a in ARMS and r in (R_LO, R_MID, R_HI)
    ]
    try:
        fit = boundary.fit(boundary.Data.from_rows(rows))
    except ValueError as err:
        return {"error": str(err)}
    groups = set(fit.data.groups)
    out = {"fit": fit, "cov": coverage(cells, plateau)}  # the runs fitted, for `one_sided`
    d50 = lambda a: {(a, R_HI): 1, (a, R_LO): -1}
    wants = {f"Δ50 {ARM_NAMES[a]}": d50(a) for a in ARMS}
    wants["D50_W"] = {**d50("wang"), **{k: -v for k, v in d50("sqrt_depth").items()}}
    wants["D50_L"] = {**d50("deeploop"), **{k: -v for k, v in d50("wang").items()}}
    out["weights"] = {name: w for name, w in wants.items() if set(w) <= groups}
    for name, w in out["weights"].items():
        out[name] = (fit.combination(w), *fit.interval(w))
    return out


def one_sided(cov: dict, weights: dict) -> list[str]:
    """The (arm, R) groups of a Δ50 combination whose runs all train (or all fail): their 50% rate lies outside
    the rates run, and the Firth fit places it from the penalty and the common slope, not from their data."""
    return [
        f"{ARM_NAMES[a]}, R = {r}: {'every run trains' if not cov[(a, r)]['fails'] else 'no run trains'}"
        for a, r in sorted(weights, key=lambda g: (ARMS.index(g[0]), g[1]))
        if cov[(a, r)]["fails"] in (0, cov[(a, r)]["runs"])
    ]


# ---------------------------------------------------------------------------------------- checks
def coverage(cells: dict, plateau: float) -> dict[tuple[str, int], dict]:
    """(arm, R) -> the finished runs read: how many, each seed's rates, every rate, and how many do not train.
    The readings use whatever has run; this says how much of the design (11 ladder rates × 8 seeds per arm and R)
    each row rests on."""
    out: dict = {}
    for (a, r, lr, s), c in sorted(cells.items()):
        if a in ARMS:
            row = out.setdefault((a, r), {"runs": 0, "seeds": {}, "rates": set(), "fails": 0})
            row["runs"] += 1
            row["seeds"].setdefault(s, set()).add(lr)
            row["rates"].add(lr)
            row["fails"] += not sources.trains_cell(c, plateau)
    return out


def seed_span(seeds) -> str:
    """1-8 for a run of consecutive seeds, else the list."""
    seeds = sorted(seeds)
    if len(seeds) > 1 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ", ".join(map(str, seeds))


def ladder_count(cov: dict, arm: str, r: int) -> int:
    """How many of the 11 ladder rates every seed an arm has at R has run (the fewest over its seeds; 0 when it has
    none); a rate matches within 0.01 decades (the sweeps round the ×√2 steps to 3 digits: at most 0.002 off)."""
    seeds = cov.get((arm, r), {}).get("seeds", {})
    return min((on_ladder(rates) for rates in seeds.values()), default=0)


def on_ladder(rates) -> int:
    return len(ladder_rates(rates))


def same_rate(a: float, b: float) -> bool:
    """Two rates are one rate when within 0.01 decades (the sweeps round the ladder to 3 digits)."""
    return abs(math.log10(a / b)) < 0.01


def ladder_rates(rates) -> set[float]:
    """The ladder rates among `rates` (`same_rate`)."""
    return {x for x in LADDER if any(same_rate(lr, x) for lr in rates)}


def unread(cov: dict) -> dict[str, str]:
    """arm -> why it is not read. By the reading plan (amended 2026-12-07, before any DeepLoop ladder cell was
    read), an arm is read when its ladder is whole: at every R the reading has (of 2, 12, 24), every seed the
    reading has holds every ladder rate any group of the reading holds (the core's 9 or the ladder's 11). An arm
    that is not whole enters no estimate, no estimand, no Δ50 fit and no 1,000-step rate; its runs are counted."""
    groups = [g for g in cov if g[1] in (R_LO, R_MID, R_HI)]
    if not groups:
        return {}
    rounds = sorted({r for _, r in groups})
    seeds = sorted({s for g in groups for s in cov[g]["seeds"]})
    design = set().union(*(ladder_rates(rates) for g in groups for rates in cov[g]["seeds"].values()))
    out = {}
    for arm in sorted({a for a, _ in groups}, key=ARMS.index):
        gaps = []
        for r in rounds:
            have = cov.get((arm, r), {"seeds": {}})["seeds"]
            runs = sum(len(ladder_rates(have.get(s, ())) & design) for s in seeds)
            if runs < len(seeds) * len(design):
                gaps.append(f"R = {r}: {runs} of {len(seeds) * len(design)} ladder runs")
        if gaps:
            out[arm] = "; ".join(gaps)
    return out


def on_tail(lr: float) -> bool:
    """Whether `lr` is one of the tail's rates (`same_rate`)."""
    return any(same_rate(lr, x) for x in TAIL)


def tail_unread(cov: dict) -> dict[str, str]:
    """arm -> why its tail is not read. By the reading plan (amended 2026-12-07, night, before any tail cell had
    run), an arm's tail is read when whole: its 10 rates × seeds 1-3 × R = 2, 12 and 24 (90 runs); until then its
    tail runs enter no vertex and no Δ50 fit, and are counted. An arm with no tail run has nothing held back."""
    need = len(TAIL) * len(TAIL_SEEDS) * 3
    out = {}
    for arm in ARMS:
        runs = sum(
            sum(map(on_tail, cov.get((arm, r), {"seeds": {}})["seeds"].get(s, ())))
            for r in (R_LO, R_MID, R_HI)
            for s in TAIL_SEEDS
        )
        if 0 < runs < need:
            out[arm] = f"{runs} of {need} tail runs"
    return out


def held_list(held: dict[str, str]) -> str:
    """The arms `unread` holds back, each with its gaps, as one line."""
    return "; ".join(f"{ARM_NAMES[a]} ({why})" for a, why in held.items())


def reproducibility(cells: dict, rival: dict) -> dict:
    """The cells this experiment shares with the rival grid (same arm, R, rate and seed): how many, how many
    have bitwise equal final losses, the largest absolute difference, and the same per rate."""
    shared = [
        (k, abs(c["loss"] - rival[k]["loss"]))
        for k, c in cells.items()
        if k in rival and c["loss"] is not None and rival[k]["loss"] is not None
    ]
    by_rate: dict[float, list[float]] = {}
    for k, d in shared:
        by_rate.setdefault(k[2], []).append(d)
    diffs = [d for _, d in shared]
    return {
        "shared": len(shared),
        "equal": sum(d == 0 for d in diffs),
        "max_diff": max(diffs, default=None),
        "by_rate": {lr: (len(ds), sum(d == 0 for d in ds), max(ds)) for lr, ds in sorted(by_rate.items())},
    }


def long_rates(cells: dict, plateau: float) -> dict[tuple[str, int], list[float]]:
    """The 1,000-step check's rates, by the pre-registered rule: per arm and R ∈ {2, 12}, the ladder rate nearest
    (in log) the 200-step seed-mean vertex, and two ladder rates either side of it (clipped to the ladder)."""
    out = {}
    for arm in ARMS:
        for r in (R_LO, R_MID):
            rates = sources.by_rate(cells, arm, r)
            ok = {
                lr: statistics.fmean(c["loss"] for c in cs)
                for lr, cs in rates.items()
                if all(sources.trains_cell(c, plateau) for c in cs)
            }
            v = quadratic_vertex(ok) if len(ok) >= 3 else None
            if v is None:
                continue
            i = min(range(len(LADDER)), key=lambda k: abs(math.log10(LADDER[k]) - v["x"]))
            i = min(max(i, 2), len(LADDER) - 3)
            out[(arm, r)] = list(LADDER[i - 2 : i + 3])
    return out


def long_sweep(rates: dict, plateau: float) -> str:
    """The 1,000-step check's sweep file (YAML text) from `long_rates`."""
    import yaml

    lam = {r: round(r**0.25, 6) for r in (R_LO, R_MID)}
    include = []
    for (arm, r), lrs in rates.items():
        head = (
            {"model.config.residual": ["deeploop"]}
            if arm == "deeploop"
            else {
                "model.config.residual": ["preln"],
                "model.config.branch_scale": ["wang"],
                "model.config.branch_lambda": [lam[r]],
            }
            if arm == "threequarter"
            else {"model.config.residual": ["preln"], "model.config.branch_scale": [arm]}
        )
        include.append(
            {**head, "model.config.n_rounds": [r], "model.optim.lr": lrs, "seed_everything": list(LONG_SEEDS)}
        )
    spec = {
        "description": "The depth exponent, the 1,000-step check around each 200-step vertex.",
        "base": ["configs/deeploop_r6.yaml", "configs/cpu.yaml", "configs/study_map.yaml"],
        "overrides": {"trainer.max_steps": LONG_STEPS},
        "include": include,
        "out": "runs/sweeps/gamma_long",
    }
    lines = [
        "# Written by `python -m experiments.gamma.readings long-sweep` by the rule of",
        "# docs/results/gamma/PREREGISTRATION.md: per arm and R, the ladder rate nearest the 200-step seed-mean",
        f"# vertex and two ladder rates either side, seeds 1-3, {LONG_STEPS} steps (plateau {plateau:.4f}).",
    ]
    lines += [f"# - {ARM_NAMES[a]} at R = {r}: " + ", ".join(f"{x:.3g}" for x in lrs) for (a, r), lrs in rates.items()]
    return "\n".join(lines) + "\n" + yaml.safe_dump(spec, sort_keys=False, width=110)


def long_cells(folders) -> dict:
    """The 1,000-step check's cells (`read`), refused when a completed one did not run `LONG_STEPS` steps (a
    200-step folder passed as --long would read as "no change")."""
    cells = read(folders)
    short = sorted(c["cell"] for c in cells.values() if c["status"] == "completed" and c.get("steps") != LONG_STEPS)
    if short:
        raise ValueError(
            f"--long: {len(short)} completed cell(s) did not run {LONG_STEPS} steps (e.g. {short[0]}); fix: pass the "
            "1,000-step check's runs (runs/sweeps/gamma_long, from configs/sweeps/gamma/long.yaml)"
        )
    return cells


def long_design(cells: dict, plateau: float) -> dict[str, set[tuple[int, float, int]]]:
    """arm -> the 1,000-step check's cells (R, rate, seed) by the rule (`long_rates` × `LONG_SEEDS`)."""
    out: dict[str, set] = {}
    for (arm, r), lrs in long_rates(cells, plateau).items():
        out.setdefault(arm, set()).update((r, lr, s) for lr in lrs for s in LONG_SEEDS)
    return out


def long_unread(design: dict, long: dict) -> dict[str, str]:
    """arm -> "k of n check runs" for each arm whose check is not whole (a cell of its design not finished): such
    an arm is counted, not read, as an arm whose ladder is not whole is (rates matched by `same_rate`)."""
    out = {}
    for arm, want in design.items():
        done = sum(any((a, rr, ss) == (arm, r, s) and same_rate(x, lr) for a, rr, x, ss in long) for r, lr, s in want)
        if done < len(want):
            out[arm] = f"{done} of {len(want)} check runs"
    return out


def change_word(lo: float, hi: float) -> str:
    """The 1,000-step check's word on the change of Δ₁₂: holds (inside ±0.15), moves (excludes 0), else not
    resolved."""
    lo, hi = round(lo, 2), round(hi, 2)
    return "holds" if -TRANSFER <= lo and hi <= TRANSFER else "moves" if lo > 0 or hi < 0 else "not resolved"


def long_check(short: dict, long: dict, plateau: float) -> dict:
    """Per arm whose check is whole: Δ₁₂ at 1,000 steps (each seed's own vertex over the check's rates), Δ₁₂ at 200
    steps (the same seeds, over the ladder) and their change per seed, each with its t interval; the change's word
    (`change_word`) must survive moving a censored per-seed value toward its open side, as every word must
    (`robust_word`). "held": the arms whose check is not whole, counted."""
    held = long_unread(long_design(short, plateau), long)
    out: dict = {"held": held, "rows": {}}
    for arm in ARMS:
        if arm in held:
            continue
        a = seed_shifts(long, arm, plateau, R_LO, R_MID)
        b = seed_shifts(short, arm, plateau, R_LO, R_MID)
        seeds = sorted(set(a) & set(b))
        a, b = ({s: d[s] for s in seeds} for d in (a, b))
        per = combine({"long": a, "short": b}, {"long": 1, "short": -1})
        est = t_estimate(per)
        if est is None:
            continue
        out["rows"][arm] = {
            "long": t_estimate(a),
            "short": t_estimate(b),
            "change": est,
            "word": robust_word(per, change_word),
        }
    return out


# ---------------------------------------------------------------------------------------- the report
def seeds_n(est: dict | None) -> str:
    return "— (under 2 seeds)" if est is None else f"{est['seeds']} ({est['n']})"


def fmt(est: dict | None, spec: str = "{:+.2f}") -> str:
    if est is None:
        return "— | —"
    return f"{spec.format(est['mean'])} | [{spec.format(est['lo'])}, {spec.format(est['hi'])}]"


def markdown(
    res: dict,
    cells: dict,
    plateau: float,
    argv: list[str],
    logit: dict,
    repro: dict | None,
    res12: dict | None,
    longc: dict | None,
    cov: dict,
    held: dict[str, str],
    tail_held: dict[str, str] | None = None,
) -> list[str]:
    md = [
        "# The depth exponent γ: the readings stated before any fit, computed",
        "",
        (
            f"Written by `python -m experiments.gamma.readings {' '.join(argv)}`; the rules are in "
            "`docs/results/gamma/PREREGISTRATION.md` and coded in `experiments/gamma/readings.py`. A seed trains when it "
            f"completed with its final validation loss below the plateau {plateau:.4f} − 0.1 nat."
        ),
        "",
    ]
    if "verdict" in res:
        md += [f"**Verdict (R = {R_LO} → {R_HI}): {res['verdict']}**", ""]
    elif any(a in held for a in ESTIMANDS["D_W"]):
        md += [f"**Verdict (R = {R_LO} → {R_HI}): not read (a core arm's ladder is not whole)**", ""]
    if held:
        md += [
            (
                "Not read (an arm is read when its ladder is whole: every ladder rate of the reading, for every seed, "
                "at every R; the runs are counted below): " + held_list(held) + "."
            ),
            "",
        ]
    md += [
        (
            "Every interval: the mean over seeds of per-seed estimates (each seed's own vertices) with its 95% "
            "Student t interval on n − 1 degrees of freedom; the seeds are named in each row."
        ),
        "",
        f"## Δ = log10 η*({R_HI}) − log10 η*({R_LO}) per arm, and the estimands",
        "",
        "| quantity | seeds (n) | mean (decades) | 95% t interval | word | censored seeds | seed-mean vertex Δ "
        f"| ladder rates read (R = {R_LO} / {R_HI}) |",
        "|---|---|---:|---|---|---:|---:|---|",
    ]
    names = {
        **ARM_NAMES,
        "D_W": "D_W = Δ_Wang − Δ_1/√depth",
        "D_L": "D_L = Δ_DeepLoop − Δ_Wang",
        "linearity": "Δ_¾ − (Δ_½ + Δ_1)/2 (linearity)",
    }

    def rates_read(key: str, r_lo: int, r_hi: int) -> str:
        """How many of the 11 ladder rates the row rests on at each R (an estimand: its arms' fewest)."""
        arms = ESTIMANDS.get(key, {key: 1})
        return " / ".join(f"{min(ladder_count(cov, a, r) for a in arms)}" for r in (r_lo, r_hi))

    for key, row in res["rows"].items():
        est, (word, cens) = row["est"], row["word"]
        sm = seed_mean_shift(cells, key, plateau) if row["kind"] == "arm" else None
        md.append(
            f"| {names[key]} | {seeds_n(est)} | {fmt(est)} | {word} | {cens} | "
            f"{'—' if sm is None else f'{sm:+.2f}'} | {rates_read(key, R_LO, R_HI)} |"
        )
    gs = res.get("gamma_star")
    if gs:
        ci = "unbounded (D_W not distinguished from 0)" if gs["lo"] is None else f"[{gs['lo']:.2f}, {gs['hi']:.2f}]"
        df = len(gs["seeds"]) - 1
        md += [
            "",
            (
                f"γ* (Δ = 0 on the line through γ = ½ and 1; Fieller's 95% interval, t on {df} "
                f"degrees of freedom; descriptive): {gs['gamma']:.2f} {ci}."
            ),
        ]
    if res12:
        md += [
            "",
            "## Δ₁₂ = log10 η*(12) − log10 η*(2) (the rival study's span)",
            "",
            f"| quantity | seeds (n) | mean (decades) | 95% t interval | word | censored seeds | ladder rates read "
            f"(R = {R_LO} / {R_MID}) |",
            "|---|---|---:|---|---|---:|---|",
        ]
        for key, row in res12["rows"].items():
            (word, cens), est = row["word"], row["est"]
            md.append(
                f"| {names[key]} | {seeds_n(est)} | {fmt(est)} | {word} | {cens} | {rates_read(key, R_LO, R_MID)} |"
            )
    md += [
        "",
        "## The runs read",
        "",
        (
            f"The design: per arm and R, the {len(LADDER)} ladder rates × seeds 1-8 (the core: the first 9 rates, "
            f"1/√depth and Wang at R = {R_LO} and {R_HI}), and the tail's 10 rates × seeds 1-3. An arm is read when its "
            "ladder is whole; the rows above give the ladder rates they rest on (the fewest any of its seeds has)."
        ),
        "",
        "| arm | R | runs | seeds | ladder rates a seed has (fewest–most, of 11) | rates off the ladder | runs that "
        "do not train |",
        "|---|---:|---:|---|---:|---:|---:|",
    ]
    for (a, r), row in sorted(cov.items(), key=lambda kv: (ARMS.index(kv[0][0]), kv[0][1])):
        per_seed = [on_ladder(rates) for rates in row["seeds"].values()]
        span = f"{min(per_seed)}" if min(per_seed) == max(per_seed) else f"{min(per_seed)}–{max(per_seed)}"
        md.append(
            f"| {ARM_NAMES[a]} | {r} | {row['runs']} | {seed_span(row['seeds'])} | {span} | "
            f"{len(row['rates']) - on_ladder(row['rates'])} | {row['fails']} |"
        )
    md += ["", "## Δ50, the 50%-trains rate's shift (secondary)", ""]
    if tail_held:
        md += [
            (
                f"The tail not read (an arm's tail is read when whole: {len(TAIL)} rates × seeds "
                f"{seed_span(TAIL_SEEDS)} × R = {R_LO}, {R_MID} and {R_HI}; until then its tail runs enter no vertex "
                "and no Δ50 fit): " + held_list(tail_held) + "."
            ),
            "",
        ]
    if "error" in logit:
        md += [f"No logistic fit: {logit['error']}."]
    else:
        md += [
            (
                f"One Firth common-slope fit over every run of the arms read (slope {logit['fit'].slope:.2f} per decade; plain "
                f"maximum-likelihood fit {'separated' if logit['fit'].separated else 'exists'}); 95% profile-likelihood "
                "intervals (χ²₁ on the penalised likelihood, approximate coverage)."
            ),
            "",
            "| quantity | estimate (decades) | 95% profile interval | word |",
            "|---|---:|---|---|",
        ]
        for name, (v, lo, hi) in ((k, v) for k, v in logit.items() if k not in ("fit", "weights", "cov")):
            word = (
                "open interval: not resolved"
                if lo is None or hi is None
                else estimand_word(lo, hi)
                if name.startswith("D50")
                else arm_word(lo, hi)
            )
            unmeasured = one_sided(logit["cov"], logit["weights"][name])
            if unmeasured:  # a word on a rate the data do not bracket would be the penalty's, not the runs'
                word = f"not measured ({'; '.join(unmeasured)})"
            md.append(f"| {name} | {sources.signed(v)} | {sources.fmt_ci(lo, hi, spec='{:+.2f}')} | {word} |")
    if longc is not None:
        md += [
            "",
            f"## The 1,000-step check: Δ₁₂ at {LONG_STEPS:,} steps − Δ₁₂ at 200 steps",
            "",
            (
                f"Per seed ({seed_span(LONG_SEEDS)}): Δ₁₂ from its own vertices over the check's five rates at "
                f"{LONG_STEPS:,} steps, minus its Δ₁₂ at 200 steps over the ladder; each the mean with its 95% t "
                "interval on n − 1 degrees of freedom. A censored seed has a vertex at the edge of its rates."
            ),
            "",
        ]
        if longc["held"]:
            md += [
                f"Not read (an arm is read when its check is whole: five rates × seeds {seed_span(LONG_SEEDS)} × R = "
                f"{R_LO} and {R_MID}): " + held_list(longc["held"]) + ".",
                "",
            ]
        if longc["rows"]:
            md += [
                f"| arm | seeds (n) | Δ₁₂ at {LONG_STEPS:,} steps | 95% t interval | Δ₁₂ at 200 steps | 95% t interval "
                "| change (decades) | 95% t interval | word | censored seeds |",
                "|---|---|---:|---|---:|---|---:|---|---|---:|",
            ]
        for a, r in longc["rows"].items():
            word, cens = r["word"]
            md.append(
                f"| {ARM_NAMES[a]} | {seeds_n(r['change'])} | {fmt(r['long'])} | {fmt(r['short'])} | "
                f"{fmt(r['change'])} | {word} | {cens} |"
            )
    if repro is not None:
        md += [
            "",
            "## Reproducibility against the rival grid",
            "",
            f"{repro['shared']} cells shared with the rival grid (same arm, R, rate, seed); {repro['equal']} have "
            "bitwise equal final losses; largest absolute difference "
            + ("—" if repro["max_diff"] is None else f"{repro['max_diff']:.3g}")
            + " nat/byte. By rate:",
            "",
            "| rate | shared cells | bitwise equal | largest absolute difference (nat/byte) |",
            "|---:|---:|---:|---:|",
            *(f"| {lr:g} | {n} | {eq} | {mx:.2g} |" for lr, (n, eq, mx) in repro["by_rate"].items()),
        ]
    return md + [""]


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(
        prog="python -m experiments.gamma.readings",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("command", choices=("readings", "long-sweep"))
    p.add_argument("--cells", nargs="+", required=True, help="the 200-step cells: report or sweep run folders")
    p.add_argument("--long", nargs="*", default=[], help="the 1,000-step check's cells")
    p.add_argument("--rival", help="the rival grid (report folder), for the reproducibility check")
    p.add_argument("--out", required=True, help="readings: the markdown file; long-sweep: the sweep file")
    p.add_argument("--plateau", default="auto", help="the unigram plateau in nats, or auto (the first folder's)")
    args = p.parse_args(argv)
    with one_line_errors("loopnet gamma", (ValueError, FileNotFoundError)):
        plateau = sources.plateau(args.cells, args.plateau)
        cells = read(args.cells)
        if not any(a in ARMS for a, *_ in cells):
            raise ValueError(
                f"no finished cell of the gamma sweeps in {', '.join(args.cells)}; fix: run "
                "configs/sweeps/gamma/core.yaml first (make gamma-core)"
            )
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        cov = coverage(cells, plateau)
        held, tail_held = unread(cov), tail_unread(cov)
        whole = {k: c for k, c in cells.items() if k[0] not in held and not (k[0] in tail_held and on_tail(k[2]))}
        if args.command == "long-sweep":
            if held:
                raise ValueError(
                    "the 1,000-step rates come from whole ladders; not whole: "
                    + held_list(held)
                    + "; fix: finish the ladder (make gamma) first"
                )
            out.write_text(long_sweep(long_rates(cells, plateau), plateau))
            print(f"loopnet gamma: wrote {out}")
            return
        res = reading(whole, plateau)
        has12 = any(r == R_MID for _, r, _, _ in whole)
        res12 = reading(whole, plateau, R_LO, R_MID) if has12 else None
        longc = long_check(whole, long_cells(args.long), plateau) if args.long else None
        repro = None
        if args.rival:
            rival = sources.merge(sources.read(args.rival))
            repro = reproducibility(cells, rival)
        md = markdown(res, cells, plateau, argv, logistic(whole, plateau), repro, res12, longc, cov, held, tail_held)
    out.write_text("\n".join(md))
    print(f"loopnet gamma: verdict: {res.get('verdict', '— (the core is not whole)')}")
    if held:
        print(f"loopnet gamma: not read, its ladder not whole: {held_list(held)}")
    if tail_held:
        print(f"loopnet gamma: the tail not read, not whole: {held_list(tail_held)}")
    print(f"loopnet gamma: wrote {out}")


if __name__ == "__main__":
    main()
