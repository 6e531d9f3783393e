"""The runs that do not train, seen through their last diagnostics: a check added after the transfer readings
(2026-12-07), not one of them.

    python -m experiments.transfer.stall --cells runs/sweeps/transfer_width runs/sweeps/transfer_target

No run of the study diverged: a run that fails the trains rule ends near the unigram plateau. Its summary holds
the per-visit diagnostics of its last step (step 199; `VisitDiagnostics`, docs/diagnostics.md). Per (arm, cell,
rate), over the seeds, this prints:

    trains          how many seeds train (`loopnet.study.measures.trains`, the readings' rule)
    branch ratio    ‖f(x)‖/‖α·x‖, the branch-to-skip ratio, its median over the visits (the seeds' median)
    gradient fall   (log10 ‖∂L/∂x‖ at round R's last visit − log10 ‖∂L/∂x‖ at round 1's first visit) / R, the
                    decades the activation gradient loses per round on its way back through the loop (the seeds'
                    median): ~0 when it reaches round 1 undiminished; inf when it is 0 there (vanished in fp32)

It needs the run folders (their summary.json files; the committed archives hold them), not a cells.csv.
"""

from __future__ import annotations

import math
import re
import statistics
import sys
from pathlib import Path

from experiments.transfer import readings as tr
from loopnet.env import one_line_errors
from loopnet.study.measures import trains

ROUND = re.compile(r"^r(\d+)_")  # loopnet.model.Visit.tag: r03_k1_attn (prelude/coda visits: p1_…, c1_…)


def visit_measures(stats: dict) -> tuple[float, float] | None:
    """(median branch ratio, gradient fall in decades a round) of one run's last per-visit statistics, the loop's
    visits in the order the model runs them (the summary's order); None without them."""
    loop = [(tag, s) for tag, s in stats.items() if ROUND.match(tag)]
    if not loop:
        return None
    rounds = int(ROUND.match(loop[-1][0]).group(1))
    first, last = loop[0][1]["act_grad_norm"], loop[-1][1]["act_grad_norm"]
    if last <= 0:
        fall = math.nan  # no gradient at the output end: nothing to compare
    elif first <= 0:
        fall = math.inf
    else:
        fall = (math.log10(last) - math.log10(first)) / rounds
    return statistics.median(s["branch_ratio"] for _, s in loop), fall


def read(folders, plateau: float) -> dict[tuple[str, str, float], list[tuple[bool, float, float]]]:
    """(arm, cell, rate) -> [(trains, branch ratio, gradient fall)] over the finished runs of the sweep folders."""
    from loopnet.study.report.runs import load_runs

    rows: dict[tuple[str, str, float], list[tuple[bool, float, float]]] = {}
    for folder in map(Path, folders):
        every = load_runs(folder)[0]
        finished = [r for r in every if r.finished and r.summary and r.summary.get("config")]
        if not finished:
            raise ValueError(f"{folder} has no finished run with a summary; fix: pass the transfer sweeps' folders")
        base = [r for r in finished if "model.config.parametrization" not in r.params]
        default = (base or finished)[0].summary["config"]
        for run in finished:
            arm, cell = tr._arm_cell(run, default)
            measures = visit_measures(run.summary.get("last_visit_stats") or {})
            if arm is None or cell is None or run.lr is None or measures is None:
                continue
            ok = trains(run.status, run.value("final_val_loss"), plateau)
            rows.setdefault((arm, cell, float(run.lr)), []).append((ok, *measures))
    return rows


def table(rows: dict) -> list[str]:
    lines = [
        "| arm | cell | η | trains | branch ratio (median) | gradient fall (decades a round, median) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    order = {a: i for i, a in enumerate(tr.ARM_NAMES)}
    for arm, cell, lr in sorted(rows, key=lambda k: (order[k[0]], k[1], k[2])):
        seeds = rows[(arm, cell, lr)]
        ratio = statistics.median(r for _, r, _ in seeds)
        falls = [f for _, _, f in seeds if not math.isnan(f)]
        fall = statistics.median(falls) if falls else math.nan
        lines.append(
            f"| {tr.ARM_NAMES[arm]} | {cell} | {lr:.3g} | {sum(ok for ok, _, _ in seeds)} of {len(seeds)} "
            f"| {ratio:.3f} | {fall:+.2f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    p = tr.parser("experiments.transfer.stall", __doc__, cells_help="the transfer sweeps' run folders")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    from experiments import sources

    with one_line_errors("loopnet transfer", (ValueError, FileNotFoundError)):
        plateau = sources.plateau(args.cells, args.plateau)
        rows = read(args.cells, plateau)
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
