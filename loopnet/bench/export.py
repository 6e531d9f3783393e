"""Export and load of a GPT-2-small-sized model: time and peak memory, beside `torch.load` of its checkpoint.

    loopnet bench export [--reps 3] [--out export.md] [--json export.json] [--d_model 768 --n_blocks 12 ...]

The model: GPT-2 small's shape as a loopnet model, K = 12 blocks × R = 1 round, d 768, 12 heads, 1024
positions, vocabulary 50304, tied head (124 M parameters, 497 MB in fp32), random weights, saved as a
`loopnet fit` checkpoint (the network under `model.`). Each row runs in a fresh Python process that imports
what it needs first, then times one operation and reads its peak RSS minus the RSS after the imports, as a
ratio of the weight bytes (Linux: the peak VmHWM, reset after the imports through /proc/self/clear_refs, so that
the imports' own peak cannot hide the row's; elsewhere `resource.getrusage`'s ru_maxrss):

  export             `loopnet.formats.hf.export` of the .ckpt into a new folder (read, safetensors, tokenizer, code)
  read_exported      the exported folder's LoopConfig and state dict (memory-mapped), every byte then read once
  torch.load         the .ckpt with torch's restricted unpickler (weights_only), every byte then read once
  torch.load mmap    the same with mmap=True (the tensors stay in the file until read)
  from_pretrained    transformers' AutoModelForCausalLM on the exported folder (trust_remote_code)

Rows take turns `reps` times in rotating order, so that a shared machine's load falls on every row alike; the
table gives each row's median. Every file is in the page cache when read (the export just wrote it), so the
times are of decoding and copying, not of the disk. Target: a load's peak RSS ≤ 1.3× the weight bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

TARGET = 1.3  # peak RSS of a load / weight bytes
GPT2_SMALL = {
    "vocab_size": 50304,
    "seq_len": 1024,
    "d_model": 768,
    "n_heads": 12,
    "n_blocks": 12,
    "n_rounds": 1,
    "residual": "preln",
}
ROWS = ("export", "read_exported", "torch.load", "torch.load mmap", "from_pretrained")

# Measured in a fresh process after its imports: `peak_rss()` the peak RSS in bytes since `base` (the RSS after the
# imports), and `touch` reads every byte of some tensors once (a memory-mapped tensor is read from the file there).
PEAK_RSS = r"""
import resource
KB = 1024

def status(field):  # /proc/self/status's field in bytes
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * KB for line in f if line.startswith(field + ":"))

try:  # the peak so far (the imports') reset to the current RSS (Linux: clear_refs 5), so the peak is the row's own
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    peak_rss, base = (lambda: status("VmHWM")), status("VmRSS")
except OSError:  # elsewhere: ru_maxrss, whose peak may be the imports'
    peak_rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * KB  # noqa: E731
    base = peak_rss()

def touch(tensors):  # in chunks of 16 M elements: a bf16 tensor's fp32 sum holds no full fp32 copy
    return sum(float(c.float().sum()) for t in tensors for c in t.detach().reshape(-1).split(1 << 24))
"""

# One row in a fresh process: imports, the baseline RSS, the timed operation, every weight byte read once.
CHILD = (
    r"""
import json, sys, time
row, ckpt, folder, out = sys.argv[1:5]
import torch
from loopnet.formats import hf
if row == "from_pretrained":
    from transformers import AutoModelForCausalLM
if row == "export":
    import loopnet.eval.adapter, transformers, tokenizers  # noqa: F401  (export's imports, outside the timing)
"""
    + PEAK_RSS
    + r"""
t = time.perf_counter()
if row == "export":
    hf.export(ckpt, out)
elif row == "read_exported":
    touch(hf.read_exported(folder)[1].values())
elif row.startswith("torch.load"):
    state = torch.load(ckpt, map_location="cpu", weights_only=True, mmap=row.endswith("mmap"))["state_dict"]
    touch(state.values())
else:
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    touch(model.parameters())
seconds = time.perf_counter() - t
peak = peak_rss()
print(json.dumps({"seconds": seconds, "peak_bytes": peak - base, "base_bytes": base}))
"""
)


def make_checkpoint(path: Path, overrides: dict, seed: int = 0) -> tuple[int, int]:
    """Save the random model as `loopnet fit` would (its config and the network under `model.`);
    (parameters, weight bytes)."""
    import dataclasses

    import torch

    from loopnet.model import LoopConfig, LoopedTransformer

    torch.manual_seed(seed)
    model = LoopedTransformer(LoopConfig(**(GPT2_SMALL | overrides)))
    state = model.state_dict()
    weights = {t.data_ptr(): t for t in state.values()}  # the tied head once
    torch.save(
        {
            "hyper_parameters": {"config": dataclasses.asdict(model.config)},
            "global_step": 0,
            "state_dict": {f"model.{k}": v for k, v in state.items()},
        },
        path,
    )
    return model.num_params(non_embedding=False), sum(t.numel() * t.element_size() for t in weights.values())


def run_row(row: str, ckpt: Path, folder: Path, scratch: Path) -> dict:
    out = scratch / f"export-{os.urandom(4).hex()}"
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])
    }
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, row, str(ckpt), str(folder), str(out)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode:
        raise RuntimeError(f"bench export: row {row} failed: {proc.stderr.strip()[-2000:]}")
    if out.exists():
        import shutil

        shutil.rmtree(out)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(reps: int, overrides: dict) -> dict:
    from loopnet.env import machine
    from loopnet.formats import hf

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    with tempfile.TemporaryDirectory(prefix="loopnet-bench-export-") as scratch:
        scratch = Path(scratch)
        ckpt = scratch / "last.ckpt"
        params, weight_bytes = make_checkpoint(ckpt, overrides)
        folder = hf.export(ckpt, scratch / "exported")
        results: dict[str, list[dict]] = {row: [] for row in ROWS}
        for rep in range(reps):
            for row in ROWS[rep % len(ROWS) :] + ROWS[: rep % len(ROWS)]:  # rotating order
                results[row].append(run_row(row, ckpt, folder, scratch))
                r = results[row][-1]
                print(
                    f"[bench export] rep {rep + 1}/{reps} {row:<16} {r['seconds']:7.2f} s  "
                    f"peak {r['peak_bytes'] / weight_bytes:.2f}x",
                    file=sys.stderr,
                    flush=True,
                )
        ckpt_bytes = ckpt.stat().st_size
        exported_bytes = sum(p.stat().st_size for p in folder.iterdir())
    rows = {
        row: {
            "seconds": statistics.median(r["seconds"] for r in runs),
            "peak_ratio": statistics.median(r["peak_bytes"] / weight_bytes for r in runs),
            "seconds_all": [r["seconds"] for r in runs],
        }
        for row, runs in results.items()
    }
    return {
        "rows": rows,
        "parameters": params,
        "weight_bytes": weight_bytes,
        "ckpt_bytes": ckpt_bytes,
        "exported_bytes": exported_bytes,
        "reps": reps,
        "config": GPT2_SMALL | overrides,
        "machine": machine(),
        "load_average": load,
        "date": datetime.now(UTC).isoformat(timespec="minutes"),
    }


def markdown(res: dict, command: str) -> str:
    load = res["load_average"]
    head = (
        f"`{command}`: {res['parameters'] / 1e6:.1f} M parameters, {res['weight_bytes'] / 1e6:.0f} MB of fp32 "
        f"weights (.ckpt {res['ckpt_bytes'] / 1e6:.0f} MB, exported folder {res['exported_bytes'] / 1e6:.0f} MB), "
        f"{res['reps']} repetitions, {res['date']}, "
        f"load average at start {'?' if load is None else f'{load:.1f}'}."
    )
    lines = [head, "", "| row | time (median) | times | peak RSS / weight bytes |", "|---|---:|---|---:|"]
    for row, r in res["rows"].items():
        times = ", ".join(f"{s:.2f}" for s in r["seconds_all"])
        mark = " **✓**" if row in ("read_exported", "from_pretrained") and r["peak_ratio"] <= TARGET else ""
        lines.append(f"| {row} | {r['seconds']:.2f} s | {times} | {r['peak_ratio']:.2f}×{mark} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="loopnet bench export", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--reps", type=int, default=3, help="repetitions of every row (default 3)")
    for name in ("d_model", "n_heads", "n_blocks", "seq_len", "vocab_size"):
        p.add_argument(f"--{name}", type=int, help=f"another {name} (default GPT-2 small's {GPT2_SMALL[name]})")
    p.add_argument("--out", help="write the markdown table here")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    if args.reps < 1:
        p.error("--reps must be >= 1")
    overrides = {
        k: getattr(args, k)
        for k in ("d_model", "n_heads", "n_blocks", "seq_len", "vocab_size")
        if getattr(args, k) is not None
    }
    res = run(args.reps, overrides)
    text = markdown(res, " ".join(["loopnet bench export", *(argv or [])]))
    print(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2, default=str) + "\n", encoding="utf-8")
