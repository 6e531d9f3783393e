"""The one place where the residual scales α and β are computed.

Symbols follow the papers: N = K·R is the unrolled depth (visits of a block, not physical
blocks), α multiplies the skip path before the Norm at every visit, β is an *initialisation*
gain on the DeepNorm set of branch matrices (value, output, FFN in and out).

    DeepNorm  (Wang et al., DeepNet)   α = (2N)^{1/4},  β = (8N)^{-1/4}
    DeepLoop                           α = (2N)^{1/2},  β = (8N)^{-1/2}
    scaled, exponent p                 α = (2N)^{p},    β = (8N)^{-p}
    Pre-LN, Post-LN                    α = 1,           β = 1
"""

from __future__ import annotations

SCHEMES = ("preln", "postln", "deepnorm", "deeploop", "scaled")
SCHEME_EXPONENT = {"deepnorm": 0.25, "deeploop": 0.5}

# Names of the weight matrices that β scales at init (torchscale's v_proj/out_proj/fc1/fc2).
# Q, K projections and the embeddings are never scaled.
BETA_SCALED = ("v_proj", "o_proj", "fc1", "fc2")


def scheme_label(residual: str, p: float | None) -> str:
    """The residual scheme's name in run folders and reports: ``deeploop``, ``preln``, ..., or ``p0.4``
    for `scaled` at exponent p."""
    return f"p{p:g}" if residual == "scaled" and p is not None else residual


def parse_scheme(label: str) -> tuple[str, float | None]:
    """The inverse of `scheme_label`: a scheme's name -> (residual, p), e.g. ``deeploop`` -> ("deeploop", None),
    ``p0.4`` -> ("scaled", 0.4)."""
    if label in SCHEMES and label != "scaled":
        return label, None
    try:
        p = float(label[1:]) if label.startswith("p") else -1.0
    except ValueError:
        p = -1.0
    if p > 0:
        return "scaled", p
    named = ", ".join(s for s in SCHEMES if s != "scaled")
    raise ValueError(f"{label!r} names no residual scheme; use {named} or p<exponent> such as p0.375")


def residual_scales(scheme: str, n_unrolled: int, p: float | None = None) -> tuple[float, float]:
    """Return (α, β) for `scheme` at unrolled depth N = `n_unrolled`.

    `p` is required for `scaled` (any p > 0, e.g. the published sweep 0.30…0.60) and must be
    None or equal to the built-in exponent otherwise.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"residual={scheme!r} is not a known scheme; choose one of {', '.join(SCHEMES)}")
    if n_unrolled < 1:
        raise ValueError(f"unrolled depth N must be >= 1, got {n_unrolled}")
    if scheme in ("preln", "postln"):
        return 1.0, 1.0
    if scheme == "scaled":
        if p is None or not p > 0:
            raise ValueError(f"residual='scaled' needs an exponent p > 0 (e.g. p: 0.4), got p={p}")
    else:
        builtin = SCHEME_EXPONENT[scheme]
        if p is not None and p != builtin:
            raise ValueError(f"residual={scheme!r} fixes p={builtin}; use residual='scaled' with p={p}")
        p = builtin
    return (2 * n_unrolled) ** p, (8 * n_unrolled) ** (-p)
