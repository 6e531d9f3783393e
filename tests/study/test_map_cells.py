"""The map's readings recomputed from the committed cells.csv: reading 1 by the rule stated before running,
on the cells that rule named, and the figures the corrected record quotes (checked by hand from cells.csv)."""

from pathlib import Path

from loopnet.study.report import map_cells

MAP = Path(__file__).resolve().parents[2] / "docs" / "results" / "map"


def test_reading1_from_the_committed_cells(tmp_path):
    grid, bnd = map_cells.read_cells(MAP / "grid"), map_cells.read_cells(MAP / "boundary")
    plateau = 3.275707171288669
    md = "\n".join(map_cells.reading1(grid, bnd, plateau))
    # stated before running (grid + R = 12 boundary): DeepNorm 8e-3 -> 8e-3, DeepLoop 1.6e-2 -> 1.6e-2
    assert "| 0.008 → 0.008 | 0.00 | 0.016 → 0.016 | 0.00 | +0.00 | **contradicted** |" in md
    # with the R = 2 boundary added: DeepNorm 1.13e-2 -> 8e-3 (0.15 decades)
    assert "| 0.0113 → 0.008 | 0.15 | 0.016 → 0.016 | 0.00 | +0.15 | **not resolved** |" in md
    # R = 6 on the grid: 8e-3 for both (DeepLoop: 1 of 2 seeds at 1.6e-2)
    assert "deepnorm 0.008 / 0.008 / 0.008; deeploop 0.016 / 0.008 / 0.016" in md


def test_controls_and_failures_from_the_committed_cells():
    grid, bnd, expo = (map_cells.read_cells(MAP / s) for s in ("grid", "boundary", "exponent"))
    md = "\n".join(map_cells.controls_and_failures(grid, bnd, expo, 3.275707171288669))
    for figure in ("4.779", "3.818", "3.518", "2.882✓", "3.250"):
        assert figure in md
    assert md.count("3.518") == 1  # the exponent sweep's p = 0.25 copy of the DeepNorm run is the same run
