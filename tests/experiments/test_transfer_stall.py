"""The stall check (experiments/transfer/stall.py) on summaries whose answers are set by construction: a gradient
that falls by a known factor a visit gives a known fall per round, a zero at round 1 an infinite one; a sweep
folder of such summaries gives one row per (arm, cell, rate) with its seeds' medians."""

import json
import math

import pytest

from experiments.transfer import stall

PLATEAU = 3.275707171288669  # the map's


def visit_stats(rounds: int, ratio: float, factor: float) -> dict:
    """K = 2 blocks × attn/ffn: 4 visits a round; ‖∂L/∂x‖ is 1e-2 at the last visit and ×factor per visit
    earlier; a prelude visit first, which is not the loop's."""
    tags = [f"r{r:02d}_k{k}_{s}" for r in range(1, rounds + 1) for k in (1, 2) for s in ("attn", "ffn")]
    n = len(tags)
    stats = {"p1_attn": {"branch_ratio": 99.0, "act_grad_norm": 1.0}}
    for i, tag in enumerate(tags):
        stats[tag] = {"branch_ratio": ratio, "act_grad_norm": 1e-2 * factor ** (n - 1 - i)}
    return stats


def test_the_fall_is_decades_a_round_from_the_last_visit_back_to_the_first():
    ratio, fall = stall.visit_measures(visit_stats(12, 0.6, 0.5))
    assert ratio == 0.6  # the prelude's 99 is not a loop visit
    assert fall == pytest.approx(-(4 * 12 - 1) * math.log10(0.5) / 12, rel=1e-12)
    assert stall.visit_measures(visit_stats(2, 0.02, 1.0))[1] == 0.0
    vanished = visit_stats(2, 0.6, 0.5)
    vanished["r01_k1_attn"]["act_grad_norm"] = 0.0
    assert stall.visit_measures(vanished)[1] == math.inf
    assert stall.visit_measures({}) is None


def test_a_sweep_folder_gives_one_row_per_arm_cell_and_rate(tmp_path, capsys):
    cells = []
    for lr, ratio, factor, loss in ((1e-3, 0.02, 1.0, 2.7), (4e-3, 0.6, 0.5, 3.3)):
        for seed in (1, 2, 3):
            cid = f"lr{lr}-s{seed}"
            cells.append({"id": cid, "params": {"model.optim.lr": lr, "seed_everything": seed}})
            (tmp_path / cid).mkdir()
            cfg = {"parametrization": "standard", "residual": "deeploop", "d_model": 256, "n_rounds": 12}
            summary = {
                "status": "completed",
                "final_val_loss": loss,
                "config": cfg,
                "last_visit_stats": visit_stats(12, ratio * seed, factor),
            }
            (tmp_path / cid / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "sweep.json").write_text(json.dumps({"cells": cells}))
    stall.main(["--cells", str(tmp_path), "--plateau", str(PLATEAU)])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| standard")]
    assert rows == [
        "| standard + DeepLoop | target | 0.001 | 3 of 3 | 0.040 | +0.00 |",
        f"| standard + DeepLoop | target | 0.004 | 0 of 3 | 1.200 | {47 * math.log10(2) / 12:+.2f} |",
    ]


def test_a_folder_without_finished_runs_is_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as err:
        stall.main(["--cells", str(tmp_path), "--plateau", str(PLATEAU)])
    assert err.value.code == 2
    assert "has no finished run with a summary; fix:" in capsys.readouterr().err
