"""Generation speed with and without the KV cache across rounds, as a ratio measured in one run.

    loopnet bench generation [--reps 9] [--prompt 8] [--new 112] [--no-compile] [--out generation.md] [--json g.json]
    loopnet bench generation --d_model 512 --seq_len 512 --new 504     # how the ratio grows with size

The model is `configs/cpu.yaml`'s size over `configs/base.yaml` (d 128, 4 heads, 128 positions, K = 2,
R = 6, GPT-2's padded vocabulary), randomly initialised (the time per token does not depend on the
weights without an exit criterion). One prompt of `--prompt` random tokens continued greedily by
`--new` tokens, within the 128 positions: `generate(cache=False)` (the whole context through the model
for every token, the LM head at its last position only, as nanoGPT's generate) and `generate(cache=True)`
(one position per token through every round, its keys and values cached) take turns, `reps` times in
rotating order, with `generate(cache=True, compile=True)` (each token's step one `torch.compile` graph
over a static cache) as a third unless `--no-compile`; its compile (the first call, untimed in the rows)
is reported on its own. Each ratio is the median of the paired time ratios against the recompute of the
same repetition, so that a shared machine's load cancels. Every path must give the same tokens (the run
says whether they did).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import yaml

TARGET = 5.0  # ≥ 5× tokens/s with the cache
CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def cpu_config() -> dict:
    """model.config of configs/base.yaml overlaid with configs/cpu.yaml's."""
    merged: dict = {}
    for name in ("base.yaml", "cpu.yaml"):
        merged |= (yaml.safe_load((CONFIGS / name).read_text()).get("model") or {}).get("config") or {}
    return merged


def run(
    reps: int,
    prompt_len: int,
    new: int,
    seed: int = 0,
    d_model: int | None = None,
    seq_len: int | None = None,
    compiled: bool = True,
    rounds: int | None = None,
) -> dict:
    from loopnet.env import machine
    from loopnet.generate import generate
    from loopnet.model import LoopConfig, LoopedTransformer

    load_at_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    overrides = {}
    if d_model:  # the head width stays 32, as the width study keeps it
        overrides |= {"d_model": d_model, "n_heads": max(1, d_model // 32)}
    if seq_len:
        overrides["seq_len"] = seq_len
    if rounds:
        overrides["n_rounds"] = rounds
    config = LoopConfig(**(cpu_config() | overrides))
    if prompt_len + new > config.seq_len:
        raise ValueError(f"--prompt {prompt_len} + --new {new} exceeds seq_len {config.seq_len}; fix: fewer tokens")
    torch.manual_seed(seed)
    model = LoopedTransformer(config).eval()
    prompt = torch.randint(0, 50257, (1, prompt_len)).tolist()
    modes = {"recompute": {"cache": False}, "cache": {"cache": True}}
    compile_s = None
    if compiled:
        modes["compiled"] = {"cache": True, "compile": True}
        t = time.perf_counter()
        generate(model, prompt, 4, cache=True, compile=True)  # the compile, timed on its own
        compile_s = time.perf_counter() - t
    for kwargs in modes.values():  # warm-up of every path
        generate(model, prompt, 4, **kwargs)
    tokens, times = {}, {mode: [] for mode in modes}
    names = list(modes)
    for rep in range(reps):
        for mode in names[rep % len(names) :] + names[: rep % len(names)]:  # rotating order
            t = time.perf_counter()
            out = generate(model, prompt, new, **modes[mode])
            times[mode].append(time.perf_counter() - t)
            tokens.setdefault(mode, out.tokens)
            print(
                f"[bench generation] rep {rep + 1}/{reps} {mode}: {new / times[mode][-1]:8.1f} tokens/s",
                file=sys.stderr,
                flush=True,
            )
    ratios = {mode: [a / b for a, b in zip(times["recompute"], times[mode])] for mode in modes}
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=CONFIGS.parent, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    return {
        "model": {
            k: getattr(config, k)
            for k in (
                "vocab_size",
                "seq_len",
                "d_model",
                "n_heads",
                "n_blocks",
                "n_rounds",
                "residual",
                "wiring",
                "positions",
            )
        },
        "prompt_tokens": prompt_len,
        "new_tokens": new,
        "reps": reps,
        "recompute_tokens_per_s": new / statistics.median(times["recompute"]),
        "cache_tokens_per_s": new / statistics.median(times["cache"]),
        "ratio": statistics.median(ratios["cache"]),
        "ratios": ratios["cache"],
        "target": TARGET,
        "same_tokens": tokens["cache"] == tokens["recompute"],
        **(
            {
                "compiled_tokens_per_s": new / statistics.median(times["compiled"]),
                "compiled_ratio": statistics.median(ratios["compiled"]),
                "compiled_ratios": ratios["compiled"],
                "compile_s": compile_s,
                "compiled_same_tokens": tokens["compiled"] == tokens["recompute"],
            }
            if compiled
            else {}
        ),
        "machine": machine("cpu"),
        "load_at_start": load_at_start,
        "load_at_end": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "commit": commit,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def markdown(res: dict, command: str) -> str:
    m = res["machine"]

    def met(ratio: float) -> str:
        return f"≥ {res['target']:g}× ({'met' if ratio >= res['target'] else 'NOT met'})"

    rows = [
        "| row | tokens/s | ratio | target |",
        "|---|---|---|---|",
        f"| generate, recompute (cache: false) | {res['recompute_tokens_per_s']:.1f} | 1.00 | baseline |",
        f"| generate, KV cache across rounds | {res['cache_tokens_per_s']:.1f} | {res['ratio']:.2f} | {met(res['ratio'])} |",
    ]
    same = f"same greedy tokens: {res['same_tokens']}"
    if "compiled_ratio" in res:
        rows.append(
            f"| generate, KV cache, compiled step (compile: true) | {res['compiled_tokens_per_s']:.1f} | "
            f"{res['compiled_ratio']:.2f} | {met(res['compiled_ratio'])} |"
        )
        same += (
            f" (cache), {res['compiled_same_tokens']} (compiled). Compiled: paired ratios "
            f"{', '.join(f'{r:.2f}' for r in res['compiled_ratios'])}; its compile (first call, not in the "
            f"row) took {res['compile_s']:.1f} s"
        )
    return "\n".join(
        [
            *rows,
            "",
            f"Paired ratios (cache): {', '.join(f'{r:.2f}' for r in res['ratios'])}; {same}.",
            f"Model: {res['model']}; prompt {res['prompt_tokens']} tokens, {res['new_tokens']} new, batch 1, fp32.",
            f"Command: `{command}`; commit {res['commit']}; {res['date']}; {m.get('cpu')} ({m.get('cpus')} CPUs, "
            f"{m.get('torch_threads')} torch threads), torch {m.get('torch')}; load average {res['load_at_start']} "
            f"at start, {res['load_at_end']} at end.",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="loopnet bench generation", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--reps", type=int, default=9, help="paired repetitions (default 9)")
    p.add_argument("--prompt", type=int, default=8, help="prompt tokens (default 8)")
    p.add_argument("--new", type=int, default=112, help="tokens to generate (default 112)")
    p.add_argument("--d_model", type=int, help="another width (heads of 32), to see how the ratio grows with it")
    p.add_argument("--seq_len", type=int, help="another context length (prompt + new tokens must fit in it)")
    p.add_argument("--rounds", type=int, help="another R, to see how the cache's gain grows with the rounds it saves")
    p.add_argument(
        "--no-compile",
        dest="compiled",
        action="store_false",
        help="leave out the compiled step's row (its compile takes tens of seconds)",
    )
    p.add_argument("--out", help="write the markdown table here")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    if args.reps < 1 or args.prompt < 1 or args.new < 1 or (args.rounds is not None and args.rounds < 1):
        p.error("--reps, --prompt, --new and --rounds must be >= 1")
    res = run(
        args.reps,
        args.prompt,
        args.new,
        d_model=args.d_model,
        seq_len=args.seq_len,
        compiled=args.compiled,
        rounds=args.rounds,
    )
    text = markdown(res, " ".join(["loopnet bench generation", *(argv or [])]))
    print(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2, default=str) + "\n", encoding="utf-8")
