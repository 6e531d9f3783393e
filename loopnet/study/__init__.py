"""Stability studies: `loopnet sweep` runs a YAML grid of fits (resumably), `loopnet report`
turns the sweep folder into a markdown report with tables and plots.

    grid     the sweep file: base configs, overrides, grid, include -> cells and their commands
    sweep    the runner (subprocesses, skip finished cells, manifest and log)
    report   the report package: one module per part (runs, tables, depth and curve plots, exponent,
             the stability map, the document and command)
    measures what the tables measure, defined once: method labels, escape, the map's LR sensitivity
             and trainable band, first-round gradient ratio
    plotting the one way the tools draw (matplotlib, saved alike): report and probe use it
    provenance the commit and machine a report names
    probe    `loopnet probe`: the update size of the first steps over R and schemes, per parameter group
    unigram  the unigram-entropy plateau a run must leave to "escape"
"""

from .grid import Cell, Sweep, SweepError, expand, load_sweep

__all__ = ["Cell", "Sweep", "SweepError", "expand", "load_sweep"]
