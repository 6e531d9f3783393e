"""`loopnet compare`: two runs' depth profiles overlaid at chosen logging steps, as one PNG; with
--frontier, their adaptive-exit frontiers (`loopnet.diagnostics.frontier`) instead.

    loopnet compare runs/deeploop/version_0 runs/deepnorm/version_0 --steps 100 300 --out compare.png
    loopnet compare runs/deeploop/version_1 runs/deepnorm/version_1 --frontier --out frontier.png

Reads each run's per-visit scalars (``visits/<quantity>/<visit>``, `loopnet.diagnostics.tags`) from its
TensorBoard event files with TensorBoard's EventAccumulator and draws every quantity of the depth profile
(`loopnet.diagnostics.profile.VIEWS`) in a panel of its own against the visit index: one colour per run,
one line style per step. A step that a run did not log is replaced by its nearest logging step, and the
legend says which. Without --steps, each run's last logging step. Light: no Lightning, no model.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from loopnet.env import one_line_errors
from loopnet.model import Visit, visit_order

from .tags import parse_tag

RUN_COLORS = ("C0", "C3", "C2", "C4")
STEP_STYLES = ("-", "--", ":", "-.")


def event_dir(path: str) -> Path:
    """The folder holding `path`'s event files: `path` itself, or its one sub-folder that holds some (a
    run's name folder with a single version_N)."""
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"{path}: no such folder; fix: give a run's log folder (e.g. runs/NAME/version_0)")
    folders = sorted({f.parent for f in root.rglob("events.out.tfevents.*")})
    if not folders:
        raise FileNotFoundError(
            f"{path} holds no TensorBoard event files; fix: give a run's log folder "
            f"(e.g. runs/NAME/version_0) of a fit with diagnostics on"
        )
    if root in folders or len(folders) == 1:
        return root if root in folders else folders[0]
    names = ", ".join(str(f) for f in folders[:4])
    raise ValueError(f"{path} holds several runs ({names}{', ...' if len(folders) > 4 else ''}); fix: name one")


def read_visits(path: Path) -> tuple[list[Visit], dict[int, dict[str, float]]]:
    """(visits in forward order, {step: {tag: value}}) of the per-visit scalars in `path`'s event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(path), size_guidance={"scalars": 0, "images": 1, "histograms": 1, "tensors": 1})
    acc.Reload()
    tags = [t for t in acc.Tags().get("scalars", []) if t.startswith("visits/")]
    if not tags:
        raise ValueError(
            f"{path} has no per-visit scalars (visits/...); fix: train with diagnostics on "
            f"(--diagnostics.every_n_steps N, N > 0)"
        )
    visits = {parse_tag(t)[2] for t in tags}
    count = lambda part, field: max((getattr(v, field) for v in visits if v.part == part), default=0)  # noqa: E731
    # With sampled rounds, steps ran different R: the order covers the most; a step's missing rounds are nan.
    n_blocks, n_rounds = count("loop", "block"), count("loop", "round")
    by_step: dict[int, dict[str, float]] = {}
    for tag in tags:
        for event in acc.Scalars(tag):
            by_step.setdefault(event.step, {})[tag] = event.value
    return visit_order(n_blocks, n_rounds, count("prelude", "block"), count("coda", "block")), by_step


def nearest(step: int, logged: list[int]) -> int:
    return min(logged, key=lambda s: (abs(s - step), s))


def compare_figure(runs: list[tuple[str, list[Visit], dict[int, dict[str, float]]]], steps: list[int] | None):
    """The figure: one panel per depth-profile quantity, every (run, step) a line in each. `runs`:
    (label, visits, {step: scalars}) each."""
    from .profile import LABELS, VIEWS, figure, depth_profile, draw_depth

    panels = [
        (q, title if len(quantities) == 1 else f"{title.split()[0]}: {LABELS[q]}", log)
        for _, (title, quantities, log) in VIEWS.items()
        for q in quantities
    ]
    cols = 3
    rows = math.ceil(len(panels) / cols)
    fig = figure(size=(4.2 * cols, 3.0 * rows + 0.5), dpi=100)
    longest = max((visits for _, visits, _ in runs), key=len)
    lines: dict[str, list] = {q: [] for q, _, _ in panels}
    for i, (label, visits, by_step) in enumerate(runs):
        logged = sorted(by_step)
        chosen = [nearest(s, logged) for s in steps] if steps else [logged[-1]]
        for j, step in enumerate(dict.fromkeys(chosen)):  # each step once, in the order asked
            profile = depth_profile(by_step[step], visits)
            style = {
                "color": RUN_COLORS[i % len(RUN_COLORS)],
                "linestyle": STEP_STYLES[j % len(STEP_STYLES)],
                "label": f"{label}  step {step}",
            }
            for q in lines:
                lines[q].append((profile[q] + [math.nan] * (len(longest) - len(visits)), style))
    for n, (q, title, log) in enumerate(panels, start=1):
        ax = fig.add_subplot(rows, cols, n)
        draw_depth(ax, longest, lines[q], log, font=11)
        ax.set_title(title, fontsize=12, pad=4)
    handles, labels = fig.axes[0].get_legend_handles_labels()
    # As many columns as the longest label fits across the figure (a 10-pt character is ~0.08 in wide,
    # plus the line sample), and the panels start below the legend's rows: long folder names never clip.
    width = 4.2 * cols
    ncol = max(1, min(4, len(labels), int(width / (0.08 * max(map(len, labels)) + 0.6))))
    legend_in = 0.25 * math.ceil(len(labels) / ncol) + 0.2
    fig.set_size_inches(width, 3.0 * rows + legend_in)
    fig.legend(handles, labels, loc="upper center", ncol=ncol, fontsize=10, frameon=False)
    fig.text(
        0.5,
        0.005,
        "visit in forward order (each round: block 1 attn, ffn, block 2 attn, ...)",
        ha="center",
        va="bottom",
        fontsize=10,
    )
    fig.subplots_adjust(
        left=0.06,
        right=0.98,
        bottom=0.08,
        top=1 - (legend_in + 0.3) / (3.0 * rows + legend_in),
        hspace=0.35,
        wspace=0.25,
    )
    return fig


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="loopnet compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help="run log folders (2 to 4), e.g. runs/NAME/version_0")
    p.add_argument(
        "--steps", type=int, nargs="+", help="logging steps to draw (each run's nearest); default: each run's last"
    )
    p.add_argument("--labels", nargs="+", help="a legend label per run (default: the folder names)")
    p.add_argument("--out", default="compare.png", help="the PNG to write (default: compare.png)")
    p.add_argument(
        "--frontier",
        action="store_true",
        help="overlay the runs' exit frontiers (loss against mean rounds per token, from the "
        "frontier.json that `loopnet test` with --model.frontier.* writes) instead of depth profiles",
    )
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    prog = "loopnet compare"
    with one_line_errors(prog):
        if not 2 <= len(args.runs) <= len(RUN_COLORS):
            raise ValueError(f"{len(args.runs)} run(s) given; fix: give 2 to {len(RUN_COLORS)} run folders")
        if args.labels and len(args.labels) != len(args.runs):
            raise ValueError(f"{len(args.labels)} labels for {len(args.runs)} runs; fix: give one label per run")
        if args.steps and len(args.steps) > len(STEP_STYLES):
            raise ValueError(f"{len(args.steps)} steps; fix: give at most {len(STEP_STYLES)} (one line style each)")
        out = Path(args.out)
        if out.suffix.lower() != ".png" or not out.parent.is_dir():
            raise ValueError(f"--out {args.out}: not a .png in an existing folder; fix: e.g. --out compare.png")
        if args.frontier:
            from .frontier import frontier_figure, read_frontier

            frontiers = [read_frontier(run) for run in args.runs]
            labels = args.labels or [_label(Path(run)) for run in args.runs]
    if args.frontier:
        frontier_figure(list(zip(labels, frontiers))).savefig(out, format="png")
        for label, f in zip(labels, frontiers):
            print(
                f"{label}: exit {f['exit']}, "
                + ", ".join(
                    f"{p['threshold']:g} → loss {p['loss']:.4f} at {p['mean_rounds']:.2f} rounds" for p in f["points"]
                )
            )
        print(f"wrote {out}")
        return
    with one_line_errors(prog):
        folders = [event_dir(run) for run in args.runs]
        labels = args.labels or [_label(f) for f in folders]
        runs = [(label, *read_visits(f)) for label, f in zip(labels, folders)]
    fig = compare_figure(runs, args.steps)
    fig.savefig(out, format="png")
    for label, _, by_step in runs:
        logged = sorted(by_step)
        chosen = [nearest(s, logged) for s in args.steps] if args.steps else [logged[-1]]
        moved = [f"{asked} -> {got}" for asked, got in zip(args.steps or [], chosen) if asked != got]
        print(
            f"{label}: steps {', '.join(map(str, dict.fromkeys(chosen)))} (logged: {logged[0]}..{logged[-1]}, "
            f"{len(logged)} steps" + (f"; not logged, drawn at the nearest: {', '.join(moved)}" if moved else "") + ")"
        )
    print(f"wrote {out}")


def _label(folder: Path) -> str:
    """runs/NAME/version_0 -> NAME/version_0."""
    return "/".join(folder.parts[-2:]) if folder.name.startswith("version_") else folder.name
