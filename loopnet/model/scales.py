"""The one place where the residual scales α and β are computed.

Symbols follow the papers: N = K·R is the unrolled depth (visits of a block, not physical
blocks), α multiplies the skip path before the Norm at every visit, β is an *initialisation*
gain on the DeepNorm set of branch matrices (value, output, FFN in and out).

    DeepNorm  (Wang et al., DeepNet)   α = (2N)^{1/4},  β = (8N)^{-1/4}
    DeepLoop                           α = (2N)^{1/2},  β = (8N)^{-1/2}
    scaled, exponent p                 α = (2N)^{p},    β = (8N)^{-p}
    Pre-LN, Post-LN                    α = 1,           β = 1

Pre-LN's branch multiplier ε (x ← x + ε·f(Norm(x)), `branch_scale`), with K blocks and R rounds:

    one          ε = 1                 (GPT-2, nanoGPT)
    sqrt_depth   ε = λ/√(K·R)          (1/√depth of untied networks, depth N = K·R)
    wang         ε = λ/(R·√K)          (Wang et al. 2026: weight sharing correlates a block's R updates)

CompleteP's ε = (N/N₀)^-a (`LoopConfig.parametrization: completep`) is a depth rule of its own, kept with the
width rules in `loopnet.model.parametrization`; it replaces `branch_scale` (the two together are refused).
"""

from __future__ import annotations

import math

SCHEMES = ("preln", "postln", "deepnorm", "deeploop", "scaled")
BRANCH_SCALES = ("one", "sqrt_depth", "wang")
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


def branch_scale(rule: str, n_blocks: int, n_rounds: int, lam: float = 1.0) -> float:
    """Return ε for Pre-LN's branch, x ← x + ε·f(Norm(x)), with K = `n_blocks` and R = `n_rounds`.

    λ = `lam` multiplies both depth rules, so that at equal λ two rules differ by their R and K
    dependence only; `one` is ε = 1 itself and takes no λ. Like α and β, ε belongs to the training
    depth: evaluating at another R' keeps it.
    """
    if rule not in BRANCH_SCALES:
        raise ValueError(f"branch_scale={rule!r} is not a known rule; choose one of {', '.join(BRANCH_SCALES)}")
    if n_blocks < 1 or n_rounds < 1:
        raise ValueError(f"K and R must be >= 1, got K={n_blocks}, R={n_rounds}")
    if not lam > 0:
        raise ValueError(f"branch_lambda must be > 0, got {lam}; fix: give a positive λ, e.g. 1.0")
    if rule == "one":
        if lam != 1.0:
            raise ValueError(
                f"branch_scale='one' is ε = 1 and takes no λ, got branch_lambda={lam}; "
                "fix: branch_lambda: 1.0, or branch_scale: sqrt_depth or wang"
            )
        return 1.0
    if rule == "sqrt_depth":
        return lam / math.sqrt(n_blocks * n_rounds)
    return lam / (n_rounds * math.sqrt(n_blocks))
