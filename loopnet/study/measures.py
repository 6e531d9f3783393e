"""The study's definitions, each once: how a method is named, when a run escaped the unigram plateau
and after how many steps, when it trains and how the stability map summarises a loss-vs-rate curve
(LR sensitivity, the trainable band), how much of the gradient reaches the first round. The grid names its cells
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
    "seed_everything": "s",
    "model.optim.lr": "lr",
}
LR_KEY = "model.optim.lr"  # the stability map's axis
# Grid keys a method label leaves out: the scheme and wiring it starts with, and R and the seed it groups over.
STANDARD_KEYS = {"model.config.residual", "model.config.wiring", "model.config.p", "model.config.n_rounds",
                 "seed_everything"}


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
    return "-".join([scheme_label(config.get("residual", "?"), config.get("p")), str(config.get("wiring", "?")),
                     *extra])


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
        return {"largest": None, "smallest": None, "width": None, "censored_high": False, "censored_low": False,
                "contiguous": True}
    lo, hi = ok[0], ok[-1]
    inside = rates[rates.index(lo):rates.index(hi) + 1]
    return {"largest": hi, "smallest": lo, "width": math.log10(hi / lo), "censored_high": hi == rates[-1],
            "censored_low": lo == rates[0], "contiguous": all(trained[lr] for lr in inside)}


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
    return {"a": a, "b": b, "se_b": math.sqrt(haa / det) if det > 0 else math.inf,
            "x50": -a / b if b else math.nan}


# ---------------------------------------------------------------------------------------- intervals
# Student's t, the 0.975 quantile, df = 1 … 30 (three decimals, as printed in every table; a test checks
# them against scipy where it is installed). Above 30 the value at 30, which errs on the wide side.
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)


def _t975(df: float) -> float:
    """The table's quantile at df rounded down (at least 1; beyond the table, its last value)."""
    return T975[min(max(int(df), 1), len(T975)) - 1]


def welch_interval(xs: list[float], ys: list[float]) -> dict | None:
    """The difference of means mean(ys) − mean(xs) with its 95% interval by Welch's t (unequal variances):
    {diff, lo, hi, df}, df the Welch–Satterthwaite degrees of freedom, rounded down for the quantile (so
    the interval errs on the wide side). None unless both samples have 2 values or more."""
    if len(xs) < 2 or len(ys) < 2:
        return None
    vx, vy = statistics.variance(xs) / len(xs), statistics.variance(ys) / len(ys)
    diff = statistics.fmean(ys) - statistics.fmean(xs)
    se = math.sqrt(vx + vy)
    if se == 0:
        return {"diff": diff, "lo": diff, "hi": diff, "df": math.inf}
    df = (vx + vy) ** 2 / (vx ** 2 / (len(xs) - 1) + vy ** 2 / (len(ys) - 1))
    t = _t975(df)
    return {"diff": diff, "lo": diff - t * se, "hi": diff + t * se, "df": df}


def paired_interval(diffs: list[float]) -> dict | None:
    """The mean of paired differences (one per seed, the two runs sharing that seed's data order and the
    validation batches) with its 95% interval by Student's t on n − 1 degrees of freedom: {mean, lo, hi,
    n}. None under 2 pairs."""
    if len(diffs) < 2:
        return None
    mean, n = statistics.fmean(diffs), len(diffs)
    half = _t975(n - 1) * statistics.stdev(diffs) / math.sqrt(n)
    return {"mean": mean, "lo": mean - half, "hi": mean + half, "n": n}
