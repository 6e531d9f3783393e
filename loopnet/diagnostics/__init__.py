"""Stability diagnostics of looped Transformers: per-visit TensorBoard scalars, the measured visit
alignment κ̂_R, divergence detection and the run summary.

    VisitDiagnostics   callback: every n steps, per-visit norms and gradients, κ̂_R, update ratios
    DivergenceGuard    callback: stop on a non-finite or runaway loss, keep the last good
                       checkpoint, write <log_dir>/summary.json
    VisitProbe         the visit observer behind VisitDiagnostics (usable without Lightning)
    read_summary       read a run's summary.json (for the sweep and the report)
    tags               the tag scheme (visits/<quantity>/r03_k1_attn, sublayers/kappa/k1_attn, ...)

Open the logs with ``tensorboard --logdir runs`` (http://127.0.0.1:6006): the SCALARS tab shows
one chart per quantity and visit, CUSTOM SCALARS overlays every visit of a quantity in one chart
(and every selected run, so schemes compare) and each round's visits in a category of its own, IMAGES
shows the depth profile (norms against the visit index, log axis), HISTOGRAMS the state per round.
"""

from .callback import VisitDiagnostics
from .divergence import DivergenceGuard
from .probe import VisitProbe, alignment
from .summary import SUMMARY_NAME, read_summary, write_summary
from .tags import custom_scalars_layout, expected_scalar_tags, parse_tag

__all__ = [
    "SUMMARY_NAME", "DivergenceGuard", "VisitDiagnostics", "VisitProbe", "alignment", "custom_scalars_layout",
    "expected_scalar_tags", "parse_tag", "read_summary", "write_summary",
]
