"""Training throughput, MFU and memory of loopnet's training variants, as ratios measured in one run.

    loopnet bench [--smoke] [--out bench.md] [--json bench.json] [--steps 10] [--reps 3] ...
    loopnet bench sweep-startup ...   a sweep's cells started fresh and from the fit server (`loopnet.bench.sweep_startup`)
    loopnet bench generation ...      generation with and without the KV cache (`loopnet.bench.generation`)
    loopnet bench export ...          export and load of a GPT-2-small-sized model (`loopnet.bench.export`)
    loopnet bench huginn-memory ...   peak RSS of importing and loading a 1 B Huginn checkpoint (`...huginn_memory`)
    loopnet bench import-speed ...    loopnet's forward of an imported Huginn, Ouro or Parcae model against the
                                      reference code's (`...import_speed`); `huginn-speed` is its --format huginn
    python -m loopnet.bench ...

All variants train the same model on the same batches, in this process (all but one, which needs a
fresh process):

  bare          a plain PyTorch loop: forward, backward, gradient clipping at 1.0, LoopedLM's own
                AdamW and schedule (fused AdamW; bf16 autocast on CUDA or with --precision bf16).
                The baseline.
  lightning     the same LoopedLM through Lightning's Trainer with the CLI's default callbacks
                (ModelCheckpoint, GracefulInterrupt, LearningRateMonitor, TokenThroughput,
                DivergenceGuard, TensorBoard logging every 10 steps), VisitDiagnostics off.
  diagnostics   lightning plus VisitDiagnostics, logging once per timed window; the cost at the
                CLI's every_n_steps = 50 follows from it (the steps in between attach nothing).
  system malloc the bare loop in a child process that keeps glibc's default malloc settings,
                timed in windows interleaved with the bare loop here, which runs with loopnet's
                `keep_freed_memory()` as `loopnet fit` on CPU does (the HostMemory callback). CPU
                only; absent with --system-malloc, where every variant runs with glibc's defaults.
  compile       bare with `LoopedTransformer.compile()`; graphs and recompilations counted.
  checkpoint    bare with checkpoint_rounds (activation checkpointing per round).
  R = ...       bare at other round counts, same K: block time per round, linearity in R.
  data          bare fed by the real TokenStreamDataModule (embedded Shakespeare): time spent
                waiting in the loader's next() per step.
  nanoGPT       an independent plain GPT of loopnet's size (`loopnet.bench.nanogpt`: fused QKV, LayerNorm,
                SDPA, tied head; L = K layers) trained by nanoGPT's step: forward, backward, clipping at
                1.0, AdamW as nanoGPT configures it (fused on CUDA only). The baseline of
  preln R=1     loopnet's bare loop on the same model, Pre-LN at R = 1: K blocks, learned positions, tied
                head, the same batches. `--vs-nanogpt` runs these two rows alone (e.g. at GPT-2's
                vocabulary: --vs-nanogpt --d-model 256 --n-blocks 4 --seq-len 256 --vocab-size 50304).

Timing, in two phases so that the load of a shared machine cancels in the ratios. A: the bare loop,
lightning and diagnostics run whole windows of `steps` steps (after `warmup` steps; a fresh Trainer
each), `reps` times in alternating order; a window runs from the start of one step to the start of
the step after it (data fetch, every hook and logger included; synchronised on CUDA). B: the
bare-loop variants take one step each in turn (rotating order), `steps × reps` turns, each step
timed on its own. Tokens/s come from the median step time; a ratio is the median of the paired
(same rep, same turn) throughput ratios to the baseline.

MFU = model FLOPs (`LoopedTransformer.flops_per_token`, recomputation not counted)
× tokens/s / peak; the peak is the device's dense bf16 peak from a table on known GPUs (H100, H200,
A100), otherwise this machine's own matmul FLOP/s in the run's precision, the best of probes at start,
between the phases and at the end.

Memory, one forward + backward per configuration: "saved" is the bytes of the distinct tensors
autograd saves for backward (`torch.autograd.graph.saved_tensors_hooks`, parameters excluded);
"peak" is the peak of activations, gradients and temporaries above the step's start —
`torch.cuda.max_memory_allocated` on GPU, on CPU torch's MemTracker (a dispatch mode that follows
every tensor storage's allocation and release).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import asdict
from typing import Optional

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch  # noqa: E402

from loopnet.bench.memory import fmt_bytes, step_memory  # noqa: E402
from loopnet.bench.peak import Peak  # noqa: E402
from loopnet.bench.report import fast_paths, markdown  # noqa: E402
from loopnet.bench.settings import PROFILES, RealData, Settings, memory_loader, random_batches  # noqa: E402
from loopnet.bench.targets import TARGETS, evaluate, median  # noqa: E402
from loopnet.bench.variants import Bare, Lit, NanoGPTStep, Row, SystemMallocChild, step_breakdown  # noqa: E402
from loopnet.env import machine  # noqa: E402
from loopnet.model import LoopConfig  # noqa: E402
from loopnet.training.host_memory import keep_freed_memory  # noqa: E402


_T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[bench {time.perf_counter() - _T0:6.1f} s] {msg}", file=sys.stderr, flush=True)


def phase_a(s: Settings, rows: dict[str, Row], batches: list, base_cfg: LoopConfig, root: str, diag_every: int) -> None:
    """Phase A: the bare loop vs Lightning (and diagnostics, system malloc), whole windows, alternating order."""
    window = {
        "bare (windows)": Bare(s, base_cfg),
        "lightning": Lit(s, base_cfg, root, "lightning"),
        f"diagnostics@{diag_every}": Lit(s, base_cfg, root, "diagnostics", diag_every),
    }
    rows["bare (windows)"] = Row(
        "bare (windows)",
        "the bare loop timed in whole windows like the Trainer runs, interleaved with them: the baseline of lightning",
        base_cfg,
    )
    rows["lightning"] = Row(
        "lightning",
        "Lightning Trainer + the CLI's default callbacks, VisitDiagnostics off",
        base_cfg,
        "bare (windows)",
        str(TARGETS["lightning"]),
    )
    rows[f"diagnostics@{diag_every}"] = Row(
        f"diagnostics@{diag_every}",
        f"lightning + VisitDiagnostics(every_n_steps={diag_every}): one logging step per window",
        base_cfg,
        "lightning",
    )
    with contextlib.ExitStack() as stack:
        if s.keep_freed_memory:  # the contrast only exists when this process applied it
            window["system malloc"] = stack.enter_context(SystemMallocChild(s))
            rows["system malloc"] = Row(
                "system malloc",
                "the bare loop in a child process with glibc's default "
                "malloc, windows interleaved with bare (windows), which runs with "
                "keep_freed_memory() as `loopnet fit` on CPU does",
                base_cfg,
                "bare (windows)",
            )
        names = list(window)
        for rep in range(s.reps):
            for name in names if rep % 2 == 0 else names[::-1]:
                t = time.perf_counter()
                rows[name].times.append(window[name].run(memory_loader(batches), s.warmup, s.steps))
                log(
                    f"A {rep + 1}/{s.reps} {name:>16}: {rows[name].times[-1] * 1e3:9.1f} ms/step "
                    f"({time.perf_counter() - t:.1f} s)"
                )


def benchmark(s: Settings, smoke: bool, command: str) -> dict:
    warnings.filterwarnings("ignore")
    import logging

    for name in (
        "lightning.pytorch",
        "lightning.fabric",
        "lightning.pytorch.utilities.rank_zero",
        "lightning.fabric.utilities.rank_zero",
        "torch._dynamo",
        "torch._inductor",
    ):
        logging.getLogger(name).setLevel(logging.ERROR)

    t_start = time.perf_counter()
    info = machine(s.device)
    if not s.cuda and info.get("load_at_start", 0) > (os.cpu_count() or 1) and torch.get_num_threads() > 1:
        log(
            f"the machine is busy (load {info['load_at_start']:.1f} on {os.cpu_count()} CPUs): multi-threaded "
            f"kernels will wait on each other; --threads 1 gives steadier figures"
        )
    peak = Peak(s, smoke)
    log(f"peak probe at start: {peak.method}")
    K, R = s.n_blocks, s.n_rounds
    base_cfg = s.config()
    batches = random_batches(s, s.warmup + s.steps + 2)
    if s.cuda:
        batches = [(x.pin_memory(), y.pin_memory()) for x, y in batches]
    cycle = lambda: itertools.cycle(batches)  # noqa: E731
    root = tempfile.mkdtemp(prefix="loopnet-bench-")
    rows: dict[str, Row] = {}

    diag_every = s.steps  # exactly one logging step falls in every timed window
    if not s.only_nanogpt:
        phase_a(s, rows, batches, base_cfg, root, diag_every)
    shutil.rmtree(root, ignore_errors=True)  # the Trainers' logs and checkpoints
    peak.probe()

    # Phase B: bare-loop variants, one step each in turn (rotating order), times paired per turn.
    step_runners: dict[str, Bare] = {}

    def add(row: Row, runner: Bare) -> None:
        rows[row.name], step_runners[row.name] = row, runner

    # loopnet against an independent plain GPT of its size: Pre-LN at R = 1, as the GPT has L = K layers.
    preln = s.config(n_rounds=1, residual="preln")
    add(
        Row(
            "nanoGPT",
            f"an independent plain GPT (loopnet.bench.nanogpt: fused QKV, LayerNorm, SDPA, tied head), "
            f"{K} layers, nanoGPT's training step and AdamW",
            preln,
        ),
        NanoGPTStep(s, cycle()),
    )
    add(
        Row(
            "preln R=1",
            f"bare loop, Pre-LN, K={K} R=1 (the GPT's size), the same batches in the same turns",
            preln,
            "nanoGPT",
            str(TARGETS["nanogpt"]),
        ),
        Bare(s, preln, source=cycle()),
    )
    if not s.only_nanogpt:
        add(Row("bare", f"bare PyTorch loop, eager, K={K} R={R}", base_cfg), Bare(s, base_cfg, source=cycle()))
    if s.compile:
        from torch._dynamo.utils import counters
        from torch._functorch import config as functorch_config
        from torch._inductor import config as inductor_config

        # Compile from scratch, as a first run would: inductor's on-disk caches off.
        inductor_config.fx_graph_cache = False
        functorch_config.enable_autograd_cache = False
        graphs_before = counters["stats"]["unique_graphs"]
        add(
            Row(
                "compile",
                "bare loop, LoopedTransformer.compile(): each sublayer and the head compiled once",
                base_cfg,
                "bare",
                str(TARGETS["compile"]) if not s.cuda else "",
            ),
            Bare(s, base_cfg, True, cycle()),
        )
    ckpt_cfg = s.config(checkpoint_rounds=True)
    if not s.only_nanogpt:
        add(
            Row("checkpoint", "bare loop, checkpoint_rounds=True", ckpt_cfg, "bare", str(TARGETS["checkpoint"])),
            Bare(s, ckpt_cfg, source=cycle()),
        )
    for r in s.rounds:
        if r != R:
            add(
                Row(f"R={r}", f"bare loop, K={K} R={r}", s.config(n_rounds=r), "bare", str(TARGETS["rounds"])),
                Bare(s, s.config(n_rounds=r), source=cycle()),
            )
    real: Optional[RealData] = None
    if s.data:
        try:
            real = RealData(s)
            log(f"TokenStreamDataModule ready in {real.setup_s:.1f} s")
            add(
                Row(
                    "data",
                    f"bare loop fed by TokenStreamDataModule (shakespeare, num_workers={s.workers})",
                    base_cfg,
                    "bare",
                    str(TARGETS["data"]),
                ),
                Bare(s, base_cfg, source=real),
            )
        except Exception as err:  # noqa: BLE001 - the data package may be mid-change; report, don't die
            log(f"data variant skipped: {type(err).__name__}: {err}")
    names = list(step_runners)
    for name in names:  # warm-up (and compilation)
        t = time.perf_counter()
        for _ in range(s.warmup):
            step_runners[name].timed_step()
        log(f"B warm-up {name:>16}: {time.perf_counter() - t:.1f} s for {s.warmup} steps")
    turns = s.steps * s.reps
    for turn in range(turns):
        for name in names[turn % len(names) :] + names[: turn % len(names)]:
            elapsed, wait = step_runners[name].timed_step()
            rows[name].times.append(elapsed)
            rows[name].wait.append(wait)
        if (turn + 1) % max(1, turns // 5) == 0:
            log(
                f"B turn {turn + 1}/{turns}: "
                + ", ".join(f"{n} {median(rows[n].times) * 1e3:.0f}" for n in names)
                + " ms/step"
            )

    # Derived row: diagnostics at the CLI's every_n_steps = 50, from the measured windows.
    diag, lit = rows.get(f"diagnostics@{diag_every}"), rows.get("lightning")  # None with --vs-nanogpt: no phase A
    if diag is not None and diag_every < 50:
        at50 = [lt + (dt - lt) * diag_every / 50 for lt, dt in zip(lit.times, diag.times)]
        rows["diagnostics@50"] = Row(
            "diagnostics@50",
            "lightning + VisitDiagnostics(every_n_steps=50), the CLI "
            f"default: the extra time of diagnostics@{diag_every} spread over 50 steps",
            base_cfg,
            "lightning",
            str(TARGETS["diagnostics@50"]),
            at50,
            derived=True,
        )
    elif diag is not None:
        diag.target = str(TARGETS["diagnostics@50"])

    breakdown = step_breakdown(step_runners["bare"]) if "bare" in step_runners else None
    if s.compile:
        runner = step_runners["compile"]
        rows["compile"].extra = {
            "graphs": counters["stats"]["unique_graphs"] - graphs_before,
            "first_step_s": runner.first_step_s,
            "eager_breakdown": breakdown,
        }
        # Another round count R' must reuse the same graphs: one more training step at R' = R/2.
        before = counters["stats"]["unique_graphs"]
        x, y, _ = runner.fetch(runner.source)
        with runner.autocast:
            _, loss = runner.model(x, y, rounds=max(1, R // 2))
        loss.backward()
        runner.opt.zero_grad(set_to_none=True)
        rows["compile"].extra["new_graphs_other_R"] = counters["stats"]["unique_graphs"] - before
    if "data" in rows:
        d = rows["data"]
        d.extra = {
            "wait_ms": median(d.wait) * 1e3,
            "wait_frac": median([w / t for w, t in zip(d.wait, d.times)]),
            "setup_s": real.setup_s,
        }
    step_runners.clear()  # free the models before the memory measurements

    # Memory: one forward + backward per (K, R, checkpointing).
    memory: list[dict] = []
    if s.memory:
        ks = sorted({max(1, K // 2), K, 2 * K})
        configs = [(K, r) for r in sorted(set(s.rounds) | {R})] + [(k, R) for k in ks if k != K]
        for k, r in configs:
            entry = {"K": k, "R": r}
            for ckpt in (False, True):
                try:
                    m = step_memory(s, s.config(n_blocks=k, n_rounds=r, checkpoint_rounds=ckpt), batches[0])
                except torch.OutOfMemoryError:
                    m = {"saved": None, "peak": None}
                    torch.cuda.empty_cache()
                entry["ckpt" if ckpt else "plain"] = m
            memory.append(entry)
            log(
                f"memory K={k} R={r}: plain {fmt_bytes(entry['plain']['peak'])}, "
                f"ckpt {fmt_bytes(entry['ckpt']['peak'])}"
            )
        by = {(e["K"], e["R"]): e for e in memory}
        rows["bare"].peak_bytes = by[(K, R)]["plain"]["peak"]
        rows["checkpoint"].peak_bytes = by[(K, R)]["ckpt"]["peak"]
        for r in s.rounds:
            if f"R={r}" in rows:
                rows[f"R={r}"].peak_bytes = by[(K, r)]["plain"]["peak"]

    skipped = {}  # the variants a full run has and this one left out (--vs-nanogpt runs only its pair)
    if not s.compile and not s.only_nanogpt:
        skipped["compile"] = "skipped (--smoke runs it with --compile)" if smoke else "skipped (--no-compile)"
    if "data" not in rows and not s.only_nanogpt:
        skipped["data"] = "skipped (--no-data)" if not s.data else "skipped (TokenStreamDataModule failed, see the log)"
    peak.probe()
    result = evaluate(s, rows, memory, peak.flops)
    result["skipped"] = skipped
    result.update(
        machine=info,
        peak_flops=peak.flops,
        peak_method=peak.method,
        command=command,
        settings=asdict(s),
        seconds=time.perf_counter() - t_start,
        smoke=smoke,
        eager_breakdown=breakdown,
        fast_paths=fast_paths(s),
    )
    return result


# ----------------------------------------------------------------------------------------- CLI
def parse(argv: list[str]) -> tuple[argparse.Namespace, Settings]:
    p = argparse.ArgumentParser(
        prog="loopnet bench",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.split("\n")[2:]),
    )
    p.add_argument("--smoke", action="store_true", help="tiny sizes, two timed steps per variant, no compile (seconds)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    for name in (
        "vocab-size",
        "seq-len",
        "d-model",
        "n-heads",
        "n-blocks",
        "n-rounds",
        "batch-size",
        "steps",
        "warmup",
        "reps",
        "workers",
    ):
        p.add_argument(f"--{name}", type=int, default=None, help="default: from the device's profile")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch intra-op threads (default: torch's, 1 with --smoke: tiny ops gain nothing from more)",
    )
    p.add_argument(
        "--precision",
        choices=["bf16", "fp32"],
        default=None,
        help="bf16 autocast (Lightning's bf16-mixed) or fp32 (default: bf16 on CUDA, fp32 on CPU)",
    )
    p.add_argument("--rounds", type=int, nargs="+", default=[1, 3, 6, 12], help="round counts at fixed K")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile variant")
    p.add_argument("--compile", action="store_true", help="run the torch.compile variant even with --smoke")
    p.add_argument("--no-data", action="store_true", help="skip the real data-loader variant")
    p.add_argument("--no-memory", action="store_true", help="skip the memory table")
    p.add_argument(
        "--system-malloc",
        action="store_true",
        help="CPU: leave glibc's malloc settings as they are in this process (no keep_freed_memory(), "
        "as `loopnet fit --host_memory.keep_freed false`): every variant, compile included, "
        "runs with the system allocator",
    )
    p.add_argument(
        "--vs-nanogpt",
        action="store_true",
        help="only loopnet (Pre-LN, R = 1) against the independent nanoGPT of its size, one step each in "
        "turn; e.g. --vs-nanogpt --d-model 256 --n-blocks 4 --seq-len 256 --vocab-size 50304",
    )
    p.add_argument("--out", default=None, help="also write the markdown report here")
    p.add_argument("--json", default=None, help="also write every number as JSON here")
    args = p.parse_args(argv)
    threads = args.threads or (1 if args.smoke else None)
    if threads:
        torch.set_num_threads(threads)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    profile = dict(PROFILES["smoke" if args.smoke else ("cuda" if device.startswith("cuda") else "cpu")])
    for key in profile:
        if getattr(args, key, None) is not None:
            profile[key] = getattr(args, key)
    bf16 = args.precision == "bf16" if args.precision else device.startswith("cuda")
    only = args.vs_nanogpt  # the other variants off
    s = Settings(
        device=device,
        rounds=[] if only else sorted(set(args.rounds)),
        compile=(not args.smoke or args.compile) and not args.no_compile and not only,
        data=not args.no_data and not only,
        memory=not args.no_memory and not only,
        bf16=bf16,
        only_nanogpt=only,
        **profile,
    )
    s.config()  # fail early on a bad model shape
    return args, s


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    rows = {
        "sweep-startup": "loopnet.bench.sweep_startup",
        "generation": "loopnet.bench.generation",
        "export": "loopnet.bench.export",
        "huginn-memory": "loopnet.bench.huginn_memory",
        "import-speed": "loopnet.bench.import_speed",
    }
    if argv[:1] == ["huginn-speed"]:  # the Huginn row's own name
        argv = ["import-speed", "--format", "huginn", *argv[1:]]
    if argv[:1] and argv[0] in rows:  # rows of their own, each with its own --help
        import importlib

        return importlib.import_module(rows[argv[0]]).main(argv[1:])
    args, s = parse(argv)
    # As `loopnet fit` on CPU runs (the system-malloc row is the contrast).
    if args.system_malloc and s.cuda:
        log("--system-malloc changes nothing on CUDA (the host allocator only matters to CPU training)")
    if not s.cuda and not args.system_malloc:
        # Lightning loaded before the allocator setting, as in `loopnet fit` (its HostMemory callback).
        import lightning  # noqa: F401

        s.keep_freed_memory = keep_freed_memory()
    command = " ".join(["loopnet bench", *argv])
    res = benchmark(s, args.smoke, command)
    text = markdown(res)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2, default=str)


if __name__ == "__main__":
    main()
