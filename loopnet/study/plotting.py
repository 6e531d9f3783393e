"""The one way the study's tools draw: matplotlib without a display, every figure saved the same
way, one colour per method across a report's plots. `loopnet report` and `loopnet probe` use it;
matplotlib is imported on first use only (the tools' --help stays light)."""

from __future__ import annotations

import math


def pyplot():
    try:
        import matplotlib
    except ImportError as err:
        raise SystemExit("loopnet report needs matplotlib: pip install 'loopnet[report]' (or matplotlib)") from err
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def legend(ax, **kwargs) -> None:
    if ax.get_legend_handles_labels()[0]:  # nothing drawn (e.g. no finished run): no empty legend
        ax.legend(**kwargs)


def colors(methods):
    plt = pyplot()
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {m: cycle[i % len(cycle)] for i, m in enumerate(methods)}


def save(plt, fig, path) -> None:
    """Every plot is written the same way: tight layout, 120 dpi PNG, figure closed (no leak). A figure of
    many panels that tight layout cannot fit is saved as laid out (matplotlib's warning says only that)."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Tight layout not applied")
        fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)



def smooth(values: list[float], weight: float = 0.6) -> list[float]:
    out, last = [], None
    for v in values:
        last = v if last is None or not math.isfinite(last) else weight * last + (1 - weight) * v
        out.append(last)
    return out


