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
    """Wall time and process CPU time of each step, from its on_train_batch_start to the next
    one's (or to the end of training)."""

    def __init__(self):
        self.stamps: list[tuple[float, float]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.stamps.append((time.perf_counter(), time.process_time()))

    def on_train_end(self, trainer, pl_module):
        self.stamps.append((time.perf_counter(), time.process_time()))

    def step_times(self, clock: int) -> list[float]:
        return [b[clock] - a[clock] for a, b in zip(self.stamps, self.stamps[1:])]


def run(variant: str, steps: int, every: int, root: str) -> StepTimer:
    torch.manual_seed(0)
    module = LoopedLM(config=LoopConfig(**CONFIG), optim=OptimConfig(lr=1e-3, warmup_steps=10))
    tokens = torch.randint(0, CONFIG["vocab_size"], (steps * BATCH, CONFIG["seq_len"] + 1))
    data = DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=BATCH)
    timer = StepTimer()
    extra = {"none": [], "diagnostics": [VisitDiagnostics(every_n_steps=every)],
             "guard": [DivergenceGuard()]}[variant]
    trainer = L.Trainer(
        default_root_dir=root, logger=TensorBoardLogger(root, name=variant), max_steps=steps, accelerator="cpu",
        devices=1, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        log_every_n_steps=every, limit_val_batches=0, gradient_clip_val=1.0, callbacks=[timer, *extra],
    )
    trainer.fit(module, data)
    return timer


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
    timers: dict[str, list[StepTimer]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as root:
        for rep in range(args.reps):
            for v in variants if rep % 2 == 0 else variants[::-1]:
                timers[v].append(run(v, args.steps, args.every, root))

    cfg = LoopConfig(**CONFIG)
    print(f"tiny LoopedLM K={cfg.n_blocks} R={cfg.n_rounds} d={cfg.d_model} T={cfg.seq_len} batch={BATCH}, "
          f"{args.steps} steps x {args.reps} reps, CPU, {torch.get_num_threads()} thread(s), {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}")
    logging = lambda step: step % args.every == 0  # noqa: E731
    between = lambda step: not logging(step)  # noqa: E731
    for clock, name in ((0, "wall"), (1, "CPU")):
        def ms(v, keep=lambda step: True):
            """Median over reps of the mean step time (ms) over the kept steps past warm-up."""
            return 1e3 * statistics.median(
                statistics.mean(t for i, t in enumerate(timer.step_times(clock)) if i >= args.warmup and keep(i))
                for timer in timers[v])

        base, diag, guard = ms("none"), ms("diagnostics"), ms("guard")
        extra = ms("diagnostics", logging) - ms("none", logging)  # Lightning logs on these steps too
        print(f"[{name} time]")
        print(f"  no callback                        {base:8.2f} ms/step")
        print(f"  VisitDiagnostics every {args.every:<4d}        {diag:8.2f} ms/step   "
              f"ratio {diag / base:.3f} (target <= 1.03)")
        print(f"    steps between logging steps      {ms('diagnostics', between):8.2f} ms/step   "
              f"ratio {ms('diagnostics', between) / ms('none', between):.3f} to the same steps without")
        print(f"    a logging step costs             {extra:+8.2f} ms      ({extra / base:.1f} plain steps)")
        print(f"  DivergenceGuard (every step)       {guard:8.2f} ms/step   ratio {guard / base:.3f}")


if __name__ == "__main__":
    main()
