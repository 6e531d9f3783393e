"""The map's readings recomputed from the committed cells.csv: reading 1 by the rule stated before running,
on the cells that rule named, and the figures the corrected record quotes (checked by hand from cells.csv)."""

from pathlib import Path

from experiments import sources
from experiments.map import readings as map_readings

MAP = Path(__file__).resolve().parents[2] / "docs" / "results" / "map"


def test_reading1_from_the_committed_cells(tmp_path):
    grid, bnd = sources.read_cells(MAP / "grid"), sources.read_cells(MAP / "boundary")
    plateau = 3.275707171288669
    md = "\n".join(map_readings.reading1(grid, bnd, plateau))
    # stated before running (grid + R = 12 boundary): DeepNorm 8e-3 -> 8e-3, DeepLoop 1.6e-2 -> 1.6e-2
    assert "| 0.008 → 0.008 | 0.00 | 0.016 → 0.016 | 0.00 | +0.00 | **contradicted** |" in md
    # with the R = 2 boundary added: DeepNorm 1.13e-2 -> 8e-3 (0.15 decades)
    assert "| 0.0113 → 0.008 | 0.15 | 0.016 → 0.016 | 0.00 | +0.15 | **not resolved** |" in md
    # R = 6 on the grid: 8e-3 for both (DeepLoop: 1 of 2 seeds at 1.6e-2)
    assert "deepnorm 0.008 / 0.008 / 0.008; deeploop 0.016 / 0.008 / 0.016" in md


def test_controls_and_failures_from_the_committed_cells():
    grid, bnd, expo = (sources.read_cells(MAP / s) for s in ("grid", "boundary", "exponent"))
    md = "\n".join(map_readings.controls_and_failures(grid, bnd, expo, 3.275707171288669))
    for figure in ("4.779", "3.818", "3.518", "2.882✓", "3.250"):
        assert figure in md
    assert md.count("3.518") == 1  # the exponent sweep's p = 0.25 copy of the DeepNorm run is the same run


def _cell(scheme, R, lr, seed, loss, sweep="controls_grid"):
    return {
        "sweep": sweep,
        "cell": f"{scheme}-r{R}-lr{lr:g}-s{seed}",
        "scheme": scheme,
        "p": "",
        "R": R,
        "lr": lr,
        "seed": seed,
        "status": "completed",
        "loss": loss,
    }


def test_the_controls_best_rate_censoring_and_paired_difference():
    """Synthetic cells with a known answer: Pre-LN's best rate at R = 2 is interior (2e-3), Post-LN's is its
    lowest (censored, on the plateau), and Pre-LN − DeepNorm at their own best rates is, per seed, 0.06 and
    0.05: mean 0.055, 95% t interval 0.055 ± 12.706·0.005 on 1 degree of freedom."""
    plateau = 3.3
    grid = [
        _cell("deepnorm", 2, 1e-3, 1, 2.60, "grid"),
        _cell("deepnorm", 2, 1e-3, 2, 2.50, "grid"),
        _cell("deepnorm", 2, 2e-3, 1, 2.70, "grid"),
        _cell("deepnorm", 2, 2e-3, 2, 2.60, "grid"),
    ]
    controls = [
        _cell("preln", 2, 1e-3, 1, 2.70),
        _cell("preln", 2, 1e-3, 2, 2.60),
        _cell("preln", 2, 2e-3, 1, 2.66),
        _cell("preln", 2, 2e-3, 2, 2.55),
        _cell("preln", 2, 4e-3, 1, 2.80),
        _cell("preln", 2, 4e-3, 2, 2.90),
        _cell("postln", 2, 1e-3, 1, 3.30),
        _cell("postln", 2, 1e-3, 2, 3.31),
        _cell("postln", 2, 2e-3, 1, 3.31),
        _cell("postln", 2, 2e-3, 2, 3.32),
    ]
    md = "\n".join(map_readings.controls_and_failures(grid, [], [], plateau, [controls]))
    assert "- preln at R = 2: 0.001: 2.700✓, 2.600✓; 0.002: 2.660✓, 2.550✓; 0.004: 2.800✓, 2.900✓; η* = 0.002." in md
    assert (
        "- postln at R = 2: 0.001: 3.300, 3.310; 0.002: 3.310, 3.320; η* = 0.001 (censored: the lowest rate run), "
        "on the plateau." in md
    )
    half = 12.7062 * 0.005
    assert (
        f"- R = 2: Pre-LN (η* 0.002) − deepnorm (η* 0.001) best loss, seeds 1, 2: +0.055 nat "
        f"[{0.055 - half:+.3f}, {0.055 + half:+.3f}] (per seed +0.060, +0.050)."
    ) in md
    assert "- preln at R = 6: not run." in md and "deeploop" not in md


def test_report_plots_are_saved_with_a_palette(tmp_path):
    """`plotting.save` writes a 256-colour palette PNG (a report's plots are committed by the dozen), at the
    figure's size and with its colours: a red line stays red."""
    from PIL import Image

    from loopnet.study.plotting import pyplot, save

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([0, 1], [0, 1], color=(1.0, 0.0, 0.0), linewidth=6)
    save(plt, fig, tmp_path / "p.png")
    image = Image.open(tmp_path / "p.png")
    assert image.mode == "P" and image.size == (480, 360)
    colours = {rgb for _, rgb in image.convert("RGB").getcolors(maxcolors=256)}
    assert (255, 0, 0) in colours and (255, 255, 255) in colours
