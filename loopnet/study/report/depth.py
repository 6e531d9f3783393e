"""Plots over the depth: a quantity vs R per method (final validation loss, κ̂), and per-visit
quantities at the end of training in execution order."""

from __future__ import annotations

import math

from loopnet.model import SUBLAYERS, Visit

from ..measures import geomean
from ..plotting import colors as method_colors, legend, pyplot, save


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


def plot_val_vs_r(methods, rounds, groups, plateau, path):
    plt = pyplot()
    colors = method_colors(methods)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    _errorbar_vs_r(ax, methods, rounds, groups, lambda g: g.loss(), colors)
    if plateau is not None and ax.get_ylim()[1] >= plateau:
        ax.axhline(plateau, ls=":", color="grey", label=f"unigram plateau {plateau:.2f}")
    ax.set_ylabel("final validation loss (nats)")
    ax.set_title("Final validation loss vs R (mean ± std over seeds; x: a diverged seed)")
    legend(ax, fontsize=8)
    save(plt, fig, path)


def plot_kappa_vs_r(methods, rounds, groups, path):
    plt = pyplot()
    colors = method_colors(methods)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    _errorbar_vs_r(ax, methods, rounds, groups, lambda g: g.kappa(), colors)
    ax.plot(rounds, rounds, ls=":", color="grey", label="κ̂ = R (aligned visits)")
    ax.axhline(1.0, ls="--", color="grey", lw=0.8, label="κ̂ = 1 (orthogonal visits)")
    ax.set_ylabel("κ̂ (whole model), last diagnostics step")
    ax.set_title("Measured visit alignment κ̂ vs R (mean ± std over seeds)")
    legend(ax, fontsize=8)
    save(plt, fig, path)


def _visit_key(tag: str):
    v = Visit.parse(tag)
    return v.round, v.block, SUBLAYERS.index(v.sublayer)


def plot_per_visit(methods, rounds, groups, quantity: str, ylabel: str, title: str, path):
    """A per-visit quantity at every visit, in execution order, at the last diagnostics step: one
    panel per method, one line per R (geometric mean over the seeds that completed: the values
    span orders of magnitude)."""
    plt = pyplot()
    n = len(methods)
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows), squeeze=False, sharey=True)
    cmap = plt.get_cmap("viridis")
    for ax, m in zip(axes.flat, methods):
        for i, r in enumerate(rounds):
            g = groups.get((m, r))
            stats = [
                run.value("last_visit_stats") for run in (g.completed if g else []) if run.value("last_visit_stats")
            ]
            if not stats:
                continue
            tags = sorted(stats[0], key=_visit_key)
            ys = [geomean(s[t][quantity] for s in stats if t in s) for t in tags]
            ax.plot(range(1, len(tags) + 1), ys, marker=".", color=cmap(i / max(1, len(rounds) - 1)), label=f"R = {r}")
        ax.set_title(m, fontsize=10)
        ax.set_yscale("log")
        ax.set_xlabel("visit (execution order)")
        legend(ax, fontsize=7)
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(title, fontsize=11)
    save(plt, fig, path)
