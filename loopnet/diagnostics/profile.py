"""The depth profile: at a logging step, each per-visit norm against the visit's position in the forward
pass (visit 1 = round 1, block 1, attn; then ffn, block 2, ..., round R), on a log axis, as one image
(`tags.PROFILE_TAG`, TensorBoard's IMAGES tab, with a slider over the logging steps). It shows where along
the unrolled depth the stream grows or the gradient vanishes, which the per-visit charts (one line per
visit over training steps) show only one visit at a time.

Drawn with matplotlib's Agg canvas directly (no pyplot, no display) into a PNG written as a TensorBoard
image summary; matplotlib is imported on the first logging step only.
"""

from __future__ import annotations

import io
import math

from loopnet.model import Visit

from .tags import visit_tag

# What the profile draws, in this order (the norms that span decades along the depth).
PROFILE_QUANTITIES = ("resid_norm", "state_norm", "act_grad_norm", "param_grad_norm")
LABELS = {
    "resid_norm": "residual stream RMS (pre-Norm)",
    "state_norm": "state RMS (after the Norm)",
    "act_grad_norm": "activation gradient ‖∂L/∂x‖",
    "param_grad_norm": "per-visit parameter gradient ‖g_r,j‖",
}


def depth_profile(scalars: dict[str, float], visits: list[Visit]) -> dict[str, list[float]]:
    """{quantity: its value at each visit, in forward order} from one logging step's scalars (keyed
    by `tags.visit_tag`); `visits` in forward order (`loopnet.model.visit_order`)."""
    return {q: [scalars[visit_tag(q, v)] for v in visits] for q in PROFILE_QUANTITIES}


def profile_png(profile: dict[str, list[float]], visits: list[Visit], title: str = "") -> bytes:
    """The depth profile (`profile_figure`) as a PNG."""
    buf = io.BytesIO()
    profile_figure(profile, visits, title).savefig(buf, format="png")
    return buf.getvalue()


def profile_figure(profile: dict[str, list[float]], visits: list[Visit], title: str = ""):
    """The depth profile as a matplotlib Figure (Agg canvas): x = visit index in forward order
    (1 … 2·K·R, rounds marked), one line per quantity on a log y axis (non-positive or non-finite
    values left out)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4), dpi=80)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    x = list(range(1, len(visits) + 1))
    for q in PROFILE_QUANTITIES:
        y = [v if math.isfinite(v) and v > 0 else math.nan for v in profile[q]]
        if any(math.isfinite(v) for v in y):
            ax.plot(x, y, marker=".", linewidth=1.2, label=LABELS[q])
    ax.set_yscale("log")
    starts = [i for i, v in zip(x, visits) if v.block == 1 and v.sublayer == "attn"]
    for i in starts[1:]:
        ax.axvline(i - 0.5, color="0.8", linewidth=0.8, zorder=0)
    step = max(1, len(starts) // 16)  # at most ~16 round labels
    ax.set_xticks(starts[::step], [f"r{visits[i - 1].round}" for i in starts[::step]])
    ax.set_xlim(0.5, len(visits) + 0.5)
    ax.set_xlabel("visit in forward order (each round: block 1 attn, ffn, block 2 attn, ...)")
    ax.grid(True, which="major", axis="y", alpha=0.3)
    if ax.lines:  # nothing finite to draw (a diverged run): no legend, and no matplotlib warning
        ax.legend(fontsize=7, loc="upper left")
    if title:
        ax.set_title(title, fontsize=9)
    fig.subplots_adjust(left=0.09, right=0.98, bottom=0.13, top=0.92)  # tight_layout's result, without its cost
    return fig


def write_png(writer, tag: str, png: bytes, step: int) -> None:
    """A PNG as a TensorBoard image summary (what `SummaryWriter.add_image` writes, without re-encoding)."""
    import struct

    from tensorboard.compat.proto.summary_pb2 import Summary

    file_writer = getattr(writer, "file_writer", None)
    if file_writer is None:  # not torch's SummaryWriter
        return
    width, height = struct.unpack(">II", png[16:24])  # the IHDR chunk
    image = Summary.Image(height=height, width=width, colorspace=4, encoded_image_string=png)
    file_writer.add_summary(Summary(value=[Summary.Value(tag=tag, image=image)]), step)
