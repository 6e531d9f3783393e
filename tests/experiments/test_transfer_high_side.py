"""The high-side check (experiments/transfer/high_side.py) on synthetic runs whose 50%-trains rates are known by
construction: every seed's trains-pattern in a cell is a translate of one pattern, so Δ50 is exactly the
translation; runs that fail at the ladder's bottom (too slow, not unstable) break the pre-registered fit's
monotone model, and the high side, which drops them, recovers the translation."""

import math

import pytest

from experiments.transfer import high_side as hs
from experiments.transfer import readings as tr

PLATEAU = 3.275707171288669  # the map's
OFFSETS = [-0.3, -0.15, 0.0, 0.0, 0.15, 0.3]  # per-seed edge of training around the cell's centre (decades)


def runs_with_slow_bottom(centres: dict[str, float], slow_cell: str | None) -> dict:
    """Seed s trains below log10 η = centre + offset_s, with a loss bowl whose lowest point is a ladder rate 0.475
    decades below the centre; in `slow_cell`, seeds 1-3 at the three lowest rates end above the trains threshold (completed)."""
    runs = {}
    for cell, c in centres.items():
        for s in range(1, 7):
            for k in range(40):
                u = c - 1.0 + k * 0.05 + 0.025
                ok = u < c + OFFSETS[s - 1]
                loss = 2.7 + 0.1 * (u - (c - 0.475)) ** 2 if ok else None
                if cell == slow_cell and s <= 3 and k < 3:
                    loss = 3.2  # completed, above plateau − 0.1: does not train
                runs[("completep", cell, 10**u, s)] = {
                    "arm": "completep", "cell": cell, "d": 64, "R": 2, "lr": 10**u, "seed": s,
                    "status": "completed" if loss is not None else "diverged", "loss": loss, "init_loss": 5.77,
                }  # fmt: skip
    return runs


def test_the_best_mean_rate_is_the_bowls_lowest_point():
    runs = runs_with_slow_bottom({"source": -1.5}, None)
    assert math.log10(hs.best_mean_rate(runs, "completep", "source")) == pytest.approx(-1.5 - 0.475, abs=1e-9)
    assert hs.best_mean_rate(runs, "completep", "width") is None


def test_the_high_side_drops_the_slow_bottom_and_recovers_the_translation():
    runs = runs_with_slow_bottom({"source": -1.5, "target": -2.1}, slow_cell="source")
    every = tr.delta50(runs, "completep", "source", "target", PLATEAU)
    high = hs.high_side(runs)
    assert min(math.log10(lr) for (_, c, lr, _) in high if c == "source") == pytest.approx(-1.975, abs=1e-9)
    assert not any(r["loss"] == 3.2 for r in high.values())
    d = tr.delta50(high, "completep", "source", "target", PLATEAU)
    assert d["est"] == pytest.approx(-0.6, abs=1e-6)
    assert d["lo"] < -0.6 < d["hi"]
    # the bottom's failures pull the every-run fit off the translation
    assert abs(every["est"] + 0.6) > 0.05


def test_the_table_prints_both_fits_for_each_arm_and_pair(tmp_path, capsys):
    runs = runs_with_slow_bottom({"source": -1.5, "width": -1.5, "target": -2.1}, slow_cell="source")
    tr.write_csv(runs, tmp_path / "cells.csv")
    hs.main(["--cells", str(tmp_path), "--plateau", str(PLATEAU)])
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| μP + CompleteP (Pre-LN) | source → target"))
    assert "-0.60 [" in row.split("|")[4]  # the high side's Δ50
    assert out.count("| μP + CompleteP (Pre-LN) |") == 3
