"""loopnet's forward of an imported Huginn model against the reference code's own forward, paired in one run.

    loopnet bench huginn-speed --reference DIR [--python /tmp/huginn-env/bin/python] [--reps 5] [--dtypes float32,bfloat16]
                               [--seq_len 256 --n_embd 1024 ...] [--out huginn-speed.md] [--json huginn-speed.json]

DIR holds the reference's two files, `raven_modeling_minimal.py` and `raven_config_minimal.py` (a
seal-rg/recurrent-pretraining checkout's `recpre/`, or a Hugging Face folder with Huginn's remote code); nothing of it
is part of loopnet. The reference needs transformers 4.5x: `--python` names an interpreter that has it (and torch);
loopnet's model (torch only) runs under the same interpreter, in the same process.

The model: a random checkpoint in Huginn's hub layout (`loopnet.bench.huginn_checkpoint`) at a size where the blocks
dominate: d 1024, 16 heads, FFN 2816, prelude 1, core 2, coda 1, vocabulary 8192, R = 4 rounds (10 block visits), one
sequence of 256 tokens. Both models read the same files: the reference through `RavenForCausalLM.from_pretrained`,
loopnet through `read_huginn` + `build_network`, each in the dtype timed.

Pairing: one child process, both models loaded, `torch.set_num_threads(--threads)`; per dtype, after a warm-up forward
of each, `reps` turns, each turn one timed forward of each (`torch.no_grad()`, the reference with
`num_steps=R`, loopnet with `rounds=R`, both from their random initial state), the order alternating per turn.
Reported: each side's median time and the median of the per-turn ratios loopnet / reference (< 1: loopnet faster).
A check first: at fp32, from the zero initial state, the two logits agree (their largest difference is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

SIZES = {
    "n_embd": 1024,
    "n_heads": 16,
    "intermediate_size": 2816,
    "vocab_size": 8192,
    "block_size": 256,
    "n_layers_in_prelude": 1,
    "n_layers_in_recurrent_block": 2,
    "n_layers_in_coda": 1,
}
ROUNDS = 4
FILES = ("raven_modeling_minimal.py", "raven_config_minimal.py")

CHILD = r"""
import importlib, json, statistics, sys, time
from pathlib import Path
import torch
reference, folder, reps, dtypes, threads, rounds = sys.argv[1:7]
reps, threads, rounds = int(reps), int(threads), int(rounds)
torch.set_num_threads(threads)
sys.path.insert(0, reference)
modeling = importlib.import_module("huginn_reference.raven_modeling_minimal")
import transformers
from loopnet.checkpoints import build_network
from loopnet.formats.huginn import read_huginn
import dataclasses

cfg, state, _ = read_huginn(folder)
T = cfg.seq_len
ids = torch.randint(0, 256, (1, T), generator=torch.Generator().manual_seed(0))
out = {"transformers": transformers.__version__, "torch": torch.__version__, "threads": threads, "dtypes": {}}

def timed(f):
    t = time.perf_counter()
    with torch.no_grad():
        f()
    return time.perf_counter() - t

# the check: same logits from the zero state (fp32)
ref = modeling.RavenForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
ours = build_network(dataclasses.replace(cfg, state_init="zero"), state, dtype=torch.float32)
with torch.no_grad():
    a = ref(ids, input_states=torch.zeros(1, T, cfg.d_model), num_steps=rounds).logits
    b = ours(ids, rounds=rounds)[0].float()
out["max_abs_logit_diff_fp32"] = float((a - b).abs().max())
out["logit_scale"] = float(a.abs().max())
del ref, ours

for name in dtypes.split(","):
    dtype = getattr(torch, name)
    ref = modeling.RavenForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    ours = build_network(cfg, state, dtype=dtype)
    run = {"reference": lambda: ref(ids, num_steps=rounds), "loopnet": lambda: ours(ids, rounds=rounds)}
    for f in run.values():
        timed(f)  # warm-up
    times = {k: [] for k in run}
    for turn in range(reps):
        order = ("reference", "loopnet") if turn % 2 == 0 else ("loopnet", "reference")
        for k in order:
            times[k].append(timed(run[k]))
        print(f"[bench huginn-speed] {name} turn {turn + 1}/{reps}: reference {times['reference'][-1]:.3f} s, "
              f"loopnet {times['loopnet'][-1]:.3f} s", file=sys.stderr, flush=True)
    ratios = [l / r for l, r in zip(times["loopnet"], times["reference"])]
    out["dtypes"][name] = {
        "reference": statistics.median(times["reference"]),
        "loopnet": statistics.median(times["loopnet"]),
        "ratio": statistics.median(ratios),
        "ratios": ratios,
        "times": times,
    }
    del ref, ours
print(json.dumps(out))
"""


def reference_package(reference: Path, into: Path) -> None:
    """The reference's two files as the package `huginn_reference` (they import each other relatively)."""
    found = {
        name: next((p for p in (reference / name, reference / "recpre" / name) if p.is_file()), None) for name in FILES
    }
    missing = [name for name, path in found.items() if path is None]
    if missing:
        raise SystemExit(
            f"loopnet bench huginn-speed: {reference} holds no {', '.join(missing)} (nor under recpre/); fix: give "
            f"a seal-rg/recurrent-pretraining checkout or a folder with Huginn's remote code"
        )
    (into / "huginn_reference").mkdir()
    (into / "huginn_reference" / "__init__.py").write_text("")
    for name, path in found.items():
        (into / "huginn_reference" / name).write_text(path.read_text())


def run(reference: str, python: str, reps: int, dtypes: str, threads: int, sizes: dict) -> dict:
    from loopnet.bench.huginn_checkpoint import write_checkpoint
    from loopnet.env import machine

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    with tempfile.TemporaryDirectory(prefix="loopnet-bench-huginn-speed-") as tmp:
        tmp = Path(tmp)
        reference_package(Path(reference), tmp)
        folder = tmp / "huginn"
        made = write_checkpoint(folder, sizes, dtype=__import__("torch").float32)
        env = os.environ | {
            "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": str(threads),
        }
        args = [reference, str(folder), str(reps), dtypes, str(threads), str(ROUNDS)]
        proc = subprocess.run(
            [python, "-c", CHILD, str(tmp), *args[1:]], stdout=subprocess.PIPE, text=True, env=env, check=False
        )
    if proc.returncode:
        raise SystemExit(f"loopnet bench huginn-speed: the timing process failed (exit {proc.returncode}); see above")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    return res | {
        "parameters": made["parameters"],
        "sizes": sizes,
        "rounds": ROUNDS,
        "reps": reps,
        "python": python,
        "machine": machine(),
        "load_average": load,
        "date": datetime.now(UTC).isoformat(timespec="minutes"),
    }


def markdown(res: dict, command: str) -> str:
    s, load = res["sizes"], res["load_average"]
    head = (
        f"`{command}`: {res['parameters'] / 1e6:.0f} M parameters (d {s['n_embd']}, FFN {s['intermediate_size']}, "
        f"P {s['n_layers_in_prelude']} + K {s['n_layers_in_recurrent_block']}·R {res['rounds']} + "
        f"C {s['n_layers_in_coda']}, vocabulary {s['vocab_size']}), one sequence of {s['block_size']} tokens, "
        f"{res['reps']} paired turns, {res['threads']} thread(s), torch {res['torch']}, transformers "
        f"{res['transformers']}, {res['date']}, load average at start {'?' if load is None else f'{load:.1f}'}. "
        f"Check at fp32 from the zero state: largest |Δ logit| {res['max_abs_logit_diff_fp32']:.2e} "
        f"(logits up to {res['logit_scale']:.1f})."
    )
    lines = [head, "", "| dtype | reference (median) | loopnet (median) | loopnet / reference (median of turns) |"]
    lines.append("|---|---:|---:|---:|")
    for name, r in res["dtypes"].items():
        lines.append(f"| {name} | {r['reference']:.3f} s | {r['loopnet']:.3f} s | {r['ratio']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="loopnet bench huginn-speed", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--reference", required=True, help="the folder of raven_modeling_minimal.py (or its recpre/)")
    p.add_argument("--python", default=sys.executable, help="an interpreter with transformers 4.5x and torch")
    p.add_argument("--reps", type=int, default=5, help="paired turns per dtype (default 5)")
    p.add_argument("--dtypes", default="float32,bfloat16", help="the dtypes timed (default float32,bfloat16)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of both sides (default 1)")
    for name, value in SIZES.items():
        p.add_argument(f"--{name}", type=int, help=f"another {name} (default {value})")
    p.add_argument("--out", help="write the markdown table here")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    if args.reps < 1:
        p.error("--reps must be >= 1")
    sizes = SIZES | {k: getattr(args, k) for k in SIZES if getattr(args, k) is not None}
    res = run(args.reference, args.python, args.reps, args.dtypes, args.threads, sizes)
    text = markdown(res, " ".join(["loopnet bench huginn-speed", *(argv or [])]))
    print(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2, default=str) + "\n", encoding="utf-8")
