"""The study's definitions, each once: how a method is named, when a run escaped the unigram plateau
and after how many steps, how much of the gradient reaches the first round. The grid names its cells
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


def escape_step(train_loss: list[tuple[int, float]], plateau: float) -> int | None:
    """Steps to escape: the first step at which the training loss, smoothed (EMA 0.9), is below the
    plateau; None when it never is."""
    ema = None
    for step, value in train_loss:
        ema = value if ema is None else 0.9 * ema + 0.1 * value
        if ema < plateau:
            return step
    return None


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
