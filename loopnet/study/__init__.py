"""Stability studies: `loopnet sweep` runs a YAML grid of fits (resumably), `loopnet report`
turns the sweep folder into a markdown report with tables and plots.

    grid     the sweep file: base configs, overrides, grid, include -> cells and their commands
    sweep    the runner (subprocesses, skip finished cells, manifest and log)
    report   tables and matplotlib plots from the run summaries and TensorBoard events
    measures what the tables measure, defined once: method labels, escape, first-round gradient ratio
    probe    `loopnet probe`: the update size of the first AdamW steps over R and schemes
    unigram  the unigram-entropy plateau a run must leave to "escape"
"""

from .grid import Cell, Sweep, SweepError, expand, load_sweep

__all__ = ["Cell", "Sweep", "SweepError", "expand", "load_sweep"]
