"""Cost of the diagnostics: training step time with `VisitDiagnostics` (every 50 steps) against no
callback, and the extra time of one logging step.

    python -m loopnet.bench.diagnostics_overhead [--steps 150] [--reps 3] [--every 50] [--threads 1]

A tiny LoopedLM (K = 2, R = 3, d = 64, DeepLoop) trains on random tokens on the CPU, with the same
Trainer and TensorBoardLogger in every variant. A step's time is the wall time from one
`on_train_batch_start` to the next (forward, backward, optimiser, every callback and logger).
Variants run interleaved, in alternating order, `reps` times; the figures are medians over reps of
per-run means, the first `warmup` steps of each run left out. The DivergenceGuard, which checks the
loss and the gradient norm at every step, is measured too. One intra-op thread by default: a tiny
model gains nothing from more, and on a busy machine oversubscribed threads make timings noise.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import warnings

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from torch.utils.data import DataLoader, TensorDataset

from loopnet.diagnostics import DivergenceGuard, VisitDiagnostics
from loopnet.model import LoopConfig
from loopnet.training.module import LoopedLM, OptimConfig

CONFIG = dict(vocab_size=512, seq_len=64, d_model=64, n_heads=4, n_blocks=2, n_rounds=3, residual="deeploop")
BATCH = 8


class StepTimer(Callback):
    """Wall time of each step, from its on_train_batch_start to the next one's (or to the end)."""

    def __init__(self):
        self.starts: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.starts.append(time.perf_counter())

    def on_train_end(self, trainer, pl_module):
        self.starts.append(time.perf_counter())

    def step_times(self) -> list[float]:
        return [b - a for a, b in zip(self.starts, self.starts[1:])]


def run(variant: str, steps: int, every: int, root: str) -> list[float]:
    torch.manual_seed(0)
    module = LoopedLM(config=LoopConfig(**CONFIG), optim=OptimConfig(lr=1e-3, warmup_steps=10))
    tokens = torch.randint(0, CONFIG["vocab_size"], (steps * BATCH, CONFIG["seq_len"] + 1))
    data = DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=BATCH)
    timer = StepTimer()
    extra = {"none": [], "diagnostics": [VisitDiagnostics(every_n_steps=every)], "guard": [DivergenceGuard()]}[variant]
    trainer = L.Trainer(
        default_root_dir=root, logger=TensorBoardLogger(root, name=variant), max_steps=steps, accelerator="cpu",
        devices=1, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        log_every_n_steps=every, limit_val_batches=0, gradient_clip_val=1.0, callbacks=[timer, *extra],
    )
    trainer.fit(module, data)
    return timer.step_times()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=150, help="steps per run")
    p.add_argument("--reps", type=int, default=3, help="interleaved repetitions of each variant")
    p.add_argument("--every", type=int, default=50, help="VisitDiagnostics.every_n_steps")
    p.add_argument("--warmup", type=int, default=10, help="first steps of each run left out")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    variants = ["none", "diagnostics", "guard"]
    times: dict[str, list[list[float]]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as root:
        for rep in range(args.reps):
            for v in variants if rep % 2 == 0 else variants[::-1]:
                times[v].append(run(v, args.steps, args.every, root)[args.warmup:])

    def median_mean(v, keep=lambda step: True):
        return statistics.median(
            statistics.mean(t for i, t in enumerate(ts, start=args.warmup) if keep(i)) for ts in times[v])

    logging = lambda step: step % args.every == 0  # noqa: E731
    base = median_mean("none")
    diag_all = median_mean("diagnostics")
    diag_between = median_mean("diagnostics", lambda s: not logging(s))
    base_between = median_mean("none", lambda s: not logging(s))
    diag_logging = median_mean("diagnostics", logging)
    base_logging = median_mean("none", logging)  # Lightning's own logging also happens on these steps
    guard = median_mean("guard")

    cfg = LoopConfig(**CONFIG)
    print(f"tiny LoopedLM K={cfg.n_blocks} R={cfg.n_rounds} d={cfg.d_model} T={cfg.seq_len} batch={BATCH}, "
          f"{args.steps} steps x {args.reps} reps, CPU, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs")
    print(f"no callback                          {base * 1e3:8.2f} ms/step")
    print(f"VisitDiagnostics every {args.every:<4d}         {diag_all * 1e3:8.2f} ms/step   "
          f"ratio {diag_all / base:.3f} (target <= 1.03)")
    print(f"  steps between logging steps        {diag_between * 1e3:8.2f} ms/step   "
          f"ratio {diag_between / base_between:.3f} to the same steps without")
    print(f"  a logging step                     {diag_logging * 1e3:8.2f} ms        "
          f"+{(diag_logging - base_logging) * 1e3:.2f} ms over the same step without "
          f"({(diag_logging - base_logging) / base_between:.1f} plain steps)")
    print(f"DivergenceGuard (every step)         {guard * 1e3:8.2f} ms/step   ratio {guard / base:.3f}")


if __name__ == "__main__":
    main()
