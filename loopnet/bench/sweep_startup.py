"""What a fit's fixed start-up costs a sweep: one 12-cell sweep of R = 2 fits, started fresh and from the fit server.

    loopnet bench sweep-startup [--steps 200] [--jobs 1] [--order fresh,forkserver] [--out bench.md] [--json out.json]
    python -m loopnet.bench.sweep_startup ...

The cells are the stability map's at R = 2 (configs/study_map.yaml on the CPU overlay): DeepNorm and
DeepLoop × lr 2e-3, 4e-3, 8e-3 × seeds 1, 2, each `--steps` steps (the map's 200 by default). The same
sweep runs twice, in one run of this command, into two temporary folders: `loopnet sweep --start fresh`
(every fit a new process that imports torch and Lightning) and `--start forkserver` (every fit a fork of a
server that imported them once). Each is timed from the `loopnet sweep` command's start to its end; the
ratio is fresh / forkserver. Each cell's seconds come from the sweep's log. The two sweeps' cells must
give equal final training and validation losses (their fits are the same computation); the report says
whether they do. The load average is printed beside the times: on a shared machine the ratio is only
as good as the load was steady.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parents[2]  # this checkout
STARTS = ("fresh", "forkserver")


def sweep_spec(out: Path, steps: int) -> dict:
    return {
        "description": "loopnet bench sweep-startup: the map's R = 2 cells",
        "base": [
            str(HERE / "configs/deeploop_r6.yaml"),
            str(HERE / "configs/cpu.yaml"),
            str(HERE / "configs/study_map.yaml"),
        ],
        "overrides": {
            "model.config.n_rounds": 2,
            "trainer.max_steps": steps,
            "trainer.val_check_interval": min(50, steps),
        },
        "grid": {
            "model.config.residual": ["deepnorm", "deeploop"],
            "model.optim.lr": [2e-3, 4e-3, 8e-3],
            "seed_everything": [1, 2],
        },
        "out": str(out),
    }


def run_sweep(folder: Path, steps: int, start: str, jobs: int) -> dict:
    """One timed `loopnet sweep` of the 12 cells; its wall time, cells' seconds and losses."""
    out = folder / start
    path = folder / f"{start}.yaml"
    path.write_text(yaml.safe_dump(sweep_spec(out, steps)))
    cmd = [sys.executable, "-m", "loopnet", "sweep", str(path), "--start", start, "--jobs", str(jobs)]
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    res = subprocess.run(cmd, cwd=HERE, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if res.returncode != 0:
        raise SystemExit(
            f"loopnet bench sweep-startup: the {start} sweep failed (exit {res.returncode}):\n"
            f"{(res.stdout + res.stderr)[-3000:]}"
        )
    log = [json.loads(line) for line in (out / "sweep_log.jsonl").read_text().splitlines()]
    cells = {}
    for e in log:
        if e["event"] == "finished":
            summary = json.loads((out / e["cell"] / "summary.json").read_text())
            cells[e["cell"]] = {
                "seconds": e["seconds"],
                "final_train_loss": summary["final_train_loss"],
                "val_history": summary["val_history"],
            }
    return {"start": start, "wall_s": wall, "load_before": load, "load_after": os.getloadavg()[0], "cells": cells}


def markdown(res: dict) -> str:
    runs, ratio = res["runs"], res["ratio"]
    lines = [
        f"## Sweep start-up: {res['cells']} cells of R = 2, {res['steps']} steps, {res['jobs']} at a time",
        "",
        f"`{res['command']}` on {res['machine']['cpu']} ({res['machine']['cpus']} CPUs)",
        "",
        "| start | sweep wall (s) | median cell (s) | load avg 1 min (before → after) |",
        "|---|---|---|---|",
    ]
    for r in runs.values():
        secs = sorted(c["seconds"] for c in r["cells"].values())
        lines.append(
            f"| {r['start']} | {r['wall_s']:.1f} | {secs[len(secs) // 2]:.1f} | "
            f"{r['load_before']:.2f} → {r['load_after']:.2f} |"
        )
    lines += [
        "",
        f"**fresh / forkserver: {ratio:.2f}×** (target ≥ 1.3×). Per-cell losses equal in both: "
        f"{'yes' if res['equal_losses'] else 'NO'}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="loopnet bench sweep-startup",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.split("\n")[2:]),
    )
    p.add_argument("--steps", type=int, default=200, help="training steps per cell (default: the map's 200)")
    p.add_argument("--jobs", type=int, default=1, help="cells at once in each sweep (default 1)")
    p.add_argument("--order", default="fresh,forkserver", help="the order of the two sweeps (default fresh,forkserver)")
    p.add_argument("--keep", help="run the sweeps in this folder and keep it (default: a temporary folder)")
    p.add_argument("--out", help="also write the markdown report here")
    p.add_argument("--json", help="also write every number as JSON here")
    args = p.parse_args(argv)
    order = args.order.split(",")
    if sorted(order) != sorted(STARTS):
        p.error(f"--order must name {' and '.join(STARTS)} once each, e.g. forkserver,fresh")
    from loopnet.env import machine

    with tempfile.TemporaryDirectory(prefix="sweep-startup-") as tmp:
        folder = Path(args.keep) if args.keep else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        runs = {}
        for start in order:
            print(f"loopnet bench sweep-startup: the {start} sweep ...", file=sys.stderr, flush=True)
            runs[start] = run_sweep(folder, args.steps, start, args.jobs)
            print(f"  {runs[start]['wall_s']:.1f} s", file=sys.stderr, flush=True)
    fresh, forked = runs["fresh"]["cells"], runs["forkserver"]["cells"]
    res = {
        "command": " ".join(["loopnet bench sweep-startup", *(argv if argv is not None else sys.argv[1:])]),
        "machine": machine(),
        "steps": args.steps,
        "jobs": args.jobs,
        "cells": len(fresh),
        "ratio": runs["fresh"]["wall_s"] / runs["forkserver"]["wall_s"],
        "equal_losses": fresh.keys() == forked.keys()
        and all(
            fresh[c]["final_train_loss"] == forked[c]["final_train_loss"]
            and fresh[c]["val_history"] == forked[c]["val_history"]
            for c in fresh
        ),
        "runs": runs,
    }
    text = markdown(res)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
