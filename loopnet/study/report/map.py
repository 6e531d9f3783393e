"""The stability map: when `model.optim.lr` is a grid axis, each method's final validation loss vs the
learning rate at every R, and what summarises such a curve (Wortsman et al. 2023, arXiv 2309.14322):
the best rate and loss, the LR sensitivity, the largest rate that trains and the trainable band.

A *curve* is one (method, R): a method here is the scheme and wiring without the rate
(`Run.family`), its points the grid's rates, each with its seeds. Definitions, written into the
report as well (`DEFINITIONS`), are those of `loopnet.study.measures`:

    per rate η     ℓ(η) = mean over the seeds of min(final val loss, ℓ₀), a diverged seed counting ℓ₀
    best           η* = argmin ℓ(η), ℓ* = ℓ(η*), shown with the completed seeds' mean ± std at η*
    sensitivity    mean over the grid of ℓ(η) − ℓ*
    trains         every seed at η completed with final val loss < plateau − 0.1 nat (at the fixed last step)
    band           the smallest and largest η that train, width log10(largest/smallest) decades
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from ..measures import (
    READING1_SUPPORT,
    TRAIN_MARGIN,
    capped_loss,
    lr_sensitivity,
    paired_interval,
    reading1_verdict,
    trainable_band,
    trains,
    welch_interval,
)
from ..plotting import legend, pyplot, save
from .runs import Run
from .tables import fmt, mean_std

DEFINITIONS = f"""Definitions (`loopnet.study.measures`; Wortsman et al. 2023, "Small-scale proxies for large-scale
Transformer training instabilities", arXiv 2309.14322). A curve is one (method, R), its points the grid's
learning rates η (log-spaced), each with its seeds; the loss of a run is its final validation loss, at the
sweep's fixed last step.

- **ℓ₀**, the loss at initialisation: the training loss of the untrained model at step 0, mean over the
  curve's runs (where step 0 was not logged: ln V, the uniform prediction over the model's V ids).
- **ℓ(η)**: the mean over the seeds of min(loss, ℓ₀); a seed that diverged counts ℓ₀ (a failed run costs
  what no training costs).
- **best lr** η* = argmin ℓ(η) over the grid; **best loss** ℓ* = ℓ(η*), shown as mean ± sample std over
  the seeds that completed at η*.
- **LR sensitivity** = mean over the grid of ℓ(η) − ℓ* (Wortsman et al.'s E_η[min(ℓ(η), ℓ₀) − ℓ*]): 0 when
  every rate reaches the best loss, ℓ₀ − ℓ* when only one rate trains at all. It depends on the grid's span:
  compare it between curves of the same grid only.
- **trains**: at η, *every* seed completed (no divergence) with its loss below the unigram plateau −
  {TRAIN_MARGIN} nat (a margin, so that a run ending on the plateau, within noise of it, does not count).
- **largest lr that trains** and the **trainable band** [smallest, largest rate that trains], its **width**
  log10(largest / smallest) in decades. "≥" / "≤": the edge is the grid's own, so the true edge lies beyond
  it; "gaps" marks a band with a rate inside it that does not train."""


@dataclass
class Curve:
    """The seeds at every rate of one (method, R)."""

    family: str
    rounds: int
    by_lr: dict[float, list[Run]] = field(default_factory=dict)
    init_loss: float = math.nan
    init_how: str = ""

    @property
    def rates(self) -> list[float]:
        return sorted(self.by_lr)

    @property
    def ran(self) -> bool:
        """Some seed of the curve finished (a sweep run with --only lists the others' cells as not run)."""
        return any(r.finished for runs in self.by_lr.values() for r in runs)

    def completed(self, lr: float) -> list[tuple]:
        """(seed, final validation loss) of the seeds at `lr` that completed."""
        return [
            (r.seed, r.value("final_val_loss"))
            for r in self.by_lr[lr]
            if r.status == "completed" and r.value("final_val_loss") is not None
        ]

    def completed_losses(self, lr: float) -> list[float]:
        return [loss for _, loss in self.completed(lr)]

    def losses(self, lr: float) -> tuple[float | None, float | None]:
        """Mean ± std of the final validation loss over the seeds at `lr` that completed."""
        return mean_std(self.completed_losses(lr))

    def capped(self, lr: float) -> float | None:
        """ℓ(η): mean over the finished seeds of min(loss, ℓ₀), a diverged seed counting ℓ₀."""
        runs = [r for r in self.by_lr[lr] if r.finished]
        if not runs:
            return None
        return statistics.fmean(capped_loss(r.status, r.value("final_val_loss"), self.init_loss) for r in runs)

    def capped_curve(self) -> dict[float, float]:
        return {lr: v for lr in self.rates if (v := self.capped(lr)) is not None}

    def best(self) -> float | None:
        curve = self.capped_curve()
        return min(curve, key=curve.get) if curve else None

    def sensitivity(self) -> float | None:
        return lr_sensitivity(self.capped_curve())

    def trained(self, plateau: float) -> dict[float, bool]:
        """Rate -> every seed trained; rates with an unfinished seed are left out (not judged)."""
        return {
            lr: all(trains(r.status, r.value("final_val_loss"), plateau) for r in runs)
            for lr, runs in self.by_lr.items()
            if runs and all(r.finished for r in runs)
        }

    def band(self, plateau: float | None) -> dict | None:
        return None if plateau is None else trainable_band(self.trained(plateau))

    def diverged(self, lr: float) -> int:
        return sum(r.status == "diverged" for r in self.by_lr[lr])


def is_map(runs: list[Run]) -> bool:
    """The report draws the map when the learning rate is a grid axis with at least two values."""
    from ..measures import LR_KEY

    return len({r.params[LR_KEY] for r in runs if LR_KEY in r.params}) >= 2


def init_loss(runs: list[Run]) -> tuple[float, str]:
    """ℓ₀ of a curve: the mean step-0 training loss of its runs, else ln V (see DEFINITIONS)."""
    first = [
        r.curves["train/loss"][0][1] for r in runs if r.curves.get("train/loss") and r.curves["train/loss"][0][0] == 0
    ]
    if first:
        return statistics.fmean(first), f"step-0 training loss, mean of {len(first)} run(s)"
    vocab = next(
        (
            ((r.summary or {}).get("config") or {}).get("vocab_size")
            for r in runs
            if ((r.summary or {}).get("config") or {}).get("vocab_size")
        ),
        None,
    )
    return (math.log(vocab), f"ln V, V = {vocab}") if vocab else (math.nan, "unknown (no step-0 loss, no vocab_size)")


def curves(runs: list[Run]) -> list[Curve]:
    """One curve per (method, R) with a learning rate, in the runs' order of methods and increasing R."""
    out: dict[tuple[str, int], Curve] = {}
    for run in runs:
        if run.lr is None or run.rounds is None:
            continue
        curve = out.setdefault((run.family, run.rounds), Curve(run.family, run.rounds))
        curve.by_lr.setdefault(float(run.lr), []).append(run)
    families = list(dict.fromkeys(r.family for r in runs))
    for curve in out.values():
        curve.init_loss, curve.init_how = init_loss([r for rs in curve.by_lr.values() for r in rs])
    return sorted(out.values(), key=lambda c: (families.index(c.family), c.rounds))


# ---------------------------------------------------------------------------------------- tables
def lr_text(lr: float | None) -> str:
    return "—" if lr is None else f"{lr:.3g}"


def band_cells(band: dict | None) -> tuple[str, str, str]:
    """(largest lr that trains, band, width in decades) as table cells, with the censoring marks."""
    if band is None:
        return "not judged", "—", "—"
    if band["largest"] is None:
        return "none", "none", "0"
    hi = ("≥ " if band["censored_high"] else "") + lr_text(band["largest"])
    lo = ("≤ " if band["censored_low"] else "") + lr_text(band["smallest"])
    width = ("≥ " if band["censored_high"] or band["censored_low"] else "") + f"{band['width']:.2f}"
    return hi, f"{lo} … {hi}" + ("" if band["contiguous"] else " (gaps)"), width


def summary_table(cs: list[Curve], plateau: float | None) -> str:
    lines = [
        "| method | R | seeds | ℓ₀ | best lr | best loss | LR sensitivity | largest lr that trains | "
        "trainable band | width (decades) |",
        "|---|---:|---:|---:|---:|---|---:|---:|---|---:|",
    ]
    for c in cs:
        if not c.ran:
            lines.append(f"| {c.family} | {c.rounds} | 0 | — | not run | — | — | not run | — | — |")
            continue
        best = c.best()
        mean, std = c.losses(best) if best is not None else (None, None)
        loss = (
            "—"
            if best is None
            else (
                f"all diverged (ℓ = ℓ₀ {fmt(c.init_loss)})"
                if mean is None
                else fmt(mean) + ("" if std is None else f" ± {fmt(std)}")
            )
        )
        seeds = max((sum(r.finished for r in v) for v in c.by_lr.values()), default=0)
        sens = c.sensitivity()
        lines.append(
            f"| {c.family} | {c.rounds} | {seeds} | {fmt(c.init_loss, 3)} | {lr_text(best)} | {loss} | "
            f"{'—' if sens is None else fmt(sens, 3)} | " + " | ".join(band_cells(c.band(plateau))) + " |"
        )
    return "\n".join(lines)


def loss_table(cs: list[Curve], plateau: float | None) -> str:
    """Every point of every curve: mean ± std over completed seeds, with diverged and untrained marks."""
    rates = sorted({lr for c in cs for lr in c.by_lr})
    lines = [
        "| method | R | " + " | ".join(f"lr {lr_text(lr)}" for lr in rates) + " |",
        "|---|---:|" + "---|" * len(rates),
    ]
    for c in cs:
        cells = []
        for lr in rates:
            if lr not in c.by_lr:
                cells.append("")
                continue
            runs = c.by_lr[lr]
            mean, std = c.losses(lr)
            text = "diverged" if mean is None and c.diverged(lr) else ("not run" if mean is None else fmt(mean, 3))
            if std is not None:
                text += f" ± {fmt(std, 3)}"
            marks = []
            if c.diverged(lr) and mean is not None:
                marks.append(f"† {c.diverged(lr)}/{len(runs)}")
            if plateau is not None and lr in c.trained(plateau) and c.trained(plateau)[lr]:
                marks.append("✓")
            cells.append(text + (f" {' '.join(marks)}" if marks else ""))
        lines.append(f"| {c.family} | {c.rounds} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _pair(cs: list[Curve]) -> tuple[str, str] | None:
    """The DeepNorm and DeepLoop methods of the same wiring (`deepnorm-carry`, `deeploop-carry`)."""
    families = list(dict.fromkeys(c.family for c in cs))
    for f in families:
        if f.startswith("deepnorm") and (other := "deeploop" + f.removeprefix("deepnorm")) in families:
            return f, other
    return None


def decisive_readings(cs: list[Curve], plateau: float | None) -> str:
    """The two readings stated before running (docs/results/map/README.md), computed from the tables:
    (1) from the smallest to the largest R, the fall of each scheme's largest trainable rate, against
    the theory's extra √(R ratio) for DeepNorm under sign-like (AdamW) updates; (2) at each R, DeepLoop's
    best loss minus DeepNorm's, each at its own best rate."""
    pair = _pair(cs)
    if pair is None or plateau is None:
        return "Not computed: the sweep has no DeepNorm/DeepLoop pair of one wiring, or no plateau was judged."
    by = {(c.family, c.rounds): c for c in cs}
    rounds = sorted({c.rounds for c in cs if (pair[0], c.rounds) in by and (pair[1], c.rounds) in by})
    if not rounds:
        return "Not computed: DeepNorm and DeepLoop share no R."
    lines = []
    lo, hi = rounds[0], rounds[-1]
    falls, censored = {}, False
    one_rate = all(len(c.by_lr) == 1 for c in cs)  # a confirmation sweep: no boundary to read
    if one_rate:
        lines.append("- Reading 1: not read here (one rate per curve).")
    for f in () if one_rate else pair:
        a, b = by[(f, lo)].band(plateau), by[(f, hi)].band(plateau)
        if a["largest"] is None or b["largest"] is None:
            falls[f] = None
            lines.append(f"- {f}: no rate trains at R = {lo if a['largest'] is None else hi}; fall not defined.")
            continue
        falls[f] = math.log10(a["largest"] / b["largest"])
        cens = [f"R = {r}" for r, band in ((lo, a), (hi, b)) if band["censored_high"]]
        censored = censored or bool(cens)
        lines.append(
            f"- {f}: largest trainable lr {lr_text(a['largest'])} at R = {lo}, {lr_text(b['largest'])} at "
            f"R = {hi}: falls by {falls[f]:.2f} decades"
            + (f" (censored at the grid's top: {', '.join(cens)})" if cens else "")
        )
    theory = 0.5 * math.log10(hi / lo)
    if falls and all(v is not None for v in falls.values()):
        extra = falls[pair[0]] - falls[pair[1]]
        word = reading1_verdict(extra, censored)
        lines.append(
            f"- **Reading 1**: DeepNorm's fall minus DeepLoop's = {extra:+.2f} decades: **{word}** by the rule "
            f"stated before running (*supported* at ≥ {READING1_SUPPORT:.2f} decades with neither scheme "
            f"censored by the grid's top, *contradicted* at ≤ 0, else *not resolved*); the theory (sign-like "
            f"updates, DeepNorm/DeepLoop output-change ratio 2√N) predicts +{theory:.2f} (= ½·log10({hi}/{lo})). "
            f"The rates' step here is {_grid_step(cs):.2f} decades."
        )
    lines.append(
        "- **Reading 2** (DeepLoop's best loss − DeepNorm's, each at its own best lr; ± the two sample stds "
        "combined, the rule stated before running: *ahead* below −that, *behind* above +that, else *not "
        "distinguished*; the 95% interval of the difference by Welch's t; and, where the two share seeds, "
        "the mean of the per-seed differences with its 95% t interval: a seed fixes the data order and the "
        "two runs are scored on the same validation batches, so pairing removes the seed's own effect):"
    )
    for r in rounds:
        dn, dl = by[(pair[0], r)], by[(pair[1], r)]
        bn, bl = dn.best(), dl.best()
        (mn, sn), (ml, sl) = (dn.losses(bn) if bn else (None, None), dl.losses(bl) if bl else (None, None))
        if mn is None or ml is None:
            lines.append(f"  - R = {r}: not defined (a scheme has no completed run at its best lr)")
            continue
        spread = math.hypot(sn or 0.0, sl or 0.0)
        d = ml - mn
        word = "ahead" if d < -spread else ("behind" if d > spread else "not distinguished")
        xs, ys = dn.completed_losses(bn), dl.completed_losses(bl)
        w = welch_interval(xs, ys)
        ci = "" if w is None else f"; 95% interval [{w['lo']:+.3f}, {w['hi']:+.3f}] (Welch, df {w['df']:.1f})"
        ln, ll = dict(dn.completed(bn)), dict(dl.completed(bl))
        pi = paired_interval([ll[seed] - loss for seed, loss in ln.items() if seed in ll])
        if pi is not None:
            ci += f"; paired by seed {pi['mean']:+.3f} [{pi['lo']:+.3f}, {pi['hi']:+.3f}] ({pi['n']} seeds)"
        lines.append(
            f"  - R = {r}: {d:+.3f} ± {spread:.3f} nat: DeepLoop **{word}** (DeepNorm {fmt(mn)} at lr "
            f"{lr_text(bn)}, {len(xs)} seeds; DeepLoop {fmt(ml)} at lr {lr_text(bl)}, "
            f"{len(ys)} seeds{ci})"
        )
    return "\n".join(lines)


def _grid_step(cs: list[Curve]) -> float:
    steps = [math.log10(b / a) for c in cs for a, b in zip(c.rates, c.rates[1:])]
    return min(steps) if steps else float("nan")


# ---------------------------------------------------------------------------------------- plots
def plot_loss_vs_lr(cs: list[Curve], plateau: float | None, path) -> None:
    """Per method, final validation loss vs lr (log x), one curve per R: mean ± std over the completed
    seeds; an x at the top for a rate where a seed diverged."""
    plt = pyplot()
    # a method not run gets no empty panel (unless nothing ran: then every panel is empty)
    families = list(dict.fromkeys(c.family for c in cs if c.ran)) or list(dict.fromkeys(c.family for c in cs))
    all_rounds = sorted({c.rounds for c in cs})
    cmap = plt.get_cmap("viridis")
    fig, axes = plt.subplots(1, len(families), figsize=(5 * len(families), 4.2), squeeze=False, sharey=True)
    for ax, f in zip(axes[0], families):
        for c in (c for c in cs if c.family == f):
            color = cmap(all_rounds.index(c.rounds) / max(1, len(all_rounds) - 1))
            pts = [(lr, *c.losses(lr)) for lr in c.rates]
            pts = [(lr, m, s or 0.0) for lr, m, s in pts if m is not None]
            if pts:
                ax.errorbar(
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    yerr=[p[2] for p in pts],
                    marker="o",
                    capsize=3,
                    color=color,
                    label=f"R = {c.rounds}",
                )
            div = [lr for lr in c.rates if c.diverged(lr)]
            if div:
                ax.plot(div, [c.init_loss] * len(div), marker="x", ls="none", color=color, ms=8)
        if plateau is not None:
            ax.axhline(plateau, ls=":", color="grey", lw=0.8, label=f"plateau {plateau:.2f}")
            ax.axhline(plateau - TRAIN_MARGIN, ls="--", color="grey", lw=0.8, label=f"plateau − {TRAIN_MARGIN}")
        ax.set(xscale="log", title=f, xlabel="learning rate (constant after warm-up)")
        legend(ax, fontsize=7)
    axes[0, 0].set_ylabel("final validation loss (nats)")
    fig.suptitle("Loss vs learning rate (mean ± std over seeds; x at ℓ₀: a seed diverged)", fontsize=10)
    save(plt, fig, path)


def plot_heatmap(cs: list[Curve], plateau: float | None, path) -> None:
    """Method × R: log10 of the largest rate that trains, and the LR sensitivity, each cell annotated."""
    plt = pyplot()
    families = list(dict.fromkeys(c.family for c in cs))
    rounds = sorted({c.rounds for c in cs})
    by = {(c.family, c.rounds): c for c in cs}
    panels = [
        (
            "log10 largest lr that trains",
            lambda c: (lambda b: math.log10(b["largest"]) if b and b["largest"] else math.nan)(c.band(plateau)),
            lambda c, v: band_cells(c.band(plateau))[0],
        ),
        (
            "LR sensitivity (nats)",
            lambda c: c.sensitivity() if c.sensitivity() is not None else math.nan,
            lambda c, v: f"{v:.2f}",
        ),
    ]
    fig, axes = plt.subplots(1, 2, figsize=(4 + 1.3 * len(rounds) * 2, 1.5 + 0.6 * len(families)), squeeze=False)
    for ax, (title, value, text) in zip(axes[0], panels):
        grid = [[value(by[(f, r)]) if (f, r) in by else math.nan for r in rounds] for f in families]
        im = ax.imshow(grid, cmap="viridis", aspect="auto")
        for i, f in enumerate(families):
            for j, r in enumerate(rounds):
                if (f, r) in by:
                    v = grid[i][j]
                    label = text(by[(f, r)], v) if math.isfinite(v) else ("none" if by[(f, r)].ran else "not run")
                    ax.text(j, i, label, ha="center", va="center", fontsize=8, color="white")
        ax.set_xticks(range(len(rounds)), [f"R = {r}" for r in rounds])
        ax.set_yticks(range(len(families)), families)
        ax.set_title(title, fontsize=9)
        fig.colorbar(im, ax=ax)
    save(plt, fig, path)


def plot_best_lr_vs_r(cs: list[Curve], plateau: float | None, path) -> None:
    """Per method, the best lr (solid) and the largest lr that trains (dashed) vs R, log-log."""
    plt = pyplot()
    families = list(dict.fromkeys(c.family for c in cs))
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for i, f in enumerate(families):
        mine = [c for c in cs if c.family == f]
        pts = [(c.rounds, c.best()) for c in mine if c.best() is not None]
        if pts:
            ax.plot(*zip(*pts), marker="o", color=cycle[i % len(cycle)], label=f"{f}: best lr")
        bands = [(c.rounds, c.band(plateau)) for c in mine]
        top = [(r, b["largest"]) for r, b in bands if b and b["largest"]]
        if top:
            ax.plot(*zip(*top), marker="^", ls="--", color=cycle[i % len(cycle)], label=f"{f}: largest lr that trains")
    rounds = sorted({c.rounds for c in cs})
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="rounds R",
        ylabel="learning rate",
        title="Best and largest trainable learning rate vs R",
    )
    ax.set_xticks(rounds, [str(r) for r in rounds])
    legend(ax, fontsize=7)
    save(plt, fig, path)


def section(runs: list[Run], plateau: float | None, out) -> tuple[list[str], dict[str, str]]:
    """The report's stability-map section (markdown lines) and its plots {file: caption}, drawn into `out`."""
    cs = curves(runs)
    plots = {
        "map_loss_vs_lr.png": "Stability map: loss vs learning rate",
        "map_heatmap.png": "Stability map: largest trainable lr and LR sensitivity, method × R",
        "map_best_lr_vs_R.png": "Stability map: best and largest trainable lr vs R",
    }
    plot_loss_vs_lr(cs, plateau, out / "map_loss_vs_lr.png")
    plot_heatmap(cs, plateau, out / "map_heatmap.png")
    plot_best_lr_vs_r(cs, plateau, out / "map_best_lr_vs_R.png")
    inits = sorted({c.init_how.split(",")[0] for c in cs if c.ran})
    md = [
        "## Stability map",
        "",
        DEFINITIONS,
        "",
        f"Plateau: {'not judged' if plateau is None else f'{plateau:.4f} nats'}; ℓ₀ from: {', '.join(inits)}.",
        "",
        summary_table(cs, plateau),
        "",
        "Every point (final validation loss, mean ± std over completed seeds; † diverged seeds; ✓ every seed trains):",
        "",
        loss_table(cs, plateau),
        "",
        "### Decisive readings",
        "",
        decisive_readings(cs, plateau),
        "",
    ]
    for file, caption in plots.items():
        md += [f"![{caption}]({file})", ""]
    return md, plots
