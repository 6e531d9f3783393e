"""The TensorBoard tag scheme of loopnet's diagnostics (the report parses these tags).

Every tag is ``<group>/<quantity>/<name>`` (TensorBoard groups its charts by the first part):

    visits/<quantity>/<visit.tag>        one value per sublayer visit i = (r, j), e.g.
                                         visits/resid_norm/r03_k1_attn; a prelude or coda visit
                                         is p<k>_<s> or c<k>_<s>, e.g. visits/resid_norm/p1_attn
        resid_norm       RMS of the pre-Norm stream α·x + f(x) (Pre-LN: the new stream x + f)
        state_norm_dev   RMS of the visit's output minus 1: the state after the Norm has RMS ≈ 1 by
                         construction (exactly 1 with unit gains), so only its deviation is shown
                         (Pre-LN: the stream's RMS − 1)
        branch_ratio     ‖f(x)‖ / ‖α·x‖, branch to skip (Frobenius norms over the batch)
        act_grad_norm    ‖∂L/∂x‖ at the visit's output (Frobenius norm over the batch)
        param_grad_norm  ‖g_{r,j}‖: the part of the shared weights' gradient flowing through
                         this visit, over all parameters of the physical sublayer
      attention visits only (Wortsman et al. 2023's attention-logit growth, `probe.attention_logit_stats`):
        attn_logit_max     the largest attention logit q·k/√d_h, over heads, batch and causal positions
        attn_logit_absmax  the largest |q·k/√d_h| over the same
        attn_log_z         the heads' mean log-partition log Σ_{j≤i} exp(q_i·k_j/√d_h) over batch,
                           heads and queries
    sublayers/<quantity>/<visit.physical>   one value per physical sublayer j, e.g.
                                         sublayers/kappa/k1_attn
        kappa            κ̂_R(j) = ‖Σ_r g_{r,j}‖² / Σ_r ‖g_{r,j}‖² (1 = orthogonal visits, R = aligned);
                         1 by definition for a prelude or coda sublayer (p1_attn, c1_ffn: one visit)
        grad_norm        ‖Σ_r g_{r,j}‖, the sublayer's gradient norm (before clipping)
        update_ratio     ‖ΔW_j‖ / ‖W_j‖ of the optimiser step (W_j: all the sublayer's parameters)
    grad/global_norm     global gradient norm of all parameters, before clipping
    grad/kappa_model     κ̂_R over all sublayers at once (their gradients concatenated)
    output/log_z         the LM head's mean log-partition logsumexp(z) over the positions of the model's
                         output (the last round's logits): Wortsman et al.'s output-logit divergence
    output/logit_absmax  the largest |z| of those logits
    update/output_change ‖x' − x‖/‖x‖ of the final state (end of the last round) caused by the
                         optimiser step, on the step's batch (`loopnet.diagnostics.update_size`)
    update/output_change/r<rr>  the same for the state at the end of round r
    update/logit_change  the same for the logits
    hist/state/r<rr>     histogram of the state at the end of round r (a strided sample of values)
    hist/token_rms/r<rr> histogram of the per-token RMS of the last pre-Norm stream of round r
    depth/<view>         images: the depth profile, per-visit values against the visit index in forward
                         order (`loopnet.diagnostics.profile`): depth/gradients (act_grad_norm,
                         param_grad_norm), depth/norms (resid_norm), depth/qk_logits (attn_logit_max,
                         attn_log_z), depth/skip_ratio (branch_ratio)
    update/per_round/output_change  image: update/output_change/r<rr> against the round r
                         (`loopnet.diagnostics.profile.round_figure`)
    fixed_point/<quantity>/r<rr>  validation's extrapolation and fixed-point profile per round
                         (`loopnet.diagnostics.fixed_point`; test_fixed_point/... at test), and the image
                         fixed_point/<quantity> of it against the round r, the training R marked

    coordcheck/width, coordcheck/rounds  images of `loopnet coordcheck` (in its own `<out>/tb` folder, not a
                         run's): mean |x| of every visit (named by `Visit.tag`), the attention and output logits
                         against width and against R (`loopnet.diagnostics.coord_check`)

The images' group is named ``depth`` so that TensorBoard's TIME SERIES dashboard, which sorts tag groups
by name and opens the first two, opens the depth profile first (before Lightning's ``epoch``).

"RMS" is sqrt(mean(x²)) over all elements; gradient norms are Frobenius (L2) norms. Visit names
come from `loopnet.model.Visit` only (``Visit.tag`` / ``Visit.physical``); parse them back with
`parse_tag`.
"""

from __future__ import annotations

from loopnet.model import Visit

FORWARD_QUANTITIES = ("resid_norm", "state_norm_dev", "branch_ratio")  # measured in the forward, in this order
VISIT_QUANTITIES = FORWARD_QUANTITIES + ("act_grad_norm", "param_grad_norm")  # every visit
ATTN_QUANTITIES = ("attn_logit_max", "attn_logit_absmax", "attn_log_z")  # attention visits only
OUTPUT_QUANTITIES = ("log_z", "logit_absmax")  # output/<quantity>: the LM head's logits
SUBLAYER_QUANTITIES = ("kappa", "grad_norm", "update_ratio")
GLOBAL_TAGS = ("grad/global_norm", "grad/kappa_model")
UPDATE_QUANTITIES = ("output_change", "logit_change")
HIST_QUANTITIES = ("state", "token_rms")
PROFILE_GROUP = "depth"  # the depth profile's images: depth/gradients, depth/norms, ...


def visit_quantities(visit: Visit) -> tuple[str, ...]:
    """The quantities logged for `visit`: VISIT_QUANTITIES, and ATTN_QUANTITIES at an attention visit."""
    return VISIT_QUANTITIES + (ATTN_QUANTITIES if visit.sublayer == "attn" else ())


def visit_tag(quantity: str, visit: Visit) -> str:
    return f"visits/{quantity}/{visit.tag}"


def sublayer_tag(quantity: str, physical: str) -> str:
    return f"sublayers/{quantity}/{physical}"


def hist_tag(quantity: str, round_: int) -> str:
    return f"hist/{quantity}/r{round_:02d}"


def output_tag(quantity: str) -> str:
    return f"output/{quantity}"


def update_tag(quantity: str, round_: int | None = None) -> str:
    """``update/output_change``, ``update/logit_change``, ``update/output_change/r03``."""
    return f"update/{quantity}" if round_ is None else f"update/{quantity}/r{round_:02d}"


def parse_tag(tag: str) -> tuple[str, str, Visit | str | None]:
    """Split a diagnostics tag into (group, quantity, name): the name is a `Visit` for
    ``visits/...``, the physical sublayer (``"k1_attn"``) for ``sublayers/...``, the round number
    as a string for ``hist/...`` and for per-round ``update/...``, None for ``grad/...``, ``output/...``
    and the other ``update/...``."""
    parts = tag.split("/")
    if parts[0] == "visits" and len(parts) == 3:
        return "visits", parts[1], Visit.parse(parts[2])
    if parts[0] in ("sublayers", "hist") and len(parts) == 3:
        return parts[0], parts[1], parts[2]
    if parts[0] in ("grad", "update", "output") and len(parts) == 2:
        return parts[0], parts[1], None
    if parts[0] == "update" and len(parts) == 3:
        return "update", parts[1], parts[2]
    raise ValueError(f"{tag!r} is not a loopnet diagnostics tag (see loopnet.diagnostics.tags)")


def expected_scalar_tags(
    n_blocks: int, n_rounds: int, update_size: bool = True, n_prelude: int = 0, n_coda: int = 0
) -> list[str]:
    """Every scalar tag one logging step writes for a K-block model that runs R rounds (with P prelude and
    C coda blocks)."""
    from loopnet.model import visit_order

    visits = visit_order(n_blocks, n_rounds, n_prelude, n_coda)
    physical = sorted({v.physical for v in visits})
    return (
        [visit_tag(q, v) for v in visits for q in visit_quantities(v)]
        + [sublayer_tag(q, j) for q in SUBLAYER_QUANTITIES for j in physical]
        + list(GLOBAL_TAGS)
        + [output_tag(q) for q in OUTPUT_QUANTITIES]
        + (
            [update_tag(q) for q in UPDATE_QUANTITIES]
            + [update_tag("output_change", r) for r in range(1, n_rounds + 1)]
            if update_size
            else []
        )
    )


def round_category(round_: int) -> str:
    """The custom-scalars category of round r's charts, e.g. ``round 03``."""
    return f"round {round_:02d}"


def custom_scalars_layout(n_rounds: int, untied: bool = False) -> dict:
    """TensorBoard custom-scalars layout. One category per round (``round 03``) with a chart per visit
    quantity holding only that round's visits: 2·K lines per run (K for the attention quantities), each
    chart on a scale of its own. No chart mixes rounds: across the depth, the per-visit values are drawn
    by the depth profile (IMAGES, ``depth/...``). Category ``training``: loss, gradient norm, κ̂, update
    size and the output logits' instability signals; ``sublayers``: one chart per quantity over the
    physical sublayers. Per-visit values span decades: every chart's "Toggle y-axis log scale" button
    (TensorBoard's, not settable from a layout) gives a log axis. Charts select tags by regex, so they
    hold for any K. `untied`: a category ``prelude and coda`` with a chart per quantity over their visits.
    Quantities with one value per round (the update size per round, the fixed-point profile) have no chart
    here, where a dozen lines would be told apart on hover only: they are images against the round r
    (``update/per_round/output_change``, ``fixed_point/<quantity>``; `profile.round_figure`), and each
    round's value is a chart of its own in SCALARS."""
    sublayers = {q: ["Multiline", [rf"^sublayers/{q}/"]] for q in SUBLAYER_QUANTITIES}
    train = {  # anchored: TensorBoard searches a chart's regexes anywhere in a tag
        "loss": ["Multiline", [r"^train/loss$", r"^val/loss$"]],
        "global grad norm (before clipping)": ["Multiline", [r"^grad/global_norm$"]],
        "kappa (model)": ["Multiline", [r"^grad/kappa_model$"]],
        "output logits: mean log Z": ["Multiline", [r"^output/log_z$"]],
        "output logits: max |logit|": ["Multiline", [r"^output/logit_absmax$"]],
        "update size (output change of the step)": ["Multiline", [r"^update/output_change$", r"^update/logit_change$"]],
    }
    quantities = VISIT_QUANTITIES + ATTN_QUANTITIES
    rounds = {
        round_category(r): {f"{q} r{r:02d}": ["Multiline", [rf"^visits/{q}/r{r:02d}_"]] for q in quantities}
        for r in range(1, n_rounds + 1)
    }
    extra = {}
    if untied:
        extra["prelude and coda"] = {q: ["Multiline", [rf"^visits/{q}/[pc]\d+_"]] for q in quantities}
    return {"training": train, **rounds, **extra, "sublayers": sublayers}
