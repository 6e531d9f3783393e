"""`loopnet coordcheck`: microsoft/mup's coordinate check, per visit of a looped model.

    loopnet coordcheck --config configs/preln_r6.yaml --config configs/cpu.yaml --config configs/study_map.yaml \\
        --widths 64 128 256 512 --rounds 2 6 12 --parametrizations standard mup completep --steps 4 \\
        --seeds 1 2 --lr 1e-2 --out runs/coordcheck

For every (parametrization, width d, rounds R, seed) a fresh model of the config (d_model = d, n_rounds = R; the
head count stays, so d_h grows with d as μP assumes) takes `--steps` AdamW steps at a constant rate from its
initialisation, on the same first training batches for every cell. Before each step its forward pass records the
mean |x| over all coordinates (Yang et al.'s `coord_check`, `x.abs().mean()`) of:

    embedding               the loop's input x0 (what round 1 reads)
    branch/<visit.tag>      each visit's branch output f(·) (Pre-LN: ε·f, what it adds to the stream)
    state/<visit.tag>       each visit's output stream
    attn_logits/<visit.tag> each attention visit's logits q·k/√d_h (the queries as the model scales them) over
                            the causal positions
    logits                  the output logits of the last round

Visits are named by `loopnet.model.Visit.tag` (r03_k1_attn, p1_attn, c1_ffn), as everywhere in loopnet. Under μP
the curves of mean |x| against width are flat (hidden activations) or fall (attention and output logits at
initialisation, ∝ 1/√d); under the standard parametrization they grow after a step or two at a rate high
enough, the output logits first. The log-log slope of each curve against width, per step, is the number to read.

Writes into `--out`: coord_check.csv (every measurement), coord_slopes.csv (per parametrization, R, step and
quantity: the slope of log mean|x| against log d for each seed, their mean and the 95% t half-width),
coord_width.png (mean |x| against d, log-log, a row per (parametrization, R), a panel per step, one curve per
quantity), coord_rounds.png (against R at the largest width: the last round's visits, the embedding and the
logits), report.md, and TensorBoard events (`tb/`) with both figures as the images coordcheck/width and
coordcheck/rounds.
"""

from __future__ import annotations

import argparse
import csv
import math
import shlex
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

from loopnet.env import machine, one_line_errors
from loopnet.study.measures import t_quantile

PARAMETRIZATIONS = ("standard", "mup", "completep")


class CoordObserver:
    """A `VisitObserver` that keeps mean |x| of every visit's branch output, output stream and attention logits,
    of the loop's input and of the last logits it sees (`LoopedTransformer.attach_observer`)."""

    def __init__(self):
        self.values: dict[str, float] = {}

    def on_visit(self, visit, trace) -> None:
        import torch

        with torch.no_grad():
            if not self.values:  # the first visit's input is the loop's (or the prelude's) input
                self.values["embedding"] = trace.x.abs().mean().item()
            self.values[f"branch/{visit.tag}"] = trace.branch.abs().mean().item()
            self.values[f"state/{visit.tag}"] = trace.state.abs().mean().item()
            if trace.qk is not None:
                self.values[f"attn_logits/{visit.tag}"] = mean_abs_attention_logit(*trace.qk)

    def on_logits(self, r: int, logits) -> None:
        self.values["logits"] = logits.detach().abs().mean().item()


def mean_abs_attention_logit(q, k) -> float:
    """mean |q·k/√d_h| over batch, heads and the causal positions j ≤ i (q, k: B, H, T, d_h), in fp32."""
    import torch

    T, d_h = q.size(-2), q.size(-1)
    logits = (q.detach().float() @ k.detach().float().transpose(-1, -2)) / math.sqrt(d_h)
    allowed = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    return (logits.abs() * allowed).sum().item() / (allowed.sum().item() * q.size(0) * q.size(1))


def arm_config(base, parametrization: str, width: int, rounds: int, base_width: int, base_depth: int | None):
    """The config of one cell: `base` at width d and R rounds under `parametrization`. CompleteP needs Pre-LN with
    branch_scale one (its own ε): the arm sets them; the others keep the config's residual scheme."""
    extra = {
        "mup_base_width": None if parametrization == "standard" else base_width,
        "completep_base_depth": None,
        "completep_alpha": 1.0,
    }
    if parametrization == "completep":
        extra |= {
            "residual": "preln",
            "p": None,
            "branch_scale": "one",
            "branch_lambda": 1.0,
            "sandwich": False,
            "completep_base_depth": base_depth,
        }
    return replace(base, d_model=width, n_rounds=rounds, dropout=0.0, parametrization=parametrization, **extra)


def measure_cell(cfg, optim, batches, seed: int, clip) -> list[dict[str, float]]:
    """A fresh model of `cfg` (seed `seed`) trained one AdamW step per batch at a constant rate; per step, what
    `CoordObserver` saw in the forward pass before that step's update (step 1: at initialisation)."""
    import torch

    from loopnet.training.module import LoopedLM

    torch.manual_seed(seed)
    lm = LoopedLM(config=cfg, optim=replace(optim, warmup_steps=0, decay_steps=10**9, min_lr_ratio=1.0))
    model = lm.model
    optimizer = lm.configure_optimizers()["optimizer"]
    steps = []
    for inputs, targets in batches:
        observer = CoordObserver()
        model.attach_observer(observer)
        _, loss = model(inputs, targets)
        model.attach_observer(None)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        steps.append(observer.values | {"loss": loss.item()})
    return steps


def run(
    base,
    optim,
    batches,
    parametrizations,
    widths,
    rounds,
    seeds,
    clip,
    base_width: int | None = None,
    base_depth: int | None = None,
    log=print,
) -> list[dict]:
    """Every cell's measurements as rows {parametrization, width, rounds, seed, step, quantity, value}; d₀ and N₀
    default to the smallest width and the depth at the smallest R."""
    base_width = base_width or min(widths)
    base_depth = base_depth or base.depth(min(rounds))
    rows = []
    for param in parametrizations:
        for R in rounds:
            for d in widths:
                cfg = arm_config(base, param, d, R, base_width, base_depth)
                for seed in seeds:
                    for step, values in enumerate(measure_cell(cfg, optim, batches, seed, clip), start=1):
                        rows += [
                            {
                                "parametrization": param,
                                "width": d,
                                "rounds": R,
                                "seed": seed,
                                "step": step,
                                "quantity": q,
                                "value": v,
                            }
                            for q, v in values.items()
                        ]
                    log(
                        f"{param:>9} R={R:<3} d={d:<5} seed {seed}: logits {values['logits']:.4g}, "
                        f"loss {values['loss']:.4g}"
                    )
    return rows


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log y against log x."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def slopes(rows: list[dict]) -> list[dict]:
    """Per (parametrization, R, step, quantity): each seed's slope of log mean|x| against log width, their mean,
    and the 95% t half-width of the mean over seeds (None with one seed)."""
    cells: dict[tuple, dict[int, dict[int, float]]] = {}
    for r in rows:
        if r["quantity"] == "loss":
            continue
        key = (r["parametrization"], r["rounds"], r["step"], r["quantity"])
        cells.setdefault(key, {}).setdefault(r["seed"], {})[r["width"]] = r["value"]
    out = []
    for (param, R, step, q), by_seed in cells.items():
        per_seed = [
            slope(sorted(w), [w[d] for d in sorted(w)]) for w in by_seed.values() if len(w) > 1 and min(w.values()) > 0
        ]
        if not per_seed:
            continue
        n = len(per_seed)
        half = t_quantile(0.975, n - 1) * statistics.stdev(per_seed) / math.sqrt(n) if n > 1 else None
        out.append(
            {
                "parametrization": param,
                "rounds": R,
                "step": step,
                "quantity": q,
                "seeds": n,
                "slope": statistics.fmean(per_seed),
                "half_width": half,
                "per_seed": per_seed,
            }
        )
    return out


def _curves(rows, param, R, step):
    """{quantity: {width: mean over seeds of mean |x|}} of one panel."""
    acc: dict[str, dict[int, list[float]]] = {}
    for r in rows:
        if (r["parametrization"], r["rounds"], r["step"]) == (param, R, step) and r["quantity"] != "loss":
            acc.setdefault(r["quantity"], {}).setdefault(r["width"], []).append(r["value"])
    return {q: {d: statistics.fmean(v) for d, v in sorted(by.items())} for q, by in acc.items()}


def _style(plt, quantity: str, order: list[str]):
    """(colour, line style, label or None) of a quantity: the visits coloured by their order in the forward pass."""
    if quantity == "logits":
        return "black", "-", "output logits"
    if quantity == "embedding":
        return "0.5", "-", "embedding"
    kind, tag = quantity.split("/", 1)
    colour = plt.cm.viridis(order.index(tag) / max(1, len(order) - 1))
    return colour, {"branch": "-", "state": ":", "attn_logits": "--"}[kind], None


def plot_width(rows: list[dict], path: Path, kinds=("branch", "attn_logits")):
    """mean |x| against width, log-log: a row per (parametrization, R), a panel per step, a curve per quantity."""
    from loopnet.study.plotting import pyplot

    plt = pyplot()
    arms = sorted(
        {(r["parametrization"], r["rounds"]) for r in rows}, key=lambda a: (PARAMETRIZATIONS.index(a[0]), a[1])
    )
    steps = sorted({r["step"] for r in rows})
    fig, axes = plt.subplots(
        len(arms), len(steps), figsize=(3.2 * len(steps), 2.8 * len(arms)), squeeze=False, sharex=True
    )
    for row, (param, R) in enumerate(arms):
        for col, step in enumerate(steps):
            ax = axes[row][col]
            curves = _curves(rows, param, R, step)
            order = list(dict.fromkeys(q.split("/", 1)[1] for q in curves if q.startswith("branch/")))
            for q, by in curves.items():
                if "/" in q and q.split("/", 1)[0] not in kinds:
                    continue
                colour, ls, label = _style(plt, q, order)
                ax.plot(
                    list(by),
                    list(by.values()),
                    color=colour,
                    ls=ls,
                    lw=1.4 if label else 0.8,
                    label=label,
                    marker="o" if label else None,
                    ms=3,
                )
            ax.set(xscale="log", yscale="log", title=f"{param}, R = {R}, step {step}")
            ax.set_xticks(sorted({r["width"] for r in rows}), [str(d) for d in sorted({r["width"] for r in rows})])
            ax.minorticks_off()
            if row == len(arms) - 1:
                ax.set_xlabel("width d")
            if col == 0:
                ax.set_ylabel("mean |x|")
    axes[0][0].plot([], [], color="C0", ls="-", label="branch f(·), by visit")
    axes[0][0].plot([], [], color="C0", ls="--", label="attention logits, by visit")
    axes[0][0].legend(fontsize=6)
    return fig, plt


def plot_rounds(rows: list[dict], path: Path):
    """mean |x| against R at the largest width, log-log: a row per parametrization, a panel per step; the last
    round's visits (by physical sublayer), the embedding and the logits."""
    from loopnet.model import Visit
    from loopnet.study.plotting import pyplot

    plt = pyplot()
    width = max(r["width"] for r in rows)
    params = [p for p in PARAMETRIZATIONS if any(r["parametrization"] == p for r in rows)]
    steps = sorted({r["step"] for r in rows})
    fig, axes = plt.subplots(len(params), len(steps), figsize=(3.2 * len(steps), 2.8 * len(params)), squeeze=False)
    for row, param in enumerate(params):
        for col, step in enumerate(steps):
            ax = axes[row][col]
            series: dict[str, dict[int, list[float]]] = {}
            for r in rows:
                if (r["parametrization"], r["width"], r["step"]) != (param, width, step) or r["quantity"] == "loss":
                    continue
                q = r["quantity"]
                if "/" in q:
                    kind, tag = q.split("/", 1)
                    visit = Visit.parse(tag)
                    if kind == "state" or (visit.looped and visit.round != r["rounds"]):
                        continue  # the last round's visits only: comparable across R
                    q = f"{kind}/{visit.physical}"
                series.setdefault(q, {}).setdefault(r["rounds"], []).append(r["value"])
            for i, (q, by) in enumerate(sorted(series.items())):
                rs = sorted(by)
                fallback = (f"C{i % 10}", "--" if q.startswith("attn") else "-")
                style = {"logits": ("black", "-"), "embedding": ("0.5", "-")}.get(q, fallback)
                ax.plot(
                    rs,
                    [statistics.fmean(by[x]) for x in rs],
                    color=style[0],
                    ls=style[1],
                    marker="o",
                    ms=3,
                    label=q.replace("branch/", "last round's f: ").replace("attn_logits/", "last round's attn: "),
                )
            ax.set(xscale="log", yscale="log", title=f"{param}, d = {width}, step {step}")
            rounds = sorted({r["rounds"] for r in rows})
            ax.set_xticks(rounds, [str(x) for x in rounds])
            ax.minorticks_off()
            if row == len(params) - 1:
                ax.set_xlabel("rounds R")
            if col == 0:
                ax.set_ylabel("mean |x|")
    axes[0][-1].legend(fontsize=6)
    return fig, plt


def save_figure(fig, plt, path: Path, writer=None, tag: str | None = None) -> None:
    """The PNG (`loopnet.study.plotting.save`) and, with a SummaryWriter, the same image at `tag`."""
    from loopnet.study.plotting import save

    save(plt, fig, path)
    if writer is not None:
        import numpy as np
        from PIL import Image

        writer.add_image(tag, np.asarray(Image.open(path).convert("RGB")), dataformats="HWC")


def markdown(summary: list[dict], meta: dict) -> str:
    lines = [
        f"# {meta['title']}",
        "",
        "![mean |x| against width](coord_width.png)",
        "",
        "![mean |x| against R](coord_rounds.png)",
        "",
        "## How this was produced",
        "",
        "```bash",
        meta["command"],
        "```",
        "",
        f"- widths {meta['widths']}, R {meta['rounds']}, seeds {meta['seeds']}, {meta['steps']} AdamW step(s) "
        f"at a constant rate {meta['lr']:g} from the initialisation, gradient clipping {meta['clip']}; base "
        f"width d₀ = {meta['base_width']}; K = {meta['n_blocks']}, {meta['n_heads']} heads, sequence "
        f"{meta['seq_len']}, batch {meta['batch_size']}",
        f"- machine: {meta['machine']}; {meta['seconds']:.0f} s in all; loopnet @ {meta['commit']}",
        "",
        "## Slopes of log mean|x| against log d",
        "",
        "Mean over seeds, ± the 95% t half-width; the largest over visits of each kind.",
        "",
        "| parametrization | R | step | logits | embedding | branch (max over visits) | attention logits (max) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]

    def fmt(s):
        if s is None:
            return "—"
        return f"{s['slope']:+.2f}" + ("" if s["half_width"] is None else f" ± {s['half_width']:.2f}")

    keys = sorted(
        {(s["parametrization"], s["rounds"], s["step"]) for s in summary},
        key=lambda k: (PARAMETRIZATIONS.index(k[0]), k[1], k[2]),
    )
    for key in keys:
        cell = [s for s in summary if (s["parametrization"], s["rounds"], s["step"]) == key]
        pick = {q: next((s for s in cell if s["quantity"] == q), None) for q in ("logits", "embedding")}
        top = {
            k: max((s for s in cell if s["quantity"].startswith(k + "/")), key=lambda s: s["slope"], default=None)
            for k in ("branch", "attn_logits")
        }
        lines.append(
            f"| {key[0]} | {key[1]} | {key[2]} | {fmt(pick['logits'])} | {fmt(pick['embedding'])} | "
            f"{fmt(top['branch'])} | {fmt(top['attn_logits'])} |"
        )
    return "\n".join(lines) + "\n"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="loopnet coordcheck", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--widths", type=int, nargs="+", default=[64, 128, 256, 512], help="widths d (n_heads divides each)")
    p.add_argument("--rounds", type=int, nargs="+", default=[2], help="R values")
    p.add_argument("--parametrizations", nargs="+", default=list(PARAMETRIZATIONS), choices=PARAMETRIZATIONS)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    p.add_argument("--steps", type=int, default=4, help="AdamW steps from the initialisation, one panel each (1-20)")
    p.add_argument("--lr", type=float, help="the constant learning rate (default: the config's model.optim.lr)")
    p.add_argument("--base_width", type=int, help="d₀ of mup and completep (default: the smallest width)")
    p.add_argument("--base_depth", type=int, help="N₀ of completep (default: P + K·R + C at the smallest R)")
    p.add_argument("--out", required=True, help="folder for the CSVs, PNGs, report.md and tb/")
    p.add_argument("--title", default="Coordinate check per visit")
    return p


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    args, config_args = parser().parse_known_args(argv)
    with one_line_errors("loopnet coordcheck"):
        if not 1 <= args.steps <= 20:
            raise ValueError(f"--steps must be in 1..20, got {args.steps}; fix: give e.g. 4")
        if len(set(args.widths)) < 2 or min(args.widths) < 1:
            raise ValueError(f"--widths needs two or more positive widths, got {args.widths}; fix: e.g. 64 128 256")
        if min(args.rounds) < 1:
            raise ValueError(f"--rounds must all be >= 1, got {args.rounds}")
        from loopnet.study.probe import resolve

        base, optim, data, clip = resolve(config_args)
        if args.lr is not None:
            optim = replace(optim, lr=args.lr)
        base_width = args.base_width or min(args.widths)
        base_depth = args.base_depth or base.depth(min(args.rounds))
        for d in sorted(set(args.widths)):  # every cell's config checked before anything trains
            for R in args.rounds:
                for param in args.parametrizations:
                    arm_config(base, param, d, R, base_width, base_depth)
        from loopnet.model.parametrization import check_optimizer

        for param in args.parametrizations:
            check_optimizer(param, optim.optimizer)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from torch.utils.tensorboard import SummaryWriter

    from loopnet.study.provenance import git_commit

    data.setup("fit")
    loader = iter(data.train_dataloader())
    batches = [tuple(t.long() for t in next(loader)) for _ in range(args.steps)]
    start = time.perf_counter()
    rows = run(
        base,
        optim,
        batches,
        args.parametrizations,
        sorted(set(args.widths)),
        sorted(set(args.rounds)),
        args.seeds,
        clip,
        base_width,
        base_depth,
    )
    seconds = time.perf_counter() - start
    summary = slopes(rows)
    write_csvs(rows, summary, out)
    writer = SummaryWriter(str(out / "tb"))
    save_figure(*plot_width(rows, out / "coord_width.png"), out / "coord_width.png", writer, "coordcheck/width")
    save_figure(*plot_rounds(rows, out / "coord_rounds.png"), out / "coord_rounds.png", writer, "coordcheck/rounds")
    writer.close()
    info = machine()
    meta = {
        "title": args.title,
        "command": "loopnet coordcheck " + " ".join(shlex.quote(a) for a in argv),
        "widths": sorted(set(args.widths)),
        "rounds": sorted(set(args.rounds)),
        "seeds": args.seeds,
        "steps": args.steps,
        "lr": optim.lr,
        "clip": clip,
        "base_width": base_width,
        "n_blocks": base.n_blocks,
        "n_heads": base.n_heads,
        "seq_len": batches[0][0].shape[1],
        "batch_size": batches[0][0].shape[0],
        "seconds": seconds,
        "commit": git_commit() or "?",
        "machine": f"{info['cpus']} CPU(s), {info['platform']}, torch {info['torch']}",
    }
    (out / "report.md").write_text(markdown(summary, meta))
    print(f"loopnet coordcheck: {len(rows)} measurements in {seconds:.0f} s -> {out}/report.md")


def write_csvs(rows: list[dict], summary: list[dict], out: Path) -> None:
    with open(out / "coord_check.csv", "w", newline="") as f:
        w = csv.DictWriter(f, ["parametrization", "width", "rounds", "seed", "step", "quantity", "value"])
        w.writeheader()
        w.writerows(rows)
    with open(out / "coord_slopes.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["parametrization", "rounds", "step", "quantity", "seeds", "slope", "half_width", "per_seed"])
        for s in summary:
            w.writerow(
                [
                    s["parametrization"],
                    s["rounds"],
                    s["step"],
                    s["quantity"],
                    s["seeds"],
                    s["slope"],
                    s["half_width"],
                    " ".join(f"{x:.6g}" for x in s["per_seed"]),
                ]
            )


if __name__ == "__main__":
    main()
