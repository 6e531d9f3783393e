"""The sweep file: expansion into cells, ids and commands (no fit is run here)."""

import sys
from pathlib import Path

import pytest
import yaml

from loopnet.study.grid import SweepError, cell_id, cli_value, expand, load_sweep, sweep_from_dict

REPO = Path(__file__).resolve().parents[2]


def test_grid_product_and_include_fill_missing_keys():
    sweep = sweep_from_dict(
        {
            "base": [],
            "grid": {
                "model.config.residual": ["preln", "deeploop"],
                "model.config.n_rounds": [1, 3],
                "seed_everything": [1, 2],
            },
            "include": [{"model.config.residual": "preln", "model.config.wiring": "flt"}],
            "out": "x",
        }
    )
    cells = expand(sweep)
    assert len(cells) == 2 * 2 * 2 + 2 * 2
    ids = [c.id for c in cells]
    assert ids[0] == "preln-r1-s1" and "deeploop-r3-s2" in ids and "preln-r6-s1" not in ids
    assert "preln-r3-s2-flt" in ids  # include's extra key comes after the grid keys
    assert len(set(ids)) == len(ids)
    flt = next(c for c in cells if c.id == "preln-r3-s2-flt")
    assert flt.params == {
        "model.config.residual": "preln",
        "model.config.n_rounds": 3,
        "seed_everything": 2,
        "model.config.wiring": "flt",
    }


def test_command_order_cell_values_win_and_logger_is_pinned(tmp_path):
    sweep = sweep_from_dict(
        {
            "grid": {"model.config.n_rounds": [2]},
            "overrides": {"trainer.max_steps": 5, "model.optim.lr": 0.01},
            "out": str(tmp_path / "sw"),
        }
    )
    (cell,) = expand(sweep)
    cmd = cell.command
    assert cmd[:4] == [sys.executable, "-m", "loopnet.training.cli", "fit"]
    joined = " ".join(cmd)
    assert (
        "--trainer.max_steps 5" in joined
        and "--model.optim.lr 0.01" in joined
        and "--model.config.n_rounds 2" in joined
    )
    i = cmd.index("--trainer.logger.init_args.save_dir")
    assert cmd[i + 1] == str(tmp_path / "sw")
    assert cmd[cmd.index("--trainer.logger.init_args.name") + 1] == cell.id == "r2"
    assert cmd[cmd.index("--trainer.logger.init_args.version") + 1] == ""


def test_values_and_ids():
    assert cli_value(True) == "true" and cli_value(None) == "null" and cli_value([1, 2]) == "[1, 2]"
    assert cli_value(0.4) == "0.4" and cli_value("deeploop") == "deeploop"
    assert (
        cell_id({"model.config.residual": "scaled", "model.config.p": 0.45, "seed_everything": 3}) == "scaled-p0.45-s3"
    )
    assert cell_id({"model.optim.warmup_steps": 10}) == "warmup_steps10"


def test_errors():
    with pytest.raises(SweepError, match="unknown sweep keys"):
        sweep_from_dict({"grd": {}, "out": "x"})
    with pytest.raises(SweepError, match="no output folder"):
        sweep_from_dict({"grid": {"seed_everything": [1]}})
    with pytest.raises(SweepError, match="base config"):
        sweep_from_dict({"base": ["configs/nope.yaml"], "out": "x"})
    with pytest.raises(SweepError, match="both in `overrides` and in `grid`"):
        sweep_from_dict({"grid": {"seed_everything": [1]}, "overrides": {"seed_everything": 2}, "out": "x"})


@pytest.mark.parametrize("name,count", [("cpu_study.yaml", 30), ("cpu_followup.yaml", 16), ("gpu_study.yaml", 65)])
def test_shipped_sweep_files_expand(name, count, monkeypatch):
    monkeypatch.chdir(REPO)  # base paths are relative to the repository root
    sweep = load_sweep(REPO / "configs" / "sweeps" / name)
    cells = expand(sweep)
    assert len({c.id for c in cells}) == len(cells)
    if count is not None:
        assert len(cells) == count
    spec = yaml.safe_load((REPO / "configs" / "sweeps" / name).read_text())
    assert spec["out"].startswith("runs/sweeps/")
