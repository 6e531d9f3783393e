"""Time from `loopnet fit` start to its first training step, on an OpenWebText-shaped corpus under DDP.

    python -m loopnet.bench.first_step [--mb 200] [--shards 8] [--devices 2] [--repo /tmp/main78] [--json out.json]

Generates (once, under --corpus, never committed) a parquet corpus of OpenWebText's shape
(`loopnet.bench.corpus`: `text` column, ~4.9 kB documents, --mb megabytes of text in --shards files)
laid out as the hub's parquet conversion serves it (`plain_text/train/NNNN.parquet`), then runs

    loopnet fit --config configs/deeploop_r6.yaml --config configs/cpu.yaml --data.source hub --data.path <corpus>
        --data.val_fraction 0.0005 --data.val_max_tokens 1048576 --data.num_workers 2
        --trainer.strategy ddp --trainer.devices 2 --trainer.max_steps 1

(OpenWebText's data settings from base.yaml on a local copy; the CPU overlay's small model; DDP as 2
gloo processes) and reports the seconds from the command's start to the first training batch reaching
rank 0's training step (Lightning's `on_train_batch_start`; the sanity validation, which needs the
held-out windows, comes before it) and to the end of that step, read from a probe callback. Runs:
this checkout with a cold validation cache, the same again (warm: a restart), and each --repo (e.g. a
checkout of main) with the same command, so that the figures sit side by side from one run.
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

from loopnet.bench.corpus import write_corpus

HERE = Path(__file__).resolve().parents[2]  # this checkout

PROBE = '''
import json, os, time
from lightning.pytorch.callbacks import Callback

class FirstStep(Callback):
    """Rank 0 writes when the first training batch reaches the step, and when that step ends."""
    def _mark(self, trainer, key, batch_idx):
        if trainer.global_rank == 0 and batch_idx == 0:
            path = os.environ["FIRST_STEP_FILE"]
            marks = json.load(open(path)) if os.path.exists(path) else {}
            marks.setdefault(key, time.time())
            json.dump(marks, open(path, "w"))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._mark(trainer, "first_step_start", batch_idx)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._mark(trainer, "first_step_end", batch_idx)
'''


def corpus(folder: Path, mb: int, shards: int) -> Path:
    """The generated corpus (reused when already there with the same size)."""
    stamp = folder / "corpus.json"
    want = {"mb": mb, "shards": shards, "layout": "conversion"}
    if stamp.is_file() and json.loads(stamp.read_text()) == want:
        return folder
    n_docs = mb * 1_000_000 // 4900
    t0 = time.perf_counter()
    files = write_corpus(folder, n_docs, shards, "conversion")
    size = sum(f.stat().st_size for f in files)
    stamp.write_text(json.dumps(want))
    print(
        f"generated {n_docs:,} documents in {shards} shards, {size / 1e6:.0f} MB of parquet, "
        f"in {time.perf_counter() - t0:.0f} s: {folder}",
        file=sys.stderr,
    )
    return folder


def fit_command(repo: Path, data: Path, devices: int, workers: int) -> list[str]:
    cfg = repo / "configs"
    return [
        sys.executable,
        "-m",
        "loopnet",
        "fit",
        "--config",
        str(cfg / "deeploop_r6.yaml"),
        "--config",
        str(cfg / "cpu.yaml"),
        "--data.source",
        "hub",
        "--data.path",
        str(data),
        "--data.revision",
        "null",
        "--data.name",
        "null",
        "--data.val_fraction",
        "0.0005",
        "--data.val_max_tokens",
        "1048576",
        "--data.num_workers",
        str(workers),
        "--trainer.accelerator",
        "cpu",
        "--trainer.devices",
        str(devices),
        "--trainer.strategy",
        "ddp" if devices > 1 else "auto",
        "--trainer.max_steps",
        "1",
        "--trainer.callbacks+=first_step_probe.FirstStep",
    ]


DATA_ONLY = """
import json, sys, time
from loopnet.data.datamodule import TokenStreamDataModule
t0 = time.perf_counter()
dm = TokenStreamDataModule(seq_len=128, batch_size=8, source="hub", path=sys.argv[1], val_fraction=0.0005,
                           val_max_tokens=1048576, num_workers=0)
dm.check(0, 2)  # what `loopnet fit` does before training, on rank 0 of 2: the held-out windows, a first document
t1 = time.perf_counter()
next(iter(dm.train_stream(0, 2)))  # rank 0's first training batch (one slot)
t2 = time.perf_counter()
print(json.dumps({"check_s": round(t1 - t0, 2), "first_batch_s": round(t2 - t1, 2), "data_s": round(t2 - t0, 2)}))
"""


def time_data(repo: Path, data: Path, cache: Path, label: str) -> dict:
    """The data path alone, imports excluded: what rank 0 does before its first batch (one process)."""
    env = dict(
        os.environ, PYTHONPATH=str(repo), LOOPNET_CACHE_DIR=str(cache), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1"
    )
    load = os.getloadavg()[0]
    # -P: `python -c` would put the current folder, maybe another checkout, ahead of PYTHONPATH
    res = subprocess.run(
        [sys.executable, "-P", "-c", DATA_ONLY, str(data)], env=env, capture_output=True, text=True, cwd=repo
    )
    row = {"run": label, "load_at_start": round(load, 2), "exit": res.returncode}
    if res.returncode == 0:
        row |= json.loads(res.stdout.strip().splitlines()[-1])
    else:
        row["error"] = res.stderr.strip().splitlines()[-1:]
    return row


def time_fit(repo: Path, data: Path, devices: int, workers: int, cache: Path, label: str) -> dict:
    """Seconds from the start of `loopnet fit` (from `repo`) to its first training step."""
    with tempfile.TemporaryDirectory(prefix="first_step_") as tmp:
        tmp = Path(tmp)
        (tmp / "first_step_probe.py").write_text(PROBE)
        marks = tmp / "marks.json"
        env = dict(
            os.environ,
            PYTHONPATH=f"{repo}{os.pathsep}{tmp}",
            FIRST_STEP_FILE=str(marks),
            LOOPNET_CACHE_DIR=str(cache),
            HF_HUB_OFFLINE="1",
            HF_DATASETS_OFFLINE="1",
        )
        load = os.getloadavg()[0]
        t0 = time.time()
        res = subprocess.run(
            fit_command(repo, data, devices, workers), cwd=tmp, env=env, capture_output=True, text=True
        )
        total = time.time() - t0
        row = {
            "run": label,
            "repo": str(repo),
            "load_at_start": round(load, 2),
            "exit": res.returncode,
            "total_s": round(total, 1),
        }
        if marks.is_file():
            m = json.loads(marks.read_text())
            row |= {
                "to_first_step_s": round(m["first_step_start"] - t0, 1),
                "first_step_done_s": round(m.get("first_step_end", float("nan")) - t0, 1),
            }
        if res.returncode != 0:
            row["error"] = res.stderr.strip().splitlines()[-1:]
        return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loopnet.bench.first_step", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--corpus",
        default=os.path.join(tempfile.gettempdir(), "loopnet-owt-shaped"),
        help="folder of the generated corpus (made once, reused)",
    )
    p.add_argument("--mb", type=int, default=200, help="megabytes of text (default 200)")
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--devices", type=int, default=2, help="DDP ranks (gloo processes on CPU)")
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank")
    p.add_argument("--repo", action="append", default=[], help="another loopnet checkout to time the same way")
    p.add_argument("--no-data-only", action="store_true", help="skip the data path's own timing")
    p.add_argument("--data-only", action="store_true", help="time the data path alone, no fit")
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args(argv)
    data = corpus(Path(args.corpus), args.mb, args.shards)
    rows, data_rows = [], []
    repos = [(HERE, "this checkout")] + [(Path(r).resolve(), r) for r in args.repo]
    with tempfile.TemporaryDirectory(prefix="loopnet_valcache_") as cache:
        if not args.no_data_only:
            for repo, name in repos:  # interleaved with nothing else running from here: one process each
                for state in ("cold", "warm") if repo == HERE else ("",):
                    data_rows.append(time_data(repo, data, Path(cache) / "data", f"{name} {state}".strip()))
                    print(json.dumps(data_rows[-1]), file=sys.stderr)
        for repo, name in repos if not args.data_only else []:
            for state in ("cold validation cache", "warm (a restart)") if repo == HERE else ("",):
                rows.append(
                    time_fit(
                        repo, data, args.devices, args.workers, Path(cache) / "fit", f"{name}, {state}".strip(", ")
                    )
                )
                print(json.dumps(rows[-1]), file=sys.stderr)
    parquet_mb = sum(f.stat().st_size for f in Path(args.corpus).rglob("*.parquet")) / 1e6
    print(
        f"time from `loopnet fit` start to the first training step: {args.mb} MB of text in OpenWebText-shaped "
        f"parquet ({parquet_mb:.0f} MB of files), {args.shards} shards, {args.devices} DDP ranks (gloo, CPU) x "
        f"{args.workers} workers, {os.cpu_count()} CPUs"
    )
    print("| run | to first step (s) | first step done (s) | whole command (s) | load average at start |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['run']} | {r.get('to_first_step_s', 'failed')} | {r.get('first_step_done_s', '')} | "
            f"{r['total_s']} | {r['load_at_start']} |"
        )
    if data_rows:
        print(
            "\nthe data path alone, imports excluded (rank 0 of 2, one process): the checks before training, then "
            "the first batch"
        )
        print("| run | checks: held-out windows + first document (s) | first batch (s) | load average at start |")
        print("|---|---:|---:|---:|")
        for r in data_rows:
            print(
                f"| {r['run']} | {r.get('check_s', 'failed')} | {r.get('first_batch_s', '')} | {r['load_at_start']} |"
            )
    if args.json:
        Path(args.json).write_text(json.dumps({"fit": rows, "data_only": data_rows}, indent=1))
    return 0 if all(r["exit"] == 0 for r in rows + data_rows) else 1


if __name__ == "__main__":
    sys.exit(main())
