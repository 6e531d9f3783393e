"""The rival rule's, the width study's and the map controls' sweep files (docs/results/rival/README.md): each
parses into the cells the design states, and the follow-up rules that choose the confirmation and the width
boundary runs pick, from synthetic run summaries, the rates worked out by hand (no fits)."""

import json
import math
from pathlib import Path

import pytest
import yaml

from loopnet.study.grid import CLI, expand, load_sweep, sweep_from_dict
from loopnet.study.sweep import MANIFEST

GRID_RATES = [1.25e-4 * 2**i for i in range(9)]  # 1.25e-4 ... 3.2e-2 on a ×2 grid
PILOT_RATES = GRID_RATES[2:]  # the map's grid, 5e-4 ... 3.2e-2


def _params(cells, *keys):
    return {tuple(c.params[k] for k in keys) for c in cells}


def test_rival_grid_is_three_arms_by_three_r_by_nine_rates_by_three_seeds():
    cells = expand(load_sweep("configs/sweeps/rival/grid.yaml"))
    assert len(cells) == 243
    keys = (
        "model.config.residual",
        "model.config.branch_scale",
        "model.config.n_rounds",
        "model.optim.lr",
        "seed_everything",
    )
    got = _params(cells, *keys)
    want = {
        ("preln", arm, r, lr, s)
        for arm in ("one", "sqrt_depth", "wang")
        for r in (2, 6, 12)
        for lr in GRID_RATES
        for s in (1, 2, 3)
    }
    assert len(got) == 243 and {(a, b, c, round(lr, 12), s) for a, b, c, lr, s in got} == {
        (a, b, c, round(lr, 12), s) for a, b, c, lr, s in want
    }
    assert cells[0].id == "preln-eps_one-r2-lr0.000125-s1"


@pytest.mark.parametrize("d, heads", [(64, 2), (256, 8)])
def test_width_pilot_is_one_seed_on_the_maps_grid_with_heads_of_32(d, heads):
    sweep = load_sweep(f"configs/sweeps/width/d{d}_pilot.yaml")
    cells = expand(sweep)
    assert len(cells) == 28  # 2 schemes × R ∈ {2, 12} × 7 rates × 1 seed
    assert sweep.overrides == {"model.config.d_model": d, "model.config.n_heads": heads} and d // heads == 32
    assert _params(cells, "model.config.residual", "model.config.n_rounds") == {
        (s, r) for s in ("deepnorm", "deeploop") for r in (2, 12)
    }
    assert sorted({c.params["model.optim.lr"] for c in cells}) == pytest.approx(PILOT_RATES, rel=1e-12)
    assert {c.params["seed_everything"] for c in cells} == {1}


def test_map_controls_cover_the_missing_controls():
    below = expand(load_sweep("configs/sweeps/map/controls.yaml"))
    assert _params(below, "model.config.residual", "model.config.n_rounds", "model.optim.lr", "seed_everything") == {
        (scheme, R, lr, s)
        for scheme in ("preln", "postln")
        for R in (6, 12)
        for lr in (1.25e-4, 2.5e-4)
        for s in (1, 2)
    }
    grid = load_sweep("configs/sweeps/map/grid.yaml")
    assert min(grid.grid["model.optim.lr"]) == 5e-4 > max(c.params["model.optim.lr"] for c in below)
    # The Makefile's selection on the map's grid: Post-LN and Pre-LN at every R (R = 12 already run: skipped)
    import fnmatch

    picked = [c for c in expand(grid) if fnmatch.fnmatch(c.id, "postln*") or fnmatch.fnmatch(c.id, "preln*")]
    assert len([c for c in picked if c.params["model.config.n_rounds"] in (2, 6)]) == 56


def test_smoke_is_one_cell_per_arm_and_its_commands_pass_the_cli_checks():
    from loopnet.training.dry_run import check_command

    cells = expand(load_sweep("configs/sweeps/rival/smoke.yaml"))
    assert [c.params["model.config.branch_scale"] for c in cells] == ["one", "sqrt_depth", "wang"]
    for cell in cells:
        assert check_command(cell.command[len(CLI) :]) is None
    bad = cells[2].command[len(CLI) :] + ["--model.config.residual", "deeploop"]
    assert "residual: preln" in check_command(bad)


# ---------------------------------------------------------------------------------------- follow-ups
PLATEAU = 3.3


def _summary(config: dict, lr: float, loss: float | None) -> dict:
    return {
        "status": "diverged" if loss is None else "completed",
        "diverged_at_step": 50 if loss is None else None,
        "final_val_loss": loss,
        "best_val_loss": loss,
        "final_train_loss": loss,
        "global_step": 200,
        "val_history": [] if loss is None else [[200, loss]],
        "config": {"p": None, "wiring": "carry", "n_blocks": 2, "vocab_size": 320, **config},
        "hparams": {"optim": {"lr": lr}},
        "last_visit_stats": None,
        "kappa": None,
        "wall_time_s": 1.0,
    }


def _write_sweep(folder: Path, runs: list[tuple[dict, dict, float | None]], spec: dict | None = None) -> None:
    """Cells (params, model config, final loss) with their summaries and the manifest."""
    from loopnet.diagnostics import write_summary
    from loopnet.study.grid import cell_id

    cells = []
    for params, config, loss in runs:
        cid = cell_id(params)
        write_summary(folder / cid / "summary.json", _summary(config, params["model.optim.lr"], loss))
        cells.append({"id": cid, "params": params})
    (folder / MANIFEST).write_text(json.dumps({"cells": cells, "out": str(folder), "spec": spec or {}}))


# Per (arm, R): the vertex c of ℓ(u) = 2.7 + 0.5·(u − c)², u = log10 lr, in ×2 steps above 1.25e-4. Each seed adds
# an offset (−0.01, 0, +0.01) that cancels in the seed mean, so the fitted vertex is c itself; c lies 0.3 of a
# step above grid rate i, so the nearest grid rate is rate i.
VERTEX_STEP = {
    ("one", 2): 4.3,
    ("one", 6): 3.3,
    ("one", 12): 2.3,
    ("sqrt_depth", 2): 6.3,
    ("sqrt_depth", 6): 5.3,
    ("sqrt_depth", 12): 4.3,
    ("wang", 2): 5.3,
    ("wang", 6): 5.3,
    ("wang", 12): 4.3,
}


def _u(step: float) -> float:
    return math.log10(1.25e-4) + step * math.log10(2)


@pytest.fixture
def rival_runs(tmp_path):
    runs = []
    for (arm, r), step in VERTEX_STEP.items():
        for i, lr in enumerate(GRID_RATES):
            for seed, offset in zip((1, 2, 3), (-0.01, 0.0, 0.01)):
                loss = 2.7 + 0.5 * (math.log10(lr) - _u(step)) ** 2 + offset
                loss = None if i == 8 and arm == "one" else loss  # ε = 1 diverges at the top rate
                params = {
                    "model.config.residual": "preln",
                    "model.config.branch_scale": arm,
                    "model.config.n_rounds": r,
                    "model.optim.lr": lr,
                    "seed_everything": seed,
                }
                runs.append((params, {"residual": "preln", "branch_scale": arm, "n_rounds": r}, loss))
    _write_sweep(tmp_path / "rival_grid", runs)
    confirm = {
        "include": [
            {
                "model.config.residual": ["deeploop"],
                "model.config.n_rounds": [12],
                "model.optim.lr": [0.002],
                "seed_everything": [3, 4, 5],
            }
        ]
    }
    (tmp_path / "map_confirm.yaml").write_text(yaml.safe_dump(confirm))
    return tmp_path


def test_rival_confirm_takes_each_arms_vertex_rounded_to_the_grid_on_fresh_seeds(rival_runs, monkeypatch):
    from experiments import followup

    monkeypatch.setattr(followup, "MAP_CONFIRM", rival_runs / "map_confirm.yaml")
    out = rival_runs / "confirm.yaml"
    followup.main(["rival-confirm", str(rival_runs / "rival_grid"), "--plateau", str(PLATEAU), "--out", str(out)])
    cells = expand(load_sweep(out))
    assert len(cells) == 28  # 3 arms × 3 R × seeds 4, 5, 6, and DeepLoop at R = 12 on seed 6
    got = {
        (c.params["model.config.branch_scale"], c.params["model.config.n_rounds"]): c.params["model.optim.lr"]
        for c in cells
        if c.params["model.config.residual"] == "preln"
    }
    assert got == {k: pytest.approx(GRID_RATES[int(step)], rel=1e-12) for k, step in VERTEX_STEP.items()}
    assert {c.params["seed_everything"] for c in cells if c.params["model.config.residual"] == "preln"} == {4, 5, 6}
    assert _params(
        [c for c in cells if c.params["model.config.residual"] == "deeploop"],
        "model.config.n_rounds",
        "model.optim.lr",
        "seed_everything",
    ) == {(12, 0.002, 6)}
    text = out.read_text()
    for (arm, r), step in VERTEX_STEP.items():  # the header gives the fitted vertex, c to 3 decimals
        assert f"branch_scale {arm}, at R = {r}: best rate {GRID_RATES[int(step)]:g} (vertex 10^{_u(step):.3f}" in text


def test_rival_confirm_needs_the_maps_deeploop_cell(rival_runs, monkeypatch):
    from experiments import followup

    monkeypatch.setattr(followup, "MAP_CONFIRM", rival_runs / "missing.yaml")
    with pytest.raises(SystemExit):
        followup.main(
            [
                "rival-confirm",
                str(rival_runs / "rival_grid"),
                "--plateau",
                str(PLATEAU),
                "--out",
                str(rival_runs / "c.yaml"),
            ]
        )


# Per (scheme, R): the largest pilot rate at which seed 1 trains (rates above it end on the plateau or diverge).
PILOT_EDGE = {("deepnorm", 2): 8e-3, ("deeploop", 2): 1.6e-2, ("deepnorm", 12): 4e-3, ("deeploop", 12): 3.2e-2}


def test_width_boundary_is_six_rates_around_the_pilots_edge_beside_the_pilot(tmp_path):
    from experiments import followup

    spec = yaml.safe_load(Path("configs/sweeps/width/d64_pilot.yaml").read_text())
    spec["out"] = str(tmp_path / "width_d64")
    pilot = sweep_from_dict(spec)
    runs = []
    for cell in expand(pilot):
        p = cell.params
        edge = PILOT_EDGE[(p["model.config.residual"], p["model.config.n_rounds"])]
        loss = 2.8 if p["model.optim.lr"] <= edge else (3.4 if p["model.optim.lr"] < 3e-2 else None)
        runs.append((p, {"residual": p["model.config.residual"], "n_rounds": p["model.config.n_rounds"]}, loss))
    _write_sweep(tmp_path / "width_d64", runs, spec)
    out = tmp_path / "boundary.yaml"
    followup.main(["width", str(tmp_path / "width_d64"), "--plateau", str(PLATEAU), "--out", str(out)])
    boundary = load_sweep(out)
    cells = expand(boundary)
    assert (
        str(boundary.out) == f"{pilot.out}_boundary"
        and boundary.overrides == pilot.overrides
        and boundary.base == pilot.base
    )
    assert not {c.id for c in expand(pilot)} & {c.id for c in cells}  # the pilot's cells are not run again
    both = [c.params for c in [*expand(pilot), *cells]]
    for (scheme, r), edge in PILOT_EDGE.items():
        rates = [edge * 2 ** (k / 2) for k in range(-2, 4)]
        for seed in (1, 2, 3):
            mine = sorted(
                p["model.optim.lr"]
                for p in both
                if (p["model.config.residual"], p["model.config.n_rounds"], p["seed_everything"]) == (scheme, r, seed)
            )
            if seed == 1:  # the pilot's grid and the boundary rates off it
                assert all(any(lr == pytest.approx(x, rel=5e-3) for lr in mine) for x in rates)
            else:
                assert mine == pytest.approx(rates, rel=5e-3)  # 3 digits
    # per (scheme, R) 6 rates × 3 seeds, less seed 1 at the pilot's rates among them: η_p/2, η_p and 2·η_p on
    # the grid (3 each), except DeepLoop at R = 12, whose 2·η_p = 6.4e-2 is above it (2)
    assert len(cells) == 3 * 15 + 16
