"""The map's steps 2 and 3 are chosen from what step 1 found, by rules fixed before running:

    python -m experiments.followup boundary runs/sweeps/map_grid --out configs/sweeps/map/boundary.yaml
    python -m experiments.followup exponent runs/sweeps/map_grid runs/sweeps/map_boundary \\
        --out configs/sweeps/map/exponent.yaml

boundary   at the grid's smallest and largest R, for DeepNorm and DeepLoop each: η_b = the largest rate at
           which every seed trains (`measures.trains`; the grid's smallest rate when none does), and the
           rates η_b·{1/√2, 1, √2, 2} (×√2 steps across the boundary between η_b, which trains, and 2·η_b,
           which does not), 3 seeds each: 48 fits (24 a round count). Both ends of R, so that the fall of
           the largest trainable rate (the map's reading 1) is read at ×√2 resolution at both.
exponent   the residual `scaled` (α = (2N)^p, β = (8N)^-p) at p ∈ {0.25, 0.35, 0.45, 0.55}, 5 seeds, at
           the grid's largest R and two rates: η½, the rate at which DeepNorm (p = 0.25) trains for the
           fraction of seeds closest to one half over every run given (grid and boundary; ties: the
           larger rate), and 2·η½: 40 fits. The report fits P(train) logistically on p at each rate.
confirm    at every R of the grid, for DeepNorm and DeepLoop each, the best rate η* (argmin ℓ(η), as the
           report reads it from the grid's seeds 1 and 2) with fresh seeds 3, 4, 5: 18 fits. The map's
           reading 2 (best loss vs best loss) is then read on seeds that did not choose η*, so the choice
           does not bias it, and with 3 seeds a scheme rather than 2.

The rival rule and the width study (docs/results/rival/README.md) use the same rules on their own sweeps:

    python -m experiments.followup rival-confirm runs/sweeps/rival_grid --out configs/sweeps/rival/confirm.yaml
    python -m experiments.followup width runs/sweeps/width_d256 --out configs/sweeps/width/d256_boundary.yaml

rival-confirm  per Pre-LN arm (`model.config.branch_scale`) and R, the best rate η*: the vertex of a quadratic
           in log10 η fitted to the seed-paired mean loss (`measures.best_rate_shift`'s vertex, over the rates
           where every seed trains), rounded to the nearest grid rate (the argmin of ℓ(η) where fewer than 3
           rates train, said in the header), with fresh seeds 4, 5, 6: 27 fits. Plus DeepLoop at the largest
           R, at the map's confirmed best rate (configs/sweeps/map/confirm.yaml), on the seeds of 4, 5, 6 that
           the map's confirmation lacks, so that the secondary reading pairs three seeds.
width      per (scheme, R) of a width's one-seed pilot: η_p = the largest rate where every seed trains (as
           `boundary`), and six rates η_p·2^(k/2), k = −2 … 3, × seeds 1, 2, 3, less the pilot's own cells
           (seed 1 at η_p/2, η_p, 2·η_p where on its grid), into `<pilot folder>_boundary` as the map's
           boundary beside its grid; the width readings merge the two reports.

Each writes a sweep file (the rule, the numbers it was read from, the cells) for `loopnet sweep`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path

import yaml

from loopnet.env import one_line_errors

from loopnet.study.measures import LR_KEY, TRAIN_MARGIN, best_rate_shift, trains

BASE = ["configs/deeploop_r6.yaml", "configs/cpu.yaml", "configs/study_map.yaml"]
SCHEMES = ("deepnorm", "deeploop")
EXPONENTS = [0.25, 0.35, 0.45, 0.55]


def _rate(x: float) -> float:
    return float(f"{x:.3g}")


def load(folders: list[Path], plateau: str):
    """Every finished run of the folders, and the plateau (the first folder's, or the number given)."""
    from loopnet.study.report.runs import load_runs, sweep_plateau

    runs = []
    for folder in folders:
        if not folder.is_dir():
            raise ValueError(f"{folder} is not a sweep folder; fix: run its sweep first (make map runs them in order)")
        runs += [r for r in load_runs(folder)[0] if r.finished]
    if not runs:
        raise ValueError(f"no finished run in {', '.join(map(str, folders))}; fix: run the grid sweep first")
    value = float(plateau) if plateau != "auto" else sweep_plateau(runs, folders[0], folders[0] / "report")[0]
    return runs, value


def trained_fraction(runs, scheme: str, rounds: int, plateau: float) -> dict[float, tuple[int, int]]:
    """lr -> (seeds that train, seeds finished) for one scheme at R."""
    out: dict[float, list[int]] = {}
    for r in runs:
        if r.scheme == scheme and r.rounds == rounds and r.lr is not None:
            c = out.setdefault(float(r.lr), [0, 0])
            c[0] += trains(r.status, r.value("final_val_loss"), plateau)
            c[1] += 1
    return {lr: tuple(c) for lr, c in sorted(out.items())}


def largest_trained(frac: dict[float, tuple[int, int]]) -> tuple[float, str]:
    """The largest rate at which every seed trains (the smallest rate when none does), and the note saying so."""
    ok = [lr for lr, (k, n) in frac.items() if k == n]
    eta = max(ok) if ok else min(frac)
    return eta, (
        f"seeds that train per rate {_show(frac)}; largest rate where every seed trains: "
        f"{eta:g}{'' if ok else ' (none trains: the smallest rate)'}"
    )


def boundary(runs, plateau: float) -> tuple[dict, list[str]]:
    found = sorted({r.rounds for r in runs if r.scheme in SCHEMES})
    if not found:
        raise ValueError(f"no finished {' or '.join(SCHEMES)} run; fix: run the grid sweep first")
    include, notes = [], []
    for rounds, scheme in itertools.product(dict.fromkeys((found[0], found[-1])), SCHEMES):
        frac = trained_fraction(runs, scheme, rounds, plateau)
        if not frac:
            raise ValueError(f"no finished {scheme} run at R = {rounds}; fix: finish the grid sweep first")
        eta, note = largest_trained(frac)
        rates = [_rate(eta * 2 ** (i / 2)) for i in (-1, 0, 1, 2)]
        include.append(
            {
                "model.config.residual": [scheme],
                "model.config.n_rounds": [rounds],
                LR_KEY: rates,
                "seed_everything": [1, 2, 3],
            }
        )
        notes.append(f"{scheme} at R = {rounds}: {note}")
    spec = {
        "description": "The map's boundary refinement at the smallest and largest R (experiments.followup boundary).",
        "base": BASE,
        "include": include,
        "out": "runs/sweeps/map_boundary",
    }
    return spec, notes


def exponent(runs, plateau: float) -> tuple[dict, list[str]]:
    rounds = max(r.rounds for r in runs if r.scheme in SCHEMES)
    frac = trained_fraction(runs, "deepnorm", rounds, plateau)
    if not frac:
        raise ValueError(f"no finished deepnorm run at R = {rounds}; fix: finish the grid and boundary sweeps first")
    half = min(frac, key=lambda lr: (abs(frac[lr][0] / frac[lr][1] - 0.5), -lr))
    rates = [_rate(half), _rate(2 * half)]
    spec = {
        "description": "The map's exponent sweep (experiments.followup exponent).",
        "base": BASE,
        "grid": {
            "model.config.residual": ["scaled"],
            "model.config.p": EXPONENTS,
            "model.config.n_rounds": [rounds],
            LR_KEY: rates,
            "seed_everything": [1, 2, 3, 4, 5],
        },
        "out": "runs/sweeps/map_exponent",
    }
    notes = [
        f"deepnorm (p = 0.25) at R = {rounds}: seeds that train per rate {_show(frac)}; closest to one half: "
        f"{half:g}; rates {rates[0]:g} and {rates[1]:g}"
    ]
    return spec, notes


CONFIRM_SEEDS = [3, 4, 5]


def confirm(runs, plateau: float) -> tuple[dict, list[str]]:
    from loopnet.study.report.map import curves

    include, notes = [], []
    for c in curves([r for r in runs if r.scheme in SCHEMES]):
        best = c.best()
        if best is None:
            raise ValueError(f"{c.family} at R = {c.rounds} has no finished run; fix: finish the grid sweep first")
        scheme = next(r.scheme for rs in c.by_lr.values() for r in rs)
        include.append(
            {
                "model.config.residual": [scheme],
                "model.config.n_rounds": [c.rounds],
                LR_KEY: [best],
                "seed_everything": CONFIRM_SEEDS,
            }
        )
        notes.append(
            f"{scheme} at R = {c.rounds}: best rate {best:g} (ℓ(η*) = {c.capped(best):.4f}, "
            f"over seeds {sorted({r.seed for rs in c.by_lr.values() for r in rs})})"
        )
    if not include:
        raise ValueError(f"no finished {' or '.join(SCHEMES)} run; fix: run the grid sweep first")
    spec = {
        "description": "The map's confirmation of reading 2 on fresh seeds (experiments.followup confirm).",
        "base": BASE,
        "include": include,
        "out": "runs/sweeps/map_confirm",
    }
    return spec, notes


RIVAL_SEEDS = [4, 5, 6]
RIVAL_ARM = "model.config.branch_scale"
MAP_CONFIRM = Path("configs/sweeps/map/confirm.yaml")


def vertex_rate(curve, plateau: float) -> tuple[float, str]:
    """η* of one (method, R) curve: `best_rate_shift`'s vertex (the curve against itself), rounded in log10 to
    the nearest rate of the curve; the argmin of ℓ(η) when fewer than 3 rates train on every seed."""
    by_lr = {
        lr: {r.seed: r.value("final_val_loss") if r.status == "completed" else None for r in runs if r.finished}
        for lr, runs in curve.by_lr.items()
    }
    shift = best_rate_shift(by_lr, by_lr, plateau, boots=1)
    if shift is None:
        return curve.best(), "argmin of ℓ(η): fewer than 3 rates train on every seed"
    nearest = min(curve.rates, key=lambda lr: abs(math.log10(lr) - shift["x_lo"]))
    edge = {-1: ", at the fitted rates' lowest edge", 1: ", at the fitted rates' highest edge"}.get(
        shift["censored_lo"], ""
    )
    return nearest, f"vertex 10^{shift['x_lo']:.3f} = {10 ** shift['x_lo']:.3g}{edge}, seeds {shift['seeds']}"


def rival_confirm(runs, plateau: float, map_confirm: Path | None = None) -> tuple[dict, list[str]]:
    from loopnet.study.report.map import curves

    map_confirm = map_confirm or MAP_CONFIRM

    include, notes = [], []
    arms = [r for r in runs if r.scheme == "preln"]
    for c in curves(arms):
        first = next(r for rs in c.by_lr.values() for r in rs)
        arm = first.params.get(RIVAL_ARM, "one")
        if not c.ran:
            raise ValueError(
                f"{c.family} at R = {c.rounds} has no finished run; fix: finish the rival grid sweep first"
            )
        best, how = vertex_rate(c, plateau)
        include.append(
            {
                "model.config.residual": ["preln"],
                RIVAL_ARM: [arm],
                "model.config.n_rounds": [c.rounds],
                LR_KEY: [best],
                "seed_everything": RIVAL_SEEDS,
            }
        )
        notes.append(f"preln, branch_scale {arm}, at R = {c.rounds}: best rate {best:g} ({how})")
    if not include:
        raise ValueError("no finished Pre-LN run; fix: run configs/sweeps/rival/grid.yaml first")
    rounds = max(e["model.config.n_rounds"][0] for e in include)
    try:
        entries = yaml.safe_load(map_confirm.read_text())["include"]
        done = next(
            e for e in entries if e["model.config.residual"] == ["deeploop"] and e["model.config.n_rounds"] == [rounds]
        )
    except (FileNotFoundError, KeyError, TypeError, StopIteration):
        raise ValueError(
            f"{map_confirm} has no DeepLoop cell at R = {rounds}; fix: run the map's confirmation first (make map)"
        ) from None
    seeds = [s for s in RIVAL_SEEDS if s not in done["seed_everything"]]
    if seeds:
        include.append(
            {
                "model.config.residual": ["deeploop"],
                "model.config.n_rounds": [rounds],
                LR_KEY: done[LR_KEY],
                "seed_everything": seeds,
            }
        )
    notes.append(
        f"deeploop at R = {rounds}: the map's best rate {done[LR_KEY][0]:g} ({map_confirm}), which holds seeds "
        f"{done['seed_everything']}: seeds {seeds} added"
    )
    spec = {
        "description": "The rival rule's confirmation on fresh seeds (experiments.followup rival-confirm).",
        "base": BASE,
        "include": include,
        "out": "runs/sweeps/rival_confirm",
    }
    return spec, notes


WIDTH_STEPS = range(-2, 4)  # η_p·2^(k/2): two ×√2 steps below the pilot's boundary, three above
WIDTH_SEEDS = [1, 2, 3]


def width(runs, plateau: float, folder: Path) -> tuple[dict, list[str]]:
    """The boundary runs of one width beside its pilot (the module's docstring: `width`)."""
    try:
        pilot = json.loads((folder / "sweep.json").read_text())["spec"]
    except (FileNotFoundError, KeyError, json.JSONDecodeError):
        raise ValueError(f"{folder} has no sweep manifest; fix: run the width pilot sweep into it first") from None
    include, notes = [], []
    found = sorted(
        {(r.scheme, r.rounds) for r in runs if r.scheme in SCHEMES}, key=lambda t: (t[1], SCHEMES.index(t[0]))
    )
    if not found:
        raise ValueError(f"no finished {' or '.join(SCHEMES)} run in {folder}; fix: run the width pilot first")
    for scheme, rounds in found:
        eta, note = largest_trained(trained_fraction(runs, scheme, rounds, plateau))
        rates = [_rate(eta * 2 ** (k / 2)) for k in WIDTH_STEPS]
        ran = {(float(r.lr), r.seed) for r in runs if (r.scheme, r.rounds) == (scheme, rounds) and r.lr is not None}
        for seed in WIDTH_SEEDS:
            todo = [
                lr for lr in rates if not any(math.isclose(lr, done, rel_tol=1e-9) and s == seed for done, s in ran)
            ]
            if todo:
                include.append(
                    {
                        "model.config.residual": [scheme],
                        "model.config.n_rounds": [rounds],
                        LR_KEY: todo,
                        "seed_everything": [seed],
                    }
                )
        notes.append(f"{scheme} at R = {rounds}: {note}; rates {', '.join(f'{lr:g}' for lr in rates)}")
    spec = {
        "description": f"The width study's boundary runs beside the pilot (experiments.followup width): "
        f"{pilot.get('description', '')}".strip(),
        **{k: pilot[k] for k in ("base", "overrides") if k in pilot},
        "include": include,
        "out": f"{pilot['out'].rstrip('/')}_boundary",
    }
    return spec, notes


def _show(frac: dict) -> str:
    return ", ".join(f"{lr:g}: {k}/{n}" for lr, (k, n) in frac.items())


def write(spec: dict, notes: list[str], plateau: float, out: Path, argv: list[str]) -> None:
    """The sweep file, headed by how it was chosen: the command, the plateau, the numbers read."""
    header = [
        f"# Written by `python -m experiments.followup {' '.join(argv)}`: the rule is in",
        "# experiments/followup.py; a seed trains when its final validation loss is below the plateau",
        f"# {plateau:.4f} nats by {TRAIN_MARGIN} nat. Read from the runs:",
    ]
    header += [f"# - {n}" for n in notes]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(header) + "\n" + yaml.safe_dump(spec, sort_keys=False))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(
        prog="python -m experiments.followup", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("step", choices=["boundary", "exponent", "confirm", "rival-confirm", "width"])
    p.add_argument("sweep_dirs", nargs="+", help="the sweep folders to read (grid, then boundary for exponent)")
    p.add_argument("--out", required=True, help="the sweep file to write")
    p.add_argument("--plateau", default="auto", help="the unigram plateau in nats, or auto (default)")
    args = p.parse_args(argv)
    with one_line_errors("loopnet followup", (ValueError,)):
        folders = [Path(d) for d in args.sweep_dirs]
        runs, plateau = load(folders, args.plateau)
        steps = {
            "boundary": boundary,
            "exponent": exponent,
            "confirm": confirm,
            "rival-confirm": rival_confirm,
            "width": lambda runs, plateau: width(runs, plateau, folders[0]),
        }
        spec, notes = steps[args.step](runs, plateau)
    write(spec, notes, plateau, Path(args.out), argv)
    from loopnet.study.grid import expand, sweep_from_dict

    cells = len(expand(sweep_from_dict(spec)))
    print(f"loopnet followup: wrote {args.out} ({cells} cells)")


if __name__ == "__main__":
    main()
