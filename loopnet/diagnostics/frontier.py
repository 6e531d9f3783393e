"""The compute–quality frontier of adaptive exit: validation loss against mean rounds per token, one
point per exit threshold.

Teacher-forced, as the loss is: every round runs over the whole sequence (up to `max_rounds`), each
position's criterion (`loopnet.model.exit.ExitCriterion`) is checked after every round, and the
position's loss is that of the round it exits at (`max_rounds` if its criterion never holds). One
pass serves every threshold: the criterion's values are the same, only the threshold differs.
Positions read the others at full depth (not frozen at their exit rounds, as in cached generation).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F

from loopnet.model.exit import ExitCriterion

FRONTIER_NAME = "frontier.json"  # in the run folder, with frontier.png


class FrontierMeter:
    """Per threshold: the token-weighted loss and mean rounds per token over the batches seen."""

    def __init__(self, exit: str, thresholds: list[float], max_rounds: int):
        self.exit, self.thresholds, self.max_rounds = exit, [float(t) for t in thresholds], max_rounds
        self.reset()

    def reset(self) -> None:
        self.loss = [0.0] * len(self.thresholds)
        self.rounds = [0.0] * len(self.thresholds)
        self.tokens = 0.0

    @torch.no_grad()
    def update(self, model, idx: torch.Tensor, targets: torch.Tensor) -> None:
        valid = targets != -1
        criteria = [ExitCriterion(self.exit, t, model) for t in self.thresholds]
        n = len(criteria)
        loss = torch.zeros(n, *idx.shape, device=idx.device)
        used = torch.full((n, *idx.shape), self.max_rounds, dtype=torch.long, device=idx.device)
        done = torch.zeros(n, *idx.shape, dtype=torch.bool, device=idx.device)
        for r, x in model.iter_rounds(idx, self.max_rounds, start=True):
            if r == 0:  # the round-1 input
                for c in criteria:
                    c.start(x)
                continue
            logits = model.head(x)[0].float()
            ce = F.cross_entropy(logits.flatten(0, 1), targets.clamp_min(0).flatten(), reduction="none").view_as(
                targets
            )
            for i, c in enumerate(criteria):
                exits, _ = c.step(x, logits)
                newly = exits & ~done[i] if r < self.max_rounds else ~done[i]
                loss[i] = torch.where(newly, ce, loss[i])
                used[i] = torch.where(newly, r, used[i])
                done[i] |= newly
            if bool(done.all()):
                break
        for i in range(n):
            self.loss[i] += float(loss[i][valid].sum())
            self.rounds[i] += float(used[i][valid].sum())
        self.tokens += float(valid.sum())

    def sync(self, reduce) -> None:
        """Sum the counts over the processes (DDP ranks each see their own batches): `reduce` sums a float64
        tensor over them (`Strategy.reduce(..., reduce_op="sum")`), a collective every rank must call."""
        n = len(self.thresholds)
        total = reduce(torch.tensor([*self.loss, *self.rounds, self.tokens], dtype=torch.float64)).tolist()
        self.loss, self.rounds, self.tokens = total[:n], total[n : 2 * n], total[2 * n]

    def compute(self) -> list[dict]:
        """[{threshold, loss, ppl, mean_rounds}] in the order of the thresholds."""
        points = []
        for t, loss, rounds in zip(self.thresholds, self.loss, self.rounds):
            mean = loss / self.tokens if self.tokens else math.nan
            points.append(
                {
                    "threshold": t,
                    "loss": mean,
                    "ppl": math.exp(mean) if mean < 700 else math.inf,
                    "mean_rounds": rounds / self.tokens if self.tokens else math.nan,
                }
            )
        return points


def frontier_figure(runs: list[tuple[str, dict]]):
    """Loss against mean rounds per token, one line per run ((label, frontier.json's dict) each), each
    point labelled with its threshold; the fixed-R' losses (`fixed`: {R': loss}) as crosses."""
    from .profile import figure

    fig = figure(size=(6.4, 4.4), dpi=100)
    ax = fig.add_subplot(1, 1, 1)
    for i, (label, frontier) in enumerate(runs):
        color = f"C{[0, 3, 2, 4][i % 4]}"
        points = sorted(frontier["points"], key=lambda p: p["mean_rounds"])
        ax.plot(
            [p["mean_rounds"] for p in points],
            [p["loss"] for p in points],
            "o-",
            color=color,
            label=f"{label}: exit {frontier['exit']}",
        )
        for p in points:
            ax.annotate(
                f"{p['threshold']:g}",
                (p["mean_rounds"], p["loss"]),
                fontsize=7,
                color=color,
                textcoords="offset points",
                xytext=(3, 3),
            )
        fixed = frontier.get("fixed") or {}
        if fixed:
            ax.plot([int(r) for r in fixed], list(fixed.values()), "x", color=color, label=f"{label}: fixed R'")
    ax.set_xlabel("mean rounds per token")
    ax.set_ylabel("loss (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def write_frontier(folder: str | Path, frontier: dict, label: str = "run") -> tuple[Path, Path, object]:
    """Write ``frontier.json`` and ``frontier.png`` into `folder`; return both paths and the figure."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    json_path, png_path = folder / FRONTIER_NAME, folder / "frontier.png"
    json_path.write_text(json.dumps(frontier, indent=2) + "\n", encoding="utf-8")
    fig = frontier_figure([(label, frontier)])
    fig.savefig(png_path, format="png")
    return json_path, png_path, fig


def read_frontier(folder: str | Path) -> dict:
    path = Path(folder) / FRONTIER_NAME
    if not path.is_file():
        found = sorted(Path(folder).rglob(FRONTIER_NAME)) if Path(folder).is_dir() else []
        if len(found) != 1:
            raise FileNotFoundError(
                f"{folder} holds no {FRONTIER_NAME}; fix: run `loopnet test` with "
                f"--model.frontier.exit and --model.frontier.thresholds on that run"
            )
        path = found[0]
    return json.loads(path.read_text(encoding="utf-8"))
