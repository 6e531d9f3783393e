"""`loopnet report`: turn a sweep folder into a markdown report with tables and PNG plots.

    loopnet report runs/sweeps/cpu_study --out docs/results/cpu_study

Reads only what the runs left on disk — each cell's summary.json (`loopnet.diagnostics.read_summary`)
and its TensorBoard event files (EventAccumulator) — plus the sweep's manifest; never a model or
checkpoint. Writes into `--out` (default ``<sweep>/report``):

    report.md               tables (final validation loss per method x R as mean ± std over
                            seeds, diverged cells marked; escape from the unigram plateau; κ̂;
                            residual norms), the plots, every run, the commands and the machine
    cells.csv               one row per cell, values exactly as in the summaries
    val_loss_vs_R.png       final validation loss vs R, one line per method
    resid_norm_per_visit.png  residual norm at every visit at the end of training, per method
    grad_norm_per_visit.png each visit's share of the gradient at the end of training, per method
    kappa_vs_R.png          measured visit alignment κ̂ (whole model) vs R
    loss_curves.png         training and validation loss curves, one panel per R
    kappa_curves.png        κ̂ at every diagnostics step, one panel per R > 1
    window.png              (runs with diagnostics at >= 8 steps) the FLT paper's window: end-of-loop
                            state norm, first FFN's gradient and update size over the steps
    exponent.png            (sweeps of the exponent p) escape fraction and loss vs p

A *method* is the residual scheme and the wiring (``deeploop-carry``, ``preln-flt``, ``p0.4-carry`` for
`scaled` with p = 0.4), plus any other grid key the sweep varies except R and the seed. A run
*escapes* when it did not diverge and its final validation loss (the final training loss if it
never validated) is strictly below the unigram plateau: by default (`--plateau auto`) the loss
the training unigram distribution scores on the run's own validation batches, or 7.67 nats for
hub datasets (`loopnet.study.unigram`); `--plateau VALUE` sets it.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import math
import platform
import shlex
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from loopnet.diagnostics import SUMMARY_NAME
from loopnet.env import fail, one_line_errors
from loopnet.diagnostics.tags import sublayer_tag, visit_tag
from loopnet.model import SUBLAYERS, Visit

from .measures import end_loss, escape_step, escaped, first_round_gradient_ratio, geomean, method_label
from .sweep import FINAL_STATUSES, MANIFEST, cell_summary

FIRST_FFN_GRAD = sublayer_tag("grad_norm", Visit(1, 1, "ffn").physical)  # the FLT paper's first-FFN gradient


@dataclass
class Run:
    """One cell as the report sees it: its grid values and what its summary says."""

    id: str
    params: dict[str, Any]
    summary: dict | None
    method: str = "?"
    scheme: str = "?"
    p: float | None = None
    rounds: int | None = None
    seed: Any = None
    escaped: bool | None = None
    plateau: float | None = None
    curves: dict[str, list[tuple[int, float]]] = field(default_factory=dict)

    @property
    def status(self) -> str:
        return self.summary["status"] if self.summary else "not run"

    @property
    def finished(self) -> bool:
        return self.status in FINAL_STATUSES

    def value(self, key: str) -> Any:
        return self.summary.get(key) if self.summary else None

    @property
    def kappa(self) -> float | None:
        kappa = self.value("kappa") or {}
        return kappa.get("model")

    @property
    def escape_step(self) -> int | None:
        """`measures.escape_step` of the run's training loss; None when the run did not escape (or
        logged no training loss)."""
        if not self.escaped or "train/loss" not in self.curves or self.plateau is None:
            return None
        return escape_step(self.curves["train/loss"], self.plateau)

    @property
    def end_loss(self) -> float | None:
        return end_loss(self.summary)


# ---------------------------------------------------------------------------------------- reading
def load_runs(sweep_dir: Path) -> tuple[list[Run], dict]:
    """Every cell of the sweep (from its manifest; without one, every sub-folder with a summary)."""
    manifest_path = sweep_dir / MANIFEST
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    cells = manifest.get("cells") or [{"id": p.parent.name, "params": {}} for p in sorted(sweep_dir.glob(f"*/{SUMMARY_NAME}"))]
    runs = []
    for cell in cells:
        runs.append(Run(cell["id"], dict(cell.get("params") or {}), cell_summary(sweep_dir / cell["id"])))
    default_config = next((r.summary["config"] for r in runs if r.summary and r.summary.get("config")), {})
    for run in runs:
        describe(run, sweep_dir, default_config)
    return runs, manifest


def describe(run: Run, sweep_dir: Path, default_config: dict) -> None:
    """Fill in the run's method label, R and seed (from its summary, else its grid values)."""
    config = dict(default_config)
    for key, value in run.params.items():
        if key.startswith("model.config."):
            config[key.removeprefix("model.config.")] = value
    if run.summary and run.summary.get("config"):
        config = run.summary["config"]
    run.scheme = config.get("residual", "?")
    run.p = config.get("p")
    run.rounds = config.get("n_rounds")
    run.method = method_label(config, run.params)
    run.seed = run.params.get("seed_everything")
    if run.seed is None:  # not a grid key: the seed the fit resolved (its config.yaml)
        try:
            run.seed = yaml.safe_load((sweep_dir / run.id / "config.yaml").read_text()).get("seed_everything")
        except (FileNotFoundError, AttributeError, yaml.YAMLError):
            pass


CURVES = ("train/loss", "val/loss", "grad/kappa_model", "update/output_change", FIRST_FFN_GRAD)


def final_state_tag(n_blocks: int, n_rounds: int) -> str:
    """The state at the end of the last round: the last visit's output (Pre-LN: the stream)."""
    return visit_tag("state_norm", Visit(n_rounds, n_blocks, SUBLAYERS[-1]))


def read_curves(run_dir: Path, tags=CURVES) -> dict[str, list[tuple[int, float]]]:
    """Scalar curves of a run from its TensorBoard event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not run_dir.is_dir():
        return {}
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})  # 0: keep every point
    acc.Reload()
    available = set(acc.Tags().get("scalars", []))
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in tags if tag in available}


def sweep_plateau(runs: list[Run], sweep_dir: Path, cache_dir: Path) -> tuple[float, str]:
    """The unigram plateau of the sweep's validation loss (`loopnet.study.unigram.run_plateau`),
    from the first cell's resolved config; computed once and cached in `cache_dir`."""
    from .unigram import run_plateau

    config = None
    for run in runs:
        path = sweep_dir / run.id / "config.yaml"
        if path.is_file():
            config = yaml.safe_load(path.read_text()) or {}
            break
    if config is None:
        raise ValueError("no cell has a config.yaml to read the data source from; pass --plateau VALUE")
    # What the plateau depends on: the data, and which tokens a run validates on.
    key = {"data": config.get("data"), "seq_len": config["model"]["config"]["seq_len"],
           "limit_val_batches": (config.get("trainer") or {}).get("limit_val_batches")}
    cache = cache_dir / "plateau.json"
    if cache.is_file():
        cached = json.loads(cache.read_text())
        if cached.get("key") == key:
            return cached["plateau"], cached["how"]
    value, how = run_plateau(config)
    cache_dir.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"key": key, "plateau": value, "how": how}, indent=2) + "\n")
    return value, how


# ---------------------------------------------------------------------------------------- tables
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
        vals = [max(s["resid_norm"] for s in r.value("last_visit_stats").values())
                for r in self.completed if r.value("last_visit_stats")]
        return mean_std(vals)

    def first_last_grad(self) -> float | None:
        """`measures.first_round_gradient_ratio` over the completed seeds."""
        return first_round_gradient_ratio([run.value("last_visit_stats") for run in self.completed], self.rounds)

    def loss_cell(self) -> str:
        if not self.finished:
            return "not run"
        if not self.completed:
            steps = sorted(r.value("diverged_at_step") for r in self.diverged if r.value("diverged_at_step") is not None)
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
    lines = ["| method | " + " | ".join(f"R = {r}" for r in rounds) + " |",
             "|---|" + "---|" * len(rounds)]
    for m in methods:
        lines.append(f"| {m} | " + " | ".join(cell(groups[(m, r)]) if (m, r) in groups else "" for r in rounds) + " |")
    return "\n".join(lines)


def runs_table(runs: list[Run]) -> str:
    lines = ["| cell | method | R | seed | status | final val loss | best val loss | final train loss | "
             "diverged at step | steps | κ̂ (model) | escaped | wall s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        esc = "—" if r.escaped is None else ("yes" if r.escaped else "no")
        div = r.value("diverged_at_step")
        wall = r.value("wall_time_s")
        lines.append(f"| {r.id} | {r.method} | {r.rounds} | {r.seed} | {r.status} | {fmt(r.value('final_val_loss'))} | "
                     f"{fmt(r.value('best_val_loss'))} | {fmt(r.value('final_train_loss'))} | "
                     f"{'—' if div is None else div} | {r.value('global_step') if r.summary else '—'} | "
                     f"{fmt(r.kappa, 3)} | {esc} | {'—' if wall is None else f'{wall:.0f}'} |")
    return "\n".join(lines)


def write_csv(runs: list[Run], path: Path) -> None:
    keys = ("status", "final_val_loss", "best_val_loss", "final_train_loss", "diverged_at_step", "global_step",
            "wall_time_s")
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["cell", "method", "scheme", "p", "R", "seed", *keys, "kappa_model", "escaped"])
        for r in runs:
            w.writerow([r.id, r.method, r.scheme, r.p, r.rounds, r.seed, r.status,
                        *(repr(r.value(k)) if isinstance(r.value(k), float) else r.value(k) for k in keys[1:]),
                        repr(r.kappa) if r.kappa is not None else None, r.escaped])


# ---------------------------------------------------------------------------------------- plots
def _pyplot():
    try:
        import matplotlib
    except ImportError as err:
        raise SystemExit("loopnet report needs matplotlib: pip install 'loopnet[report]' (or matplotlib)") from err
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _legend(ax, **kwargs) -> None:
    if ax.get_legend_handles_labels()[0]:  # nothing drawn (e.g. no finished run): no empty legend
        ax.legend(**kwargs)


def _colors(methods):
    plt = _pyplot()
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {m: cycle[i % len(cycle)] for i, m in enumerate(methods)}


def _errorbar_vs_r(ax, methods, rounds, groups, stat, colors):
    for m in methods:
        xs, ys, es = [], [], []
        for r in rounds:
            g = groups.get((m, r))
            mean, std = stat(g) if g else (None, None)
            if mean is not None:
                xs.append(r), ys.append(mean), es.append(std or 0.0)
        if xs:
            ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=m, color=colors[m])
        for r in rounds:  # diverged seeds: a cross on the x axis
            g = groups.get((m, r))
            if g and g.diverged:
                ax.plot([r], [ax.get_ylim()[1]], marker="x", ls="none", color=colors[m], clip_on=False)
    ax.set_xticks(rounds)
    ax.set_xlabel("rounds R")


def _save(plt, fig, path) -> None:
    """Every plot is written the same way: tight layout, 120 dpi PNG, figure closed (no leak)."""
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_val_vs_r(methods, rounds, groups, plateau, path):
    plt = _pyplot()
    colors = _colors(methods)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    _errorbar_vs_r(ax, methods, rounds, groups, lambda g: g.loss(), colors)
    if plateau is not None and ax.get_ylim()[1] >= plateau:
        ax.axhline(plateau, ls=":", color="grey", label=f"unigram plateau {plateau:.2f}")
    ax.set_ylabel("final validation loss (nats)")
    ax.set_title("Final validation loss vs R (mean ± std over seeds; x: a diverged seed)")
    _legend(ax, fontsize=8)
    _save(plt, fig, path)


def plot_kappa_vs_r(methods, rounds, groups, path):
    plt = _pyplot()
    colors = _colors(methods)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    _errorbar_vs_r(ax, methods, rounds, groups, lambda g: g.kappa(), colors)
    ax.plot(rounds, rounds, ls=":", color="grey", label="κ̂ = R (aligned visits)")
    ax.axhline(1.0, ls="--", color="grey", lw=0.8, label="κ̂ = 1 (orthogonal visits)")
    ax.set_ylabel("κ̂ (whole model), last diagnostics step")
    ax.set_title("Measured visit alignment κ̂ vs R (mean ± std over seeds)")
    _legend(ax, fontsize=8)
    _save(plt, fig, path)


def _visit_key(tag: str):
    v = Visit.parse(tag)
    return v.round, v.block, SUBLAYERS.index(v.sublayer)


def plot_per_visit(methods, rounds, groups, quantity: str, ylabel: str, title: str, path):
    """A per-visit quantity at every visit, in execution order, at the last diagnostics step: one
    panel per method, one line per R (geometric mean over the seeds that completed: the values
    span orders of magnitude)."""
    plt = _pyplot()
    n = len(methods)
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows), squeeze=False, sharey=True)
    cmap = plt.get_cmap("viridis")
    for ax, m in zip(axes.flat, methods):
        for i, r in enumerate(rounds):
            g = groups.get((m, r))
            stats = [run.value("last_visit_stats") for run in (g.completed if g else []) if run.value("last_visit_stats")]
            if not stats:
                continue
            tags = sorted(stats[0], key=_visit_key)
            ys = [geomean(s[t][quantity] for s in stats if t in s) for t in tags]
            ax.plot(range(1, len(tags) + 1), ys, marker=".", color=cmap(i / max(1, len(rounds) - 1)), label=f"R = {r}")
        ax.set_title(m, fontsize=10)
        ax.set_yscale("log")
        ax.set_xlabel("visit (execution order)")
        _legend(ax, fontsize=7)
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(title, fontsize=11)
    _save(plt, fig, path)


def _smooth(values: list[float], weight: float = 0.6) -> list[float]:
    out, last = [], None
    for v in values:
        last = v if last is None or not math.isfinite(last) else weight * last + (1 - weight) * v
        out.append(last)
    return out


def plot_loss_curves(methods, rounds, runs, plateau, path):
    """Training loss (smoothed, solid) and validation loss (dashed, dots), one panel per R,
    one colour per method, every seed drawn."""
    plt = _pyplot()
    colors = _colors(methods)
    fig, axes = plt.subplots(1, len(rounds), figsize=(5 * len(rounds), 4.2), squeeze=False, sharey=True)
    for ax, r in zip(axes[0], rounds):
        for run in runs:
            if run.rounds != r or not run.curves:
                continue
            first = not any(l.get_label() == run.method for l in ax.get_lines())
            if "train/loss" in run.curves:
                steps, vals = zip(*run.curves["train/loss"])
                ax.plot(steps, _smooth(list(vals)), color=colors[run.method], lw=1, alpha=0.8,
                        label=run.method if first else None)
            if "val/loss" in run.curves:
                steps, vals = zip(*run.curves["val/loss"])
                ax.plot(steps, vals, color=colors[run.method], ls="--", marker=".", lw=0.8, alpha=0.8)
        if plateau is not None:
            ax.axhline(plateau, ls=":", color="grey", lw=0.8)
        ax.set_title(f"R = {r}")
        ax.set_xlabel("step")
        _legend(ax, fontsize=7)
    axes[0, 0].set_ylabel("loss (nats): train solid, val dashed")
    _save(plt, fig, path)


def plot_kappa_curves(methods, rounds, runs, path) -> bool:
    """κ̂ (whole model) at every diagnostics step, one panel per R > 1, every seed drawn."""
    rounds = [r for r in rounds if r > 1]
    if not rounds or not any("grad/kappa_model" in run.curves for run in runs):
        return False
    plt = _pyplot()
    colors = _colors(methods)
    fig, axes = plt.subplots(1, len(rounds), figsize=(5 * len(rounds), 4.2), squeeze=False)
    for ax, r in zip(axes[0], rounds):
        for run in runs:
            if run.rounds == r and "grad/kappa_model" in run.curves:
                first = not any(l.get_label() == run.method for l in ax.get_lines())
                steps, vals = zip(*run.curves["grad/kappa_model"])
                ax.plot(steps, vals, color=colors[run.method], marker=".", lw=1, alpha=0.8,
                        label=run.method if first else None)
        ax.axhline(r, ls=":", color="grey", lw=0.8)
        ax.axhline(1.0, ls="--", color="grey", lw=0.8)
        ax.set(title=f"R = {r} (dotted: κ̂ = R, dashed: κ̂ = 1)", xlabel="step", ylim=(0, r + 0.5))
        _legend(ax, fontsize=7)
    axes[0, 0].set_ylabel("κ̂ (whole model)")
    _save(plt, fig, path)
    return True


def plot_window(methods, runs, path) -> bool:
    """The FLT paper's diagnostic window, mean over seeds per method and R: the state norm at the end
    of the last round, the first FFN's gradient norm and the update size of the step, over the steps
    that logged diagnostics. Drawn when the runs logged diagnostics at ≥ 8 steps."""
    keys = [("state", "state RMS at the end of the last round"), (FIRST_FFN_GRAD, "first FFN's gradient norm"),
            ("update/output_change", "output change of the step")]
    series: dict[tuple[str, int], dict[str, dict[int, list[float]]]] = {}
    for run in runs:
        cfg = (run.summary or {}).get("config") or {}
        curves = dict(run.curves)
        if "n_blocks" in cfg and final_state_tag(cfg["n_blocks"], cfg["n_rounds"]) in curves:
            curves["state"] = curves[final_state_tag(cfg["n_blocks"], cfg["n_rounds"])]
        for key, _ in keys:
            for step, value in curves.get(key, []):
                series.setdefault((run.method, run.rounds), {}).setdefault(key, {}).setdefault(step, []).append(value)
    if not series or max(len(v.get(FIRST_FFN_GRAD, {})) for v in series.values()) < 8:
        return False
    plt = _pyplot()
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 4))
    for i, ((method, r), data) in enumerate(sorted(series.items(), key=lambda kv: (methods.index(kv[0][0]), kv[0][1]))):
        for ax, (key, title) in zip(axes, keys):
            if key in data:
                steps = sorted(data[key])
                ax.plot(steps, [statistics.fmean(data[key][s]) for s in steps], marker=".", lw=1,
                        color=cycle[i % len(cycle)], label=f"{method}, R = {r}")
            ax.set(title=title, xlabel="step", yscale="log")
    for ax in axes:
        _legend(ax, fontsize=7)
    fig.suptitle("Diagnostic window (mean over seeds)", fontsize=10)
    _save(plt, fig, path)
    return True


def plot_exponent(runs: list[Run], path) -> bool:
    """For sweeps of the exponent p (`scaled`): escape fraction and final val loss vs p, per R."""
    scaled = [r for r in runs if r.scheme == "scaled" and r.p is not None and r.finished]
    if not scaled:
        return False
    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for r in sorted({run.rounds for run in scaled}):
        ps = sorted({run.p for run in scaled if run.rounds == r})
        sel = lambda p: [run for run in scaled if run.rounds == r and run.p == p]  # noqa: E731
        esc = [statistics.fmean(bool(x.escaped) for x in sel(p)) for p in ps]
        ax1.plot(ps, esc, marker="o", label=f"R = {r}")
        losses = [[x.value("final_val_loss") for x in sel(p) if x.status == "completed" and x.value("final_val_loss") is not None] for p in ps]
        pts = [(p, *mean_std(v)) for p, v in zip(ps, losses) if v]
        if pts:
            ax2.errorbar([p for p, _, _ in pts], [m for _, m, _ in pts], yerr=[s or 0 for _, _, s in pts], marker="o",
                         capsize=3, label=f"R = {r}")
    ax1.set(xlabel="exponent p", ylabel="fraction of seeds escaping the plateau", ylim=(-0.05, 1.05))
    ax2.set(xlabel="exponent p", ylabel="final validation loss (completed seeds)")
    for ax in (ax1, ax2):
        ax.axvline(0.25, ls=":", color="grey", lw=0.8)
        ax.axvline(0.5, ls=":", color="grey", lw=0.8)
        _legend(ax, fontsize=8)
    fig.suptitle("Exponent sweep: α = (2N)^p, β = (8N)^-p (dotted: DeepNorm 1/4, DeepLoop 1/2)", fontsize=10)
    _save(plt, fig, path)
    return True


# ---------------------------------------------------------------------------------------- report
def git_commit() -> str | None:
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).resolve().parent).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


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


def machine_line(info: dict | None) -> str:
    if not info:
        return "unknown (no manifest)"
    gpus = f", GPUs: {', '.join(info['gpus'])}" if info.get("gpus") else ", no GPU"
    return (f"{info.get('cpus')} CPU cores ({info.get('cpu')}){gpus}; {info.get('platform')}; "
            f"Python {info.get('python')}, torch {info.get('torch')}")


def build_report(sweep_dir: Path, out: Path, plateau_arg: str = "auto", title: str | None = None,
                 notes: str | None = None, argv: list[str] | None = None) -> Path:
    runs, manifest = load_runs(sweep_dir)
    if not runs:
        raise ValueError(f"{sweep_dir} holds no sweep manifest ({MANIFEST}) and no run summaries")
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
        extra = (final_state_tag(config["n_blocks"], config["n_rounds"]),) if "n_blocks" in config else ()
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
    plot_per_visit(methods, rounds, groups, "resid_norm", "residual RMS (pre-Norm stream)",
                   "Residual norm per visit at the end of training", out / "resid_norm_per_visit.png")
    plot_per_visit(methods, rounds, groups, "param_grad_norm", "‖g_r,j‖ (visit's share of the gradient)",
                   "Per-visit parameter gradient norm at the end of training", out / "grad_norm_per_visit.png")
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
        "## How this was produced", "",
        "```bash",
        "# from the repository root",
        sweep_cmd,
        report_cmd,
        "```", "",
        f"- sweep invoked as: {'; '.join(f'`{i}`' for i in invocations) or 'unknown'}",
        f"- machine: {machine_line(manifest.get('machine'))}",
        f"- cells: {len(runs)}, finished {finished} "
        f"({sum(r.status == 'diverged' for r in runs)} diverged), fit time {wall / 60:.1f} min in all",
        f"- report written {dt.datetime.now().isoformat(timespec='minutes')} by loopnet"
        f"{' @ ' + commit if commit else ''} on {platform.node()}",
        setup_section(manifest), "",
        "## Final validation loss", "",
        "Mean ± sample std over the seeds that completed (a diverged seed is left out and counted with †); "
        "values straight from each run's `summary.json` (`final_val_loss`).", "",
        wide_table(methods, rounds, groups, Group.loss_cell), "",
        "## Escape from the unigram plateau", "",
        f"Seeds whose final validation loss is below the unigram plateau, out of the finished seeds. "
        f"Plateau: {'—' if plateau is None else f'{plateau:.4f} nats'}, {plateau_how}. A diverged seed did not escape.", "",
        wide_table(methods, rounds, groups, Group.escape_cell), "",
        "Steps to escape: the first step at which the training loss, smoothed by an EMA of weight 0.9, is below "
        "the plateau; mean ± std over the seeds that escaped.", "",
        wide_table(methods, rounds, groups, lambda g: g.stat_cell(g.escape_steps, lambda v: f"{v:.0f}")), "",
        "## Measured visit alignment κ̂ (whole model)", "",
        "κ̂ = ‖Σ_r g_r‖² / Σ_r ‖g_r‖² over all sublayers at the last diagnostics step (1: orthogonal visits, "
        "R: identical); mean ± std over completed seeds.", "",
        wide_table(methods, rounds, groups, lambda g: g.stat_cell(g.kappa)), "",
        "## Largest residual norm over the visits", "",
        "Largest RMS of the pre-Norm stream over all visits at the last diagnostics step; mean ± std over "
        "completed seeds. For Pre-LN this is the residual stream itself (the FLT paper's \"residual explosion\" "
        "grows it with R); the Post-LN family renormalises the stream at every visit, so there it is about α·1 "
        "plus the branch (α = 1, (2N)^¼, (2N)^½ for postln, deepnorm, deeploop).", "",
        wide_table(methods, rounds, groups, lambda g: g.stat_cell(g.max_resid)), "",
        "## Gradient reaching the first round", "",
        "‖g_1,j‖ / ‖g_R,j‖: the norm of the gradient a physical sublayer receives through its first-round visit "
        "over that through its last-round visit, at the last diagnostics step; geometric mean over sublayers and "
        "completed seeds. ≪ 1: the early rounds get (almost) no gradient, and κ̂ ≈ 1 then means one visit "
        "dominates rather than orthogonal visits.", "",
        wide_table(methods, rounds, groups, lambda g: "—" if g.first_last_grad() is None else f"{g.first_last_grad():.1e}"), "",
        "## Plots", "",
    ]
    for file, caption in plots.items():
        md += [f"### {caption}", "", f"![{caption}]({file})", ""]
    md += ["## Every run", "", runs_table(runs), "",
           "Per-cell values at full precision: [cells.csv](cells.csv). Each cell's logs are in "
           f"`{manifest.get('out') or sweep_dir}/<cell>/` (TensorBoard: `tensorboard --logdir {manifest.get('out') or sweep_dir}`).", ""]
    path = out / "report.md"
    path.write_text("\n".join(md))
    return path


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="loopnet report", description=__doc__.split("\n\n")[0])
    p.add_argument("sweep_dir", help="the sweep folder (the `out:` of the sweep file)")
    p.add_argument("--out", help="report folder (default: <sweep_dir>/report)")
    p.add_argument("--plateau", default="auto",
                   help="unigram plateau in nats for the escape column: a number, 'auto' (computed from the "
                        "training data; 7.67 for hub datasets) or 'none' (default auto)")
    p.add_argument("--title", help="report title")
    p.add_argument("--notes", help="markdown file inserted under the title (e.g. the reading of the results)")
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
        path = build_report(sweep_dir, out, args.plateau, args.title, notes, argv)
    print(f"loopnet report: wrote {path}")


if __name__ == "__main__":
    main()
