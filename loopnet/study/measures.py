"""The study's definitions, each once: how a method is named, when a run escaped the unigram plateau
and after how many steps, when it trains and how the stability map summarises a loss-vs-rate curve
(LR sensitivity, the trainable band), how much of the gradient reaches the first round, the intervals
(Student's t at real degrees of freedom), reading 1's verdict rule, and the best-rate shift Δ (a
quadratic's vertex in log lr, bootstrapped over seeds; the 50%-trains rate is `loopnet.study.boundary`). The grid names its cells
with `param_label`, the report its methods and columns with the rest; the scheme's own name
(`scheme_label`, also `loopnet fit`'s run folders) lives with the schemes in `loopnet.model.scales`.
Light to import (no plotting)."""

from __future__ import annotations

import math
import re
import statistics
from typing import Any

from loopnet.model.scales import scheme_label
from loopnet.model.visits import Visit

# Short names of grid keys in cell ids and method labels (`r6`, `s2`, `lr0.001`); others use their last part.
SHORT = {
    "model.config.residual": "",
    "model.config.wiring": "",
    "model.config.n_rounds": "r",
    "model.config.n_blocks": "k",
    "model.config.p": "p",
    "model.config.branch_scale": "eps_",
    "seed_everything": "s",
    "model.optim.lr": "lr",
}
LR_KEY = "model.optim.lr"  # the stability map's axis
# Grid keys a method label leaves out: the scheme and wiring it starts with, and R and the seed it groups over.
STANDARD_KEYS = {
    "model.config.residual",
    "model.config.wiring",
    "model.config.p",
    "model.config.n_rounds",
    "seed_everything",
}


# ---------------------------------------------------------------------------------------- names
def slug(value: Any) -> str:
    text = f"{value:g}" if isinstance(value, float) else str(value)
    return re.sub(r"[^A-Za-z0-9.]+", "", text)


def param_label(key: str, value: Any) -> str:
    """One grid value as it stands in a cell id or a method label: ``r6``, ``s2``, ``deeploop``."""
    return f"{SHORT.get(key, key.rsplit('.', 1)[-1])}{slug(value)}"


def method_label(config: dict, params: dict[str, Any]) -> str:
    """A method: the scheme and the wiring, plus the run's other grid values (``deeploop-carry``,
    ``p0.4-lt``, ``deeploop-carry-lr0.001``); R and the seed are what a method is compared over."""
    extra = [param_label(k, v) for k, v in params.items() if k not in STANDARD_KEYS]
    return "-".join(
        [scheme_label(config.get("residual", "?"), config.get("p")), str(config.get("wiring", "?")), *extra]
    )


# ---------------------------------------------------------------------------------------- escape
def end_loss(summary: dict | None) -> float | None:
    """The loss that decides escape: the final validation loss, else the final training loss."""
    summary = summary or {}
    v = summary.get("final_val_loss")
    return v if v is not None else summary.get("final_train_loss")


def escaped(status: str, loss: float | None, plateau: float) -> bool:
    """A run escaped when it completed (did not diverge) with its end loss strictly below the plateau."""
    return status == "completed" and loss is not None and loss < plateau


def escape_step(val_history: list[tuple[int, float]], plateau: float) -> int | None:
    """Steps to escape: the first step at which the *validation* loss (the summary's `val_history`,
    measured every `val_check_interval` steps) is below the plateau it is judged against; None when it
    never is. No smoothing, so no lag: its resolution is the validation interval. (The earlier
    definition, an EMA 0.9 of the training loss against the validation plateau, mixed two references
    (training text scores below the held-out play's plateau from the start) and lagged by ~10 logged
    steps.)"""
    for step, value in val_history:
        if value is not None and math.isfinite(value) and value < plateau:
            return int(step)
    return None


# ---------------------------------------------------------------------------------------- the map
# Wortsman et al. 2023, "Small-scale proxies for large-scale Transformer training instabilities"
# (arXiv 2309.14322): the loss-vs-learning-rate curve, its LR sensitivity and the trainable band.
TRAIN_MARGIN = 0.1  # nats below the plateau a run must end to count as trained


def trains(status: str, loss: float | None, plateau: float, margin: float = TRAIN_MARGIN) -> bool:
    """A run *trains* when it completed (did not diverge) with its final validation loss, at the
    sweep's fixed last step, below plateau − margin: a margin, so that a run ending on the plateau
    (within noise of it) does not count."""
    return status == "completed" and loss is not None and math.isfinite(loss) and loss < plateau - margin


def capped_loss(status: str, loss: float | None, init_loss: float) -> float:
    """A run's loss as LR sensitivity counts it: min(final validation loss, ℓ₀), and ℓ₀ for a run that
    diverged (or has no finite loss): a failed run costs what no training at all costs."""
    if status != "completed" or loss is None or not math.isfinite(loss):
        return init_loss
    return min(loss, init_loss)


def lr_sensitivity(losses: dict[float, float]) -> float | None:
    """Wortsman et al.'s LR sensitivity over a log-spaced grid of rates η: the mean over the grid of
    ℓ(η) − ℓ*, where ℓ(η) is the (capped, `capped_loss`) loss at η and ℓ* = min_η ℓ(η). 0: every rate
    reaches the best loss; ℓ₀ − ℓ*: only one rate trains at all."""
    if not losses:
        return None
    best = min(losses.values())
    return statistics.fmean(v - best for v in losses.values())


def trainable_band(trained: dict[float, bool]) -> dict:
    """The rates that train (every seed, `trains`) on the grid `trained` (rate -> all seeds trained):
    the largest and the smallest, the band's width log10(largest / smallest) in decades, whether each
    edge is the grid's own (censored: the true edge lies beyond it) and whether the trainable rates are
    contiguous on the grid. Empty band: largest = smallest = width = None."""
    rates = sorted(trained)
    ok = [lr for lr in rates if trained[lr]]
    if not ok:
        return {
            "largest": None,
            "smallest": None,
            "width": None,
            "censored_high": False,
            "censored_low": False,
            "contiguous": True,
        }
    lo, hi = ok[0], ok[-1]
    inside = rates[rates.index(lo) : rates.index(hi) + 1]
    return {
        "largest": hi,
        "smallest": lo,
        "width": math.log10(hi / lo),
        "censored_high": hi == rates[-1],
        "censored_low": lo == rates[0],
        "contiguous": all(trained[lr] for lr in inside),
    }


# ---------------------------------------------------------------------------------------- gradients
def geomean(values) -> float:
    values = [v for v in values if v is not None and v > 0]
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else float("nan")


def first_round_gradient_ratio(visit_stats: list[dict], rounds: int) -> float | None:
    """How much of the gradient reaches the first round: per physical sublayer j, ‖g_1,j‖ / ‖g_R,j‖
    (visit gradient norms of summary.json's `last_visit_stats`), geometric mean over the sublayers and
    the runs given. None at R = 1 or without statistics."""
    if rounds == 1:
        return None
    ratios = []
    for stats in visit_stats:
        visits = {Visit.parse(t): q for t, q in (stats or {}).items()}
        for v, q in visits.items():
            last = visits.get(Visit(rounds, v.block, v.sublayer))
            if v.round == 1 and last and last["param_grad_norm"]:
                ratios.append(q["param_grad_norm"] / last["param_grad_norm"])
    return geomean(ratios) if ratios else None


# ---------------------------------------------------------------------------------------- exponent
def logistic_fit(xs: list[float], ys: list[bool], iterations: int = 50) -> dict | None:
    """Maximum-likelihood logistic regression P(y) = 1 / (1 + exp(−(a + b·x))) by Newton's method:
    {a, b, se_b (Wald: √ of the inverse Fisher information's b entry), x50 = −a/b (P = ½)}. None when
    the fit has no finite maximum: every y equal, or the x's separate the y's completely (then the
    slope's sign is all the data says)."""
    n = len(xs)
    if n < 2 or len(set(ys)) < 2 or len(set(xs)) < 2:
        return None
    lo1 = max((x for x, y in zip(xs, ys) if y), default=None)
    hi0 = min((x for x, y in zip(xs, ys) if not y), default=None)
    lo0, hi1 = max(x for x, y in zip(xs, ys) if not y), min(x for x, y in zip(xs, ys) if y)
    if lo1 <= hi0 or lo0 <= hi1:  # every success at or below every failure (or the reverse): separated
        return None
    a = b = 0.0
    for _ in range(iterations):
        ps = [1 / (1 + math.exp(-(a + b * x))) for x in xs]
        ga = sum(y - p for y, p in zip(ys, ps))
        gb = sum((y - p) * x for x, y, p in zip(xs, ys, ps))
        w = [p * (1 - p) for p in ps]
        haa, hab, hbb = sum(w), sum(wi * x for wi, x in zip(w, xs)), sum(wi * x * x for wi, x in zip(w, xs))
        det = haa * hbb - hab * hab
        if det <= 0:
            return None
        da, db = (hbb * ga - hab * gb) / det, (haa * gb - hab * ga) / det
        a, b = a + da, b + db
        if abs(da) < 1e-12 and abs(db) < 1e-12:
            break
    ps = [1 / (1 + math.exp(-(a + b * x))) for x in xs]
    w = [p * (1 - p) for p in ps]
    haa, hab, hbb = sum(w), sum(wi * x for wi, x in zip(w, xs)), sum(wi * x * x for wi, x in zip(w, xs))
    det = haa * hbb - hab * hab
    return {"a": a, "b": b, "se_b": math.sqrt(haa / det) if det > 0 else math.inf, "x50": -a / b if b else math.nan}


# ---------------------------------------------------------------------------------------- intervals
def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularised incomplete beta function (modified Lentz)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1 + num * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularised incomplete beta function."""
    if x <= 0 or x >= 1:
        return 0.0 if x <= 0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1 - front * _betacf(b, a, 1 - x) / b


def t_cdf(t: float, df: float) -> float:
    """Student's t distribution function for real (fractional) degrees of freedom df > 0:
    P(T ≤ t) = 1 − ½·I_{df/(df+t²)}(df/2, ½) for t ≥ 0, by symmetry below."""
    tail = 0.5 * _betainc(df / 2, 0.5, df / (df + t * t))
    return 1 - tail if t >= 0 else tail


def t_quantile(q: float, df: float) -> float:
    """The q quantile of Student's t with real df > 0 (Welch's df is fractional: it is not rounded), by
    bisection on `t_cdf` to 1e-12."""
    if not 0 < q < 1 or not df > 0:
        raise ValueError(f"t_quantile needs 0 < q < 1 and df > 0, got q={q}, df={df}")
    if q < 0.5:
        return -t_quantile(1 - q, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < q:
        lo, hi = hi, hi * 2
    while hi - lo > 1e-12 * max(1.0, hi):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < q else (lo, mid)
    return (lo + hi) / 2


def welch_interval(xs: list[float], ys: list[float]) -> dict | None:
    """The difference of means mean(ys) − mean(xs) with its 95% interval by Welch's t (unequal variances):
    {diff, lo, hi, df}, df the Welch–Satterthwaite degrees of freedom, used as the real number it is (a
    df of 1.98 rounded down to 1 would widen the interval ~3×). None unless both samples have 2 values or
    more."""
    if len(xs) < 2 or len(ys) < 2:
        return None
    vx, vy = statistics.variance(xs) / len(xs), statistics.variance(ys) / len(ys)
    diff = statistics.fmean(ys) - statistics.fmean(xs)
    se = math.sqrt(vx + vy)
    if se == 0:
        return {"diff": diff, "lo": diff, "hi": diff, "df": math.inf}
    df = (vx + vy) ** 2 / (vx**2 / (len(xs) - 1) + vy**2 / (len(ys) - 1))
    t = t_quantile(0.975, df)
    return {"diff": diff, "lo": diff - t * se, "hi": diff + t * se, "df": df}


def paired_interval(diffs: list[float]) -> dict | None:
    """The mean of paired differences (one per seed, the two runs sharing that seed's data order and the
    validation batches) with its 95% interval by Student's t on n − 1 degrees of freedom: {mean, lo, hi,
    n, t} (t: the mean over its standard error). None under 2 pairs."""
    if len(diffs) < 2:
        return None
    mean, n = statistics.fmean(diffs), len(diffs)
    se = statistics.stdev(diffs) / math.sqrt(n)
    half = t_quantile(0.975, n - 1) * se
    return {"mean": mean, "lo": mean - half, "hi": mean + half, "n": n, "t": mean / se if se else math.inf}


# ---------------------------------------------------------------------------------------- reading 1
READING1_SUPPORT = 0.30  # decades: one ×2 grid step


def reading1_verdict(extra: float, censored: bool) -> str:
    """The map's reading 1 by the rule stated before running, on the difference of falls rounded to the
    two decimals printed (a ×√2 ladder's rates are rounded to 3 digits, so an unrounded 0 can read
    ±0.0003): *not resolved* when either scheme's boundary is censored by the grid's top; else
    *supported* at ≥ 0.30 decades (one ×2 step, the theory's direction), *contradicted* at ≤ 0
    (DeepLoop's boundary falls as much or more), *not resolved* between."""
    shown = round(extra, 2)
    if censored:
        return "not resolved"
    if shown >= READING1_SUPPORT:
        return "supported"
    return "contradicted" if shown <= 0 else "not resolved"


# ---------------------------------------------------------------------------------------- best-rate shift
VERTEX_HALF_WIDTH = 0.61  # decades either side of the lowest mean loss: two ×2 steps (2·log10 2 = 0.602)


def quadratic_vertex(mean_loss: dict[float, float], half_width: float = VERTEX_HALF_WIDTH) -> dict | None:
    """η* as the vertex of a quadratic in u = log10 η fitted (least squares) to the mean loss at the rates
    within `half_width` decades of the rate with the lowest mean: {x: log10 η*, censored, rates}. When the
    quadratic opens downward, or its vertex lies outside the fitted rates, x is the nearer fitted edge and
    censored is −1 (the vertex lies at or below the lowest fitted rate) or +1 (at or above the highest);
    0 otherwise. None under 3 rates."""
    import numpy as np

    best = min(mean_loss, key=mean_loss.get)
    rates = sorted(lr for lr in mean_loss if abs(math.log10(lr / best)) <= half_width)
    if len(rates) < 3:
        return None
    u = np.log10(rates)
    c2, c1, _ = np.polyfit(u, [mean_loss[lr] for lr in rates], 2)
    lo, hi = float(u[0]), float(u[-1])
    if c2 <= 0:  # no minimum: the lower of the two ends
        x = lo if mean_loss[rates[0]] <= mean_loss[rates[-1]] else hi
    else:
        x = -c1 / (2 * c2)
    censored = -1 if x <= lo else (1 if x >= hi else 0)
    return {"x": min(max(x, lo), hi), "censored": censored, "rates": rates}


def best_rate_shift(
    lo: dict[float, dict], hi: dict[float, dict], plateau: float, boots: int = 2000, seed: int = 0
) -> dict | None:
    """Δ = log10 η*(R_hi) − log10 η*(R_lo), η* the `quadratic_vertex` of the seed-paired mean loss, with a
    95% percentile bootstrap interval over seeds.

    lo, hi: rate -> {seed: final validation loss (None: the run did not complete)} at the two R. Used:
    the seeds that ran at every rate of both R (the same seed sets the same data order at both, so the
    seeds are resampled jointly) and, at each R, the rates where every one of them trains (`trains`).
    Each bootstrap draw resamples the seeds with replacement and repeats the whole procedure. Returns
    {delta, lo, hi, x_lo, x_hi, censored_lo, censored_hi, rates_lo, rates_hi, seeds, boots,
    censored_share}."""
    import random

    seeds = sorted(set.intersection(*(set(v) for v in (*lo.values(), *hi.values()))))
    if len(seeds) < 2:
        return None

    def vertex(curve, draw):
        ok = {
            lr: [by[s] for s in draw]
            for lr, by in curve.items()
            if all(trains("completed" if by[s] is not None else "diverged", by[s], plateau) for s in set(draw))
        }
        return quadratic_vertex({lr: statistics.fmean(v) for lr, v in ok.items()})

    a, b = vertex(lo, seeds), vertex(hi, seeds)
    if a is None or b is None:
        return None
    rng = random.Random(seed)
    deltas, censored = [], 0
    for _ in range(boots):
        draw = [rng.choice(seeds) for _ in seeds]
        va, vb = vertex(lo, draw), vertex(hi, draw)
        if va is None or vb is None:
            continue
        deltas.append(vb["x"] - va["x"])
        censored += bool(va["censored"] or vb["censored"])
    deltas.sort()
    q = lambda p: deltas[min(len(deltas) - 1, max(0, round(p * (len(deltas) - 1))))]
    return {
        "delta": b["x"] - a["x"],
        "lo": q(0.025),
        "hi": q(0.975),
        "x_lo": a["x"],
        "x_hi": b["x"],
        "censored_lo": a["censored"],
        "censored_hi": b["censored"],
        "rates_lo": a["rates"],
        "rates_hi": b["rates"],
        "seeds": seeds,
        "boots": len(deltas),
        "censored_share": censored / len(deltas) if deltas else math.nan,
    }
