"""The cells a reading reads, and what every study's readings do with them.

A sweep leaves them in either of two forms: its run folder (the manifest and each cell's summary.json, read
by `runs.load_runs` as `loopnet report` reads them) or a report folder's committed `cells.csv` and
`plateau.json` (`read_cells`). Each cell of `read` is `read_cells`'s dict plus `arm`, Pre-LN's branch
multiplier rule (`model.config.branch_scale`; "one" where not set), and `scheme` is the *group* a reading
compares: the arm's name for a Pre-LN cell (one, sqrt_depth, wang), else the scheme, so that `merge` and
`by_rate` key by it."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

from loopnet.model.scales import BRANCH_SCALES
from loopnet.study.measures import slug, trainable_band, trains
from loopnet.study.sweep import MANIFEST

ARM_KEY = "model.config.branch_scale"


def read_cells(folder: Path) -> list[dict]:
    """The cells of one report folder: scheme, p, R, lr (from the cell id), seed, status, final loss, steps run."""
    out = []
    for row in csv.DictReader((folder / "cells.csv").open()):
        lr = re.search(r"-lr([0-9.e-]+)-s\d+$", row["cell"])
        out.append(
            {
                "sweep": folder.name,
                "cell": row["cell"],
                "scheme": row["scheme"],
                "p": row["p"],
                "R": int(row["R"]),
                "lr": float(lr.group(1)) if lr else None,
                "seed": int(row["seed"]),
                "status": row["status"],
                "loss": float(row["final_val_loss"]) if row["final_val_loss"] else None,
                "steps": int(row["global_step"]) if row.get("global_step") else None,
            }
        )
    return out


def merge(*sweeps: list[dict]) -> dict[tuple, dict]:
    """(scheme, R, lr, seed) -> the first finished cell of the sweeps given (a cell rerun by a later sweep,
    same seed and rate, is the same run: the boundary reran 16 grid cells and matched them)."""
    out: dict[tuple, dict] = {}
    for cells in sweeps:
        for c in cells:
            if c["status"] in ("completed", "diverged"):
                out.setdefault((c["scheme"], c["R"], c["lr"], c["seed"]), c)
    return out


def trains_cell(c: dict, plateau: float) -> bool:
    return trains(c["status"], c["loss"], plateau)


def by_rate(cells: dict, scheme: str, rounds: int) -> dict[float, list[dict]]:
    out: dict[float, list[dict]] = {}
    for (s, r, lr, _), c in sorted(cells.items()):
        if s == scheme and r == rounds:
            out.setdefault(lr, []).append(c)
    return out


def largest_trainable(cells: dict, scheme: str, rounds: int, plateau: float) -> dict:
    """The ×√2 "every seed trains" rule (`measures.trainable_band`) on the rates these cells ran."""
    rates = by_rate(cells, scheme, rounds)
    return trainable_band({lr: all(trains_cell(c, plateau) for c in cs) for lr, cs in rates.items()})


def fmt_lr(x: float | None) -> str:
    return "—" if x is None else f"{x:.3g}"


def signed(v: float, digits: int = 2) -> str:
    """`v` with its sign to `digits` decimals; a value that rounds to zero prints unsigned ("0.00"): the sign of a
    figure below the last printed digit is rounding noise, and differs between CPUs."""
    text = f"{v:+.{digits}f}"
    return text[1:] if float(text) == 0 else text


def fmt_ci(lo, hi, scale=lambda v: v, spec="{:.3g}") -> str:
    def end(v):
        return "open" if v is None else spec.format(scale(v))

    return f"[{end(lo)}, {end(hi)}]"


def arm_of(cell_id: str) -> str:
    """The branch_scale rule in a cell id (`preln-eps_sqrtdepth-r2-lr0.001-s1`: "sqrt_depth"); "one" without."""
    found = re.search(r"(?:^|-)eps_([A-Za-z0-9.]+)(?:-|$)", cell_id)
    if not found:
        return "one"
    by_slug = {slug(a): a for a in BRANCH_SCALES}
    if found.group(1) not in by_slug:
        raise ValueError(
            f"cell {cell_id!r} names an unknown branch_scale {found.group(1)!r}; fix: one of {', '.join(BRANCH_SCALES)}"
        )
    return by_slug[found.group(1)]


def group_of(scheme: str, arm: str) -> str:
    return arm if scheme == "preln" else scheme


def _from_runs(folder: Path) -> list[dict]:
    from loopnet.study.report.runs import load_runs

    out = []
    for run in load_runs(folder)[0]:
        arm = run.params.get(ARM_KEY) or (run.value("config") or {}).get("branch_scale") or "one"
        loss = run.value("final_val_loss")
        out.append(
            {
                "sweep": folder.name,
                "cell": run.id,
                "scheme": run.scheme,
                "p": run.p,
                "R": run.rounds,
                "lr": float(run.lr) if run.lr is not None else None,
                "seed": run.seed,
                "status": run.status,
                "loss": float(loss) if loss is not None else None,
                "steps": run.value("global_step"),
                "arm": arm,
            }
        )
    return out


def read(folder: Path | str) -> list[dict]:
    """Every cell of a report folder (its cells.csv) or a sweep's run folder (its manifest)."""
    folder = Path(folder)
    if (folder / "cells.csv").is_file():
        cells = [dict(c, arm=arm_of(c["cell"])) for c in read_cells(folder)]
    elif (folder / MANIFEST).is_file():
        cells = _from_runs(folder)
    else:
        raise ValueError(
            f"{folder} has neither cells.csv nor a sweep manifest ({MANIFEST}); fix: pass a report "
            f"folder (loopnet report's --out) or a sweep's run folder (runs/sweeps/<name>)"
        )
    return [dict(c, scheme=group_of(c["scheme"], c["arm"])) for c in cells]


def plateau(folders, given: str = "auto") -> float:
    """The unigram plateau: the number given, else the first folder's plateau.json (a report folder's, or
    a run folder's report/ cache), else computed from a run folder (`runs.sweep_plateau`, cached there)."""
    if given != "auto":
        try:
            return float(given)
        except ValueError:
            raise ValueError(f"--plateau takes a number or auto, got {given!r}") from None
    folders = [Path(f) for f in folders]
    for f in folders:
        for path in (f / "plateau.json", f / "report" / "plateau.json"):
            if path.is_file():
                return float(json.loads(path.read_text())["plateau"])
    for f in folders:
        if (f / MANIFEST).is_file():
            from loopnet.study.report.runs import load_runs, sweep_plateau

            return sweep_plateau(load_runs(f)[0], f, f / "report")[0]
    raise ValueError(f"no plateau.json in {', '.join(map(str, folders))}; fix: pass --plateau VALUE")
