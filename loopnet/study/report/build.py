"""The report document and the `loopnet report` command: reads the runs, writes every table and
plot through the modules of its parts, and report.md with how it was produced."""

from __future__ import annotations

import argparse
import fnmatch
import datetime as dt
import platform
import shlex
import sys
from pathlib import Path

from loopnet.diagnostics import SUMMARY_NAME
from loopnet.env import fail, one_line_errors

from ..measures import escaped
from ..provenance import git_commit, machine_line
from ..sweep import MANIFEST
from .curves import plot_kappa_curves, plot_loss_curves, plot_window
from .depth import plot_kappa_vs_r, plot_per_visit, plot_val_vs_r
from . import map as stability_map
from .exponent import exponent_table, plot_exponent
from .runs import CURVES, final_state_tags, load_runs, read_curves, sweep_plateau
from .tables import Group, group_runs, runs_table, wide_table, write_csv


def setup_section(manifest: dict) -> str:
    lines = []
    if manifest.get("base"):
        lines.append(f"- base configs: {', '.join(f'`{b}`' for b in manifest['base'])}")
    if manifest.get("overrides"):
        lines.append("- every cell: " + ", ".join(f"`{k}={v}`" for k, v in manifest["overrides"].items()))
    spec = manifest.get("spec") or {}
    if spec.get("grid"):
        lines.append("- grid: " + "; ".join(f"`{k}` ∈ {v}" for k, v in spec["grid"].items()))
    for entry in spec.get("include") or []:
        lines.append("- plus: " + ", ".join(f"`{k}` = {v}" for k, v in entry.items()) + " (other keys from the grid)")
    return "\n".join(lines)


def repeated_runs(runs) -> str | None:
    """Why a folder without a manifest cannot be averaged over seeds, or None: some of its runs share
    method, R and seed (versions of one run, e.g. a 300-step one and a 100-step one), not seeds."""
    seen: dict[tuple, list[str]] = {}
    for run in runs:
        if run.seed is not None:
            seen.setdefault((run.method, run.rounds, run.seed), []).append(run.id)
    for (method, rounds, seed), ids in seen.items():
        if len(ids) > 1:
            return (
                f"{', '.join(ids)} are the same run ({method}, R = {rounds}, seed {seed}), not seeds to average; "
                f"fix: keep one version per seed in the folder (move the others out), or run a sweep"
            )
    return None


def build_report(
    sweep_dir: Path,
    out: Path,
    plateau_arg: str = "auto",
    title: str | None = None,
    notes: str | None = None,
    argv: list[str] | None = None,
    only: list[str] | None = None,
) -> Path:
    runs, manifest = load_runs(sweep_dir)
    if only:  # the cells a sweep ran with --only: the others are not this report's, not "not run"
        runs = [r for r in runs if any(fnmatch.fnmatchcase(r.id, glob) for glob in only)]
        if not runs:
            raise ValueError(
                f"no cell of {sweep_dir} matches --only {' '.join(only)}; fix: a glob over the cell ids "
                f"(`loopnet sweep SWEEP_FILE --dry_run` lists them)"
            )
    if not runs:
        deeper = sorted(sweep_dir.glob(f"*/*/{SUMMARY_NAME}"))
        if deeper:  # `loopnet fit`'s own layout, runs/<run name>/version_N/summary.json
            raise ValueError(
                f"{sweep_dir} is not a sweep folder: it holds no sweep manifest ({MANIFEST}), and its "
                f"{len(deeper)} run summaries lie two levels down (e.g. {deeper[0]}); fix: give "
                f"`loopnet report` a sweep's folder (`loopnet sweep ... --out`), or one run name folder "
                f"whose version_N folders are seeds; `loopnet compare RUN_A RUN_B` overlays single runs"
            )
        raise ValueError(
            f"{sweep_dir} holds no sweep manifest ({MANIFEST}) and no run summary (*/{SUMMARY_NAME}); "
            f"fix: give the --out folder of a `loopnet sweep`"
        )
    same_run = repeated_runs(runs) if not manifest else None
    if same_run:
        raise ValueError(same_run)
    out.mkdir(parents=True, exist_ok=True)

    if plateau_arg == "none":
        plateau, plateau_how = None, "not judged (--plateau none)"
    elif plateau_arg == "auto":
        plateau, plateau_how = sweep_plateau(runs, sweep_dir, out)
    else:
        plateau, plateau_how = float(plateau_arg), "given with --plateau"
    for run in runs:
        if plateau is not None and run.finished:
            run.escaped = escaped(run.status, run.end_loss, plateau)
        run.plateau = plateau
        config = (run.summary or {}).get("config") or {}
        extra = final_state_tags(config["n_blocks"], config["n_rounds"]) if "n_blocks" in config else ()
        run.curves = read_curves(sweep_dir / run.id, CURVES + extra)

    methods, rounds, groups = group_runs(runs)
    plots = {
        "val_loss_vs_R.png": "Final validation loss vs R",
        "resid_norm_per_visit.png": "Residual norm per visit at the end of training",
        "grad_norm_per_visit.png": "Per-visit parameter gradient norm at the end of training",
        "kappa_vs_R.png": "Measured visit alignment κ̂ vs R",
        "loss_curves.png": "Loss curves",
    }
    plot_val_vs_r(methods, rounds, groups, plateau, out / "val_loss_vs_R.png")
    plot_per_visit(
        methods,
        rounds,
        groups,
        "resid_norm",
        "residual RMS (pre-Norm stream)",
        "Residual norm per visit at the end of training",
        out / "resid_norm_per_visit.png",
    )
    plot_per_visit(
        methods,
        rounds,
        groups,
        "param_grad_norm",
        "‖g_r,j‖ (visit's share of the gradient)",
        "Per-visit parameter gradient norm at the end of training",
        out / "grad_norm_per_visit.png",
    )
    plot_kappa_vs_r(methods, rounds, groups, out / "kappa_vs_R.png")
    plot_loss_curves(methods, rounds, runs, plateau, out / "loss_curves.png")
    if plot_kappa_curves(methods, rounds, runs, out / "kappa_curves.png"):
        plots["kappa_curves.png"] = "κ̂ over training"
    if plot_window(methods, runs, out / "window.png"):
        plots["window.png"] = "Diagnostic window: end-of-loop state norm, first FFN's gradient, update size"
    if plot_exponent(runs, out / "exponent.png"):
        plots["exponent.png"] = "Exponent sweep: escape fraction and loss vs p"
    write_csv(runs, out / "cells.csv")

    name = Path(manifest.get("out") or sweep_dir).name
    report_cmd = shlex.join(["loopnet", "report", *(argv if argv is not None else [str(sweep_dir), "--out", str(out)])])
    sweep_file = manifest.get("sweep_file")
    sweep_cmd = f"loopnet sweep {sweep_file}" if sweep_file else "(unknown: no manifest)"
    invocations = manifest.get("invocations") or ([manifest["invocation"]] if manifest.get("invocation") else [])
    finished = sum(r.finished for r in runs)
    commit = git_commit()
    wall = sum(r.value("wall_time_s") or 0 for r in runs)

    md = [f"# {title or f'Stability study: {name}'}", ""]
    if manifest.get("description"):
        md += [manifest["description"].strip(), ""]
    if notes:
        md += [notes.strip(), ""]
    md += [
        "## How this was produced",
        "",
        "```bash",
        "# from the repository root",
        sweep_cmd,
        report_cmd,
        "```",
        "",
        f"- sweep invoked as: {'; '.join(f'`{i}`' for i in invocations) or 'unknown'}",
        f"- machine: {machine_line(manifest.get('machine'))}",
        f"- cells: {len(runs)}, finished {finished} "
        f"({sum(r.status == 'diverged' for r in runs)} diverged), fit time {wall / 60:.1f} min in all",
        f"- report written {dt.datetime.now().isoformat(timespec='minutes')} by loopnet"
        f"{' @ ' + commit if commit else ''} on {platform.node()}",
        setup_section(manifest),
        "",
        "## Final validation loss",
        "",
        "Mean ± sample std over the seeds that completed (a diverged seed is left out and counted with †); "
        "values straight from each run's `summary.json` (`final_val_loss`).",
        "",
        wide_table(methods, rounds, groups, Group.loss_cell),
        "",
        "## Escape from the unigram plateau",
        "",
        f"Seeds whose final validation loss is below the unigram plateau, out of the finished seeds. "
        f"Plateau: {'—' if plateau is None else f'{plateau:.4f} nats'}, {plateau_how}. A diverged seed did not escape.",
        "",
        wide_table(methods, rounds, groups, Group.escape_cell),
        "",
        "Steps to escape: the first validation step at which the validation loss is below the plateau (no "
        "smoothing, so no lag; resolution: the validation interval); mean ± std over the seeds that escaped.",
        "",
        wide_table(methods, rounds, groups, lambda g: g.stat_cell(g.escape_steps, lambda v: f"{v:.0f}")),
        "",
        "## Measured visit alignment κ̂ (whole model)",
        "",
        "κ̂ = ‖Σ_r g_r‖² / Σ_r ‖g_r‖² over all sublayers at the last diagnostics step (1: orthogonal visits, "
        "R: identical); mean ± std over completed seeds.",
        "",
        wide_table(methods, rounds, groups, lambda g: g.stat_cell(g.kappa)),
        "",
        "## Largest residual norm over the visits",
        "",
        "Largest RMS of the pre-Norm stream over all visits at the last diagnostics step; mean ± std over "
        'completed seeds. For Pre-LN this is the residual stream itself (the FLT paper\'s "residual explosion" '
        "grows it with R); the Post-LN family renormalises the stream at every visit, so there it is about α·1 "
        "plus the branch (α = 1, (2N)^¼, (2N)^½ for postln, deepnorm, deeploop).",
        "",
        wide_table(methods, rounds, groups, lambda g: g.stat_cell(g.max_resid)),
        "",
        "## Gradient reaching the first round",
        "",
        "‖g_1,j‖ / ‖g_R,j‖: the norm of the gradient a physical sublayer receives through its first-round visit "
        "over that through its last-round visit, at the last diagnostics step; geometric mean over sublayers and "
        "completed seeds. ≪ 1: the early rounds get (almost) no gradient, and κ̂ ≈ 1 then means one visit "
        "dominates rather than orthogonal visits.",
        "",
        wide_table(
            methods, rounds, groups, lambda g: "—" if g.first_last_grad() is None else f"{g.first_last_grad():.1e}"
        ),
        "",
    ]
    from loopnet.diagnostics.fixed_point import fixed_point_table

    fixed = fixed_point_table([(run.id, run.summary) for run in runs])
    if fixed:  # runs trained with model.extrapolate_rounds
        md += [
            "## Extrapolation and fixed points",
            "",
            "The last validation's per-round profile (`summary.json`'s `fixed_point`; docs/inference.md), "
            "each cell at the listed rounds r.",
            "",
            fixed,
            "",
        ]
    exponent = exponent_table(runs, plateau)
    if exponent:
        md += ["## Exponent sweep: training vs p", "", exponent, ""]
    if stability_map.is_map(runs):
        md += stability_map.section(runs, plateau, out)[0]
    md += ["## Plots", ""]
    for file, caption in plots.items():
        md += [f"### {caption}", "", f"![{caption}]({file})", ""]
    md += [
        "## Every run",
        "",
        runs_table(runs),
        "",
        "Per-cell values at full precision: [cells.csv](cells.csv). Each cell's logs are in "
        f"`{manifest.get('out') or sweep_dir}/<cell>/` (TensorBoard: `tensorboard --logdir {manifest.get('out') or sweep_dir}`).",
        "",
    ]
    path = out / "report.md"
    path.write_text("\n".join(md))
    return path


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="loopnet report",
        description="Turn a sweep folder into a markdown report "
        "with tables and PNG plots (loopnet.study.report says what it holds).",
    )
    p.add_argument("sweep_dir", help="the sweep folder (the `out:` of the sweep file)")
    p.add_argument("--out", help="report folder (default: <sweep_dir>/report)")
    p.add_argument(
        "--plateau",
        default="auto",
        help="unigram plateau in nats for the escape column: a number, 'auto' (computed from the "
        "training data; 7.67 for hub datasets) or 'none' (default auto)",
    )
    p.add_argument("--title", help="report title")
    p.add_argument("--notes", help="markdown file inserted under the title (e.g. the reading of the results)")
    p.add_argument(
        "--only",
        action="append",
        metavar="GLOB",
        help="report only the cells whose id matches (repeatable), as `loopnet sweep --only` ran them",
    )
    return p


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser().parse_args(argv)
    sweep_dir = Path(args.sweep_dir)
    if not sweep_dir.is_dir():
        fail("loopnet report", f"{sweep_dir} is not a folder")
    if args.plateau not in ("auto", "none"):
        try:
            float(args.plateau)
        except ValueError:
            fail("loopnet report", f"--plateau takes a number, auto or none, got {args.plateau!r}")
    notes = Path(args.notes).read_text() if args.notes else None
    out = Path(args.out) if args.out else sweep_dir / "report"
    with one_line_errors("loopnet report", (ValueError,)):
        path = build_report(sweep_dir, out, args.plateau, args.title, notes, argv, args.only)
    print(f"loopnet report: wrote {path}")
