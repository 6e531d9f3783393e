"""`loopnet probe`: the update-size test of DeepLoop's theory, over R and schemes, at initialisation.

    loopnet probe --config configs/deeploop_r6.yaml --config configs/cpu.yaml --config configs/study_cpu.yaml \\
        --rounds 1 2 4 8 16 32 --schemes postln deepnorm deeploop p0.375 --seeds 1 2 3 --steps 3 \\
        --out docs/results/update_size

DeepLoop's argument: one shared optimiser update changes the model's output by
O(M·κ_R·(β/α)²), with M = 2N = 2KR visits, κ_R the visit alignment and α = (2N)^p, β = (8N)^-p:

    Post-LN (p = 0)   2N·κ_R               slope 1 in R (κ_R = 1) to 2 (κ_R = R)
    DeepNorm (p = ¼)  κ_R / 2              slope 0 to 1: grows ~R when the visits are aligned
    DeepLoop (p = ½)  κ_R / (8N)           slope -1 to 0: flat when aligned
    exponent p        2N·κ_R·(16N²)^-2p    slope 1 - 4p to 2 - 4p

For every (scheme, R, seed) cell a fresh model (the config's, with that scheme and R) takes
`--steps` AdamW steps from its initialisation on the first training batches (the same batches for
every cell) at a constant learning rate; each step measures, on its own batch, κ̂_R over the whole
model (`loopnet.diagnostics.visit_probe`) and the relative change of the final state, of every round's
state and of the logits that the step caused (`loopnet.diagnostics.update_size`), exactly as
`VisitDiagnostics` logs them during training. Neither paper measured this.

Writes into `--out`: probe.json (settings, machine, every measurement), probe.csv, update_size.png
(output change vs R, log-log, one panel per scheme, with the theory's slopes) and report.md.

`--groups` splits the first step's output change by parameter group (embeddings + head, norm gains,
the β-scaled V/O/fc1/fc2, Q/K), under AdamW and SGD (`--optimizers`), from the initialisation and/or
from checkpoints of real runs (`--checkpoints`; `--with_init` adds fresh models of the checkpoints'
configs), with the DeepNorm/DeepLoop ratio against 4N (SGD) and 2√N (sign update): see
`loopnet.study.update_groups`. It writes groups.json, groups.csv, groups.png and report.md.

    loopnet probe --config configs/deeploop_r6.yaml --config configs/cpu.yaml --config configs/study_cpu.yaml \
        --groups --rounds 1 8 32 --schemes deepnorm deeploop --seeds 1 2 3 --out docs/results/map/probe
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import shlex
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

from loopnet.env import machine, one_line_errors
from loopnet.model import scales
from loopnet.model.scales import SCHEME_EXPONENT, residual_scales

from . import update_groups as ug

# The exponent p of each named scheme the probe takes; Post-LN is p = 0 (α = β = 1).
SCHEME_P = {"postln": 0.0, **SCHEME_EXPONENT}


def parse_scheme(name: str) -> tuple[str, float | None]:
    """A `--schemes` name -> (residual, p): `postln`, `deepnorm`, `deeploop` or `p<exponent>` (residual
    `scaled`); Pre-LN has no place on the theory's α/β axis."""
    try:
        residual, p = scales.parse_scheme(name)
    except ValueError:
        residual, p = None, None
    if residual in SCHEME_P or residual == "scaled":
        return residual, p
    raise ValueError(f"--schemes {name!r}: use postln, deepnorm, deeploop or p<exponent> such as p0.375")


def exponent(name: str) -> float:
    """The p of α = (2N)^p, β = (8N)^-p (Post-LN: 0)."""
    residual, p = parse_scheme(name)
    return p if p is not None else SCHEME_P[residual]


def theory(name: str, n_blocks: int, rounds: int, kappa: float) -> float:
    """M·κ·(β/α)², the quantity the theory bounds the output change by."""
    residual, p = parse_scheme(name)
    n = n_blocks * rounds
    alpha, beta = residual_scales(residual, n, p)
    return 2 * n * kappa * (beta / alpha) ** 2


def resolve(config_args: list[str]):
    """(LoopConfig, OptimConfig, data module, gradient clip value) of a `loopnet fit` command line, through
    the CLI's own parser and checks (config files, keys, types); nothing is trained or written."""
    from loopnet.training.dry_run import parse_fit

    cfg = parse_fit(config_args)
    from loopnet.data import TokenStreamDataModule
    from loopnet.model import LoopConfig
    from loopnet.training.module import OptimConfig

    model_cfg = LoopConfig(**cfg.model.config.as_dict())
    optim = OptimConfig(**cfg.model.optim.as_dict())
    data = TokenStreamDataModule(**cfg.data.as_dict())
    return model_cfg, optim, data, cfg.trainer.gradient_clip_val


def measure_cell(base, optim, batches, scheme: str, rounds: int, seed: int, clip) -> list[dict]:
    """Train a fresh model `len(batches)` steps from init; per step its κ̂ and update size."""
    import torch

    from loopnet.diagnostics.callback import physical_sublayers
    from loopnet.diagnostics.visit_probe import VisitProbe, kappas
    from loopnet.diagnostics.update_size import relative_changes, round_outputs
    from loopnet.training.module import LoopedLM

    residual, p = parse_scheme(scheme)
    torch.manual_seed(seed)
    cfg = replace(base, residual=residual, p=p, n_rounds=rounds, dropout=0.0)
    lm = LoopedLM(config=cfg, optim=replace(optim, warmup_steps=0, decay_steps=10**9))  # constant rate
    model = lm.model
    optimizer = lm.configure_optimizers()["optimizer"]
    rows = []
    for step, (inputs, targets) in enumerate(batches):
        before = round_outputs(model, inputs)
        probe = VisitProbe()
        model.attach_observer(probe)
        _, loss = model(inputs, targets)
        loss.backward()
        model.attach_observer(None)
        num, den = probe.alignment_terms(physical_sublayers(model))
        kappa = kappas(num, den)["model"].item()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        changes = {
            k.removeprefix("update/"): v.item()
            for k, v in relative_changes(before, round_outputs(model, inputs)).items()
        }
        rows.append(
            {
                "scheme": scheme,
                "rounds": rounds,
                "seed": seed,
                "step": step + 1,
                "loss": loss.item(),
                "kappa": kappa,
                "output_change": changes["output_change"],
                "logit_change": changes["logit_change"],
                "round_change": [changes[f"output_change/r{r:02d}"] for r in range(1, rounds + 1)],
            }
        )
    return rows


def fit_slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of log y against log x."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if y > 0]
    if len(pts) < 2:
        return None
    mx, my = statistics.fmean(p[0] for p in pts), statistics.fmean(p[1] for p in pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx else None


def summarise(rows: list[dict], schemes: list[str], rounds: list[int], n_blocks: int, quantity: str) -> dict:
    """Per scheme and R: mean ± std over seeds of `quantity` averaged over the probe's steps, the
    mean κ̂, the theory's M·κ̂·(β/α)²; per scheme the fitted log-log slope and the theory's bounds."""
    out = {}
    for s in schemes:
        per_r = {}
        for r in rounds:
            cell = [x for x in rows if x["scheme"] == s and x["rounds"] == r]
            seeds = sorted({x["seed"] for x in cell})
            vals = [statistics.fmean(x[quantity] for x in cell if x["seed"] == sd) for sd in seeds]
            kap = [statistics.fmean(x["kappa"] for x in cell if x["seed"] == sd) for sd in seeds]
            if not vals:
                continue
            per_r[r] = {
                "mean": statistics.fmean(vals),
                "std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
                "kappa": statistics.fmean(kap),
                "kappa_std": statistics.stdev(kap) if len(kap) > 1 else 0.0,
                "theory": theory(s, n_blocks, r, statistics.fmean(kap)),
                "n": len(vals),
            }
        rs = sorted(per_r)
        p = exponent(s)
        out[s] = {
            "per_r": per_r,
            "slope": fit_slope(rs, [per_r[r]["mean"] for r in rs]),
            "theory_slope": fit_slope(rs, [per_r[r]["theory"] for r in rs]),
            "bounds": (1 - 4 * p, 2 - 4 * p),
        }
    return out


def plot(summary: dict, rounds: list[int], quantity: str, path: Path) -> None:
    from .plotting import pyplot, save

    plt = pyplot()
    fig, axes = plt.subplots(1, len(summary), figsize=(3.6 * len(summary), 3.6), sharey=True, squeeze=False)
    for ax, (s, res) in zip(axes[0], summary.items()):
        rs = sorted(res["per_r"])
        if not rs:
            continue
        ys = [res["per_r"][r]["mean"] for r in rs]
        ax.errorbar(
            rs,
            ys,
            yerr=[res["per_r"][r]["std"] for r in rs],
            marker="o",
            capsize=3,
            color="C0",
            label=f"measured (slope {res['slope']:.2f})",
        )
        anchor_r, anchor_y = rs[0], ys[0]
        th = [res["per_r"][r]["theory"] for r in rs]
        ax.plot(
            rs,
            [anchor_y * t / th[0] for t in th],
            ls=":",
            color="C3",
            label=f"M·κ̂·(β/α)² (slope {res['theory_slope']:.2f})",
        )
        lo, hi = res["bounds"]
        for slope, style, name in ((lo, "--", "κ=1"), (hi, "-.", "κ=R")):
            ax.plot(
                rs,
                [anchor_y * (r / anchor_r) ** slope for r in rs],
                ls=style,
                color="0.5",
                lw=1,
                label=f"theory, {name}: slope {slope:g}",
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(rounds, [str(r) for r in rounds])
        ax.set_xlabel("rounds R")
        ax.set_title(s)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel(f"{quantity.replace('_', ' ')} after one step")
    save(plt, fig, path)


def markdown(summary: dict, rounds: list[int], meta: dict) -> str:
    lines = [f"# {meta['title']}", ""]
    if meta.get("notes"):
        lines += [meta["notes"].strip(), ""]
    lines += [
        "## How this was produced",
        "",
        "```bash",
        meta["command"],
        "```",
        "",
        f"- {meta['cells']} cells (scheme × R × seed), {meta['steps']} AdamW step(s) each from the "
        f"initialisation at a constant learning rate {meta['lr']:g}, gradient clipping {meta['clip']}; "
        f"K = {meta['n_blocks']}, d = {meta['d_model']}, sequence {meta['seq_len']}, batch {meta['batch_size']}",
        f"- machine: {meta['machine']}; {meta['seconds']:.0f} s in all; loopnet @ {meta['commit']}",
        "- output change: ‖x_R' − x_R‖/‖x_R‖ of the final state on the step's own batch, before and after "
        "the step, without grad (`loopnet.diagnostics.update_size`), averaged over the steps, then mean ± "
        "std over seeds; κ̂ over the whole model at each step (`loopnet.diagnostics.visit_probe`)",
        "- theory: M·κ̂·(β/α)² with the measured κ̂ (its log-log slope), and the bounds 1 − 4p (κ = 1, "
        "decorrelated visits) and 2 − 4p (κ = R, aligned)",
        "",
        "![output change vs R](update_size.png)",
        "",
        "| scheme | p | "
        + " | ".join(f"R = {r}" for r in rounds)
        + " | slope measured | slope M·κ̂·(β/α)² | theory κ=1 … κ=R |",
        "|---|---:|" + "---:|" * len(rounds) + "---:|---:|---|",
    ]
    for s, res in summary.items():
        cells = [
            f"{res['per_r'][r]['mean']:.3g} ± {res['per_r'][r]['std']:.2g}" if r in res["per_r"] else "—"
            for r in rounds
        ]
        slope = "—" if res["slope"] is None else f"{res['slope']:.2f}"
        tslope = "—" if res["theory_slope"] is None else f"{res['theory_slope']:.2f}"
        lines.append(
            f"| {s} | {exponent(s):g} | "
            + " | ".join(cells)
            + f" | {slope} | {tslope} | {res['bounds'][0]:g} … {res['bounds'][1]:g} |"
        )
    lines += [
        "",
        "Measured κ̂ (whole model, mean over steps, mean ± std over seeds):",
        "",
        "| scheme | " + " | ".join(f"R = {r}" for r in rounds) + " |",
        "|---|" + "---:|" * len(rounds),
    ]
    for s, res in summary.items():
        lines.append(
            f"| {s} | "
            + " | ".join(
                f"{res['per_r'][r]['kappa']:.2f} ± {res['per_r'][r]['kappa_std']:.2f}" if r in res["per_r"] else "—"
                for r in rounds
            )
            + " |"
        )
    return "\n".join(lines) + "\n"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="loopnet probe", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rounds", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32], help="R values")
    p.add_argument(
        "--schemes",
        nargs="+",
        default=["postln", "deepnorm", "deeploop", "p0.375"],
        help="postln, deepnorm, deeploop, p<exponent> (residual scaled)",
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--steps", type=int, default=3, help="AdamW steps from the initialisation (1-5)")
    p.add_argument(
        "--groups",
        action="store_true",
        help="split the first step's output change by parameter group (loopnet.study.update_groups)",
    )
    p.add_argument(
        "--optimizers",
        nargs="+",
        default=["adamw", "sgd"],
        choices=ug.OPTIMIZERS,
        help="with --groups: the optimisers whose step is split (default adamw sgd; muon: "
        "torch.optim.Muon on the blocks' matrices, AdamW on the rest, at the config's muon_lr or lr)",
    )
    p.add_argument("--sgd_lr", type=float, help="with --groups: SGD's learning rate (default: the config's lr)")
    p.add_argument(
        "--checkpoints",
        nargs="+",
        metavar="CKPT",
        help="with --groups: probe from these checkpoints of real runs (their config and AdamW state) "
        "instead of fresh models; --schemes and --rounds are then the checkpoints'",
    )
    p.add_argument(
        "--with_init",
        action="store_true",
        help="with --checkpoints: also probe fresh models (--seeds) of each checkpoint's config (step 0)",
    )
    p.add_argument("--out", required=True, help="folder for probe.json, probe.csv, update_size.png, report.md")
    p.add_argument("--title", default="Update size vs R at initialisation")
    p.add_argument("--notes", help="markdown file inserted as the report's reading")
    return p


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    args, config_args = parser().parse_known_args(argv)
    with one_line_errors("loopnet probe"):
        for s in args.schemes:
            parse_scheme(s)  # fails on a name it does not know
        schemes = args.schemes
        if not 1 <= args.steps <= 50:
            raise ValueError(f"--steps must be in 1..50, got {args.steps}")
        if min(args.rounds) < 1:
            raise ValueError(f"--rounds must all be >= 1, got {args.rounds}")
        if args.notes and not Path(args.notes).is_file():
            raise FileNotFoundError(f"--notes {args.notes}: no such file")
        if (args.checkpoints or args.with_init) and not args.groups:
            raise ValueError("--checkpoints and --with_init belong to --groups; fix: add --groups")
        for path in args.checkpoints or []:  # each refused in one line before the data loads
            ug.read_checkpoint(path)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    notes = Path(args.notes).read_text() if args.notes else None  # read before anything in out is written

    import torch

    from .provenance import git_commit

    base, optim, data, clip = resolve(config_args)
    data.setup("fit")
    loader = iter(data.train_dataloader())
    batches = [tuple(t.long() if hasattr(t, "long") else t for t in next(loader)) for _ in range(args.steps)]
    if args.groups:
        return run_groups(args, argv, out, notes, base, optim, batches[0], clip)
    start, rows = time.perf_counter(), []
    rounds = sorted(set(args.rounds))
    for s in schemes:
        for r in rounds:
            for seed in args.seeds:
                rows += measure_cell(base, optim, batches, s, r, seed, clip)
                last = rows[-1]
                print(
                    f"{s:>9} R={r:<3} seed {seed}: output change {last['output_change']:.4g}, κ̂ {last['kappa']:.2f}",
                    flush=True,
                )
    seconds = time.perf_counter() - start
    info = machine()
    command = "loopnet probe " + " ".join(shlex.quote(a) for a in argv)
    meta = {
        "title": args.title,
        "notes": notes,
        "command": command,
        "cells": len(schemes) * len(rounds) * len(args.seeds),
        "steps": args.steps,
        "lr": optim.lr,
        "clip": clip,
        "n_blocks": base.n_blocks,
        "d_model": base.d_model,
        "seq_len": batches[0][0].shape[1],
        "batch_size": batches[0][0].shape[0],
        "seconds": seconds,
        "commit": git_commit() or "?",
        "torch_threads": torch.get_num_threads(),
        "machine": f"{info['cpus']} CPU(s), {info['platform']}, torch {info['torch']}",
    }
    summary = summarise(rows, schemes, rounds, base.n_blocks, "output_change")
    (out / "probe.json").write_text(
        json.dumps({"meta": meta, "config": base.__dict__, "rows": rows, "summary": summary}, indent=1, default=str)
    )
    with open(out / "probe.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["scheme", "rounds", "seed", "step", "loss", "kappa", "output_change", "logit_change"])
        for x in rows:
            w.writerow(
                [
                    x["scheme"],
                    x["rounds"],
                    x["seed"],
                    x["step"],
                    x["loss"],
                    x["kappa"],
                    x["output_change"],
                    x["logit_change"],
                ]
            )
    plot(summary, rounds, "output_change", out / "update_size.png")
    (out / "report.md").write_text(markdown(summary, rounds, meta))
    print(f"loopnet probe: {len(rows)} measurements in {seconds:.0f} s -> {out}/report.md")


def run_groups(args, argv, out: Path, notes, base, optim, batch, clip) -> None:
    """`--groups`: every starting point (fresh models, checkpoints) x optimiser, split by group."""
    import torch

    from loopnet.model.scales import scheme_label

    from .provenance import git_commit

    sgd_lr = args.sgd_lr if args.sgd_lr is not None else optim.lr
    lrs = {"adamw": optim.lr, "sgd": sgd_lr, "muon": optim.lr if optim.muon_lr is None else optim.muon_lr}
    starts = []  # (label, rounds, seed, lm, AdamW state or None)
    if args.checkpoints:
        configs = {}
        for path in args.checkpoints:
            lm, state, step, name = ug.from_checkpoint(path)
            starts.append((f"{name}@step{step}", lm.config.n_rounds, path, lambda lm=lm: lm, state))
            configs[(name, lm.config.n_rounds)] = lm.config
        if args.with_init:
            for (name, rounds), cfg in configs.items():
                scheme = scheme_label(cfg.residual, cfg.p)
                for seed in args.seeds:
                    starts.append(
                        (
                            f"{name}@step0",
                            rounds,
                            seed,
                            lambda c=cfg, sc=scheme, r=rounds, sd=seed: ug.fresh_model(c, optim, sc, r, sd),
                            None,
                        )
                    )
    else:
        for scheme in args.schemes:
            for rounds in sorted(set(args.rounds)):
                for seed in args.seeds:
                    starts.append(
                        (
                            ug.label(scheme, base),
                            rounds,
                            seed,
                            lambda sc=scheme, r=rounds, sd=seed: ug.fresh_model(base, optim, sc, r, sd),
                            None,
                        )
                    )
    start, rows = time.perf_counter(), []
    for label, rounds, seed, make, state in starts:
        lm = make()
        for kind in args.optimizers:
            got = ug.measure_groups(lm, batch, kind, lrs[kind], clip, state)
            rows.append(
                {
                    "label": label,
                    "rounds": rounds,
                    "seed": str(seed),
                    "optimizer": kind,
                    "n_blocks": lm.config.n_blocks,
                    "lr": lrs[kind],
                    **got,
                }
            )
            print(
                f"{label:>16} R={rounds:<3} {seed} {kind:>5}: "
                + ", ".join(f"{g} {got[g]:.3g}" for g in (*ug.GROUPS, "all")),
                flush=True,
            )
    seconds = time.perf_counter() - start
    info = machine()
    what = (
        f"{len(args.checkpoints)} checkpoint(s)"
        + (f" and fresh models of their configs, seeds {args.seeds}" if args.with_init else "")
        if args.checkpoints
        else f"fresh models: schemes {args.schemes} x R {sorted(set(args.rounds))} x seeds {args.seeds}"
    )
    meta = {
        "title": args.title if args.title != parser().get_default("title") else "Update size per parameter group",
        "notes": notes,
        "command": "loopnet probe " + " ".join(shlex.quote(a) for a in argv),
        "what": what,
        "lr": optim.lr,
        "sgd_lr": sgd_lr,
        "clip": clip,
        "seconds": seconds,
        "commit": git_commit() or "?",
        "machine": f"{info['cpus']} CPU(s), {info['platform']}, torch {info['torch']}, "
        f"{torch.get_num_threads()} thread(s)",
    }
    (out / "groups.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    with open(out / "groups.csv", "w", newline="") as f:
        keys = [
            "label",
            "rounds",
            "seed",
            "optimizer",
            "lr",
            *ug.GROUPS,
            "all",
            "all_logits",
            "additivity",
            "kappa",
            "loss",
        ]
        w = csv.writer(f)
        w.writerow(keys)
        for row in rows:
            w.writerow([row[k] for k in keys])
    plot_groups(rows, out / "groups.png")
    (out / "report.md").write_text(
        ug.markdown(rows, meta).replace(
            "## How this was produced", "![output change per group](groups.png)\n\n## How this was produced", 1
        )
    )
    for r in ug.ratio_rows(ug.summarise(rows)):
        print(
            f"DeepNorm/DeepLoop {r['optimizer']:>5} {ug.where(r['suffix']):>14} R={r['rounds']:<3} "
            f"theory {r['theory']:.1f} ({'4N' if r['optimizer'] == 'sgd' else '2√N'}): "
            + ", ".join(f"{g} {r[g]:.3g}" for g in (*ug.GROUPS, "all")),
            flush=True,
        )
    print(f"loopnet probe: {len(rows)} measurements in {seconds:.0f} s -> {out}/report.md")


def plot_groups(rows: list[dict], path: Path) -> None:
    """Output change per group vs R, log-log: one panel per optimiser, one colour per group, one line
    style per scheme (mean over seeds)."""
    from .plotting import legend, pyplot, save

    plt = pyplot()
    summary = ug.summarise(rows)
    kinds = list(dict.fromkeys(r["optimizer"] for r in rows))
    labels = list(dict.fromkeys(r["label"] for r in rows))
    styles = ["-", "--", ":", "-."]
    fig, axes = plt.subplots(1, len(kinds), figsize=(6 * len(kinds), 4.5), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        for i, g in enumerate((*ug.GROUPS, "all")):
            for j, label in enumerate(labels):
                pts = sorted(
                    (r, s[g][0]) for (lb, r, k), s in summary.items() if lb == label and k == kind and s[g][0] > 0
                )
                if pts:
                    ax.plot(
                        *zip(*pts),
                        marker="o",
                        ls=styles[j % len(styles)],
                        color=f"C{i}",
                        label=f"{ug.GROUP_TEXT.get(g, g)}, {label}",
                    )
        ax.set(xscale="log", yscale="log", xlabel="rounds R", title=kind, ylabel="relative change of the final state")
        legend(ax, fontsize=6)
    save(plt, fig, path)


if __name__ == "__main__":
    main()
