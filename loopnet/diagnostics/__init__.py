"""Stability diagnostics of looped Transformers: per-visit TensorBoard scalars, the measured visit
alignment κ̂_R, divergence detection and the run summary.

    VisitDiagnostics   callback: every n steps, per-visit norms and gradients, κ̂_R, update ratios
    DivergenceGuard    callback: stop on a non-finite or runaway loss, keep the last good
                       checkpoint, write <log_dir>/summary.json
    VisitProbe         the visit observer behind VisitDiagnostics (usable without Lightning)
    RunSummary         the record summary.json is written from, fed by the two callbacks
    read_summary       read a run's summary.json (for the sweep and the report)
    tags               the tag scheme (visits/<quantity>/r03_k1_attn, sublayers/kappa/k1_attn, ...)

Open the logs with ``tensorboard --logdir runs`` (http://127.0.0.1:6006): TIME SERIES opens on the depth
profile (IMAGES ``depth/...``: per-visit values against the visit index, one small view each), SCALARS
shows one chart per quantity and visit, CUSTOM SCALARS one category per round whose charts hold only that
round's visits (and every selected run, so schemes compare), HISTOGRAMS the state per round.
`loopnet compare RUN_A RUN_B --steps ...` overlays two runs' depth profiles (`.compare`).
"""

from loopnet.lazy import lazy_attributes

# Imported on first use (PEP 562): `loopnet sweep` and `loopnet report` read summaries and tags without
# importing Lightning, which the callbacks need (most of a command's start-up).
_WHERE = {
    "VisitDiagnostics": ".callback",
    "DivergenceGuard": ".divergence",
    "RunSummary": ".summary",
    "VisitProbe": ".visit_probe",
    "alignment": ".visit_probe",
    "kappas": ".visit_probe",
    "SUMMARY_NAME": ".summary",
    "read_summary": ".summary",
    "write_summary": ".summary",
    "custom_scalars_layout": ".tags",
    "expected_scalar_tags": ".tags",
    "parse_tag": ".tags",
}

__getattr__, __dir__, __all__ = lazy_attributes(__name__, _WHERE)
