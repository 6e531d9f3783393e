"""The map's readings recomputed from its committed per-run values (each report folder's `cells.csv` and
`plateau.json`), without the run folders that `loopnet report` reads:

    python -m experiments.map.readings docs/results/map --out docs/results/map/readings.md

Written: reading 1 by the rule stated before running, on the cells that rule named (the grid and the
boundary at R = 12) and with the boundary at R = 2 added after the grid was seen; the 50%-trains rate
of every (scheme, R) from the common-slope logistic fit (`loopnet.study.boundary`) with its profile
intervals, the DeepLoop/DeepNorm ratio and the difference of falls, beside the ×√2 "every seed trains"
rule and the exact trend test; reading 2's intervals with Welch's real degrees of freedom; the best-rate
shift Δ (`measures.best_rate_shift`); and the post-hoc checks (the controls per seed, the runs that end
well above the plateau, the best-loss drift from R = 2 to R = 12 per seed)."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from loopnet.study import boundary
from loopnet.study.measures import TRAIN_MARGIN, best_rate_shift, paired_interval, reading1_verdict, welch_interval

from experiments.sources import by_rate, fmt_ci, fmt_lr, largest_trainable, merge, read_cells, trains_cell

PAIR = ("deepnorm", "deeploop")


def as_deepnorm(cells: list[dict]) -> list[dict]:
    """The exponent sweep's p = 0.25 cells are DeepNorm (α = (2N)^¼, β = (8N)^−¼; identical losses)."""
    return [dict(c, scheme="deepnorm") for c in cells if c["scheme"] == "scaled" and c["p"] and float(c["p"]) == 0.25]


# ---------------------------------------------------------------------------------------- sections
def reading1(grid, bnd, plateau) -> list[str]:
    r12 = [c for c in bnd if c["R"] == 12]
    sets = {
        "stated before running: the grid + the boundary at R = 12": merge(grid, r12),
        "after the grid was seen (2026-12-01): + the boundary at R = 2": merge(grid, bnd),
    }
    md = [
        "## Reading 1: the largest rate where every seed trains (the ×√2 rule)",
        "",
        "| cells | DeepNorm R = 2 → 12 | fall | DeepLoop R = 2 → 12 | fall | DeepNorm's fall − DeepLoop's | verdict |",
        "|---|---|---:|---|---:|---:|---|",
    ]
    for name, cells in sets.items():
        bands = {(s, r): largest_trainable(cells, s, r, plateau) for s in PAIR for r in (2, 12)}
        falls = {s: math.log10(bands[(s, 2)]["largest"] / bands[(s, 12)]["largest"]) for s in PAIR}
        extra = falls["deepnorm"] - falls["deeploop"]
        censored = any(b["censored_high"] for b in bands.values())
        md.append(
            f"| {name} | {fmt_lr(bands[('deepnorm', 2)]['largest'])} → {fmt_lr(bands[('deepnorm', 12)]['largest'])} | "
            f"{falls['deepnorm']:.2f} | {fmt_lr(bands[('deeploop', 2)]['largest'])} → "
            f"{fmt_lr(bands[('deeploop', 12)]['largest'])} | {falls['deeploop']:.2f} | {extra:+.2f} | "
            f"**{reading1_verdict(extra, censored)}** |"
        )
    grid_only = merge(grid)
    md += [
        "",
        "On the ×2 grid alone (2 seeds), the largest rate where every seed trains: "
        + "; ".join(
            f"{s} " + " / ".join(fmt_lr(largest_trainable(grid_only, s, r, plateau)["largest"]) for r in (2, 6, 12))
            for s in PAIR
        )
        + " at R = 2 / 6 / 12.",
        "",
    ]
    return md


def logistic(cells: dict, plateau: float, label: str, detail: bool) -> tuple[list[str], dict]:
    groups = [(s, r) for s in PAIR for r in (2, 6, 12)]
    rows = [((s, r), lr, trains_cell(c, plateau)) for (s, r, lr, _), c in sorted(cells.items()) if (s, r) in groups]
    data = boundary.Data.from_rows(rows)
    fit = boundary.fit(data)
    limits = boundary.ml_limits(data) if fit.separated else None
    out = {"fit": fit, "limits": limits}
    md = []
    if detail:
        md += [
            f"Cells: {label}. Firth common slope b = {fit.slope:.1f} per decade (P(trains) from 0.9 to 0.1 "
            f"over {2 * math.log(9) / abs(fit.slope):.2f} decades). The plain maximum-likelihood fit "
            f"{'has no finite maximum (separated: its slope runs to −∞)' if fit.separated else 'exists'}.",
            "",
            "| scheme | R | seeds that train per rate | ×√2 rule: largest rate where every seed trains | "
            "η50 (Firth) | 95% profile interval | plain ML as the slope → −∞ | exact trend test P |",
            "|---|---:|---|---:|---:|---|---|---:|",
        ]
    for g in groups:
        rates = by_rate(cells, *g)
        counts = {lr: (sum(trains_cell(c, plateau) for c in cs), len(cs)) for lr, cs in rates.items()}
        lo, hi = fit.interval({g: 1})
        out[g] = (fit.x50(g), lo, hi)
        if not detail:
            continue
        a, b = limits[g] if limits else (None, None)
        limit = (
            "— (the plain fit exists)"
            if a is None
            else f"η50 = {10**a:.3g} (some seeds train there, some not)"
            if a == b
            else f"η50 anywhere in ({10**a:.3g}, {10**b:.3g})"
        )
        ladder = sorted(counts)
        # scores: half-octave positions on the rate ladder (×√2 steps)
        test = boundary.exact_trend_test(
            [[(round(2 * math.log2(lr / ladder[0])), k, n) for lr, (k, n) in counts.items()]]
        )
        band = largest_trainable(cells, *g, plateau)
        md.append(
            f"| {g[0]} | {g[1]} | "
            + ", ".join(f"{lr:.3g}: {k}/{n}" for lr, (k, n) in counts.items())
            + f" | {fmt_lr(band['largest'])} | {10 ** fit.x50(g):.3g} | {fmt_ci(lo, hi, lambda v: 10**v)} | {limit} | "
            f"{test['p_falls']:.2g} |"
        )

    def both(w):  # Firth's estimate and interval, and the plain likelihood's range as the slope → −∞
        rng = (
            None
            if limits is None
            else (
                sum(min(k * limits[g][0], k * limits[g][1]) for g, k in w.items()),
                sum(max(k * limits[g][0], k * limits[g][1]) for g, k in w.items()),
            )
        )
        return (fit.combination(w), *fit.interval(w), rng)

    out["falls"] = both({("deepnorm", 2): 1, ("deepnorm", 12): -1, ("deeploop", 2): -1, ("deeploop", 12): 1})
    for s in PAIR:
        out[("fall", s)] = both({(s, 2): 1, (s, 12): -1})
    for r in (2, 6, 12):
        out[("ratio", r)] = both({("deeploop", r): 1, ("deepnorm", r): -1})
    return md, out


def show_range(rng, scale=lambda v: v, spec="{:+.2f}") -> str:
    if rng is None:
        return "—"
    lo, hi = (spec.format(scale(v)) for v in rng)
    return lo if lo == hi else f"{lo} … {hi}"


def logistic_section(grid, bnd, conf, expo, plateau) -> list[str]:
    primary = merge(grid, bnd, conf)
    md = [
        "## The 50%-trains rate (logistic, common slope): primary from 2026-12-02",
        "",
        "logit P(a seed trains) = a_g + b·log10 η, one intercept per (scheme, R), one slope b; η50_g = 10^(−a_g/b). "
        "Firth's penalised likelihood (finite where the plain fit is separated); 95% intervals by profile "
        "likelihood (Heinze & Schemper 2002), χ²₁(0.95) = 3.84. The exact trend test: within the (scheme, R), "
        "P(the training seeds sit at rates this low or lower | how many seeds train), every placement equally "
        "likely (Cochran–Armitage's statistic, exact).",
        "",
    ]
    text, fit = logistic(
        primary,
        plateau,
        "grid + boundary (R = 2 and 12) + confirmation, DeepNorm and DeepLoop, each (scheme, R, rate, seed) once",
        detail=True,
    )
    md += text + [
        "",
        "| quantity | estimate (Firth) | 95% profile interval | plain ML as the slope → −∞ |",
        "|---|---:|---|---|",
    ]
    ratio = lambda x: 10**x
    for r in (2, 6, 12):
        v, lo, hi, rng = fit[("ratio", r)]
        md.append(
            f"| η50 DeepLoop / DeepNorm, R = {r} | ×{10**v:.2f} | {fmt_ci(lo, hi, ratio, '×{:.2f}')} | "
            f"{show_range(rng, ratio, '×{:.2f}')} |"
        )
    for s in PAIR:
        v, lo, hi, rng = fit[("fall", s)]
        md.append(
            f"| {s}'s fall, log10 η50(R = 2) − log10 η50(R = 12) | {v:+.2f} | {fmt_ci(lo, hi, spec='{:+.2f}')} | "
            f"{show_range(rng)} |"
        )
    v, lo, hi, rng = fit["falls"]
    md.append(
        f"| **difference of falls** (DeepNorm's − DeepLoop's), decades | **{v:+.2f}** | "
        f"{fmt_ci(lo, hi, spec='{:+.2f}')} | {show_range(rng)} |"
    )
    md += [
        "",
        "The same fit on other sets of cells (a check that the choice of cells does not drive it):",
        "",
        "| cells | difference of falls | 95% interval | ratio R = 2 / 6 / 12 |",
        "|---|---:|---|---|",
    ]
    for label, cells in (
        ("grid + boundary (no confirmation)", merge(grid, bnd)),
        ("grid + boundary at R = 12 (the cells stated before running)", merge(grid, [c for c in bnd if c["R"] == 12])),
        (
            "primary + exponent sweep's p = 0.25 (DeepNorm) at R = 12, seeds 4-5 and 2.26e-2",
            merge(grid, bnd, conf, as_deepnorm(expo)),
        ),
    ):
        _, f = logistic(cells, plateau, label, detail=False)
        v, lo, hi, _ = f["falls"]
        md.append(
            f"| {label} | {v:+.2f} | {fmt_ci(lo, hi, spec='{:+.2f}')} | "
            + " / ".join(f"×{10 ** f[('ratio', r)][0]:.2f}" for r in (2, 6, 12))
            + " |"
        )
    return md + [""]


def best(cells: dict, scheme: str, rounds: int) -> float:
    """The grid's best rate: argmin over rates of the mean final loss (no run diverged, and every loss is
    below ℓ₀, so the capped ℓ(η) is this mean)."""
    rates = by_rate(cells, scheme, rounds)
    return min(rates, key=lambda lr: statistics.fmean(c["loss"] for c in rates[lr]))


def reading2(grid, conf) -> list[str]:
    md = [
        "## Reading 2 with Welch's real degrees of freedom",
        "",
        "DeepLoop − DeepNorm final loss, each at its own best rate (nats/byte), 95% intervals: Welch at the "
        "Welch–Satterthwaite df as a real number, and the paired-by-seed t interval.",
        "",
        "| cells | R | DeepNorm (rate) | DeepLoop (rate) | difference | Welch df | Welch 95% | paired 95% |",
        "|---|---:|---|---|---:|---:|---|---|",
    ]
    for label, cells in (("grid, seeds 1-2", merge(grid)), ("confirmation, seeds 3-5", merge(conf))):
        for r in (2, 6, 12):
            b = {s: best(cells, s, r) for s in PAIR}
            loss = {s: {c["seed"]: c["loss"] for c in by_rate(cells, s, r)[b[s]]} for s in PAIR}
            xs, ys = list(loss["deepnorm"].values()), list(loss["deeploop"].values())
            w = welch_interval(xs, ys)
            p = paired_interval([loss["deeploop"][k] - v for k, v in loss["deepnorm"].items() if k in loss["deeploop"]])
            md.append(
                f"| {label} | {r} | {statistics.fmean(xs):.3f} ({b['deepnorm']:.3g}) | {statistics.fmean(ys):.3f} "
                f"({b['deeploop']:.3g}) | {w['diff']:+.3f} | {w['df']:.2f} | [{w['lo']:+.3f}, {w['hi']:+.3f}] | "
                f"[{p['lo']:+.3f}, {p['hi']:+.3f}] |"
            )
    return md + [""]


def drift(grid, conf) -> list[str]:
    """Post hoc: per seed, (DeepLoop − DeepNorm at their best rates) at R = 12 minus the same at R = 2."""
    g, c = merge(grid), merge(conf)
    rows, fresh = [], []
    for cells, seeds in ((g, (1, 2)), (c, (3, 4, 5))):
        for seed in seeds:
            d = {}
            for r in (2, 12):
                loss = {
                    s: next(x["loss"] for x in by_rate(cells, s, r)[best(cells, s, r)] if x["seed"] == seed)
                    for s in PAIR
                }
                d[r] = loss["deeploop"] - loss["deepnorm"]
            rows.append((seed, d[2], d[12], d[12] - d[2]))
            if cells is c:
                fresh.append(d[12] - d[2])
    p = paired_interval(fresh)
    md = [
        "## Post hoc: the best-loss gap from R = 2 to R = 12, per seed",
        "",
        "Per seed, d(R) = DeepLoop's final loss − DeepNorm's, each at its best rate (the grid's choice, "
        "from seeds 1-2); the drift is d(12) − d(2). Not a reading stated before running.",
        "",
        "| seed | d(2) | d(12) | drift |",
        "|---:|---:|---:|---:|",
    ]
    md += [f"| {s} | {a:+.3f} | {b:+.3f} | {x:+.3f} |" for s, a, b, x in rows]
    md += [
        "",
        f"Fresh seeds 3-5: mean drift {p['mean']:+.3f} nat, 95% t interval [{p['lo']:+.3f}, {p['hi']:+.3f}], "
        f"t({p['n'] - 1}) = {p['t']:.1f}.",
        "",
    ]
    dn = {r: statistics.fmean(x["loss"] for x in by_rate(c, "deepnorm", r)[best(c, "deepnorm", r)]) for r in (2, 6, 12)}
    dl = {r: statistics.fmean(x["loss"] for x in by_rate(c, "deeploop", r)[best(c, "deeploop", r)]) for r in (2, 6, 12)}
    md += [
        "Best loss on the fresh seeds, R = 2 / 6 / 12: DeepNorm "
        + " / ".join(f"{dn[r]:.3f}" for r in dn)
        + ", DeepLoop "
        + " / ".join(f"{dl[r]:.3f}" for r in dl)
        + ".",
        "",
    ]
    return md


def vertex(grid, plateau) -> list[str]:
    cells = merge(grid)
    md = [
        "## The best-rate shift Δ = log10 η*(12) − log10 η*(2)",
        "",
        "η*: the vertex of a quadratic in log10 η fitted to the seed-paired mean final loss at the rates within "
        "0.61 decades (two ×2 steps) of the lowest mean, among the rates where every seed trains; 95% percentile "
        "bootstrap over seeds (2,000 draws, the seeds resampled jointly at R = 2 and 12). Cells: the ×2 grid, "
        "seeds 1-2 (the boundary and confirmation cells do not cover every rate). With 2 seeds a draw is one of "
        "{1,1}, {2,2}, {1,2}: the interval says little.",
        "",
        "| scheme | η*(R = 2) | η*(R = 12) | Δ (decades) | 95% bootstrap |",
        "|---|---:|---:|---:|---|",
    ]
    for s in PAIR:
        curve = {
            r: {lr: {c["seed"]: c["loss"] for c in cs} for lr, cs in by_rate(cells, s, r).items()} for r in (2, 12)
        }
        out = best_rate_shift(curve[2], curve[12], plateau, boots=2000, seed=0)
        mark = lambda x, cen: ("≤ " if cen < 0 else "≥ " if cen > 0 else "") + f"{10**x:.3g}"
        md.append(
            f"| {s} | {mark(out['x_lo'], out['censored_lo'])} | {mark(out['x_hi'], out['censored_hi'])} | "
            f"{out['delta']:+.2f} | [{out['lo']:+.2f}, {out['hi']:+.2f}] |"
        )
    return md + [""]


def seed_mean_best(cells: dict, scheme: str, rounds: int) -> tuple[float, dict[int, float]] | None:
    """(η*, {seed: loss at η*}): the rate with the lowest mean final loss over seeds where every seed completed."""
    means = {
        lr: (statistics.fmean(c["loss"] for c in cs), {c["seed"]: c["loss"] for c in cs})
        for lr, cs in by_rate(cells, scheme, rounds).items()
        if cs and all(c["status"] == "completed" and c["loss"] is not None for c in cs)
    }
    if not means:
        return None
    lr = min(means, key=lambda r: means[r][0])
    return lr, means[lr][1]


def controls_and_failures(grid, bnd, expo, plateau, controls=()) -> list[str]:
    """The controls per seed at every R they ran (the grid's cells, then `controls` folders' own: the map's
    `controls_grid/` and `controls/` below the grid), each scheme's best rate and whether it is censored (the
    lowest rate run), and Pre-LN's best loss against DeepNorm's and DeepLoop's, paired by seed."""
    g = merge(grid, *controls)
    md = [
        "## The controls per seed, and the runs that end well above the plateau",
        "",
        "Finished seeds per rate (✓: trains). η*: the rate with the lowest seed-mean final loss where every "
        "seed completed; *censored* when it is the lowest rate run. Best-loss differences are paired by seed "
        "(each scheme at its own η*), with the 95% t interval on n − 1 degrees of freedom.",
        "",
    ]
    for s in ("preln", "postln"):
        for R in (2, 6, 12):
            rates = by_rate(g, s, R)
            if not rates:
                md.append(f"- {s} at R = {R}: not run.")
                continue
            best = seed_mean_best(g, s, R)
            tail = ""
            if best:
                lr, _ = best
                trained = any(trains_cell(c, plateau) for c in rates[lr])
                tail = (
                    f"; η* = {lr:.3g}{' (censored: the lowest rate run)' if lr == min(rates) else ''}"
                    f"{'' if trained else ', on the plateau'}"
                )
            md.append(
                f"- {s} at R = {R}: "
                + "; ".join(
                    f"{lr:.3g}: " + ", ".join(f"{c['loss']:.3f}{'✓' if trains_cell(c, plateau) else ''}" for c in cs)
                    for lr, cs in rates.items()
                )
                + tail
                + "."
            )
    md.append("")
    for R in (2, 6, 12):
        pre = seed_mean_best(g, "preln", R)
        for other in ("deepnorm", "deeploop"):
            ref = seed_mean_best(g, other, R)
            if not pre or not ref:
                continue
            seeds = sorted(set(pre[1]) & set(ref[1]))
            diff = paired_interval([pre[1][k] - ref[1][k] for k in seeds])
            if diff:
                md.append(
                    f"- R = {R}: Pre-LN (η* {pre[0]:.3g}) − {other} (η* {ref[0]:.3g}) best loss, seeds "
                    f"{', '.join(map(str, seeds))}: {diff['mean']:+.3f} nat [{diff['lo']:+.3f}, {diff['hi']:+.3f}] "
                    f"(per seed {', '.join(f'{pre[1][k] - ref[1][k]:+.3f}' for k in seeds)})."
                )
    md.append("")
    expo = [c for c in expo if not (c["p"] and float(c["p"]) == 0.25)] + as_deepnorm(expo)  # DeepNorm's once
    above = [
        c
        for c in merge(grid, bnd, expo, *controls).values()
        if c["loss"] is not None and c["loss"] > plateau + TRAIN_MARGIN
    ]
    md += [
        f"- Runs that end more than {TRAIN_MARGIN} nat above the plateau ({plateau:.3f}): "
        + "; ".join(f"{c['cell']} ({c['sweep']}) {c['loss']:.3f}" for c in sorted(above, key=lambda c: -c["loss"]))
        + ".",
        "",
    ]
    return md


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(
        prog="python -m experiments.map.readings",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("map_dir", help="the map's results folder (grid/, boundary/, confirm/, exponent/)")
    p.add_argument("--out", required=True, help="the markdown file to write")
    args = p.parse_args(argv)
    root = Path(args.map_dir)
    for sub in ("grid", "boundary", "confirm", "exponent"):
        if not (root / sub / "cells.csv").is_file():
            sys.exit(f"loopnet map readings: {root / sub / 'cells.csv'} is missing; fix: pass the map's results folder")
    plateau = json.loads((root / "grid" / "plateau.json").read_text())["plateau"]
    grid, bnd, conf, expo = (read_cells(root / s) for s in ("grid", "boundary", "confirm", "exponent"))
    md = [
        "# The map's readings, recomputed from the committed cells",
        "",
        f"Written by `python -m experiments.map.readings {' '.join(argv)}` from `grid/`, `boundary/`, "
        f"`confirm/`, `exponent/` (and, where present, `controls_grid/` and `controls/`) `cells.csv` (the run "
        f"folders are not committed). A seed trains when it "
        f"completed with its final validation loss below the plateau {plateau:.4f} − {TRAIN_MARGIN} nat.",
        "",
    ]
    md += reading1(grid, bnd, plateau) + logistic_section(grid, bnd, conf, expo, plateau) + reading2(grid, conf)
    controls = [read_cells(root / sub) for sub in ("controls_grid", "controls") if (root / sub / "cells.csv").is_file()]
    md += vertex(grid, plateau) + drift(grid, conf) + controls_and_failures(grid, bnd, expo, plateau, controls)
    Path(args.out).write_text("\n".join(md))
    print(f"loopnet map readings: wrote {args.out}")


if __name__ == "__main__":
    main()
