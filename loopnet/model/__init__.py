"""The looped Transformer, in pure PyTorch (no Lightning).

K physical blocks × R rounds (N = K·R unrolled depth), residual schemes Pre-LN, Post-LN,
DeepNorm, DeepLoop and any exponent p, and the loop wirings of the Fully Looped Transformer paper.
"""

from .config import LoopConfig
from .scales import BETA_SCALED, SCHEMES, residual_scales
from .transformer import LoopedTransformer, lm_loss, sample_next
from .visits import SUBLAYERS, Visit, VisitObserver, VisitTrace, visit_order

__all__ = [
    "BETA_SCALED", "SCHEMES", "SUBLAYERS", "LoopConfig", "LoopedTransformer", "Visit", "VisitObserver",
    "VisitTrace", "lm_loss", "residual_scales", "sample_next", "visit_order",
]
