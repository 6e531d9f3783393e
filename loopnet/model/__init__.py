"""The looped Transformer, in pure PyTorch (no Lightning).

K physical blocks × R rounds (N = K·R unrolled depth), residual schemes Pre-LN, Post-LN,
DeepNorm, DeepLoop and any exponent p, and the loop wirings of the Fully Looped Transformer paper.
"""

from loopnet.lazy import lazy_attributes

# Imported on first use (PEP 562): the visit names (`Visit`, `SUBLAYERS`) need no torch, so `loopnet report`
# and the diagnostics' tag scheme start without it.
_WHERE = {
    "LoopConfig": ".config",
    "Architecture": ".config",
    "RunSettings": ".config",
    "RUN_SETTINGS": ".config",
    "BETA_SCALED": ".scales",
    "SCHEMES": ".scales",
    "residual_scales": ".scales",
    "LoopedTransformer": ".transformer",
    "lm_loss": ".transformer",
    "Generation": "loopnet.generate",
    "sample_next": "loopnet.generate",
    "SUBLAYERS": ".visits",
    "Visit": ".visits",
    "VisitObserver": ".visits",
    "VisitTrace": ".visits",
    "visit_order": ".visits",
}

__getattr__, __dir__, __all__ = lazy_attributes(__name__, _WHERE)
