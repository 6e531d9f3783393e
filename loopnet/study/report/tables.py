"""The report's tables: how a number is written, the seeds of one (method, R) and their summary
statistics, the method × R tables, the table of every run and cells.csv."""

from __future__ import annotations

import csv
import statistics
from dataclasses import dataclass
from pathlib import Path

from ..measures import first_round_gradient_ratio
from .runs import Run


def fmt(value: float | None, digits: int = 4) -> str:
    """How every number is written in the report (the tests read them back with this)."""
    return "—" if value is None else f"{value:.{digits}f}"


def mean_std(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


@dataclass
class Group:
    """The seeds of one (method, R)."""

    method: str
    rounds: int
    runs: list[Run]

    @property
    def finished(self) -> list[Run]:
        return [r for r in self.runs if r.finished]

    @property
    def diverged(self) -> list[Run]:
        return [r for r in self.runs if r.status == "diverged"]

    @property
    def completed(self) -> list[Run]:
        return [r for r in self.runs if r.status == "completed"]

    def loss(self) -> tuple[float | None, float | None]:
        """Mean ± std of the final validation loss over the seeds that completed (not diverged)."""
        return mean_std([r.value("final_val_loss") for r in self.completed if r.value("final_val_loss") is not None])

    def kappa(self) -> tuple[float | None, float | None]:
        return mean_std([r.kappa for r in self.completed if r.kappa is not None])

    def max_resid(self) -> tuple[float | None, float | None]:
        vals = [
            max(s["resid_norm"] for s in r.value("last_visit_stats").values())
            for r in self.completed
            if r.value("last_visit_stats")
        ]
        return mean_std(vals)

    def first_last_grad(self) -> float | None:
        """`measures.first_round_gradient_ratio` over the completed seeds."""
        return first_round_gradient_ratio([run.value("last_visit_stats") for run in self.completed], self.rounds)

    def loss_cell(self) -> str:
        if not self.finished:
            return "not run"
        if not self.completed:
            steps = sorted(
                r.value("diverged_at_step") for r in self.diverged if r.value("diverged_at_step") is not None
            )
            return f"diverged ({len(self.diverged)}/{len(self.runs)}, step {steps[0]})" if steps else "diverged"
        mean, std = self.loss()
        text = fmt(mean) if std is None else f"{fmt(mean)} ± {fmt(std)}"
        if mean is None:
            text = "no val loss"
        marks = []
        if self.diverged:
            marks.append(f"† {len(self.diverged)}/{len(self.runs)} diverged")
        missing = len(self.runs) - len(self.finished)
        if missing:
            marks.append(f"{missing} not run")
        if len(self.completed) < len(self.runs):
            marks.append(f"n={len(self.completed)}")
        return text + (f" ({', '.join(marks)})" if marks else "")

    def escape_cell(self) -> str:
        judged = [r for r in self.finished if r.escaped is not None]
        if not judged:
            return "—"
        k = sum(r.escaped for r in judged)
        return f"{k}/{len(judged)}"

    def escape_steps(self) -> tuple[float | None, float | None]:
        return mean_std([r.escape_step for r in self.finished if r.escape_step is not None])

    def stat_cell(self, stat, show=lambda v: fmt(v, 3)) -> str:
        """mean ± std of `stat()` as a table cell ("—" without values), each shown by `show`."""
        mean, std = stat()
        if mean is None:
            return "—"
        return show(mean) if std is None else f"{show(mean)} ± {show(std)}"


def group_runs(runs: list[Run]) -> tuple[list[str], list[int], dict[tuple[str, int], Group]]:
    methods = list(dict.fromkeys(r.method for r in runs))
    rounds = sorted({r.rounds for r in runs if r.rounds is not None})
    groups: dict[tuple[str, int], Group] = {}
    for run in runs:
        groups.setdefault((run.method, run.rounds), Group(run.method, run.rounds, [])).runs.append(run)
    return methods, rounds, groups


def wide_table(methods, rounds, groups, cell) -> str:
    """Markdown table: one row per method, one column per R."""
    lines = ["| method | " + " | ".join(f"R = {r}" for r in rounds) + " |", "|---|" + "---|" * len(rounds)]
    for m in methods:
        lines.append(f"| {m} | " + " | ".join(cell(groups[(m, r)]) if (m, r) in groups else "" for r in rounds) + " |")
    return "\n".join(lines)


def runs_table(runs: list[Run]) -> str:
    lines = [
        "| cell | method | R | seed | status | final val loss | best val loss | final train loss | "
        "diverged at step | steps | κ̂ (model) | escaped | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        esc = "—" if r.escaped is None else ("yes" if r.escaped else "no")
        div = r.value("diverged_at_step")
        wall = r.value("wall_time_s")
        lines.append(
            f"| {r.id} | {r.method} | {r.rounds} | {r.seed} | {r.status} | {fmt(r.value('final_val_loss'))} | "
            f"{fmt(r.value('best_val_loss'))} | {fmt(r.value('final_train_loss'))} | "
            f"{'—' if div is None else div} | {r.value('global_step') if r.summary else '—'} | "
            f"{fmt(r.kappa, 3)} | {esc} | {'—' if wall is None else f'{wall:.0f}'} |"
        )
    return "\n".join(lines)


def write_csv(runs: list[Run], path: Path) -> None:
    keys = (
        "status",
        "final_val_loss",
        "best_val_loss",
        "final_train_loss",
        "diverged_at_step",
        "global_step",
        "wall_time_s",
    )
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["cell", "method", "scheme", "p", "R", "seed", *keys, "kappa_model", "escaped"])
        for r in runs:
            w.writerow(
                [
                    r.id,
                    r.method,
                    r.scheme,
                    r.p,
                    r.rounds,
                    r.seed,
                    r.status,
                    *(repr(r.value(k)) if isinstance(r.value(k), float) else r.value(k) for k in keys[1:]),
                    repr(r.kappa) if r.kappa is not None else None,
                    r.escaped,
                ]
            )
