"""`loopnet report`: turn a sweep folder into a markdown report with tables and PNG plots.

    loopnet report runs/sweeps/cpu_study --out docs/results/cpu_study

Reads only what the runs left on disk — each cell's summary.json (`loopnet.diagnostics.read_summary`)
and its TensorBoard event files (EventAccumulator) — plus the sweep's manifest; never a model or
checkpoint. Writes into `--out` (default ``<sweep>/report``):

    report.md               tables (final validation loss per method x R as mean ± std over
                            seeds, diverged cells marked; escape from the unigram plateau; κ̂;
                            residual norms), the plots, every run, the commands and the machine
    cells.csv               one row per cell, values exactly as in the summaries
    val_loss_vs_R.png       final validation loss vs R, one line per method
    resid_norm_per_visit.png  residual norm at every visit at the end of training, per method
    grad_norm_per_visit.png each visit's share of the gradient at the end of training, per method
    kappa_vs_R.png          measured visit alignment κ̂ (whole model) vs R
    loss_curves.png         training and validation loss curves, one panel per R
    kappa_curves.png        κ̂ at every diagnostics step, one panel per R > 1
    window.png              (runs with diagnostics at >= 8 steps) the FLT paper's window: end-of-loop
                            state norm, first FFN's gradient and update size over the steps
    exponent.png            (sweeps of the exponent p) escape fraction and loss vs p; report.md adds
                            the seeds that train per p and a logistic fit of training on p
    map_loss_vs_lr.png      (`model.optim.lr` a grid axis: the stability map) loss vs lr per method,
    map_heatmap.png         one curve per R; the largest trainable lr and LR sensitivity, method x R;
    map_best_lr_vs_R.png    best and largest trainable lr vs R; report.md adds their tables

A *method* is the residual scheme and the wiring (``deeploop-carry``, ``preln-flt``, ``p0.4-carry`` for
`scaled` with p = 0.4), plus any other grid key the sweep varies except R and the seed. A run
*escapes* when it did not diverge and its final validation loss (the final training loss if it
never validated) is strictly below the unigram plateau: by default (`--plateau auto`) the loss
the training unigram distribution scores on the run's own validation batches, or 7.67 nats for
hub datasets (`loopnet.study.unigram`); `--plateau VALUE` sets it.

The parts, one module each: `runs` (reading the cells), `tables` (numbers and tables, cells.csv),
`depth` (plots vs R and per visit), `curves` (plots over the steps), `exponent` (the exponent
sweep), `map` (the stability map, when `model.optim.lr` is a grid axis), `build` (report.md and
the command). Plots go through `loopnet.study.plotting`.
"""

from .build import build_report, main, parser
from .runs import Run, load_runs, read_curves
from .tables import Group, fmt, group_runs, mean_std

__all__ = [
    "Group",
    "Run",
    "build_report",
    "fmt",
    "group_runs",
    "load_runs",
    "main",
    "mean_std",
    "parser",
    "read_curves",
]
