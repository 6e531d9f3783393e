"""The exponent sweep's plot: escape fraction and final validation loss vs p (residual `scaled`)."""

from __future__ import annotations

import statistics

from ..plotting import legend, pyplot, save
from .runs import Run
from .tables import mean_std


def plot_exponent(runs: list[Run], path) -> bool:
    """For sweeps of the exponent p (`scaled`): escape fraction and final val loss vs p, per R."""
    scaled = [r for r in runs if r.scheme == "scaled" and r.p is not None and r.finished]
    if not scaled:
        return False
    plt = pyplot()
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
        legend(ax, fontsize=8)
    fig.suptitle("Exponent sweep: α = (2N)^p, β = (8N)^-p (dotted: DeepNorm 1/4, DeepLoop 1/2)", fontsize=10)
    save(plt, fig, path)
    return True


