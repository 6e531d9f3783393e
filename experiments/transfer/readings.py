"""The transfer readings (docs/results/transfer/PREREGISTRATION.md), by the rules stated there before any fit:

    python -m experiments.transfer.readings --cells runs/sweeps/transfer_source runs/sweeps/transfer_width \\
        runs/sweeps/transfer_target --out docs/results/transfer

--cells takes sweep run folders (their summaries name each run's parametrization, residual rule, width and R) or
a `cells.csv` this command wrote before. It writes OUT/cells.csv (one row per run) and OUT/readings.md.

Arms: standard (`standard` + DeepLoop), μP (`mup` + DeepLoop) and μP + CompleteP (`completep` + Pre-LN). Cells:
source (d = 64, R = 2), width (d = 256, R = 2), target (d = 256, R = 12). At the source every μP rule is 1, so
the μP arm's source runs are the standard arm's (the same runs).

Per arm and cell: each seed's best rate x_i = log10 η*_i, the vertex of a quadratic in log10 η fitted to that
seed's final losses within 0.31 decades of its lowest loss, among the rates where it trains (censored at the
nearer edge when outside or opening downward); the cell's x̄, their mean, undecided when more than one seed is
censored. A shift Δ* = x̄(B) − x̄(A) has Welch's 95% t interval. Δ50, the 50%-trains rate's shift, comes from one
Firth common-slope logistic fit per arm over its two cells' runs, with the profile-likelihood interval. The loss
lost by transferring is paired by seed with Student's t interval.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from collections import Counter
from pathlib import Path

from loopnet.env import one_line_errors
from loopnet.study import boundary
from loopnet.study.measures import capped_loss, paired_interval, quadratic_vertex, t_quantile, trains

ARMS = {("standard", "deeploop"): "standard", ("mup", "deeploop"): "mup", ("completep", "preln"): "completep"}
ARM_NAMES = {"standard": "standard + DeepLoop", "mup": "μP + DeepLoop", "completep": "μP + CompleteP (Pre-LN)"}
CELLS = {(64, 2): "source", (256, 2): "width", (256, 12): "target"}
HALF_WIDTH = 0.31  # decades: two ×√2 steps either side of a seed's lowest loss
THRESHOLD = 0.15  # decades: one ×√2 ladder step
COST = 0.02  # nat/byte: the loss-lost threshold
WIDTH_STUDY = -0.65  # decades: the width study's DeepLoop Δ50, d = 64 → 256 at R = 2, standard parametrization
FIELDS = ("arm", "cell", "d", "R", "lr", "seed", "status", "loss", "init_loss")


# ---------------------------------------------------------------------------------------- cells
def _init_loss(run_dir: Path, vocab: int | None) -> float:
    """ℓ₀ of one run: its step-0 training loss, else ln V (the map's rule, `report.map.init_loss`)."""
    from loopnet.study.report.runs import read_curves

    curve = read_curves(run_dir, ("train/loss",)).get("train/loss") or []
    if curve and curve[0][0] == 0:
        return float(curve[0][1])
    return math.log(vocab) if vocab else math.nan


def _arm_cell(run, default: dict) -> tuple[str | None, str | None]:
    """(arm, cell) of a run: from its summary's config once finished, else from the sweep's grid values over the
    config of the folder's finished runs (the sweep's fixed overrides, d_model among them)."""
    cfg = (run.summary or {}).get("config")
    if not cfg:
        cfg = dict(default)
        cfg.setdefault("parametrization", "standard")
        cfg.update({k.removeprefix("model.config."): v for k, v in run.params.items() if k.startswith("model.config.")})
    return (
        ARMS.get((cfg.get("parametrization", "standard"), cfg.get("residual"))),
        CELLS.get((cfg.get("d_model"), cfg.get("n_rounds"))),
    )


def _from_runs(folder: Path) -> list[dict]:
    """The finished runs of a sweep folder, by cell. A cell of the sweep (arm × d × R) with a run not yet finished
    is left out whole, and said on stderr: a reading computed on part of a cell's ladder would be another
    estimator (a 50%-trains rate without its highest rates, a best rate without some seeds)."""
    from loopnet.study.report.runs import load_runs

    every = load_runs(folder)[0]
    finished = [r for r in every if r.summary and r.summary.get("config")]
    base = [r for r in finished if "model.config.parametrization" not in r.params]  # the grid's own runs
    default = (base or finished)[0].summary["config"] if finished else {}
    keys = [_arm_cell(run, default) for run in every]
    planned, unfinished = Counter(keys), Counter(k for k, run in zip(keys, every) if not run.finished)
    for (arm, cell), n in unfinished.items():
        if arm is not None and cell is not None:
            print(
                f"loopnet transfer: {folder}: {ARM_NAMES[arm]}, {cell} cell: {planned[(arm, cell)] - n} of "
                f"{planned[(arm, cell)]} runs finished; the cell is left out until every run has",
                file=sys.stderr,
            )
    out = []
    for run, (arm, cell) in zip(every, keys):
        if not run.finished or not run.summary.get("config") or unfinished[(arm, cell)]:
            continue
        cfg = run.summary["config"]
        if arm is None or cell is None or run.lr is None:
            continue
        loss = run.value("final_val_loss")
        out.append(
            {
                "arm": arm,
                "cell": cell,
                "d": cfg["d_model"],
                "R": cfg["n_rounds"],
                "lr": float(run.lr),
                "seed": int(run.seed),
                "status": run.status,
                "loss": None if loss is None else float(loss),
                "init_loss": _init_loss(folder / run.id, cfg.get("vocab_size")),
            }
        )
    return out


def _from_csv(path: Path) -> list[dict]:
    out = []
    for row in csv.DictReader(path.open()):
        out.append(
            dict(
                row,
                d=int(row["d"]),
                R=int(row["R"]),
                lr=float(row["lr"]),
                seed=int(row["seed"]),
                loss=float(row["loss"]) if row["loss"] else None,
                init_loss=float(row["init_loss"]),
            )
        )
    return out


def read(folders) -> dict[tuple, dict]:
    """(arm, cell, lr, seed) -> run, over the folders given (the first finished run wins). The μP arm's source
    runs are the standard arm's (every μP rule is 1 at d = d₀): they are added under "mup" too."""
    runs: dict[tuple, dict] = {}
    for folder in map(Path, folders):
        if (folder / "cells.csv").is_file():
            rows = _from_csv(folder / "cells.csv")
        elif folder.suffix == ".csv" and folder.is_file():
            rows = _from_csv(folder)
        else:
            from loopnet.study.sweep import MANIFEST

            if not (folder / MANIFEST).is_file():
                raise ValueError(
                    f"{folder} has neither cells.csv nor a sweep manifest ({MANIFEST}); fix: pass the transfer "
                    "sweeps' run folders (runs/sweeps/transfer_*) or a cells.csv this command wrote"
                )
            rows = _from_runs(folder)
        for r in rows:
            if r["arm"] == "mup" and r["cell"] == "source":
                continue  # the source of μP is the standard arm's runs, by the design
            runs.setdefault((r["arm"], r["cell"], r["lr"], r["seed"]), r)
    for (arm, cell, lr, seed), r in list(runs.items()):
        if arm == "standard" and cell == "source":
            runs[("mup", cell, lr, seed)] = dict(r, arm="mup")
    return runs


def write_csv(runs: dict, path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        for key in sorted(runs):
            r = runs[key]
            if r["arm"] == "mup" and r["cell"] == "source":
                continue  # the standard arm's rows
            w.writerow({k: ("" if r[k] is None else r[k]) for k in FIELDS})


def trains_run(r: dict, plateau: float) -> bool:
    return trains(r["status"], r["loss"], plateau)


# ---------------------------------------------------------------------------------------- best rates
def seed_vertices(runs: dict, arm: str, cell: str, plateau: float) -> dict[int, dict]:
    """seed -> {x, censored} of that seed's quadratic vertex (None-free: seeds with under 3 trainable rates are
    reported as censored at no value, x None)."""
    curves: dict[int, dict[float, float]] = {}
    for (a, c, lr, s), r in runs.items():
        if a == arm and c == cell:
            curves.setdefault(s, {})
            if trains_run(r, plateau):
                curves[s][lr] = r["loss"]
    out = {}
    for s, curve in sorted(curves.items()):
        v = quadratic_vertex(curve, HALF_WIDTH) if curve else None
        out[s] = {"x": None, "censored": True} if v is None else {"x": v["x"], "censored": v["censored"] != 0}
    return out


def best_rate(runs: dict, arm: str, cell: str, plateau: float) -> dict | None:
    """{x (x̄), xs, seeds, censored, decided}: decided unless more than one seed is censored; None when no seed."""
    v = seed_vertices(runs, arm, cell, plateau)
    if not v:
        return None
    xs = [e["x"] for e in v.values() if e["x"] is not None]
    censored = sum(e["censored"] for e in v.values())
    return {
        "x": statistics.fmean(xs) if xs else None,
        "xs": xs,
        "seeds": sorted(v),
        "censored": censored,
        "decided": censored <= 1 and len(xs) >= 2,
    }


def welch(terms: list[tuple[float, list[float]]]) -> dict | None:
    """Σ w·mean(sample) over independent samples with its 95% t interval, Welch–Satterthwaite degrees of freedom
    (for two samples, weights +1 and −1: Welch's interval). {est, lo, hi, df}; None when a sample has under 2."""
    if any(len(xs) < 2 for _, xs in terms):
        return None
    est = sum(w * statistics.fmean(xs) for w, xs in terms)
    vs = [(w * w * statistics.variance(xs) / len(xs), len(xs)) for w, xs in terms]
    var = sum(v for v, _ in vs)
    if var == 0:
        return {"est": est, "lo": est, "hi": est, "df": math.inf}
    df = var**2 / sum(v * v / (n - 1) for v, n in vs)
    half = t_quantile(0.975, df) * math.sqrt(var)
    return {"est": est, "lo": est - half, "hi": est + half, "df": df}


def shift(best: dict, a: str, b: str) -> dict | None:
    """Δ* = x̄(b) − x̄(a) with Welch's interval; {"undecided": ...} when either cell has no best rate."""
    if best.get(a) is None or best.get(b) is None:
        return None
    for c in (a, b):
        if not best[c]["decided"]:
            return {"undecided": f"{c}: {best[c]['censored']} of {len(best[c]['seeds'])} seeds censored"}
    return welch([(1.0, best[b]["xs"]), (-1.0, best[a]["xs"])])


# ---------------------------------------------------------------------------------------- 50% rates
def logistic(runs: dict, arm: str, cells: tuple[str, str], plateau: float) -> boundary.Fit | None:
    rows = [(c, lr, trains_run(r, plateau)) for (a, c, lr, _), r in sorted(runs.items()) if a == arm and c in cells]
    if {c for c, _, _ in rows} != set(cells):
        return None
    return boundary.fit(boundary.Data.from_rows(rows))


def delta50(runs: dict, arm: str, a: str, b: str, plateau: float) -> dict | None:
    """Δ50 = c_b − c_a from the arm's common-slope Firth fit over the two cells' runs, profile interval."""
    try:
        fit = logistic(runs, arm, (a, b), plateau)
    except ValueError as err:
        return {"undecided": str(err)}
    if fit is None:
        return None
    w = {b: 1, a: -1}
    lo, hi = fit.interval(w)
    return {"est": fit.combination(w), "lo": lo, "hi": hi, "slope": fit.slope, "separated": fit.separated}


def joint_profile(std: boundary.Fit, mup: boundary.Fit, v: float, span: float = 3.0, tol: float = 1e-4) -> float:
    """max over c of P_std(c_width = c) + P_μP(c_width = c + v), by golden-section search within `span` decades of
    the standard arm's width centre."""
    f = lambda c: std.profile({"width": 1}, c) + mup.profile({"width": 1}, c + v)
    centre = std.x50("width")
    lo, hi = centre - span, centre + span
    g = (math.sqrt(5) - 1) / 2
    x1, x2 = hi - g * (hi - lo), lo + g * (hi - lo)
    f1, f2 = f(x1), f(x2)
    while hi - lo > tol:
        if f1 < f2:
            lo, x1, f1 = x1, x2, f2
            x2 = lo + g * (hi - lo)
            f2 = f(x2)
        else:
            hi, x2, f2 = x2, x1, f1
            x1 = hi - g * (hi - lo)
            f1 = f(x1)
    return max(f1, f2)


def joint_drift_difference(runs: dict, plateau: float, span: float = 3.0, tol: float = 1e-4) -> dict | None:
    """Δ50_W(μP) − Δ50_W(standard) in the joint model, a slope per arm. The source runs are one set (μP's are the
    standard's), so the source has one centre, fitted with the standard arm's slope; the difference is then
    c(μP width) − c(standard width). The two arms' parameters are disjoint and Firth's penalty of a
    block-diagonal information is the sum of the blocks', so the joint profile at v is
    max_c [P_std(c_width = c) + P_μP(c_width = c + v)], a one-dimensional maximum, and the interval is where twice
    the drop from the joint maximum reaches χ²₁(0.95)."""
    try:
        std = logistic(runs, "standard", ("source", "width"), plateau)
        rows = [
            ("width", lr, trains_run(r, plateau)) for (a, c, lr, _), r in runs.items() if a == "mup" and c == "width"
        ]
        if std is None or not rows:
            return None
        mup = boundary.fit(boundary.Data.from_rows(rows))
    except ValueError as err:
        return {"undecided": str(err)}
    c_std, c_mup = std.x50("width"), mup.x50("width")
    top = std.value + mup.value
    joint = lambda v: joint_profile(std, mup, v, span, tol)
    est = c_mup - c_std
    drop = lambda v: 2 * (top - joint(v)) - boundary.CHI2_95
    lo, hi = boundary.profile_interval(est, drop, span, tol)
    return {"est": est, "lo": lo, "hi": hi, "fits": (std, mup)}


# ---------------------------------------------------------------------------------------- loss lost
def loss_lost(runs: dict, arm: str, cell: str, source_x: float, plateau: float) -> dict | None:
    """At `cell`: η_g the ladder rate nearest 10^source_x, η_b the rate with the lowest seed-mean loss among those
    where every seed completed; lost_i = ℓ_i(η_g) − ℓ_i(η_b), a diverged run at η_g counting its ℓ₀."""
    by_rate: dict[float, dict[int, dict]] = {}
    for (a, c, lr, s), r in runs.items():
        if a == arm and c == cell:
            by_rate.setdefault(lr, {})[s] = r
    if not by_rate:
        return None
    seeds = sorted(set.intersection(*(set(v) for v in by_rate.values())))
    full = {lr: v for lr, v in by_rate.items() if all(v[s]["status"] == "completed" for s in seeds)}
    if not full:
        return {"undecided": "no rate where every seed completed"}
    eta_b = min(full, key=lambda lr: statistics.fmean(full[lr][s]["loss"] for s in seeds))
    eta_g = min(by_rate, key=lambda lr: abs(math.log10(lr) - source_x))
    cap = lambda r: capped_loss(r["status"], r["loss"], r["init_loss"])
    diffs = [cap(by_rate[eta_g][s]) - by_rate[eta_b][s]["loss"] for s in seeds]
    p = paired_interval(diffs)
    if p is None:
        return None
    diverged = sum(by_rate[eta_g][s]["status"] != "completed" for s in seeds)
    return dict(p, eta_g=eta_g, eta_b=eta_b, diverged=diverged, seeds=seeds)


# ---------------------------------------------------------------------------------------- words
def _open(e: dict | None) -> str | None:
    if e is None:
        return "not run"
    if "undecided" in e:
        return f"undecided ({e['undecided']})"
    if e["lo"] is None or e["hi"] is None:
        return "undecided (open interval)"
    return None


def transfer_word(e: dict | None) -> str:
    """On the interval's two printed decimals: transfers inside ±0.15, does not transfer wholly outside."""
    if _open(e):
        return _open(e)
    lo, hi = round(e["lo"], 2), round(e["hi"], 2)
    if -THRESHOLD <= lo and hi <= THRESHOLD:
        return "transfers"
    if hi < -THRESHOLD or lo > THRESHOLD:
        return "does not transfer"
    return "undecided"


def replicates_word(e: dict | None) -> str:
    if _open(e):
        return _open(e)
    return "replicates the width study" if e["lo"] <= WIDTH_STUDY <= e["hi"] else "departs from the width study"


def drift_word(own: dict | None, difference: dict | None) -> str:
    """μP's width drift: removes (own interval inside ±0.15), else reduces (the difference from standard wholly
    above 0), does not change it (the difference's interval contains 0); wholly below 0 is outside the
    pre-registered words and is printed as what it is."""
    if _open(own):
        return _open(own)
    if transfer_word(own) == "transfers":
        return "removes the drift"
    if _open(difference):
        return _open(difference)
    lo, hi = round(difference["lo"], 2), round(difference["hi"], 2)
    if lo > 0:
        return "reduces the drift"
    if hi < 0:
        return "increases the drift (no pre-registered word)"
    return "does not change the drift"


def cost_word(e: dict | None) -> str:
    if e is None:
        return "not run"
    if "undecided" in e:
        return f"undecided ({e['undecided']})"
    if e["hi"] < COST:
        return "negligible"
    return "material" if e["lo"] > COST else "undecided"


# ---------------------------------------------------------------------------------------- the readings
def readings(runs: dict, plateau: float) -> dict:
    arms = sorted({a for a, *_ in runs}, key=list(ARM_NAMES).index)
    best = {a: {c: best_rate(runs, a, c, plateau) for c in CELLS.values()} for a in arms}
    out: dict = {"best": best, "arms": arms}
    for a in arms:
        b = best[a]
        out[a] = {
            "transfer": (shift(b, "source", "target"), delta50(runs, a, "source", "target", plateau)),
            "width": (shift(b, "source", "width"), delta50(runs, a, "source", "width", plateau)),
            "depth": (shift(b, "width", "target"), delta50(runs, a, "width", "target", plateau)),
        }
        src = b.get("source")
        out[a]["lost"] = {
            c: (
                {"undecided": "the source has no best rate"}
                if src is None or not src["decided"]
                else loss_lost(runs, a, c, src["x"], plateau)
            )
            for c in ("target", "width")
        }
    if "standard" in arms and "mup" in arms:
        s, m = best["standard"], best["mup"]
        ok = all(x and x["decided"] for x in (s.get("width"), m.get("width")))
        # Δ*_W(μP) − Δ*_W(standard): the shared source cancels, leaving the two width cells.
        out["drift_star_diff"] = welch([(1.0, m["width"]["xs"]), (-1.0, s["width"]["xs"])]) if ok else None
        out["drift50_diff"] = joint_drift_difference(runs, plateau)
    out["versus_standard"] = {}
    for a in arms:
        if a == "standard":
            continue
        s, o = best["standard"], best[a]
        if not all(x and x["decided"] for x in (s.get("source"), s.get("target"), o.get("source"), o.get("target"))):
            out["versus_standard"][a] = {"undecided": "a cell has no best rate"}
            continue
        if a == "mup":  # the same source runs: Δ*(μP) − Δ*(standard) = x̄_target(μP) − x̄_target(standard)
            terms = [(1.0, o["target"]["xs"]), (-1.0, s["target"]["xs"])]
        else:
            terms = [
                (1.0, o["target"]["xs"]),
                (-1.0, o["source"]["xs"]),
                (-1.0, s["target"]["xs"]),
                (1.0, s["source"]["xs"]),
            ]
        out["versus_standard"][a] = welch(terms)
    return out


def _ci(e: dict | None, spec: str = "{:+.2f}") -> str:
    if e is None:
        return "— | —"
    if "undecided" in e:
        return "— | —"
    end = lambda v: "open" if v is None else spec.format(v)
    return f"{spec.format(e['est'] if 'est' in e else e['mean'])} | [{end(e['lo'])}, {end(e['hi'])}]"


def markdown(res: dict, runs: dict, plateau: float, argv: list[str]) -> list[str]:
    md = [
        "# Does the learning rate transfer? The readings stated before any fit, computed",
        "",
        f"Written by `python -m experiments.transfer.readings {' '.join(argv)}`; the rules are in "
        "`docs/results/transfer/PREREGISTRATION.md` and coded in `experiments/transfer/readings.py`. A run trains "
        f"when it completed with its final validation loss below the plateau {plateau:.4f} − 0.1 nat/byte.",
        "",
        "Measures. x_i = log10 η*_i, a seed's best rate: the vertex of a least-squares quadratic in log10 η over "
        f"that seed's final losses within {HALF_WIDTH} decades of its lowest loss, among the rates where it trains; "
        "*censored* when the vertex is outside those rates or the quadratic opens downward. x̄: the mean of a "
        "cell's x_i, *undecided* when more than one seed is censored. Δ* = x̄(B) − x̄(A) in decades with Welch's "
        "95% t interval (Welch–Satterthwaite degrees of freedom; the two cells' seeds are independent fits; "
        "nominal 95% coverage under normal per-seed errors). Δ50: the shift of the 50%-trains rate from one Firth "
        "common-slope logistic fit per arm over its two cells' runs, with the 95% profile-likelihood interval "
        "(χ²₁ on the penalised likelihood; approximate coverage). Lost: the paired mean over seeds of ℓ(η_g) − "
        "ℓ(η_b) in nats per byte with Student's 95% t interval on n − 1 degrees of freedom. Words use the "
        "intervals' two printed decimals.",
        "",
        "## Best rates per arm and cell",
        "",
        "| arm | cell | seeds | x̄ (log10 η*) | η* | censored seeds |",
        "|---|---|---|---:|---:|---:|",
    ]
    for a in res["arms"]:
        for c in CELLS.values():
            b = res["best"][a].get(c)
            if b is None:
                md.append(f"| {ARM_NAMES[a]} | {c} | — | — | — | — |")
                continue
            x = "—" if b["x"] is None else f"{b['x']:.2f}"
            eta = "—" if b["x"] is None else f"{10 ** b['x']:.3g}"
            md.append(f"| {ARM_NAMES[a]} | {c} | {b['seeds']} | {x} | {eta} | {b['censored']} |")
    for title, key in (
        ("1. Transfer, source → target", "transfer"),
        ("2. Width drift, source → width cell (R = 2)", "width"),
        ("3. Depth, width cell → target (d = 256)", "depth"),
    ):
        md += ["", f"## {title}", "", "| arm | Δ* | Welch 95% | word | Δ50 | profile 95% | word |"]
        md.append("|---|---:|---|---|---:|---|---|")
        for a in res["arms"]:
            ds, d50 = res[a][key]
            w50 = replicates_word(d50) if key == "width" and a == "standard" else transfer_word(d50)
            if key == "width" and a == "mup":
                w50 = drift_word(d50, res.get("drift50_diff"))
            ws = drift_word(ds, res.get("drift_star_diff")) if key == "width" and a == "mup" else transfer_word(ds)
            md.append(f"| {ARM_NAMES[a]} | {_ci(ds)} | {ws} | {_ci(d50)} | {w50} |")
        if key == "width" and "drift50_diff" in res:
            md += [
                "",
                "Δ_W(μP) − Δ_W(standard): best rate "
                + _ci(res["drift_star_diff"]).replace(" | ", " ")
                + " (Welch; the shared source cancels); 50% rate "
                + _ci(res["drift50_diff"]).replace(" | ", " ")
                + " (joint Firth model, a slope per arm, profile likelihood). The standard arm's word compares its Δ50_W"
                f" with the width study's {WIDTH_STUDY:+.2f} decades.",
            ]
    md += [
        "",
        "## 4. Cost of transferring",
        "",
        "| arm | cell | η_g | η_b | lost (nat/byte) | t 95% | word | diverged at η_g |",
    ]
    md.append("|---|---|---:|---:|---:|---|---|---:|")
    for a in res["arms"]:
        for c, e in res[a]["lost"].items():
            if e is None or "undecided" in e:
                md.append(f"| {ARM_NAMES[a]} | {c} | — | — | — | — | {cost_word(e)} | — |")
            else:
                md.append(
                    f"| {ARM_NAMES[a]} | {c} | {e['eta_g']:.3g} | {e['eta_b']:.3g} | {e['mean']:+.4f} | "
                    f"[{e['lo']:+.4f}, {e['hi']:+.4f}] | {cost_word(e)} | {e['diverged']} of {len(e['seeds'])} |"
                )
    md += [
        "",
        "## 5. Arms against the standard arm: Δ*(arm) − Δ*(standard)",
        "",
        "| arm | difference | Welch 95% | word |",
    ]
    md.append("|---|---:|---|---|")
    for a, e in res["versus_standard"].items():
        word = _open(e) or ("a difference" if round(e["lo"], 2) > 0 or round(e["hi"], 2) < 0 else "no difference shown")
        md.append(f"| {ARM_NAMES[a]} | {_ci(e)} | {word} |")
    return md + [""]


def parser(module: str, doc: str, cells_help: str = "the transfer sweeps' run folders, or a cells.csv"):
    """The command line the transfer study's commands share: --cells and --plateau (and what the caller adds)."""
    p = argparse.ArgumentParser(
        prog=f"python -m {module}", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--cells", nargs="+", required=True, help=cells_help)
    p.add_argument("--plateau", default="auto", help="the unigram plateau in nats, or auto (the first run folder's)")
    return p


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = parser("experiments.transfer.readings", __doc__)
    p.add_argument("--out", required=True, help="the folder for cells.csv and readings.md")
    args = p.parse_args(argv)
    from experiments import sources

    with one_line_errors("loopnet transfer", (ValueError, FileNotFoundError)):
        plateau = sources.plateau(args.cells, args.plateau)
        runs = read(args.cells)
        if not runs:
            raise ValueError(
                f"no finished run of the transfer sweeps in {', '.join(args.cells)}; fix: run "
                "configs/sweeps/transfer/source.yaml first (loopnet sweep ... --jobs 2)"
            )
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        res = readings(runs, plateau)
        write_csv(runs, out / "cells.csv")
        (out / "plateau.json").write_text(f'{{"plateau": {plateau!r}}}\n')
        (out / "readings.md").write_text("\n".join(markdown(res, runs, plateau, argv)))
    for a in res["arms"]:
        print(
            f"loopnet transfer: {ARM_NAMES[a]}: {transfer_word(res[a]['transfer'][0])} (Δ*), "
            f"{transfer_word(res[a]['transfer'][1])} (Δ50)"
        )
    print(f"loopnet transfer: wrote {out / 'readings.md'}")


if __name__ == "__main__":
    main()
