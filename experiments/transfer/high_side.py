"""Δ50 on each cell's high side: a check added after the transfer readings (2026-12-07), not one of them.

    python -m experiments.transfer.high_side --cells docs/results/transfer

The pre-registered Δ50 (`readings.delta50`) fits P(trains) = σ(b·(log10 η − c_cell)) to every run, so it assumes
that a run fails to train because its rate is too high. In the μP + CompleteP arm, half the seeds at the ladder's
lowest rate also fail the trains rule (too few steps to leave the plateau, not instability), which the model
reads as a shallow slope. This check refits the same model to each (arm, cell)'s high side only: the rates at or
above the rate with the cell's lowest seed-mean final loss among completed runs. It prints both fits side by side,
with the pre-registered words; the pre-registered readings stand as computed.
"""

from __future__ import annotations

import statistics
import sys

from experiments.transfer import readings as tr
from loopnet.env import one_line_errors

PAIRS = (("source", "target"), ("source", "width"), ("width", "target"))


def best_mean_rate(runs: dict, arm: str, cell: str) -> float | None:
    """The ladder rate with the lowest seed-mean final loss among the cell's completed runs."""
    losses: dict[float, list[float]] = {}
    for (a, c, lr, _), r in runs.items():
        if a == arm and c == cell and r["status"] == "completed":
            losses.setdefault(lr, []).append(r["loss"])
    return min(losses, key=lambda lr: statistics.mean(losses[lr])) if losses else None


def high_side(runs: dict) -> dict:
    """The runs at or above their cell's best seed-mean rate."""
    best = {(a, c): best_mean_rate(runs, a, c) for a, c, _, _ in runs}
    return {k: r for k, r in runs.items() if best[k[:2]] is not None and k[2] >= best[k[:2]]}


def _fit(e: dict | None) -> str:
    if not e or "est" not in e:
        return f"— ({e['undecided']})" if e else "—"
    lo = "open" if e["lo"] is None else f"{e['lo']:+.2f}"
    hi = "open" if e["hi"] is None else f"{e['hi']:+.2f}"
    return f"{e['est']:+.2f} [{lo}, {hi}], slope {e['slope']:.1f}, {tr.transfer_word(e)}"


def table(runs: dict, plateau: float) -> list[str]:
    high = high_side(runs)
    lines = [
        "| arm | cells | every run (pre-registered) | high side only | high-side runs |",
        "|---|---|---|---|---:|",
    ]
    for arm in ("standard", "mup", "completep"):
        for a, b in PAIRS:
            n = sum(1 for k in high if k[0] == arm and k[1] in (a, b))
            every, hs = tr.delta50(runs, arm, a, b, plateau), tr.delta50(high, arm, a, b, plateau)
            lines.append(f"| {tr.ARM_NAMES[arm]} | {a} → {b} | {_fit(every)} | {_fit(hs)} | {n} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    args = tr.parser("experiments.transfer.high_side", __doc__).parse_args(sys.argv[1:] if argv is None else argv)
    from experiments import sources

    with one_line_errors("loopnet transfer", (ValueError, FileNotFoundError)):
        plateau = sources.plateau(args.cells, args.plateau)
        runs = tr.read(args.cells)
        if not runs:
            raise ValueError(f"no finished run in {', '.join(args.cells)}; fix: pass docs/results/transfer")
    print("Δ50 in decades, Firth profile-likelihood 95% interval, common slope b per arm and pair of cells")
    print("\n".join(table(runs, plateau)))


if __name__ == "__main__":
    main()
