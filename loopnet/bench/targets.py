"""The benchmark's targets, each defined once (its name, its bound and the words the report prints,
made from the bound), and the checks of a run's timings against them."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Optional

import torch

from loopnet.bench.memory import fmt_bytes
from loopnet.bench.settings import Settings
from loopnet.bench.variants import Row
from loopnet.model import LoopedTransformer


@dataclass(frozen=True)
class Target:
    name: str  # what is measured, as the report's list of targets names it
    bound: float  # the number the check compares with
    words: str  # the target as the table prints it: {b} the bound, {pct} it in percent, {over} 1 - bound in percent

    def __str__(self) -> str:
        return self.words.format(
            b=f"{self.bound:g}", pct=f"{self.bound * 100:.0f}", over=f"{(1 - self.bound) * 100:.0f}"
        )


TARGETS = {
    "lightning": Target("Lightning overhead", 0.95, "≥ {b}× bare (overhead ≤ {over}%)"),
    "diagnostics@50": Target("VisitDiagnostics every 50 steps", 0.97, "≥ {b}× lightning"),
    "compile": Target("torch.compile", 1.2, "≥ {b}× eager (CPU)"),
    "checkpoint": Target(
        "activation checkpointing memory grows with K, not K·R", 0.25, "memory/round ≤ {pct}% of no-ckpt"
    ),
    "rounds": Target("block cost linear in R", 0.10, "block time linear in R (±{pct}%)"),
    "data": Target("data pipeline never the bottleneck", 0.05, "loader wait ≤ {pct}% of step"),
    "mfu": Target("MFU on an H100/H200", 0.40, "≥ {pct}% MFU (H100/H200, bf16)"),
    "nanogpt": Target("loopnet against an independent nanoGPT of its size", 1.1, "≥ {b}× nanoGPT (CPU)"),
}


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def ratio(rows: dict[str, Row], name: str) -> float:
    """This row's throughput over its baseline's: the median of paired time_base / time_row (paired by
    rep in phase A, by turn in phase B)."""
    row = rows[name]
    if row.baseline is None:
        return 1.0
    base = rows[row.baseline]
    return median([b / t for b, t in zip(base.times, row.times)])


def linear_fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    mx, my = statistics.mean(xs), statistics.mean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0
    return my - slope * mx, slope


def evaluate(s: Settings, rows: dict[str, Row], memory: list[dict], peak: float) -> dict:
    """Turn the timings into table rows and target checks."""
    K, R = s.n_blocks, s.n_rounds
    shown = [
        "bare",
        "preln R=1",
        "nanoGPT",
        "bare (windows)",
        "system malloc",
        "lightning",
        *(n for n in rows if n.startswith("diagnostics@")),
        "compile",
        "checkpoint",
        *(n for n in rows if n.startswith("R=")),
        "data",
    ]
    out_rows, checks = [], {}
    for name in dict.fromkeys(n for n in shown if n in rows):
        row = rows[name]
        step = median(row.times)
        tps = s.tokens_per_step / step
        flops = LoopedTransformer(row.config).flops_per_token(s.seq_len)
        out_rows.append(
            dict(
                name=name,
                description=row.description,
                baseline=row.baseline,
                step_ms=step * 1e3,
                tokens_per_s=tps,
                ratio=ratio(rows, name),
                mfu=flops * tps / peak,
                peak_bytes=row.peak_bytes,
                target=row.target,
                met=None,
                detail="",
                extra=row.extra,
                derived=row.derived,
                samples_ms=[t * 1e3 for t in row.times],
            )
        )
    by = {r["name"]: r for r in out_rows}

    def check(key: str, met: Optional[bool], detail: str, names: tuple[str, ...] = (), **extra) -> None:
        for name in names or (key,):
            if name in by:
                by[name]["met"], by[name]["detail"] = met, detail
        checks[key] = {"target": str(TARGETS[key]), "met": met, "detail": detail, **extra}

    if "lightning" in by:
        r = by["lightning"]["ratio"]
        check("lightning", r >= TARGETS["lightning"].bound, f"{(1 / r - 1) * 100:+.1f}% step time over the bare loop")
    r = by["preln R=1"]["ratio"]
    check(
        "nanogpt",
        r >= TARGETS["nanogpt"].bound if not s.cuda else None,
        f"loopnet's step {r:.2f}× as fast as nanoGPT's at d={s.d_model}, {K} layers, T={s.seq_len}, vocabulary "
        f"{s.vocab_size} (median of {len(rows['nanoGPT'].times)} paired turns)",
        ("preln R=1",),
    )
    if "diagnostics@50" in by:
        r = by["diagnostics@50"]["ratio"]
        check(
            "diagnostics@50",
            r >= TARGETS["diagnostics@50"].bound,
            f"{(1 / r - 1) * 100:+.1f}% step time over lightning",
        )
    if "compile" in by:
        r, e = by["compile"]["ratio"], by["compile"]["extra"]
        detail = (
            f"{r:.2f}× eager; {e['graphs']} compiled graphs serve all {R}×{K} block visits, "
            f"{e['new_graphs_other_R']} new at R'={max(1, R // 2)}; first step (compiling) "
            f"{e['first_step_s']:.1f} s"
        )
        b = e.get("eager_breakdown")
        if b:
            detail += (
                f"; the eager step is {b['matmul'] * 100:.0f}% matmul and {b['attention'] * 100:.0f}% "
                f"attention kernels, which compile does not change (at best "
                f"{1 / (b['matmul'] + b['attention']):.2f}×)"
            )
        check("compile", (r >= TARGETS["compile"].bound) if not s.cuda else None, detail)
    # Rounds: step time = a + b·R; the block time per round b should explain every point.
    points = sorted((rows[n].config.n_rounds, by[n]["step_ms"]) for n in by if n == "bare" or n.startswith("R="))
    if len(points) >= 2:
        a, b = linear_fit([p[0] for p in points], [p[1] for p in points])
        worst = max(abs(t - (a + b * x)) / t for x, t in points)
        detail = (
            f"{b:.1f} ms per round (K={K} blocks) + {a:.1f} ms per step outside the rounds; worst point "
            f"{worst * 100:.1f}% off the line"
        )
        check(
            "rounds",
            worst <= TARGETS["rounds"].bound and b > 0,
            detail,
            tuple(n for n in by if n.startswith("R=")),
            ms_per_round=b,
            fixed_ms=a,
            points=points,
        )
    if memory:
        value = lambda m: m["peak"] if m["peak"] is not None else m["saved"]  # noqa: E731
        ok = [e for e in memory if value(e["plain"]) is not None and value(e["ckpt"]) is not None]
        plain = [(e["R"], value(e["plain"])) for e in ok if e["K"] == K]
        ckpt = [(e["R"], value(e["ckpt"])) for e in ok if e["K"] == K]
        if len(plain) >= 2:
            sp = linear_fit([x for x, _ in plain], [m for _, m in plain])[1]
            sc = linear_fit([x for x, _ in ckpt], [m for _, m in ckpt])[1]
            ks = sorted((e["K"], value(e["plain"]), value(e["ckpt"])) for e in ok if e["R"] == R)
            detail = (
                f"peak per extra round {fmt_bytes(sc)} with checkpointing vs {fmt_bytes(sp)} without "
                f"({sc / sp * 100:.0f}%); at R={R}, K = "
                + ", ".join(str(k) for k, _, _ in ks)
                + ": "
                + " / ".join(fmt_bytes(p) for _, p, _ in ks)
                + " without, "
                + " / ".join(fmt_bytes(c) for _, _, c in ks)
                + " with"
            )
            check(
                "checkpoint",
                sp > 0 and sc <= TARGETS["checkpoint"].bound * sp,
                detail,
                bytes_per_round_ckpt=sc,
                bytes_per_round=sp,
            )
    if "data" in by:
        e = by["data"]["extra"]
        check(
            "data",
            e["wait_frac"] <= TARGETS["data"].bound,
            f"{e['wait_ms']:.2f} ms waiting for the loader per step, {e['wait_frac'] * 100:.1f}% of the step",
        )
    if s.cuda:
        best = max((r for r in out_rows if not r["derived"]), key=lambda r: r["mfu"])
        name = torch.cuda.get_device_name(s.device)
        known = "H100" in name or "H200" in name
        met = best["mfu"] >= TARGETS["mfu"].bound if known and s.d_model == 768 and s.bf16 else None
        detail = f"best: {best['name']}, {best['mfu'] * 100:.1f}% of {peak / 1e12:.0f} TFLOP/s on {name}"
        if not best["target"]:
            best["target"] = str(TARGETS["mfu"])
            check("mfu", met, detail, (best["name"],))
        else:
            check("mfu", met, detail, ("-",))
    else:
        check("mfu", None, "not measured: needs an H100/H200 (this machine has none)", ("-",))
    return {"rows": out_rows, "memory": memory, "checks": checks}
