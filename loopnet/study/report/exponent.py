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
        losses = [
            [
                x.value("final_val_loss")
                for x in sel(p)
                if x.status == "completed" and x.value("final_val_loss") is not None
            ]
            for p in ps
        ]
        pts = [(p, *mean_std(v)) for p, v in zip(ps, losses) if v]
        if pts:
            ax2.errorbar(
                [p for p, _, _ in pts],
                [m for _, m, _ in pts],
                yerr=[s or 0 for _, _, s in pts],
                marker="o",
                capsize=3,
                label=f"R = {r}",
            )
    ax1.set(xlabel="exponent p", ylabel="fraction of seeds escaping the plateau", ylim=(-0.05, 1.05))
    ax2.set(xlabel="exponent p", ylabel="final validation loss (completed seeds)")
    for ax in (ax1, ax2):
        ax.axvline(0.25, ls=":", color="grey", lw=0.8)
        ax.axvline(0.5, ls=":", color="grey", lw=0.8)
        legend(ax, fontsize=8)
    fig.suptitle("Exponent sweep: α = (2N)^p, β = (8N)^-p (dotted: DeepNorm 1/4, DeepLoop 1/2)", fontsize=10)
    save(plt, fig, path)
    return True


def exponent_table(runs: list[Run], plateau: float | None) -> str | None:
    """For sweeps of p: per (R, lr), the seeds that train (`measures.trains`: completed, final val loss
    below plateau − 0.1 nat) at each p, and the logistic fit of training on p (slope b ± its Wald
    standard error, p at which half train). None without scaled runs or a plateau."""
    from ..measures import TRAIN_MARGIN, logistic_fit, trains

    scaled = [r for r in runs if r.scheme == "scaled" and r.p is not None and r.finished]
    if not scaled or plateau is None:
        return None
    ps = sorted({r.p for r in scaled})
    cells = sorted({(r.rounds, r.lr) for r in scaled}, key=lambda c: (c[0], c[1] or 0))
    lines = [
        f"Seeds that train (completed, final validation loss below the plateau − {TRAIN_MARGIN} nat) out of the "
        "finished seeds, per exponent p; logistic fit of P(train) = σ(a + b·p) by maximum likelihood (b ± its "
        'Wald standard error; p½ = −a/b). "separated": every seed that trains is on one side of every seed '
        "that does not, so the fit has no finite maximum and only the sign of the trend is known.",
        "",
        "| R | lr | " + " | ".join(f"p = {p:g}" for p in ps) + " | slope b | p½ |",
        "|---:|---:|" + "---:|" * len(ps) + "---:|---:|",
    ]
    for rounds, lr in cells:
        sel = [r for r in scaled if r.rounds == rounds and r.lr == lr]
        ok = {r.id: trains(r.status, r.value("final_val_loss"), plateau) for r in sel}
        counts = [f"{sum(ok[r.id] for r in sel if r.p == p)}/{sum(r.p == p for r in sel)}" for p in ps]
        fit = logistic_fit([r.p for r in sel], [ok[r.id] for r in sel])
        if fit is None:
            slope = "separated" if len(set(ok.values())) > 1 else "—"
            p50 = "—"
        else:
            slope, p50 = f"{fit['b']:.1f} ± {fit['se_b']:.1f}", f"{fit['x50']:.2f}"
        lines.append(
            f"| {rounds} | {'—' if lr is None else f'{lr:.3g}'} | " + " | ".join(counts) + f" | {slope} | {p50} |"
        )
    return "\n".join(lines)
