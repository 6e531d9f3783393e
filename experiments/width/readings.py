"""The width study's reading (docs/results/rival/README.md, section 2), by the rule stated there before the run:

    python -m experiments.width.readings 64=docs/results/rival/width_d64/pilot,docs/results/rival/width_d64/boundary \\
        128=docs/results/map/grid,docs/results/map/boundary \\
        256=docs/results/rival/width_d256/pilot,docs/results/rival/width_d256/boundary --out docs/results/width/readings.md

Each D=FOLDER[,FOLDER...] gives a width's cells: report folders (cells.csv) or sweep run folders
(runs/sweeps/width_d64, runs/sweeps/width_d64_boundary); d = 128 is the map's grid and boundary. Per width, one Firth common-slope logistic
fit of "trains" on log10 lr, one intercept per (scheme, R) for DeepNorm and DeepLoop at R = 2 and 12
(`boundary.fit`), gives with profile-likelihood 95% intervals:
- the ratio of 50% rates η50(DeepLoop) / η50(DeepNorm) at R = 2 and at R = 12;
- the difference of falls [log10 η50(DeepNorm, 2) − log10 η50(DeepNorm, 12)] − [the same for DeepLoop].
The trend is the change from the smallest width to the largest in the log ratio at R = 12 and in the
difference of falls, with a 95% percentile bootstrap over seeds within each width (2,000 draws, both widths
refitted in each draw). Per quantity: grows with width (> 0, interval excludes 0), shrinks (< 0, interval
excludes 0), else not distinguished from constant, with "no large trend" where the interval is narrower
than ±0.15 decades (half its width under 0.15).

Added 2026-12-04: beside the stated bootstrap, the change's 95% profile-likelihood interval under the same model
(`change_interval`: the two widths' penalised log-likelihoods summed), with the same words. Under separation (a
width's fit separated in every draw) the seed bootstrap has few distinct values and understates the spread; the
report prints how many, and the words of both intervals. Also added: η50's factor per doubling of d.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

from loopnet.env import one_line_errors

from loopnet.study import boundary
from experiments import sources

SCHEMES = ("deepnorm", "deeploop")
ROUNDS = (2, 12)
GROUPS = [(s, r) for s in SCHEMES for r in ROUNDS]
QUANTITIES = {
    "ratio2": {("deeploop", 2): 1, ("deepnorm", 2): -1},
    "ratio12": {("deeploop", 12): 1, ("deepnorm", 12): -1},
    "falls": {("deepnorm", 2): 1, ("deepnorm", 12): -1, ("deeploop", 2): -1, ("deeploop", 12): 1},
}
NAMES = {
    "ratio2": "log10 η50 DeepLoop / DeepNorm, R = 2",
    "ratio12": "log10 η50 DeepLoop / DeepNorm, R = 12",
    "falls": "difference of falls (DeepNorm's − DeepLoop's)",
}
TREND = ("ratio12", "falls")
NO_LARGE_TREND = 0.15  # decades: an interval narrower than ± this is evidence of no large trend


def rows(cells: dict, plateau: float, draw: list | None = None) -> list[tuple]:
    """(group, lr, trains) per run of DeepNorm and DeepLoop at R = 2 and 12; with a bootstrap draw of seeds,
    each drawn seed's runs once per time it is drawn."""
    by_seed: dict = {}
    for (s, r, lr, seed), c in sorted(cells.items(), key=lambda kv: str(kv[0])):
        if (s, r) in GROUPS:
            by_seed.setdefault(seed, []).append(((s, r), lr, sources.trains_cell(c, plateau)))
    return [row for seed in (sorted(by_seed, key=str) if draw is None else draw) for row in by_seed.get(seed, [])]


def fit_width(cells: dict, plateau: float, draw: list | None = None) -> boundary.Fit:
    return boundary.fit(boundary.Data.from_rows(rows(cells, plateau, draw)))


def seeds_of(cells: dict) -> list:
    return sorted({seed for (s, r, _, seed) in cells if (s, r) in GROUPS}, key=str)


def per_width(cells: dict, plateau: float) -> dict:
    """One width's fit: each group's η50 and each quantity with its profile interval."""
    missing = [g for g in GROUPS if not sources.by_rate(cells, *g)]
    if missing:
        raise ValueError(
            f"no finished run of {', '.join(f'{s} at R = {r}' for s, r in missing)}; fix: run that "
            "width's pilot and boundary sweeps"
        )
    fit = fit_width(cells, plateau)
    out = {"fit": fit, "seeds": seeds_of(cells)}
    for g in GROUPS:
        out[g] = (fit.x50(g), *fit.interval({g: 1}))
    for q, w in QUANTITIES.items():
        out[q] = (fit.combination(w), *fit.interval(w))
    return out


def percentile(values: list[float], p: float) -> float:
    """The percentile as `measures.best_rate_shift` takes it: the sorted draw at round(p·(n − 1))."""
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(p * (len(values) - 1))))]


def _argmax(f, lo: float, hi: float, iterations: int = 60) -> float:
    """The maximum of a unimodal f on [lo, hi] by golden-section search (to ~1e-12 of the bracket)."""
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = f(a), f(b)
    for _ in range(iterations):
        if fa >= fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = f(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = f(b)
    return max(fa, fb)


def change_interval(
    small: boundary.Fit, large: boundary.Fit, weights: dict, span: float = 1.5, tol: float = 1e-3
) -> tuple[float | None, float | None]:
    """The 95% profile-likelihood interval of the change c = v(large) − v(small) of v = Σ w_g·log10 η50_g, under
    the model the reading states: one Firth common-slope fit per width. The two widths share no parameter and no
    run, so their joint penalised log-likelihood is the sum of the two, and its profile at c is the maximum over v
    of profile_small(v) + profile_large(v + c); the interval is where 2·(maximum − that) ≤ χ²₁(0.95), searched
    `span` decades either side (None on a side where it stays inside)."""
    v0, top = small.combination(weights), small.value + large.value
    est = large.combination(weights) - v0

    def drop(c):
        best = _argmax(lambda v: small.profile(weights, v) + large.profile(weights, v + c), v0 - span, v0 + span)
        return 2 * (top - best) - boundary.CHI2_95

    ends = []
    for side in (-1, 1):
        step, inner, outer = 0.02, est, None
        while step <= span:
            if drop(est + side * step) > 0:
                outer = est + side * step
                break
            inner, step = est + side * step, step * 2
        if outer is None:
            ends.append(None)
            continue
        while abs(outer - inner) > tol:
            mid = (inner + outer) / 2
            inner, outer = (mid, outer) if drop(mid) <= 0 else (inner, mid)
        ends.append((inner + outer) / 2)
    return ends[0], ends[1]


def trend(small: dict, large: dict, plateau: float, boots: int = 2000, seed: int = 0) -> dict:
    """The change from the small width to the large in each `TREND` quantity, with its 95% percentile bootstrap:
    per draw, each width's seeds resampled with replacement (independently) and both fits refitted; a draw
    where a fit has no boundary (every run trains, or none) is skipped and counted."""
    base = {
        q: fit_width(large, plateau).combination(QUANTITIES[q]) - fit_width(small, plateau).combination(QUANTITIES[q])
        for q in TREND
    }
    seeds = seeds_of(small), seeds_of(large)
    rng = random.Random(seed)
    draws: dict[str, list[float]] = {q: [] for q in TREND}
    separated = 0
    for _ in range(boots):
        picks = [[rng.choice(s) for _ in s] for s in seeds]
        try:
            fits = [fit_width(cells, plateau, pick) for cells, pick in zip((small, large), picks)]
        except ValueError:
            continue
        separated += fits[0].separated or fits[1].separated
        for q in TREND:
            draws[q].append(fits[1].combination(QUANTITIES[q]) - fits[0].combination(QUANTITIES[q]))
    fits = fit_width(small, plateau), fit_width(large, plateau)
    resamples = math.prod(math.comb(2 * len(s) - 1, len(s)) for s in seeds)  # multisets of seeds, per width
    out = {}
    for q in TREND:
        d = draws[q]
        out[q] = {
            "change": base[q],
            "lo": percentile(d, 0.025) if d else None,
            "hi": percentile(d, 0.975) if d else None,
            "boots": len(d),
            "separated_share": separated / len(d) if d else math.nan,
            "resamples": resamples,
            "distinct": len({round(v, 9) for v in d}),
            "profile": change_interval(*fits, QUANTITIES[q]),
        }
    return out


def trend_word(change: float, lo: float | None, hi: float | None) -> str:
    """The stated words: grows / shrinks when the interval excludes 0 on the estimate's side, else not
    distinguished from constant, with whether the interval is narrower than ±0.15 decades."""
    if lo is None or hi is None:
        return "not distinguished from constant (no usable bootstrap draw)"
    if change > 0 and lo > 0:
        return "grows with width"
    if change < 0 and hi < 0:
        return "shrinks with width"
    half = (hi - lo) / 2
    return "not distinguished from constant; interval ±%.2f decades: " % half + (
        "no large trend" if half < NO_LARGE_TREND else "too wide to exclude a large trend"
    )


# ---------------------------------------------------------------------------------------- the report
def ci(lo, hi, spec="{:+.2f}") -> str:
    return sources.fmt_ci(lo, hi, spec=spec)


def markdown(
    widths: dict, fits: dict, trends: dict, plateau: float, argv: list[str], plot: str, boots: int
) -> list[str]:
    d0, d1 = min(widths), max(widths)
    md = [
        "# Width: does the DeepLoop/DeepNorm gap grow with d? The reading stated before the run, computed",
        "",
        f"Written by `python -m experiments.width.readings {' '.join(argv)}`; the rule is in "
        "`docs/results/rival/README.md` (section 2) and coded in `experiments/width/readings.py`. "
        "A seed trains when it "
        f"completed with its final validation loss below the plateau {plateau:.4f} − 0.1 nat.",
        "",
    ]
    for q, t in trends.items():
        lo, hi = t["profile"]
        md += [
            f"- **{NAMES[q]}**, d = {d0} → {d1}: change {t['change']:+.2f} decades (×{10 ** t['change']:.2f}).",
            f"  - As stated before the run: 95% percentile bootstrap over seeds {ci(t['lo'], t['hi'])} "
            f"({t['boots']} "
            f"usable draws of {boots}): **{trend_word(t['change'], t['lo'], t['hi'])}**.",
            f"  - Added 2026-12-04: the same model's 95% profile-likelihood interval (the two widths' Firth fits, "
            f"their penalised log-likelihoods summed; χ²₁, approximate coverage): {ci(lo, hi)}: "
            f"**{trend_word(t['change'], lo, hi)}**. The bootstrap's {t['resamples']} possible resamples (3 seeds "
            f"a width) gave {t['distinct']} distinct values, and in {t['separated_share']:.0%} of its draws a "
            "width's fit is separated (no seed trains above a rate where one fails), where Firth's estimate is "
            "set by the penalty and resampling seeds cannot move the boundary past the rates run: its spread "
            "understates the uncertainty, and its interval is not a 95% interval. The profile interval is the "
            "one this reading supports.",
        ]
    md += [
        "",
        "## Per width",
        "",
        "| d | " + " | ".join(NAMES[q] for q in QUANTITIES) + " | slope b per decade | plain ML fit |",
        "|---:|" + "---|" * len(QUANTITIES) + "---:|---|",
    ]
    for d in sorted(widths):
        f = fits[d]
        md.append(
            f"| {d} | "
            + " | ".join(f"{f[q][0]:+.2f} {ci(f[q][1], f[q][2])}" for q in QUANTITIES)
            + f" | {f['fit'].slope:.1f} | {'separated (no finite maximum)' if f['fit'].separated else 'exists'} |"
        )
    md += [
        "",
        "Ratios as factors: "
        + "; ".join(
            f"d = {d}: ×{10 ** fits[d]['ratio2'][0]:.2f} (R = 2), ×{10 ** fits[d]['ratio12'][0]:.2f} (R = 12)"
            for d in sorted(widths)
        )
        + ".",
        "",
        "η50's factor per doubling of d (added 2026-12-04; 10^(Δ log10 η50 / doublings), from the fits above; "
        "d = 128 is the map's design, the others the pilot-and-boundary design):",
        "",
        "| scheme | R | " + " | ".join(f"d = {a} → {b}" for a, b in zip(sorted(widths), sorted(widths)[1:])) + " |",
        "|---|---:|" + "---:|" * (len(widths) - 1),
    ]
    for g in GROUPS:
        ds = sorted(widths)
        md.append(
            f"| {g[0]} | {g[1]} | "
            + " | ".join(
                f"×{10 ** ((fits[b][g][0] - fits[a][g][0]) / math.log2(b / a)):.2f}" for a, b in zip(ds, ds[1:])
            )
            + " |"
        )
    md += [
        "",
        "## The 50%-trains rate per (scheme, R)",
        "",
        "| d | scheme | R | seeds that train per rate | ×√2 rule: largest rate where every seed trains | η50 (Firth) | "
        "95% profile interval |",
        "|---:|---|---:|---|---:|---:|---|",
    ]
    for d in sorted(widths):
        for g in GROUPS:
            rates = sources.by_rate(widths[d], *g)
            counts = ", ".join(
                f"{lr:.3g}: {sum(sources.trains_cell(c, plateau) for c in cs)}/{len(cs)}" for lr, cs in rates.items()
            )
            x, lo, hi = fits[d][g]
            band = sources.largest_trainable(widths[d], *g, plateau)
            md.append(
                f"| {d} | {g[0]} | {g[1]} | {counts} | {sources.fmt_lr(band['largest'])} | {10**x:.3g} | "
                f"{sources.fmt_ci(lo, hi, lambda v: 10**v)} |"
            )
    md += ["", f"![η50 against d]({plot})", ""]
    return md


def plot_boundary(fits: dict, path: Path) -> None:
    """η50 with its profile interval against d, one line per (scheme, R); an open interval end is not drawn."""
    from loopnet.study.plotting import colors, legend, pyplot, save

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    col = colors(SCHEMES)  # one colour per scheme; R = 2 solid, R = 12 dashed
    ds = sorted(fits)
    for i, g in enumerate(GROUPS):
        xs = [d * 2 ** ((i - 1.5) * 0.03) for d in ds]  # a small offset per line, so the bars do not overlap
        ys = [10 ** fits[d][g][0] for d in ds]
        lo = [y - (10 ** fits[d][g][1] if fits[d][g][1] is not None else y) for d, y in zip(ds, ys)]
        hi = [(10 ** fits[d][g][2] if fits[d][g][2] is not None else y) - y for d, y in zip(ds, ys)]
        ax.errorbar(
            xs,
            ys,
            yerr=[lo, hi],
            fmt="-o" if g[1] == 2 else "--s",
            ms=4,
            capsize=3,
            color=col[g[0]],
            label=f"{g[0]}, R = {g[1]}",
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ds, [str(d) for d in ds])
    ax.set_xlabel("width d")
    ax.set_ylabel("η50: the rate where half the seeds train")
    legend(ax, fontsize=8)
    save(plt, fig, path)


def parse_width(text: str) -> tuple[int, list[str]]:
    d, sep, folders = text.partition("=")
    if not sep or not d.isdigit() or not folders:
        raise ValueError(
            f"{text!r} is not D=FOLDER[,FOLDER...]; fix: e.g. "
            "64=docs/results/rival/width_d64/pilot,docs/results/rival/width_d64/boundary"
        )
    return int(d), folders.split(",")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(
        prog="python -m experiments.width.readings",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("widths", nargs="+", help="D=FOLDER[,FOLDER...] per width: report folders or sweep run folders")
    p.add_argument("--out", required=True, help="the markdown file to write; the plot goes beside it")
    p.add_argument("--boots", type=int, default=2000, help="bootstrap draws (the reading states 2,000)")
    p.add_argument(
        "--plateau", default="auto", help="the unigram plateau in nats, or auto (the first folder's plateau.json)"
    )
    args = p.parse_args(argv)
    with one_line_errors("loopnet width", (ValueError, FileNotFoundError)):
        given = dict(parse_width(t) for t in args.widths)
        if len(given) < 2:
            raise ValueError("one width given; fix: pass at least two (e.g. 64=... 128=... 256=...)")
        plateau = sources.plateau([f for fs in given.values() for f in fs], args.plateau)
        widths = {d: sources.merge(*(sources.read(f) for f in fs)) for d, fs in given.items()}
        fits = {}
        for d, cells in widths.items():
            try:
                fits[d] = per_width(cells, plateau)
            except ValueError as err:
                raise ValueError(f"d = {d}: {err}") from None
        trends = trend(widths[min(widths)], widths[max(widths)], plateau, args.boots)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    plot = out.with_name(out.stem + "_boundary_vs_d.png")
    plot_boundary(fits, plot)
    out.write_text("\n".join(markdown(widths, fits, trends, plateau, argv, plot.name, args.boots)))
    for q, t in trends.items():
        print(
            f"loopnet width: {NAMES[q]}, d = {min(widths)} → {max(widths)}: {t['change']:+.2f}; seed bootstrap (as "
            f"stated) {ci(t['lo'], t['hi'])}: {trend_word(t['change'], t['lo'], t['hi'])}; profile likelihood "
            f"{ci(*t['profile'])}: {trend_word(t['change'], *t['profile'])}"
        )
    print(f"loopnet width: wrote {out} and {plot}")


if __name__ == "__main__":
    main()
