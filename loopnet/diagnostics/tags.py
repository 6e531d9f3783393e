"""The TensorBoard tag scheme of loopnet's diagnostics (the report parses these tags).

Every tag is ``<group>/<quantity>/<name>``, so that TensorBoard draws one chart per quantity
holding every visit (or every physical sublayer) of it:

    visits/<quantity>/<visit.tag>        one value per sublayer visit i = (r, j), e.g.
                                         visits/resid_norm/r03_k1_attn
        resid_norm       RMS of the pre-Norm stream α·x + f(x) (Pre-LN: the new stream x + f)
        state_norm       RMS of the visit's output, the state after the Norm (Pre-LN: = resid_norm)
        branch_ratio     ‖f(x)‖ / ‖α·x‖, branch to skip (Frobenius norms over the batch)
        act_grad_norm    ‖∂L/∂x‖ at the visit's output (Frobenius norm over the batch)
        param_grad_norm  ‖g_{r,j}‖: the part of the shared weights' gradient flowing through
                         this visit, over all parameters of the physical sublayer
    sublayers/<quantity>/<visit.physical>   one value per physical sublayer j, e.g.
                                         sublayers/kappa/k1_attn
        kappa            κ̂_R(j) = ‖Σ_r g_{r,j}‖² / Σ_r ‖g_{r,j}‖² (1 = orthogonal visits, R = aligned)
        grad_norm        ‖Σ_r g_{r,j}‖, the sublayer's gradient norm (before clipping)
        update_ratio     ‖ΔW_j‖ / ‖W_j‖ of the optimiser step (W_j: all the sublayer's parameters)
    grad/global_norm     global gradient norm of all parameters, before clipping
    grad/kappa_model     κ̂_R over all sublayers at once (their gradients concatenated)
    update/output_change ‖x' − x‖/‖x‖ of the final state (end of the last round) caused by the
                         optimiser step, on the step's batch (`loopnet.diagnostics.update_size`)
    update/output_change/r<rr>  the same for the state at the end of round r
    update/logit_change  the same for the logits
    hist/state/r<rr>     histogram of the state at the end of round r (a strided sample of values)
    hist/token_rms/r<rr> histogram of the per-token RMS of the last pre-Norm stream of round r
    profile/depth        image: the depth profile, resid_norm, state_norm, act_grad_norm and
                         param_grad_norm against the visit index in forward order, log axis
                         (`loopnet.diagnostics.profile`)

"RMS" is sqrt(mean(x²)) over all elements; gradient norms are Frobenius (L2) norms. Visit names
come from `loopnet.model.Visit` only (``Visit.tag`` / ``Visit.physical``); parse them back with
`parse_tag`.
"""

from __future__ import annotations

from loopnet.model import Visit

FORWARD_QUANTITIES = ("resid_norm", "state_norm", "branch_ratio")  # measured in the forward, in this order
VISIT_QUANTITIES = FORWARD_QUANTITIES + ("act_grad_norm", "param_grad_norm")
SUBLAYER_QUANTITIES = ("kappa", "grad_norm", "update_ratio")
GLOBAL_TAGS = ("grad/global_norm", "grad/kappa_model")
UPDATE_QUANTITIES = ("output_change", "logit_change")
HIST_QUANTITIES = ("state", "token_rms")
PROFILE_TAG = "profile/depth"


def visit_tag(quantity: str, visit: Visit) -> str:
    return f"visits/{quantity}/{visit.tag}"


def sublayer_tag(quantity: str, physical: str) -> str:
    return f"sublayers/{quantity}/{physical}"


def hist_tag(quantity: str, round_: int) -> str:
    return f"hist/{quantity}/r{round_:02d}"


def update_tag(quantity: str, round_: int | None = None) -> str:
    """``update/output_change``, ``update/logit_change``, ``update/output_change/r03``."""
    return f"update/{quantity}" if round_ is None else f"update/{quantity}/r{round_:02d}"


def parse_tag(tag: str) -> tuple[str, str, Visit | str | None]:
    """Split a diagnostics tag into (group, quantity, name): the name is a `Visit` for
    ``visits/...``, the physical sublayer (``"k1_attn"``) for ``sublayers/...``, the round number
    as a string for ``hist/...`` and for per-round ``update/...``, None for ``grad/...`` and the other
    ``update/...``."""
    parts = tag.split("/")
    if parts[0] == "visits" and len(parts) == 3:
        return "visits", parts[1], Visit.parse(parts[2])
    if parts[0] in ("sublayers", "hist") and len(parts) == 3:
        return parts[0], parts[1], parts[2]
    if parts[0] in ("grad", "update") and len(parts) == 2:
        return parts[0], parts[1], None
    if parts[0] == "update" and len(parts) == 3:
        return "update", parts[1], parts[2]
    raise ValueError(f"{tag!r} is not a loopnet diagnostics tag (see loopnet.diagnostics.tags)")


def expected_scalar_tags(n_blocks: int, n_rounds: int, update_size: bool = True) -> list[str]:
    """Every scalar tag one logging step writes for a K-block, R-round model."""
    from loopnet.model import visit_order

    visits = visit_order(n_blocks, n_rounds)
    physical = sorted({v.physical for v in visits})
    return ([visit_tag(q, v) for q in VISIT_QUANTITIES for v in visits]
            + [sublayer_tag(q, j) for q in SUBLAYER_QUANTITIES for j in physical]
            + list(GLOBAL_TAGS)
            + ([update_tag(q) for q in UPDATE_QUANTITIES]
               + [update_tag("output_change", r) for r in range(1, n_rounds + 1)] if update_size else []))


def round_category(round_: int) -> str:
    """The custom-scalars category of round r's charts, e.g. ``round 03``."""
    return f"round {round_:02d}"


def custom_scalars_layout(n_rounds: int) -> dict:
    """TensorBoard custom-scalars layout. Category ``visits``: one Multiline chart per quantity overlays
    every visit of a run (and TensorBoard draws each selected run, so schemes compare side by side);
    one category per round (``round 03``) with a chart per quantity holding only that round's visits
    (2·K lines instead of 2·K·R, on a scale of their own). Per-visit values span decades along the
    depth: every chart's "Toggle y-axis log scale" button (TensorBoard's, not settable from a layout)
    gives a log axis, and the IMAGES tab's ``profile/depth`` shows them against depth on a log axis.
    Charts select tags by regex, so they hold for any K."""
    visits = {q: ["Multiline", [rf"visits/{q}/.*"]] for q in VISIT_QUANTITIES}
    sublayers = {q: ["Multiline", [rf"sublayers/{q}/.*"]] for q in SUBLAYER_QUANTITIES}
    train = {
        "loss": ["Multiline", [r"train/loss", r"val/loss"]],
        "global grad norm (before clipping)": ["Multiline", [r"grad/global_norm"]],
        "kappa (model)": ["Multiline", [r"grad/kappa_model"]],
        "update size (output change of the step)": ["Multiline", [r"update/output_change", r"update/logit_change"]],
        "update size per round": ["Multiline", [r"update/output_change/r.*"]],
    }
    rounds = {round_category(r): {f"{q} r{r:02d}": ["Multiline", [rf"visits/{q}/r{r:02d}_.*"]] for q in VISIT_QUANTITIES}
              for r in range(1, n_rounds + 1)}
    return {"visits": visits, "sublayers": sublayers, "training": train, **rounds}
