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
    """Every plot is written the same way: tight layout, 120 dpi PNG with a 256-colour palette, figure closed
    (no leak). A figure of many panels that tight layout cannot fit is saved as laid out (matplotlib's
    warning says only that). The palette (median cut, no dithering: a plot has few colours) makes the file
    ~3× smaller than matplotlib's RGBA, which matters for reports committed by the dozen."""
    import io
    import warnings

    from PIL import Image

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Tight layout not applied")
        fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, dpi=120, format="png")
    plt.close(fig)
    image = Image.open(buf).convert("RGB")
    image.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(
        path, format="PNG", optimize=True
    )


def smooth(values: list[float], weight: float = 0.6) -> list[float]:
    out, last = [], None
    for v in values:
        last = v if last is None or not math.isfinite(last) else weight * last + (1 - weight) * v
        out.append(last)
    return out
