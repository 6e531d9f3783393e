"""Peak memory of importing and loading a Huginn checkpoint at real size: peak RSS as a ratio of the weight bytes.

    loopnet bench huginn-memory [--reps 1] [--scratch /tmp] [--out huginn-memory.md] [--json huginn-memory.json]
                                [--n_embd 3072 --n_heads 24 --intermediate_size 8192 ...]

The checkpoint: random weights in Huginn-0125's hub layout (`loopnet.bench.hub_checkpoints`: config.json,
safetensors shards of 1 GB with their index, tokenizer files), bf16, by default Huginn's shape narrowed to
d 3072, 24 heads, FFN 8192, vocabulary 65536, prelude 2, core 4, coda 2 (1.13 B parameters, 2.25 GB), written
under `--scratch` and deleted at the end. Each row runs in a fresh Python process that imports what it needs first,
then reads its peak RSS minus the RSS after the imports (Linux: VmHWM, reset through /proc/self/clear_refs; elsewhere
ru_maxrss), as a ratio of the weight bytes:

  import          `loopnet import SRC OUT`: the hub folder read (memory-mapped), renamed and permuted into loopnet's
                  state dict, written as a loopnet folder
  load bf16       `loopnet.load(OUT, dtype=torch.bfloat16)`, every weight byte read once, then a forward of 64 tokens
                  at R = 2 (every weight used; activations included)
  load fp32       the same with `loopnet.load`'s default dtype, float32: the weights converted on load (the ratio is
                  still of the bf16 weight bytes; the fp32 weights alone are 2×)
  hub folder      Huginn's folder read straight into a model (`read_huginn` + `build_network`, bf16) and the same
                  forward: the import without its write

The files are in the page cache when read (just written): the times are of decoding and copying, not of a disk.
Target: a load's peak RSS ≤ 1.3× the weight bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from loopnet.bench.export import PEAK_RSS

TARGET = 1.3  # peak RSS of a load / weight bytes
SIZES = {  # Huginn-0125's layout, narrowed to 1.13 B parameters
    "n_embd": 3072,
    "n_heads": 24,
    "intermediate_size": 8192,
    "vocab_size": 65536,
    "block_size": 4096,
    "n_layers_in_prelude": 2,
    "n_layers_in_recurrent_block": 4,
    "n_layers_in_coda": 2,
}
ROWS = ("import", "load bf16", "load fp32", "hub folder")
TOKENS, ROUNDS = 64, 2  # the forward after a load

CHILD = (
    r"""
import json, sys, time
row, src, out = sys.argv[1:4]
import torch
import loopnet
from loopnet.checkpoints import build_network
from loopnet.formats.cli import import_main
from loopnet.formats.huginn import read_huginn
torch.set_num_threads(1)
"""
    + PEAK_RSS
    + r"""
def forward(network):
    ids = torch.randint(0, 256, (1, """
    + str(TOKENS)
    + r"""), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        network(ids, rounds="""
    + str(ROUNDS)
    + r""")

t = time.perf_counter()
if row == "import":
    import_main([src, out])
elif row.startswith("load"):
    network = loopnet.load(out, dtype=torch.bfloat16 if row == "load bf16" else torch.float32).network
    touch(network.state_dict().values())
    forward(network)
else:
    cfg, state, _ = read_huginn(src)
    network = build_network(cfg, state, dtype=torch.bfloat16)
    del state
    touch(network.state_dict().values())
    forward(network)
seconds = time.perf_counter() - t
peak = peak_rss()
print(json.dumps({"seconds": seconds, "peak_bytes": peak - base, "base_bytes": base}))
"""
)


def run_row(row: str, src: Path, out: Path) -> dict:
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, row, str(src), str(out)], capture_output=True, text=True, env=env, check=False
    )
    if proc.returncode:
        raise RuntimeError(f"bench huginn-memory: row {row} failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(reps: int, sizes: dict, scratch: str | None = None) -> dict:
    from loopnet.bench.hub_checkpoints import write_checkpoint
    from loopnet.env import machine

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    with tempfile.TemporaryDirectory(prefix="loopnet-bench-huginn-", dir=scratch) as tmp:
        tmp = Path(tmp)
        src = tmp / "huginn"
        made = write_checkpoint(src, sizes)
        weight_bytes = made["weight_bytes"]
        results: dict[str, list[dict]] = {row: [] for row in ROWS}
        for rep in range(reps):
            out = tmp / f"imported-{rep}"
            for row in ROWS:  # import first: the loads read what it wrote
                results[row].append(run_row(row, src, out))
                r = results[row][-1]
                print(
                    f"[bench huginn-memory] rep {rep + 1}/{reps} {row:<11} {r['seconds']:7.2f} s  "
                    f"peak {r['peak_bytes'] / 2**20:8.0f} MiB = {r['peak_bytes'] / weight_bytes:.3f}x",
                    file=sys.stderr,
                    flush=True,
                )
            if rep + 1 < reps:
                shutil.rmtree(out)
    rows = {
        row: {
            "seconds": statistics.median(r["seconds"] for r in runs),
            "peak_bytes": statistics.median(r["peak_bytes"] for r in runs),
            "peak_ratio": statistics.median(r["peak_bytes"] / weight_bytes for r in runs),
            "base_bytes": statistics.median(r["base_bytes"] for r in runs),
            "seconds_all": [r["seconds"] for r in runs],
        }
        for row, runs in results.items()
    }
    return {
        "rows": rows,
        "parameters": made["parameters"],
        "weight_bytes": weight_bytes,
        "shards": made["files"],
        "reps": reps,
        "sizes": SIZES | sizes,
        "machine": machine(),
        "load_average": load,
        "date": datetime.now(UTC).isoformat(timespec="minutes"),
    }


def markdown(res: dict, command: str) -> str:
    load = res["load_average"]
    head = (
        f"`{command}`: {res['parameters'] / 1e9:.3f} B parameters, {res['weight_bytes'] / 1e9:.2f} GB of bf16 "
        f"weights in {res['shards']} shards, {res['reps']} repetition{'s' * (res['reps'] != 1)}, {res['date']}, "
        f"load average at start {'?' if load is None else f'{load:.1f}'}."
    )
    lines = [
        head,
        "",
        "| row | time (median) | peak RSS above the imports | / weight bytes | RSS after the imports |",
        "|---|---:|---:|---:|---:|",
    ]
    for row, r in res["rows"].items():
        mark = " **✓**" if row != "load fp32" and r["peak_ratio"] <= TARGET else ""
        lines.append(
            f"| {row} | {r['seconds']:.1f} s | {r['peak_bytes'] / 2**30:.2f} GiB | {r['peak_ratio']:.3f}×{mark} | "
            f"{r['base_bytes'] / 2**20:.0f} MiB |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="loopnet bench huginn-memory", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--reps", type=int, default=1, help="repetitions of every row (default 1)")
    p.add_argument("--scratch", help="where the checkpoint is written (default: the system's temporary folder)")
    for name, value in SIZES.items():
        p.add_argument(f"--{name}", type=int, help=f"another {name} (default {value})")
    p.add_argument("--out", help="write the markdown table here")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    if args.reps < 1:
        p.error("--reps must be >= 1")
    sizes = SIZES | {k: getattr(args, k) for k in SIZES if getattr(args, k) is not None}
    res = run(args.reps, sizes, args.scratch)
    text = markdown(res, " ".join(["loopnet bench huginn-memory", *(argv or [])]))
    print(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2, default=str) + "\n", encoding="utf-8")
