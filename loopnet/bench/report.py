"""The benchmark's markdown report."""

from __future__ import annotations

import torch

from loopnet.bench.memory import fmt_bytes
from loopnet.bench.settings import Settings
from loopnet.bench.targets import TARGETS


def markdown(res: dict) -> str:
    s, m = res["settings"], res["machine"]
    lines = ["## loopnet benchmark" + (" (smoke: tiny sizes, numbers meaningless)" if res["smoke"] else ""), ""]
    dev = m["device"] + (f" (CUDA {m.get('cuda')})" if m["device"] != "cpu" else "")
    lines += [
        f"- Machine: {m['cpu']}, {m['cpus']} CPUs ({m['torch_threads']} torch threads); device {dev}; "
        f"torch {m['torch']}, lightning {m['lightning']}, Python {m['python']}"
        + (f"; load average {m['load_at_start']:.1f} at start" if "load_at_start" in m else ""),
        f"- Peak for MFU: {res['peak_method']}",
        "- Model: "
        + (
            f"loopnet Pre-LN K={s['n_blocks']} R=1 against nanoGPT with {s['n_blocks']} layers"
            if s["only_nanogpt"]
            else f"{s['residual']} {s['wiring']}, K={s['n_blocks']} R={s['n_rounds']}"
        )
        + f", d={s['d_model']}, "
        f"{s['n_heads']} heads, T={s['seq_len']}, batch {s['batch_size']}, vocabulary {s['vocab_size']}, "
        f"{'bf16 autocast' if s['bf16'] else 'fp32'}; {s['batch_size'] * s['seq_len']} "
        f"tokens/step",
        f"- Timing: lightning and diagnostics against the bare loop in {s['reps']} reps of {s['steps']}-step windows "
        f"(after {s['warmup']} warm-up steps), alternating order; the bare-loop variants one step each in turn, "
        f"{s['reps'] * s['steps']} turns. tokens/s from the median step; ratio = median of the paired (same rep or "
        f"same turn) throughput ratios to the baseline (on a shared machine, compare ratios: the two phases "
        f"run at different times). MFU counts model FLOPs, not recomputation",
        f"- Command: `{res['command']}` ({res['seconds']:.0f} s)",
        "",
        "| variant | tokens/s | ms/step | ratio | baseline | MFU % | peak memory | target | met? |",
        "|---|---:|---:|---:|---|---:|---:|---|---|",
    ]
    mark = {True: "yes", False: "**no**", None: "—"}
    for r in res["rows"]:
        lines.append(
            f"| {r['name']} | {r['tokens_per_s']:,.0f} | {r['step_ms']:.1f} | {r['ratio']:.3f} "
            f"| {r['baseline'] or '—'} "
            f"| {r['mfu'] * 100:.1f} | {fmt_bytes(r['peak_bytes'])} | {r['target'] or ''} "
            f"| {mark[r['met']] if r['target'] else ''} |"
        )
    for name, why in res["skipped"].items():
        lines.append(f"| {name} | {why} | | | | | | | |")
    lines += ["", "Variants:", ""]
    lines += [f"- `{r['name']}`: {r['description']}" for r in res["rows"]]
    if res["memory"]:
        lines += [
            "",
            "Memory of one forward + backward (peak: activations, gradients and temporaries above the "
            "step's start, "
            + ("torch.cuda.max_memory_allocated" if s["device"].startswith("cuda") else "torch MemTracker")
            + "; saved: distinct tensors saved for backward, "
            "saved_tensors_hooks):",
            "",
            "| K | R | peak | peak, checkpoint_rounds | saved | saved, checkpoint_rounds |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for e in res["memory"]:
            lines.append(
                f"| {e['K']} | {e['R']} | {fmt_bytes(e['plain']['peak'])} | {fmt_bytes(e['ckpt']['peak'])} "
                f"| {fmt_bytes(e['plain']['saved'])} | {fmt_bytes(e['ckpt']['saved'])} |"
            )
    lines += ["", "Targets:", ""]
    for key, c in res["checks"].items():
        lines.append(
            f"- {TARGETS[key].name if key in TARGETS else key} ({c['target']}): {mark[c['met']]} — {c['detail']}"
        )
    lines += ["", "Fast paths in use:", ""] + [f"- {f}" for f in res["fast_paths"]]
    return "\n".join(lines) + "\n"


def fast_paths(s: Settings) -> list[str]:
    cfg = s.config()
    paths = []
    if s.cuda:
        flash = torch.backends.cuda.flash_sdp_enabled()
        paths.append(
            f"attention: F.scaled_dot_product_attention(is_causal=True), flash backend "
            f"{'enabled' if flash else 'disabled'}"
        )
        paths += [
            "AdamW fused=True (LoopedLM.configure_optimizers on CUDA)",
            "pinned host batches and non_blocking copies to the GPU",
        ]
    else:
        paths += [
            "host memory: glibc keeps freed memory for the next step (keep_freed_memory(), "
            f"{'applied' if s.keep_freed_memory else 'NOT applied'}; the HostMemory callback of `loopnet fit`, "
            "--host_memory.keep_freed false turns it off)",
            "attention: F.scaled_dot_product_attention(is_causal=True) (CPU flash kernel)",
            "AdamW fused=True (LoopedLM.configure_optimizers, on CPU too; nanoGPT's row keeps nanoGPT's "
            "for-loop AdamW on CPU)",
        ]
    paths.append("bf16 autocast (precision bf16-mixed)" if s.bf16 else "fp32 (--precision bf16: bf16 autocast)")
    paths.append(f"tied embeddings: {cfg.tie_embeddings} (LoopConfig.tie_embeddings)")
    paths.append(f"vocabulary {cfg.vocab_size}: {'a' if cfg.vocab_size % 64 == 0 else 'NOT a'} multiple of 64")
    if s.compile:
        paths.append("torch.compile: one graph per sublayer kind and one for the head, reused by every round and block")
    return paths
