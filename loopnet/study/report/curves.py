"""Plots over the steps: loss curves, κ̂ over training, and the FLT paper's diagnostic window."""

from __future__ import annotations

import statistics

from ..plotting import colors as method_colors, legend, pyplot, save, smooth
from .runs import FIRST_FFN_GRAD, final_state_curve


def plot_loss_curves(methods, rounds, runs, plateau, path):
    """Training loss (smoothed, solid) and validation loss (dashed, dots), one panel per R,
    one colour per method, every seed drawn."""
    plt = pyplot()
    colors = method_colors(methods)
    fig, axes = plt.subplots(1, len(rounds), figsize=(5 * len(rounds), 4.2), squeeze=False, sharey=True)
    for ax, r in zip(axes[0], rounds):
        for run in runs:
            if run.rounds != r or not run.curves:
                continue
            first = not any(l.get_label() == run.method for l in ax.get_lines())
            if "train/loss" in run.curves:
                steps, vals = zip(*run.curves["train/loss"])
                ax.plot(
                    steps,
                    smooth(list(vals)),
                    color=colors[run.method],
                    lw=1,
                    alpha=0.8,
                    label=run.method if first else None,
                )
            if "val/loss" in run.curves:
                steps, vals = zip(*run.curves["val/loss"])
                ax.plot(steps, vals, color=colors[run.method], ls="--", marker=".", lw=0.8, alpha=0.8)
        if plateau is not None:
            ax.axhline(plateau, ls=":", color="grey", lw=0.8)
        ax.set_title(f"R = {r}")
        ax.set_xlabel("step")
        legend(ax, fontsize=7)
    axes[0, 0].set_ylabel("loss (nats): train solid, val dashed")
    save(plt, fig, path)


def plot_kappa_curves(methods, rounds, runs, path) -> bool:
    """κ̂ (whole model) at every diagnostics step, one panel per R > 1, every seed drawn."""
    rounds = [r for r in rounds if r > 1]
    if not rounds or not any("grad/kappa_model" in run.curves for run in runs):
        return False
    plt = pyplot()
    colors = method_colors(methods)
    fig, axes = plt.subplots(1, len(rounds), figsize=(5 * len(rounds), 4.2), squeeze=False)
    for ax, r in zip(axes[0], rounds):
        for run in runs:
            if run.rounds == r and "grad/kappa_model" in run.curves:
                first = not any(l.get_label() == run.method for l in ax.get_lines())
                steps, vals = zip(*run.curves["grad/kappa_model"])
                ax.plot(
                    steps,
                    vals,
                    color=colors[run.method],
                    marker=".",
                    lw=1,
                    alpha=0.8,
                    label=run.method if first else None,
                )
        ax.axhline(r, ls=":", color="grey", lw=0.8)
        ax.axhline(1.0, ls="--", color="grey", lw=0.8)
        ax.set(title=f"R = {r} (dotted: κ̂ = R, dashed: κ̂ = 1)", xlabel="step", ylim=(0, r + 0.5))
        legend(ax, fontsize=7)
    axes[0, 0].set_ylabel("κ̂ (whole model)")
    save(plt, fig, path)
    return True


def plot_window(methods, runs, path) -> bool:
    """The FLT paper's diagnostic window, mean over seeds per method and R: the state norm at the end
    of the last round, the first FFN's gradient norm and the update size of the step, over the steps
    that logged diagnostics. Drawn when the runs logged diagnostics at ≥ 8 steps."""
    keys = [
        ("state", "state RMS at the end of the last round"),
        (FIRST_FFN_GRAD, "first FFN's gradient norm"),
        ("update/output_change", "output change of the step"),
    ]
    series: dict[tuple[str, int], dict[str, dict[int, list[float]]]] = {}
    for run in runs:
        cfg = (run.summary or {}).get("config") or {}
        curves = dict(run.curves)
        state = final_state_curve(curves, cfg["n_blocks"], cfg["n_rounds"]) if "n_blocks" in cfg else None
        if state is not None:
            curves["state"] = state
        for key, _ in keys:
            for step, value in curves.get(key, []):
                series.setdefault((run.method, run.rounds), {}).setdefault(key, {}).setdefault(step, []).append(value)
    if not series or max(len(v.get(FIRST_FFN_GRAD, {})) for v in series.values()) < 8:
        return False
    plt = pyplot()
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 4))
    for i, ((method, r), data) in enumerate(sorted(series.items(), key=lambda kv: (methods.index(kv[0][0]), kv[0][1]))):
        for ax, (key, title) in zip(axes, keys):
            if key in data:
                steps = sorted(data[key])
                ax.plot(
                    steps,
                    [statistics.fmean(data[key][s]) for s in steps],
                    marker=".",
                    lw=1,
                    color=cycle[i % len(cycle)],
                    label=f"{method}, R = {r}",
                )
            ax.set(title=title, xlabel="step", yscale="log")
    for ax in axes:
        legend(ax, fontsize=7)
    fig.suptitle("Diagnostic window (mean over seeds)", fontsize=10)
    save(plt, fig, path)
    return True
