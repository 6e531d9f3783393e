"""The sweep file: a YAML grid of `loopnet fit` runs over a base config, expanded into cells.

    base: [configs/deeploop_r6.yaml, configs/cpu.yaml]   # `--config` files, composed left to right
    overrides:                                            # `--key value` for every cell
      trainer.max_steps: 200
    grid:                                                 # the Cartesian product of these lists
      model.config.residual: [preln, postln, deepnorm, deeploop]
      model.config.n_rounds: [1, 3, 6]
      seed_everything: [1, 2]
    include:                                              # extra grids; a key they leave out
      - model.config.residual: preln                      # takes its list from `grid`; a key
        model.config.wiring: flt                          # of `overrides` they set wins there
    out: runs/sweeps/cpu_study                            # the sweep folder

Keys are the dotted `loopnet fit` options without the leading ``--``. A scalar counts as a
one-element list. Relative paths (`base`, `out`) are resolved against the current working
directory, exactly as `loopnet fit --config` resolves them: run sweeps from the repository root.

A cell's `seed_everything` (grid or overrides) also sets `data.seed`, the data order, unless the
sweep sets `data.seed` itself: seeds then vary the initialisation *and* the batches.

Each cell is one fit, named by its grid values (e.g. ``deeploop-r3-s1``), logging into
``<out>/<cell_id>/`` (TensorBoard events, config.yaml, checkpoints/, summary.json).
"""

from __future__ import annotations

import itertools
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .measures import param_label

SWEEP_KEYS = {"base", "overrides", "grid", "include", "out", "description"}


class SweepError(ValueError):
    """A sweep file that cannot be expanded; the message says what to fix."""


@dataclass
class Cell:
    """One run of the sweep: its id (= its log folder name) and the grid values it sets."""

    id: str
    params: dict[str, Any]
    command: list[str] = field(default_factory=list)


@dataclass
class Sweep:
    path: Path | None
    base: list[str]
    overrides: dict[str, Any]
    grid: dict[str, list]
    include: list[dict[str, list]]
    out: Path
    description: str = ""
    spec: dict = field(default_factory=dict)  # the file as read, kept in the manifest


def cli_value(value: Any) -> str:
    """A YAML/JSON value as one `loopnet fit` command-line token (jsonargparse parses it back)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        return json.dumps(value)  # true / false / null
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value)  # lists and mappings


def cell_id(params: dict[str, Any]) -> str:
    """The cell's name from its grid values, in grid-key order, e.g. ``preln-flt-r6-s2``."""
    return "-".join(param_label(key, value) for key, value in params.items()) or "cell"


def _as_list(key: str, value: Any) -> list:
    values = value if isinstance(value, list) else [value]
    if not values:
        raise SweepError(f"grid key {key!r} has an empty list: give at least one value")
    return values


def load_sweep(path: str | Path, out: str | Path | None = None) -> Sweep:
    """Read and check a sweep file (see the module docstring for its keys)."""
    path = Path(path)
    try:
        spec = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise SweepError(f"sweep file {path} does not exist") from None
    from loopnet.training.trust import refuse_sweep

    refuse_sweep(spec, path)  # a grid file names only what a config may (loopnet.training.trust)
    return sweep_from_dict(spec, path=path, out=out)


def sweep_from_dict(spec: dict, path: Path | None = None, out: str | Path | None = None) -> Sweep:
    unknown = set(spec) - SWEEP_KEYS
    if unknown:
        raise SweepError(f"unknown sweep keys {sorted(unknown)}; allowed: {sorted(SWEEP_KEYS)}")
    base = spec.get("base") or []
    base = [base] if isinstance(base, str) else list(base)
    for file in base:
        if not Path(file).is_file():
            raise SweepError(
                f"base config {file} not found (relative paths are resolved against the "
                f"current directory {Path.cwd()}; run the sweep from the repository root)"
            )
    grid = {k: _as_list(k, v) for k, v in (spec.get("grid") or {}).items()}
    include = []
    for entry in spec.get("include") or []:
        if not isinstance(entry, dict) or not entry:
            raise SweepError(f"each `include` entry must be a non-empty mapping of grid keys, got {entry!r}")
        include.append({k: _as_list(k, v) for k, v in entry.items()})
    out = out if out is not None else spec.get("out")
    if out is None:
        raise SweepError("the sweep has no output folder: set `out:` in the file or pass --out")
    overrides = dict(spec.get("overrides") or {})
    for key in grid:  # (an `include` entry may override an `overrides` key for its own cells)
        if key in overrides:
            raise SweepError(f"{key!r} is both in `overrides` and in `grid`; keep it in one place")
    return Sweep(
        path=path,
        base=base,
        overrides=overrides,
        grid=grid,
        include=include,
        out=Path(out),
        description=str(spec.get("description") or ""),
        spec=spec,
    )


def expand(sweep: Sweep) -> list[Cell]:
    """Every cell of the sweep, in a stable order: the `grid` product first, then each `include`
    grid (its missing keys filled from `grid`). Duplicate combinations are run once."""
    grids = [sweep.grid] if sweep.grid else []
    for entry in sweep.include:
        merged = dict(entry)
        for key, values in sweep.grid.items():
            merged.setdefault(key, values)
        # Keep the `grid` key order first so that the cell ids read the same way for all cells.
        ordered = {k: merged[k] for k in sweep.grid} | {k: v for k, v in merged.items() if k not in sweep.grid}
        grids.append(ordered)
    if not grids:
        grids = [{}]  # no grid at all: the sweep is the base config once
    cells, seen = [], {}
    for grid in grids:
        keys = list(grid)
        for values in itertools.product(*(grid[k] for k in keys)):
            params = dict(zip(keys, values))
            cid = cell_id(params)
            if cid in seen:
                if seen[cid] != params:
                    raise SweepError(f"two different cells are both named {cid!r}: {seen[cid]} and {params}")
                continue
            seen[cid] = params
            cells.append(Cell(cid, params, fit_command(sweep, cid, params)))
    return cells


# How a cell starts the `loopnet` CLI (its arguments follow).
CLI = [sys.executable, "-m", "loopnet.training.cli"]


def fit_command(sweep: Sweep, cid: str, params: dict[str, Any]) -> list[str]:
    """The `loopnet fit` command of one cell. Later options win, so the cell's grid values override
    `overrides`, and the pinned logger folder (``<out>/<cell_id>/``, no version_N level) comes last.
    The logger is loopnet's default TensorBoardLogger; only its folder is set here."""
    cmd = [*CLI, "fit"]
    for file in sweep.base:
        cmd += ["--config", str(file)]
    options = {**sweep.overrides, **params}
    if "seed_everything" in options and "data.seed" not in options:
        options["data.seed"] = options["seed_everything"]  # a seed varies the data order too, not only the init
    for key, value in options.items():
        cmd += [f"--{key}", cli_value(value)]
    cmd += [
        "--trainer.logger.init_args.save_dir",
        str(sweep.out),
        "--trainer.logger.init_args.name",
        cid,
        "--trainer.logger.init_args.version",
        "",  # log_dir = <out>/<cell_id>
        "--trainer.enable_progress_bar",
        "false",  # the cell's log file is read by people, not a terminal
    ]
    return cmd
