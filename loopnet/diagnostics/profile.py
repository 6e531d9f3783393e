"""The depth profile: at a logging step, per-visit values against the visit's position in the forward pass
(visit 1 = round 1, block 1, attn; then ffn, block 2, ..., round R), as small images in TensorBoard's
IMAGES (one per view, ``depth/<view>``, with a slider over the logging steps). It shows where along the
unrolled depth the stream grows, the gradient vanishes or the attention logits grow, which the per-round
charts (one line per visit over training steps) show only one round at a time.

Drawn for TensorBoard's image card (about 270 px wide): one view per image with one or two quantities,
large type, a tick per round at most every few rounds, short labels. Each view keeps one y-axis across the logging
steps of a run: its range is the union of every step drawn so far (`profile_pngs`' `ylims`), so moving the
step slider moves the lines, not the axis (a view's axis widens only when a later step leaves its range). Drawn with matplotlib's Agg canvas
directly (no pyplot, no display); matplotlib is imported on the first logging step only.
`loopnet compare` draws the same views for two runs at chosen steps (`loopnet.diagnostics.compare`).
"""

from __future__ import annotations

import io
import math

from loopnet.model import Visit

from .tags import PROFILE_GROUP, visit_tag

# view -> (title, quantities, log y axis), in the order TensorBoard shows the views (it sorts tags by name).
# Attention quantities exist at attention visits only.
VIEWS = {
    "gradients": ("gradient norms", ("act_grad_norm", "param_grad_norm"), True),
    "norms": ("residual stream RMS", ("resid_norm",), True),
    "qk_logits": ("attention logits", ("attn_logit_max", "attn_log_z"), False),
    "skip_ratio": ("branch / skip ‖f‖/‖αx‖", ("branch_ratio",), True),
}
PROFILE_QUANTITIES = tuple(q for _, quantities, _ in VIEWS.values() for q in quantities)
LABELS = {  # short: they label lines on a 270 px card
    "resid_norm": "stream RMS",
    "branch_ratio": "‖f‖/‖αx‖",
    "act_grad_norm": "‖∂L/∂x‖",
    "param_grad_norm": "‖g_r,j‖",
    "attn_logit_max": "max q·k/√d",
    "attn_log_z": "mean log Z",
}
COLORS = {
    "resid_norm": "C0",
    "branch_ratio": "C4",
    "act_grad_norm": "C3",
    "param_grad_norm": "C2",
    "attn_logit_max": "C1",
    "attn_log_z": "C9",
}
SIZE_IN, DPI, FONT = (3.6, 2.4), 100, 13  # 360 × 240 px: TensorBoard shrinks it to ~270 px, type stays ≥ 9 px


def view_tag(view: str) -> str:
    return f"{PROFILE_GROUP}/{view}"


def depth_profile(scalars: dict[str, float], visits: list[Visit]) -> dict[str, list[float]]:
    """{quantity: its value at each visit, in forward order (nan where not logged: the attention
    quantities at FFN visits)} from one logging step's scalars keyed by `tags.visit_tag`; `visits` in
    forward order (`loopnet.model.visit_order`)."""
    return {q: [scalars.get(visit_tag(q, v), math.nan) for v in visits] for q in PROFILE_QUANTITIES}


def draw_depth(
    ax,
    visits: list[Visit],
    lines: list[tuple[list[float], dict]],
    log: bool,
    font: int = FONT,
    ylim: tuple[float, float] | None = None,
) -> tuple[float, float]:
    """Draw `lines` ((values per visit, matplotlib kwargs)) against the visit index 1 … 2·K·R on `ax`;
    visits without a finite (and, on a log axis, positive) value are left out, so that the attention
    quantities join their attention visits. Rounds are marked by light lines and labelled r1, r2, … (a
    few only). `ylim`: a range the y-axis must also cover (the earlier steps' union); returns the axis's range."""
    for values, style in lines:
        points = [(i, y) for i, y in enumerate(values, start=1) if math.isfinite(y) and (y > 0 or not log)]
        if points:
            ax.plot(*zip(*points), **{"marker": ".", "linewidth": 1.6, "markersize": 4, **style})
    if log and ax.lines:
        ax.set_yscale("log")
    if ax.lines:
        _widen(ax, ylim)
    # A light line where each round (and the prelude's end, the coda) starts; labels r1, r2, … (a few
    # only), P and C for the prelude and the coda.
    starts = [i for i, v in enumerate(visits, start=1) if v.block == 1 and v.sublayer == "attn"]
    for i in starts[1:]:
        ax.axvline(i - 0.5, color="0.85", linewidth=0.8, zorder=0)
    rounds = [i for i in starts if visits[i - 1].looped]
    every = max(1, math.ceil(len(rounds) / 4))  # at most 4-5 round labels
    ticks = sorted(set(rounds[::every]) | {i for i in starts if not visits[i - 1].looped})
    label = lambda v: f"r{v.round}" if v.looped else v.part[0].upper()  # noqa: E731
    ax.set_xticks(ticks, [label(visits[i - 1]) for i in ticks])
    ax.set_xlim(0.5, len(visits) + 0.5)
    _finish_axes(ax, log, font)
    return ax.get_ylim()


def _widen(ax, ylim: tuple[float, float] | None) -> None:
    """Extend the y-axis to also cover `ylim` (the earlier steps' union), when given."""
    if ylim is not None:
        lo, hi = ax.get_ylim()
        ax.set_ylim(min(lo, ylim[0]), max(hi, ylim[1]))


def _finish_axes(ax, log: bool, font: int, y_ticks: bool = True) -> None:
    """The cards' common look: small ticks, a few short y labels (`_few_y_ticks`), a light y grid, no top or
    right spine."""
    ax.tick_params(labelsize=font - 1, length=3, pad=2)
    if y_ticks:
        _few_y_ticks(ax, log)
    ax.grid(True, which="major", axis="y", alpha=0.3)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _few_y_ticks(ax, log: bool) -> None:
    """3-5 y ticks with short labels that still differ ("0.0028", "0.003"; "1e+03"), no minor ticks:
    legible at 270 px. Set explicitly: matplotlib's log locator falls back to many ticks within a decade."""
    from matplotlib.ticker import LogLocator, MaxNLocator

    lo, hi = ax.get_ylim()
    decades = math.log10(hi / lo) if log and lo > 0 and hi > lo else 0.0
    if decades >= 1:
        locator = LogLocator(base=10, subs=(1.0, 3.0) if decades < 3 else (1.0,), numticks=5)
    else:
        locator = MaxNLocator(nbins=4)
    ticks = [t for t in locator.tick_values(lo, hi) if lo <= t <= hi]
    digits = next((d for d in range(2, 7) if len({f"{t:.{d}g}" for t in ticks}) == len(ticks)), 6)
    ax.set_yticks(ticks, [f"{t:.{digits}g}" for t in ticks])
    ax.minorticks_off()
    ax.set_ylim(lo, hi)


def figure(size=SIZE_IN, dpi=DPI):
    """A matplotlib Figure on an Agg canvas (no pyplot: no global state, no display)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def view_figure(
    view: str, profile: dict[str, list[float]], visits: list[Visit], ylims: dict[str, tuple[float, float]] | None = None
):
    """One view of the depth profile (`VIEWS`) as a matplotlib Figure (Agg canvas), 360 × 240 px: the
    title names the quantity, a compact legend the lines when there are two. With `ylims`, the y-axis also
    covers `ylims[view]` (where present), and `ylims[view]` becomes the axis's range."""
    title, quantities, log = VIEWS[view]
    fig = figure()
    ax = fig.add_subplot()
    lines = [(profile[q], {"color": COLORS[q], "label": LABELS[q]}) for q in quantities]
    limits = draw_depth(ax, visits, lines, log, ylim=None if ylims is None else ylims.get(view))
    if ylims is not None and ax.lines:
        ylims[view] = limits
    ax.set_title(title, fontsize=FONT, pad=4)
    if sum(any(math.isfinite(y) for y in profile[q]) for q in quantities) > 1:
        ax.legend(fontsize=FONT - 2, frameon=False, handlelength=1.2, borderaxespad=0.2, labelspacing=0.2)
    fig.subplots_adjust(left=0.2, right=0.97, bottom=0.12, top=0.88)  # tight_layout's result, without its cost
    return fig


def png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def profile_pngs(
    scalars: dict[str, float], visits: list[Visit], ylims: dict[str, tuple[float, float]] | None = None
) -> dict[str, bytes]:
    """{image tag: PNG} of every view with something to draw at this step (``depth/gradients``, ...).
    `ylims` ({view: y range}, updated in place): the run's axes so far, kept by the caller across steps."""
    profile = depth_profile(scalars, visits)
    return {
        view_tag(view): png(view_figure(view, profile, visits, ylims))
        for view, (_, quantities, _) in VIEWS.items()
        if any(math.isfinite(y) for q in quantities for y in profile[q])
    }


def write_png(writer, tag: str, png_bytes: bytes, step: int) -> None:
    """A PNG as a TensorBoard image summary (what `SummaryWriter.add_image` writes, without re-encoding)."""
    import struct

    from tensorboard.compat.proto.summary_pb2 import Summary

    file_writer = getattr(writer, "file_writer", None)
    if file_writer is None:  # not torch's SummaryWriter
        return
    width, height = struct.unpack(">II", png_bytes[16:24])  # the IHDR chunk
    image = Summary.Image(height=height, width=width, colorspace=4, encoded_image_string=png_bytes)
    file_writer.add_summary(Summary(value=[Summary.Value(tag=tag, image=image)]), step)


# The per-round quantities as images against the round r (TensorBoard's multiline charts label their lines on
# hover only, so a chart of one line per round is a dozen unlabelled lines): quantity -> (title, log y axis).
ROUND_VIEWS = {
    "loss": ("loss at round r", False),
    "latent_change": ("‖x_r − x_r−1‖ / ‖x_r‖", True),
    "kl": ("KL(p_r−1 ‖ p_r)", True),
    "sigma_max": ("σ_max of round r's Jacobian", False),
    "output_change": ("update: ‖Δx_r‖ / ‖x_r‖", True),
}


def round_figure(
    quantity: str, values: list[float | None], train_rounds: int | None = None, ylim: tuple[float, float] | None = None
):
    """One per-round quantity (`ROUND_VIEWS`) against r = 1 … len(values), 360 × 240 px like the depth
    profile: the x-axis is labelled "round r", a dashed line marks the training R (rounds past it are
    extrapolation), σ_max gets a line at 1 (below it the round contracts). Missing values (None, nan;
    on a log axis ≤ 0) are left out. `ylim`: a range the axis must also cover; the axis's range is
    `fig.ylim`."""
    title, log = ROUND_VIEWS[quantity]
    fig = figure()
    ax = fig.add_subplot()
    points = [
        (r, y) for r, y in enumerate(values, start=1) if y is not None and math.isfinite(y) and (y > 0 or not log)
    ]
    if points:
        ax.plot(*zip(*points), marker=".", linewidth=1.6, markersize=5, color="C0")
    if log and points:
        ax.set_yscale("log")
    if quantity == "sigma_max" and points:
        ax.axhline(1.0, color="0.6", linewidth=0.8, linestyle=":")
    if points:
        _widen(ax, ylim)
    n = len(values)
    if train_rounds and train_rounds < n:
        ax.axvline(train_rounds, color="0.5", linewidth=1.0, linestyle="--")
        ax.text(
            train_rounds,
            0.98,
            f" R={train_rounds}",
            transform=ax.get_xaxis_transform(),
            va="top",
            fontsize=FONT - 3,
            color="0.4",
        )
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(nbins=6, integer=True))
    ax.set_xlim(0.5, max(n, 1) + 0.5)
    ax.set_xlabel("round r", fontsize=FONT - 2, labelpad=1)
    _finish_axes(ax, log, FONT, y_ticks=bool(points))
    ax.set_title(title, fontsize=FONT, pad=4)
    fig.subplots_adjust(left=0.2, right=0.97, bottom=0.2, top=0.88)
    fig.ylim = ax.get_ylim() if points else None
    return fig


def round_pngs(
    per_round: dict[str, list[float | None]],
    prefix: str,
    train_rounds: int | None = None,
    ylims: dict[str, tuple[float, float]] | None = None,
) -> dict[str, bytes]:
    """{``<prefix>/<quantity>``: PNG} of each per-round quantity with a value to draw. `ylims` ({tag: y
    range}, updated in place): the run's axes so far, as `profile_pngs` keeps them."""
    out = {}
    for quantity, values in per_round.items():
        if not any(v is not None and math.isfinite(v) for v in values):
            continue
        tag = f"{prefix}/{quantity}"
        fig = round_figure(quantity, values, train_rounds, None if ylims is None else ylims.get(tag))
        if ylims is not None and fig.ylim is not None:
            ylims[tag] = fig.ylim
        out[tag] = png(fig)
    return out
