"""The training variants the benchmark times: the bare PyTorch loop and its variants, nanoGPT's step,
the same model through Lightning's Trainer with `loopnet fit`'s callbacks, and the bare loop in a child
process with the system's malloc."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Optional

import torch

from loopnet.bench.settings import Settings, memory_loader, random_batches, sync
from loopnet.model import LoopConfig


@dataclass
class Row:
    name: str
    description: str
    config: LoopConfig
    baseline: Optional[str] = None
    target: str = ""
    times: list[float] = field(default_factory=list)  # seconds per step: per window (phase A) or per step (B)
    wait: list[float] = field(default_factory=list)  # data-loader wait, paired with times
    extra: dict = field(default_factory=dict)
    peak_bytes: Optional[int] = None
    derived: bool = False


class Bare:
    """A plain PyTorch training loop over LoopedLM's model, optimiser and schedule."""

    def __init__(self, s: Settings, config: LoopConfig, compile: bool = False, source=None):
        from loopnet.training.module import LoopedLM, OptimConfig

        torch.manual_seed(0)
        self.s = s
        self.lm = LoopedLM(config=config, optim=OptimConfig(warmup_steps=10, decay_steps=100_000)).to(s.device)
        self.model = self.lm.model
        if compile:
            self.model.compile()
        opt = self.lm.configure_optimizers()  # AdamW, fused
        self.opt, self.sched = opt["optimizer"], opt["lr_scheduler"]["scheduler"]
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.autocast = s.autocast()
        self.source = source  # an endless iterator of (inputs, targets) for timed_step
        self.first_step_s: Optional[float] = None

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        with self.autocast:
            _, loss = self.model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)

    def fetch(self, it) -> tuple[torch.Tensor, torch.Tensor, float]:
        t = time.perf_counter()
        x, y = next(it)
        wait = time.perf_counter() - t
        return x.to(self.s.device, non_blocking=True), y.to(self.s.device, non_blocking=True), wait

    def timed_step(self) -> tuple[float, float]:
        """One step from `source`: (seconds, of which waiting for the loader); synchronised on CUDA."""
        sync(self.s.device)
        t = time.perf_counter()
        x, y, wait = self.fetch(self.source)
        self.step(x, y)
        sync(self.s.device)
        elapsed = time.perf_counter() - t
        if self.first_step_s is None:
            self.first_step_s = elapsed
        return elapsed, wait

    def run(self, source, warmup: int, steps: int) -> float:
        """Seconds per step over a window of `steps` steps after `warmup` (phase A)."""
        it, t0 = iter(source), 0.0
        for i in range(warmup + steps):
            if i == warmup:
                sync(self.s.device)
                t0 = time.perf_counter()
            x, y, _ = self.fetch(it)
            self.step(x, y)
        sync(self.s.device)
        return (time.perf_counter() - t0) / steps


class NanoGPTStep(Bare):
    """nanoGPT's training step on the bench's independent GPT of loopnet's size (L = K layers): forward,
    backward, clipping at 1.0, AdamW with nanoGPT's groups and lr set per step, fused on CUDA only (as
    nanoGPT's configure_optimizers decides)."""

    def __init__(self, s: Settings, source):
        from loopnet.bench.nanogpt import GPT, GPTConfig

        torch.manual_seed(0)
        self.s, self.source, self.first_step_s = s, source, None
        self.model = GPT(
            GPTConfig(
                vocab_size=s.vocab_size, block_size=s.seq_len, n_layer=s.n_blocks, n_head=s.n_heads, n_embd=s.d_model
            )
        ).to(s.device)
        self.opt = self.model.optimizer(lr=6e-4, weight_decay=0.1, fused=s.cuda)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.autocast = s.autocast()

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        for group in self.opt.param_groups:
            group["lr"] = 6e-4
        with self.autocast:
            _, loss = self.model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


class Lit:
    """The same LoopedLM through Lightning's Trainer with the default callbacks; a fresh Trainer per run."""

    def __init__(self, s: Settings, config: LoopConfig, root: str, name: str, diagnostics_every: int = 0):
        from loopnet.training.module import LoopedLM, OptimConfig

        torch.manual_seed(0)
        self.s, self.root, self.name, self.diagnostics_every = s, root, name, diagnostics_every
        self.lm = LoopedLM(config=config, optim=OptimConfig(warmup_steps=10, decay_steps=100_000))

    def callbacks(self) -> list:
        """The callbacks `loopnet fit` adds, with its defaults, but: checkpoints in this run's folder,
        VisitDiagnostics every `diagnostics_every` steps or not at all, and HostMemory's keep_freed
        False under --system-malloc, so that no Trainer changes this process's allocator."""
        from loopnet.training.defaults import default_callbacks

        return default_callbacks(
            checkpoint={"dirpath": os.path.join(self.root, self.name, "checkpoints")},
            diagnostics={"every_n_steps": self.diagnostics_every} if self.diagnostics_every else None,
            host_memory={"keep_freed": self.s.cuda or self.s.keep_freed_memory},
        )

    def run(self, source, warmup: int, steps: int) -> float:
        """Seconds per step from the start of step `warmup` to the start of step `warmup + steps`."""
        import lightning as L
        from lightning.pytorch.callbacks import Callback
        from lightning.pytorch.loggers import TensorBoardLogger

        from loopnet.training.defaults import TRAINER_DEFAULTS

        dev = self.s.device
        marks: dict[int, float] = {}

        class WindowTimer(Callback):
            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                if batch_idx in (warmup, warmup + steps):
                    sync(dev)
                    marks[batch_idx] = time.perf_counter()

        trainer = L.Trainer(
            accelerator="gpu" if self.s.cuda else "cpu",
            devices=1,
            precision="bf16-mixed" if self.s.bf16 else "32-true",
            max_steps=warmup + steps + 1,
            limit_val_batches=0,
            num_sanity_val_steps=0,
            gradient_clip_val=TRAINER_DEFAULTS["gradient_clip_val"],
            log_every_n_steps=TRAINER_DEFAULTS["log_every_n_steps"],
            logger=TensorBoardLogger(self.root, name=self.name),
            callbacks=[*self.callbacks(), WindowTimer()],
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=self.root,
        )
        trainer.fit(self.lm, train_dataloaders=source)
        return (marks[warmup + steps] - marks[warmup]) / steps


class SystemMallocChild:
    """The bare loop in a child process with glibc's default malloc.

    glibc stops adapting its mmap threshold after any `mallopt` call, so its default behaviour
    cannot be restored in this process: the child never calls it. It builds the same model and
    batches and times a window per request on stdin, so its windows interleave with this
    process's and both see the same machine load. Use it as a context manager."""

    TIMEOUT_S = 900.0  # one window, model construction included

    def __init__(self, s: Settings):
        import subprocess

        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from loopnet.bench.variants import system_malloc_child; system_malloc_child()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._send({"settings": asdict(s) | {"keep_freed_memory": False}, "threads": torch.get_num_threads()})

    def _send(self, msg: dict) -> dict:
        import select

        try:
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise RuntimeError(
                f"the system-malloc child exited with {self.proc.wait()} (its stderr is above)"
            ) from None
        ready, _, _ = select.select([self.proc.stdout], [], [], self.TIMEOUT_S)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            raise RuntimeError(
                "the system-malloc child "
                + (f"exited with {self.proc.poll()}" if ready else f"gave no answer in {self.TIMEOUT_S:.0f} s")
                + " (its stderr is above)"
            )
        return json.loads(line)

    def run(self, source, warmup: int, steps: int) -> float:
        return self._send({"warmup": warmup, "steps": steps})["seconds_per_step"]

    def __enter__(self) -> "SystemMallocChild":
        return self

    def __exit__(self, *exc) -> None:
        import subprocess

        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def system_malloc_child() -> None:
    """The child side of SystemMallocChild: settings on the first line, then one window per line."""
    first = json.loads(sys.stdin.readline())
    torch.set_num_threads(first["threads"])
    s = Settings(**first["settings"])
    runner = Bare(s, s.config())
    batches = random_batches(s, s.warmup + s.steps + 2)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        print(
            json.dumps({"seconds_per_step": runner.run(memory_loader(batches), req["warmup"], req["steps"])}),
            flush=True,
        )


def step_breakdown(runner: Bare) -> Optional[dict]:
    """Share of one eager step's operator time in matmuls, in attention and in everything else (CPU)."""
    if runner.s.cuda:
        return None
    from torch.profiler import ProfilerActivity, profile

    x, y, _ = runner.fetch(runner.source)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        runner.step(x, y)
    parts = {"matmul": 0.0, "attention": 0.0, "other": 0.0}
    for e in prof.key_averages():
        part = (
            "matmul"
            if e.key in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
            else "attention"
            if "scaled_dot_product" in e.key
            else "other"
        )
        parts[part] += e.self_cpu_time_total
    total = sum(parts.values()) or 1.0
    return {k: v / total for k, v in parts.items()}
