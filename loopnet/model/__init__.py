"""The looped Transformer, in pure PyTorch (no Lightning).

K physical blocks × R rounds (N = K·R unrolled depth), residual schemes Pre-LN, Post-LN,
DeepNorm, DeepLoop and any exponent p, and the loop wirings of the Fully Looped Transformer paper.
"""

import importlib

# Imported on first use (PEP 562): the visit names (`Visit`, `SUBLAYERS`) need no torch, so `loopnet report`
# and the diagnostics' tag scheme start without it.
_WHERE = {
    "LoopConfig": ".config", "BETA_SCALED": ".scales", "SCHEMES": ".scales", "residual_scales": ".scales",
    "LoopedTransformer": ".transformer", "lm_loss": ".transformer", "sample_next": ".transformer",
    "SUBLAYERS": ".visits", "Visit": ".visits", "VisitObserver": ".visits", "VisitTrace": ".visits",
    "visit_order": ".visits",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
