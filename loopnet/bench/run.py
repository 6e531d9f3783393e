"""Training throughput, MFU and memory of loopnet's training variants, as ratios measured in one run.

    loopnet bench [--smoke] [--out bench.md] [--json bench.json] [--steps 10] [--reps 3] ...
    python -m loopnet.bench.run ...            (or python -m loopnet.bench)

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
import platform
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Optional

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from loopnet.data.tokenizer import N_VOCAB  # noqa: E402
from loopnet.model import LoopConfig, LoopedTransformer  # noqa: E402
from loopnet.training.host_memory import keep_freed_memory  # noqa: E402


TARGETS = {
    "lightning": "≥ 0.95× bare (overhead ≤ 5%)",
    "diagnostics@50": "≥ 0.97× lightning",
    "compile": "≥ 1.2× eager (CPU)",
    "checkpoint": "memory/round ≤ ¼ of no-ckpt",
    "rounds": "block time linear in R (±10%)",
    "data": "loader wait ≤ 5% of step",
    "mfu": "≥ 40% MFU (H100/H200, bf16)",
    "nanogpt": "≥ 1.1× nanoGPT (CPU)",
}


# ----------------------------------------------------------------------------------------- settings
@dataclass
class Settings:
    device: str
    vocab_size: int
    seq_len: int
    d_model: int
    n_heads: int
    n_blocks: int
    n_rounds: int
    batch_size: int
    steps: int
    warmup: int
    reps: int
    rounds: list[int]
    workers: int
    compile: bool
    data: bool
    memory: bool
    residual: str = "deeploop"
    wiring: str = "lt"
    keep_freed_memory: bool = False  # whether this process applied loopnet.training.host_memory.keep_freed_memory
    only_nanogpt: bool = False  # --vs-nanogpt: only the nanoGPT and preln R=1 rows
    bf16: bool = False  # bf16 autocast (Lightning's bf16-mixed); the default on CUDA, --precision bf16 on CPU

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    def autocast(self):
        """The forward's precision context: bf16 autocast, or nothing (fp32)."""
        if not self.bf16:
            return contextlib.nullcontext()
        return torch.autocast("cuda" if self.cuda else "cpu", dtype=torch.bfloat16)

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len

    def config(self, **kw) -> LoopConfig:
        base = dict(vocab_size=self.vocab_size, seq_len=self.seq_len, d_model=self.d_model,
                    n_heads=self.n_heads, n_blocks=self.n_blocks, n_rounds=self.n_rounds,
                    residual=self.residual, wiring=self.wiring)
        return LoopConfig(**(base | kw))


PROFILES = {
    # CPU: the CLI's cpu.yaml model (d 128, 4 heads, T 128, batch 8, K 2 x R 6) with a 8192-token
    # vocabulary, so that the blocks, not a 50k-way head, dominate a step (--vocab-size 50304: GPT-2's).
    "cpu": dict(vocab_size=8192, seq_len=128, d_model=128, n_heads=4, n_blocks=2, n_rounds=6, batch_size=8,
                steps=10, warmup=2, reps=3, workers=0),
    # GPU: configs/base.yaml, GPT-2-small width.
    "cuda": dict(vocab_size=50304, seq_len=1024, d_model=768, n_heads=12, n_blocks=2, n_rounds=6, batch_size=16,
                 steps=20, warmup=3, reps=3, workers=4),
    "smoke": dict(vocab_size=256, seq_len=32, d_model=32, n_heads=2, n_blocks=2, n_rounds=6, batch_size=2,
                  steps=2, warmup=1, reps=1, workers=0),
}


# ----------------------------------------------------------------------------------------- machine
def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(s: Settings) -> dict:
    import lightning

    info = {"cpu": cpu_model(), "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "lightning": lightning.__version__, "python": platform.python_version(),
            "device": "cpu"}
    if s.cuda:
        info["device"] = torch.cuda.get_device_name(s.device)
        info["cuda"] = torch.version.cuda
    if hasattr(os, "getloadavg"):
        info["load_at_start"] = os.getloadavg()[0]
    return info


def matmul_flops(device: str, dtype: torch.dtype, n: int, seconds: float = 0.4, trials: int = 5) -> float:
    """Best-of-`trials` FLOP/s of an n×n matmul on `device` (the machine's own peak)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    best = 0.0
    for _ in range(trials):
        sync(device)
        k, start = 0, time.perf_counter()
        while True:
            a @ b
            k += 1
            if k % 4 == 0:
                sync(device)
                if time.perf_counter() - start > seconds:
                    break
        best = max(best, 2 * n**3 * k / (time.perf_counter() - start))
    return best


class Peak:
    """The FLOP/s that MFU divides by. Known GPUs: the datasheet's dense bf16 peak. Otherwise this
    machine's own matmul FLOP/s in the run's precision (fp32 or bf16), probed at start, between the phases and at the end;
    the best probe counts, so that a probe slowed by other work on a shared machine does not
    inflate MFU."""

    def __init__(self, s: Settings, smoke: bool):
        self.s, self.probes = s, []
        self.datasheet: Optional[tuple[str, float]] = None
        if s.cuda and s.bf16:
            from loopnet.training.callbacks import gpu_bf16_peak  # imports Lightning: only here

            name = torch.cuda.get_device_name(s.device)
            peak = gpu_bf16_peak(name)
            self.datasheet = (name, peak) if peak is not None else None
        self.n = 256 if smoke else (8192 if s.cuda else 1024)
        self.seconds = 0.1 if smoke else 0.4
        self.probe()

    def probe(self) -> None:
        if self.datasheet is None:
            dtype = torch.bfloat16 if self.s.bf16 else torch.float32
            self.probes.append(matmul_flops(self.s.device, dtype, self.n, seconds=self.seconds))

    @property
    def flops(self) -> float:
        return self.datasheet[1] if self.datasheet else max(self.probes)

    @property
    def method(self) -> str:
        if self.datasheet:
            return f"{self.datasheet[0]}: dense bf16 peak {self.datasheet[1] / 1e12:.0f} TFLOP/s (datasheet)"
        dtype = "bf16" if self.s.bf16 else "fp32"
        what = (f"{torch.cuda.get_device_name(self.s.device)} {dtype}" if self.s.cuda
                else f"this CPU's {dtype}, {torch.get_num_threads()} threads,")
        unit, scale = ("TFLOP/s", 1e12) if self.s.cuda else ("GFLOP/s", 1e9)
        return (f"{what} {self.n}×{self.n} matmul, best of 5 trials at start, between the phases and at the end: "
                f"{self.flops / scale:.1f} {unit} (the probes: "
                + ", ".join(f"{p / scale:.1f}" for p in self.probes) + ")")


# ----------------------------------------------------------------------------------------- data
def random_batches(s: Settings, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, s.vocab_size, (n, s.batch_size, s.seq_len + 1), generator=g)
    return [(t[:, :-1].contiguous(), t[:, 1:].contiguous()) for t in tokens]


def memory_loader(batches: list) -> DataLoader:
    """The in-memory batches through a DataLoader, pinned on CUDA (as the real loader does)."""
    return DataLoader(batches, batch_size=None, shuffle=False, pin_memory=torch.cuda.is_available())


class RealData:
    """The real training stream: TokenStreamDataModule(source=shakespeare).train_dataloader()."""

    def __init__(self, s: Settings):
        from loopnet.data import TokenStreamDataModule

        start = time.perf_counter()
        self.dm = TokenStreamDataModule(seq_len=s.seq_len, batch_size=s.batch_size, num_workers=s.workers, seed=0)
        self.dm.setup("fit")
        self.iterator = iter(self.dm.train_dataloader())
        self.setup_s = time.perf_counter() - start
        self.vocab_size = s.vocab_size

    def __iter__(self):
        return self

    def __next__(self):
        x, y = next(self.iterator)
        if self.vocab_size < N_VOCAB:  # a benchmark vocabulary smaller than GPT-2's: fold the ids into it
            x, y = x.remainder(self.vocab_size), y.remainder(self.vocab_size)
        return x, y


# ----------------------------------------------------------------------------------------- variants
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


def default_callbacks(root: str, diagnostics_every: int, keep_freed: bool = True) -> list:
    """The callbacks `loopnet fit` adds (training/cli.py), with its defaults (`keep_freed`: HostMemory's,
    False under --system-malloc so that no Trainer changes this process's allocator)."""
    from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint

    from loopnet.diagnostics import DivergenceGuard, VisitDiagnostics
    from loopnet.training.callbacks import GracefulInterrupt, HostMemory, TokenThroughput
    from loopnet.training.cli import CHECKPOINT_DEFAULTS

    callbacks = [
        ModelCheckpoint(dirpath=os.path.join(root, "checkpoints"), **CHECKPOINT_DEFAULTS),
        GracefulInterrupt(),
        LearningRateMonitor(logging_interval="step"),
        TokenThroughput(),
        DivergenceGuard(),
        HostMemory(keep_freed=keep_freed),
    ]
    if diagnostics_every:
        callbacks.append(VisitDiagnostics(every_n_steps=diagnostics_every))
    return callbacks


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
        self.model = GPT(GPTConfig(vocab_size=s.vocab_size, block_size=s.seq_len, n_layer=s.n_blocks,
                                   n_head=s.n_heads, n_embd=s.d_model)).to(s.device)
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

    def run(self, source, warmup: int, steps: int) -> float:
        """Seconds per step from the start of step `warmup` to the start of step `warmup + steps`."""
        import lightning as L
        from lightning.pytorch.callbacks import Callback
        from lightning.pytorch.loggers import TensorBoardLogger

        dev = self.s.device
        marks: dict[int, float] = {}

        class WindowTimer(Callback):
            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                if batch_idx in (warmup, warmup + steps):
                    sync(dev)
                    marks[batch_idx] = time.perf_counter()

        trainer = L.Trainer(
            accelerator="gpu" if self.s.cuda else "cpu", devices=1,
            precision="bf16-mixed" if self.s.bf16 else "32-true",
            max_steps=warmup + steps + 1, limit_val_batches=0, num_sanity_val_steps=0,
            gradient_clip_val=1.0, log_every_n_steps=10,
            logger=TensorBoardLogger(self.root, name=self.name),
            callbacks=[*default_callbacks(os.path.join(self.root, self.name), self.diagnostics_every,
                                          keep_freed=self.s.cuda or self.s.keep_freed_memory), WindowTimer()],
            enable_progress_bar=False, enable_model_summary=False, default_root_dir=self.root,
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
            [sys.executable, "-c", "from loopnet.bench.run import system_malloc_child; system_malloc_child()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._send({"settings": asdict(s) | {"keep_freed_memory": False}, "threads": torch.get_num_threads()})

    def _send(self, msg: dict) -> dict:
        import select

        try:
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise RuntimeError(f"the system-malloc child exited with {self.proc.wait()} (its stderr is above)") from None
        ready, _, _ = select.select([self.proc.stdout], [], [], self.TIMEOUT_S)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            raise RuntimeError("the system-malloc child " + (f"exited with {self.proc.poll()}" if ready else
                               f"gave no answer in {self.TIMEOUT_S:.0f} s") + " (its stderr is above)")
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
        print(json.dumps({"seconds_per_step": runner.run(memory_loader(batches), req["warmup"], req["steps"])}),
              flush=True)


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
        part = ("matmul" if e.key in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
                else "attention" if "scaled_dot_product" in e.key else "other")
        parts[part] += e.self_cpu_time_total
    total = sum(parts.values()) or 1.0
    return {k: v / total for k, v in parts.items()}


# ----------------------------------------------------------------------------------------- memory
def step_memory(s: Settings, config: LoopConfig, batch) -> dict:
    """Saved-for-backward bytes and peak bytes of one forward + backward (see the module docstring)."""
    torch.manual_seed(0)
    model = LoopedTransformer(config).to(s.device)
    x, y = (t.to(s.device) for t in batch)
    autocast = s.autocast()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params and ptr != 0:
            saved[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
        _, loss = model(x, y)
    loss.backward()
    model.zero_grad(set_to_none=True)
    out = {"saved": sum(saved.values()), "peak": None}
    del loss
    if s.cuda:
        sync(s.device)
        torch.cuda.reset_peak_memory_stats(s.device)
        base = torch.cuda.memory_allocated(s.device)
        with autocast:
            _, loss = model(x, y)
        loss.backward()
        sync(s.device)
        out["peak"] = torch.cuda.max_memory_allocated(s.device) - base
    else:
        try:
            from torch.distributed._tools.mem_tracker import MemTracker
        except ImportError:  # torch built without distributed
            return out
        tracker = MemTracker()
        tracker.track_external(model)
        with tracker:
            with autocast:
                _, loss = model(x, y)
            loss.backward()
        snap = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
        out["peak"] = sum(v for k, v in snap.items() if str(k).rsplit(".", 1)[-1] in ("GRAD", "ACT", "TEMP", "OTH"))
    model.zero_grad(set_to_none=True)
    return out


# ----------------------------------------------------------------------------------------- the run
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


def fmt_bytes(n: Optional[float]) -> str:
    if n is None:
        return "—"
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 or n == 0 else f"{n / 2**10:.0f} KiB"


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
    rows["bare (windows)"] = Row("bare (windows)", "the bare loop timed in whole windows like the Trainer runs, "
                                 "interleaved with them: the baseline of lightning", base_cfg)
    rows["lightning"] = Row("lightning", "Lightning Trainer + the CLI's default callbacks, VisitDiagnostics off",
                            base_cfg, "bare (windows)", TARGETS["lightning"])
    rows[f"diagnostics@{diag_every}"] = Row(
        f"diagnostics@{diag_every}", f"lightning + VisitDiagnostics(every_n_steps={diag_every}): one logging step "
        "per window", base_cfg, "lightning")
    with contextlib.ExitStack() as stack:
        if s.keep_freed_memory:  # the contrast only exists when this process applied it
            window["system malloc"] = stack.enter_context(SystemMallocChild(s))
            rows["system malloc"] = Row("system malloc", "the bare loop in a child process with glibc's default "
                                        "malloc, windows interleaved with bare (windows), which runs with "
                                        "keep_freed_memory() as `loopnet fit` on CPU does", base_cfg, "bare (windows)")
        names = list(window)
        for rep in range(s.reps):
            for name in names if rep % 2 == 0 else names[::-1]:
                t = time.perf_counter()
                rows[name].times.append(window[name].run(memory_loader(batches), s.warmup, s.steps))
                log(f"A {rep + 1}/{s.reps} {name:>16}: {rows[name].times[-1] * 1e3:9.1f} ms/step "
                    f"({time.perf_counter() - t:.1f} s)")


def benchmark(s: Settings, smoke: bool, command: str) -> dict:
    warnings.filterwarnings("ignore")
    import logging

    for name in ("lightning.pytorch", "lightning.fabric", "lightning.pytorch.utilities.rank_zero",
                 "lightning.fabric.utilities.rank_zero", "torch._dynamo", "torch._inductor"):
        logging.getLogger(name).setLevel(logging.ERROR)

    t_start = time.perf_counter()
    info = machine(s)
    if not s.cuda and info.get("load_at_start", 0) > (os.cpu_count() or 1) and torch.get_num_threads() > 1:
        log(f"the machine is busy (load {info['load_at_start']:.1f} on {os.cpu_count()} CPUs): multi-threaded "
            f"kernels will wait on each other; --threads 1 gives steadier figures")
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
    add(Row("nanoGPT", f"an independent plain GPT (loopnet.bench.nanogpt: fused QKV, LayerNorm, SDPA, tied head), "
            f"{K} layers, nanoGPT's training step and AdamW", preln), NanoGPTStep(s, cycle()))
    add(Row("preln R=1", f"bare loop, Pre-LN, K={K} R=1 (the GPT's size), the same batches in the same turns",
            preln, "nanoGPT", TARGETS["nanogpt"]), Bare(s, preln, source=cycle()))
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
        add(Row("compile", "bare loop, LoopedTransformer.compile(): each sublayer and the head compiled once",
                base_cfg, "bare", TARGETS["compile"] if not s.cuda else ""), Bare(s, base_cfg, True, cycle()))
    ckpt_cfg = s.config(checkpoint_rounds=True)
    if not s.only_nanogpt:
        add(Row("checkpoint", "bare loop, checkpoint_rounds=True", ckpt_cfg, "bare", TARGETS["checkpoint"]),
            Bare(s, ckpt_cfg, source=cycle()))
    for r in s.rounds:
        if r != R:
            add(Row(f"R={r}", f"bare loop, K={K} R={r}", s.config(n_rounds=r), "bare", TARGETS["rounds"]),
                Bare(s, s.config(n_rounds=r), source=cycle()))
    real: Optional[RealData] = None
    if s.data:
        try:
            real = RealData(s)
            log(f"TokenStreamDataModule ready in {real.setup_s:.1f} s")
            add(Row("data", f"bare loop fed by TokenStreamDataModule (shakespeare, num_workers={s.workers})",
                    base_cfg, "bare", TARGETS["data"]), Bare(s, base_cfg, source=real))
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
        for name in names[turn % len(names):] + names[:turn % len(names)]:
            elapsed, wait = step_runners[name].timed_step()
            rows[name].times.append(elapsed)
            rows[name].wait.append(wait)
        if (turn + 1) % max(1, turns // 5) == 0:
            log(f"B turn {turn + 1}/{turns}: " + ", ".join(f"{n} {median(rows[n].times) * 1e3:.0f}" for n in names)
                + " ms/step")

    # Derived row: diagnostics at the CLI's every_n_steps = 50, from the measured windows.
    diag, lit = rows.get(f"diagnostics@{diag_every}"), rows.get("lightning")
    if diag is None:
        pass  # --vs-nanogpt: no phase A
    elif diag_every < 50:
        at50 = [lt + (dt - lt) * diag_every / 50 for lt, dt in zip(lit.times, diag.times)]
        rows["diagnostics@50"] = Row("diagnostics@50", "lightning + VisitDiagnostics(every_n_steps=50), the CLI "
                                     f"default: the extra time of diagnostics@{diag_every} spread over 50 steps",
                                     base_cfg, "lightning", TARGETS["diagnostics@50"], at50, derived=True)
    else:
        diag.target = TARGETS["diagnostics@50"]

    breakdown = step_breakdown(step_runners["bare"]) if "bare" in step_runners else None
    if s.compile:
        runner = step_runners["compile"]
        rows["compile"].extra = {"graphs": counters["stats"]["unique_graphs"] - graphs_before,
                                 "first_step_s": runner.first_step_s, "eager_breakdown": breakdown}
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
        d.extra = {"wait_ms": median(d.wait) * 1e3, "wait_frac": median([w / t for w, t in zip(d.wait, d.times)]),
                   "setup_s": real.setup_s}
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
            log(f"memory K={k} R={r}: plain {fmt_bytes(entry['plain']['peak'])}, "
                f"ckpt {fmt_bytes(entry['ckpt']['peak'])}")
        by = {(e["K"], e["R"]): e for e in memory}
        rows["bare"].peak_bytes = by[(K, R)]["plain"]["peak"]
        rows["checkpoint"].peak_bytes = by[(K, R)]["ckpt"]["peak"]
        for r in s.rounds:
            if f"R={r}" in rows:
                rows[f"R={r}"].peak_bytes = by[(K, r)]["plain"]["peak"]

    skipped = {}
    if not s.compile:
        skipped["compile"] = "skipped (--smoke runs it with --compile)" if smoke else "skipped (--no-compile)"
    if "data" not in rows:
        skipped["data"] = "skipped (--no-data)" if not s.data else "skipped (TokenStreamDataModule failed, see the log)"
    peak.probe()
    result = evaluate(s, rows, memory, peak.flops)
    result["skipped"] = skipped
    result.update(machine=info, peak_flops=peak.flops, peak_method=peak.method, command=command, settings=asdict(s),
                  seconds=time.perf_counter() - t_start, smoke=smoke, eager_breakdown=breakdown,
                  fast_paths=fast_paths(s))
    return result


def evaluate(s: Settings, rows: dict[str, Row], memory: list[dict], peak: float) -> dict:
    """Turn the timings into table rows and target checks."""
    K, R = s.n_blocks, s.n_rounds
    shown = ["bare", "preln R=1", "nanoGPT", "bare (windows)", "system malloc", "lightning", *(n for n in rows if n.startswith("diagnostics@")), "compile",
             "checkpoint", *(n for n in rows if n.startswith("R=")), "data"]
    out_rows, checks = [], {}
    for name in dict.fromkeys(n for n in shown if n in rows):
        row = rows[name]
        step = median(row.times)
        tps = s.tokens_per_step / step
        flops = LoopedTransformer(row.config).flops_per_token(s.seq_len)
        out_rows.append(dict(name=name, description=row.description, baseline=row.baseline,
                             step_ms=step * 1e3, tokens_per_s=tps, ratio=ratio(rows, name), mfu=flops * tps / peak,
                             peak_bytes=row.peak_bytes, target=row.target, met=None, detail="", extra=row.extra,
                             derived=row.derived, samples_ms=[t * 1e3 for t in row.times]))
    by = {r["name"]: r for r in out_rows}

    def check(key: str, met: Optional[bool], detail: str, names: tuple[str, ...] = (), **extra) -> None:
        for name in names or (key,):
            if name in by:
                by[name]["met"], by[name]["detail"] = met, detail
        checks[key] = {"target": TARGETS[key], "met": met, "detail": detail, **extra}

    if "lightning" in by:
        r = by["lightning"]["ratio"]
        check("lightning", r >= 0.95, f"{(1 / r - 1) * 100:+.1f}% step time over the bare loop")
    r = by["preln R=1"]["ratio"]
    check("nanogpt", r >= 1.1 if not s.cuda else None,
          f"loopnet's step {r:.2f}× as fast as nanoGPT's at d={s.d_model}, {K} layers, T={s.seq_len}, vocabulary "
          f"{s.vocab_size} (median of {len(rows['nanoGPT'].times)} paired turns)", ("preln R=1",))
    if "diagnostics@50" in by:
        r = by["diagnostics@50"]["ratio"]
        check("diagnostics@50", r >= 0.97, f"{(1 / r - 1) * 100:+.1f}% step time over lightning")
    if "compile" in by:
        r, e = by["compile"]["ratio"], by["compile"]["extra"]
        detail = (f"{r:.2f}× eager; {e['graphs']} compiled graphs serve all {R}×{K} block visits, "
                  f"{e['new_graphs_other_R']} new at R'={max(1, R // 2)}; first step (compiling) "
                  f"{e['first_step_s']:.1f} s")
        b = e.get("eager_breakdown")
        if b:
            detail += (f"; the eager step is {b['matmul'] * 100:.0f}% matmul and {b['attention'] * 100:.0f}% "
                       f"attention kernels, which compile does not change (at best "
                       f"{1 / (b['matmul'] + b['attention']):.2f}×)")
        check("compile", (r >= 1.2) if not s.cuda else None, detail)
    # Rounds: step time = a + b·R; the block time per round b should explain every point.
    points = sorted((rows[n].config.n_rounds, by[n]["step_ms"]) for n in by if n == "bare" or n.startswith("R="))
    if len(points) >= 2:
        a, b = linear_fit([p[0] for p in points], [p[1] for p in points])
        worst = max(abs(t - (a + b * x)) / t for x, t in points)
        detail = (f"{b:.1f} ms per round (K={K} blocks) + {a:.1f} ms per step outside the rounds; worst point "
                  f"{worst * 100:.1f}% off the line")
        check("rounds", worst <= 0.10 and b > 0, detail, tuple(n for n in by if n.startswith("R=")),
              ms_per_round=b, fixed_ms=a, points=points)
    if memory:
        value = lambda m: m["peak"] if m["peak"] is not None else m["saved"]  # noqa: E731
        ok = [e for e in memory if value(e["plain"]) is not None and value(e["ckpt"]) is not None]
        plain = [(e["R"], value(e["plain"])) for e in ok if e["K"] == K]
        ckpt = [(e["R"], value(e["ckpt"])) for e in ok if e["K"] == K]
        if len(plain) >= 2:
            sp = linear_fit([x for x, _ in plain], [m for _, m in plain])[1]
            sc = linear_fit([x for x, _ in ckpt], [m for _, m in ckpt])[1]
            ks = sorted((e["K"], value(e["plain"]), value(e["ckpt"])) for e in ok if e["R"] == R)
            detail = (f"peak per extra round {fmt_bytes(sc)} with checkpointing vs {fmt_bytes(sp)} without "
                      f"({sc / sp * 100:.0f}%); at R={R}, K = " + ", ".join(str(k) for k, _, _ in ks)
                      + ": " + " / ".join(fmt_bytes(p) for _, p, _ in ks) + " without, "
                      + " / ".join(fmt_bytes(c) for _, _, c in ks) + " with")
            check("checkpoint", sp > 0 and sc <= 0.25 * sp, detail, bytes_per_round_ckpt=sc, bytes_per_round=sp)
    if "data" in by:
        e = by["data"]["extra"]
        check("data", e["wait_frac"] <= 0.05, f"{e['wait_ms']:.2f} ms waiting for the loader per step, "
              f"{e['wait_frac'] * 100:.1f}% of the step")
    if s.cuda:
        best = max((r for r in out_rows if not r["derived"]), key=lambda r: r["mfu"])
        name = torch.cuda.get_device_name(s.device)
        known = "H100" in name or "H200" in name
        met = best["mfu"] >= 0.40 if known and s.d_model == 768 and s.bf16 else None
        detail = f"best: {best['name']}, {best['mfu'] * 100:.1f}% of {peak / 1e12:.0f} TFLOP/s on {name}"
        if not best["target"]:
            best["target"] = TARGETS["mfu"]
            check("mfu", met, detail, (best["name"],))
        else:
            check("mfu", met, detail, ("-",))
    else:
        check("mfu", None, "not measured: needs an H100/H200 (this machine has none)", ("-",))
    return {"rows": out_rows, "memory": memory, "checks": checks}


# ----------------------------------------------------------------------------------------- report
def markdown(res: dict) -> str:
    s, m = res["settings"], res["machine"]
    lines = ["## loopnet benchmark" + (" (smoke: tiny sizes, numbers meaningless)" if res["smoke"] else ""), ""]
    dev = m["device"] + (f" (CUDA {m.get('cuda')})" if m["device"] != "cpu" else "")
    lines += [
        f"- Machine: {m['cpu']}, {m['cpus']} CPUs ({m['torch_threads']} torch threads); device {dev}; "
        f"torch {m['torch']}, lightning {m['lightning']}, Python {m['python']}"
        + (f"; load average {m['load_at_start']:.1f} at start" if "load_at_start" in m else ""),
        f"- Peak for MFU: {res['peak_method']}",
        f"- Model: " + (f"loopnet Pre-LN K={s['n_blocks']} R=1 against nanoGPT with {s['n_blocks']} layers"
                        if s["only_nanogpt"] else f"{s['residual']} {s['wiring']}, K={s['n_blocks']} R={s['n_rounds']}")
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
            f"| {mark[r['met']] if r['target'] else ''} |")
    for name, why in ({} if s["only_nanogpt"] else res["skipped"]).items():
        lines.append(f"| {name} | {why} | | | | | | | |")
    lines += ["", "Variants:", ""]
    lines += [f"- `{r['name']}`: {r['description']}" for r in res["rows"]]
    if res["memory"]:
        lines += ["", "Memory of one forward + backward (peak: activations, gradients and temporaries above the "
                  "step's start, " + ("torch.cuda.max_memory_allocated" if s["device"].startswith("cuda")
                                      else "torch MemTracker") + "; saved: distinct tensors saved for backward, "
                  "saved_tensors_hooks):", "",
                  "| K | R | peak | peak, checkpoint_rounds | saved | saved, checkpoint_rounds |",
                  "|---:|---:|---:|---:|---:|---:|"]
        for e in res["memory"]:
            lines.append(f"| {e['K']} | {e['R']} | {fmt_bytes(e['plain']['peak'])} | {fmt_bytes(e['ckpt']['peak'])} "
                         f"| {fmt_bytes(e['plain']['saved'])} | {fmt_bytes(e['ckpt']['saved'])} |")
    lines += ["", "Targets:", ""]
    names = {"lightning": "Lightning overhead", "diagnostics@50": "VisitDiagnostics every 50 steps",
             "compile": "torch.compile", "checkpoint": "activation checkpointing memory grows with K, not K·R",
             "rounds": "block cost linear in R", "data": "data pipeline never the bottleneck",
             "mfu": "MFU on an H100/H200", "nanogpt": "loopnet against an independent nanoGPT of its size"}
    for key, c in res["checks"].items():
        lines.append(f"- {names.get(key, key)} ({c['target']}): {mark[c['met']]} — {c['detail']}")
    lines += ["", "Fast paths in use:", ""] + [f"- {f}" for f in res["fast_paths"]]
    return "\n".join(lines) + "\n"


def fast_paths(s: Settings) -> list[str]:
    cfg = s.config()
    paths = []
    if s.cuda:
        flash = torch.backends.cuda.flash_sdp_enabled()
        paths.append(f"attention: F.scaled_dot_product_attention(is_causal=True), flash backend "
                     f"{'enabled' if flash else 'disabled'}")
        paths += ["AdamW fused=True (LoopedLM.configure_optimizers on CUDA)",
                  "pinned host batches and non_blocking copies to the GPU"]
    else:
        paths += ["host memory: glibc keeps freed memory for the next step (keep_freed_memory(), "
                  f"{'applied' if s.keep_freed_memory else 'NOT applied'}; the HostMemory callback of `loopnet fit`, "
                  "--host_memory.keep_freed false turns it off)",
                  "attention: F.scaled_dot_product_attention(is_causal=True) (CPU flash kernel)",
                  "AdamW fused=True (LoopedLM.configure_optimizers, on CPU too; nanoGPT's row keeps nanoGPT's "
                  "for-loop AdamW on CPU)"]
    paths.append("bf16 autocast (precision bf16-mixed)" if s.bf16 else "fp32 (--precision bf16: bf16 autocast)")
    paths.append(f"tied embeddings: {cfg.tie_embeddings} (LoopConfig.tie_embeddings)")
    paths.append(f"vocabulary {cfg.vocab_size}: {'a' if cfg.vocab_size % 64 == 0 else 'NOT a'} multiple of 64")
    if s.compile:
        paths.append("torch.compile: one graph per sublayer kind and one for the head, reused by every round and block")
    return paths


# ----------------------------------------------------------------------------------------- CLI
def parse(argv: list[str]) -> tuple[argparse.Namespace, Settings]:
    p = argparse.ArgumentParser(prog="loopnet bench", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.split("\n")[2:]))
    p.add_argument("--smoke", action="store_true", help="tiny sizes, two timed steps per variant, no compile (seconds)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    for name in ("vocab-size", "seq-len", "d-model", "n-heads", "n-blocks", "n-rounds", "batch-size", "steps",
                 "warmup", "reps", "workers"):
        p.add_argument(f"--{name}", type=int, default=None, help="default: from the device's profile")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads (default: torch's, 1 with --smoke: tiny ops gain nothing from more)")
    p.add_argument("--precision", choices=["bf16", "fp32"], default=None,
                   help="bf16 autocast (Lightning's bf16-mixed) or fp32 (default: bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--rounds", type=int, nargs="+", default=[1, 3, 6, 12], help="round counts at fixed K")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile variant")
    p.add_argument("--compile", action="store_true", help="run the torch.compile variant even with --smoke")
    p.add_argument("--no-data", action="store_true", help="skip the real data-loader variant")
    p.add_argument("--no-memory", action="store_true", help="skip the memory table")
    p.add_argument("--system-malloc", action="store_true",
                   help="CPU: leave glibc's malloc settings as they are in this process (no keep_freed_memory(), "
                        "as `loopnet fit --host_memory.keep_freed false`): every variant, compile included, "
                        "runs with the system allocator")
    p.add_argument("--vs-nanogpt", action="store_true",
                   help="only loopnet (Pre-LN, R = 1) against the independent nanoGPT of its size, one step each in "
                        "turn; e.g. --vs-nanogpt --d-model 256 --n-blocks 4 --seq-len 256 --vocab-size 50304")
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
    s = Settings(device=device, rounds=[] if only else sorted(set(args.rounds)), compile=(not args.smoke or args.compile)
                 and not args.no_compile and not only, data=not args.no_data and not only,
                 memory=not args.no_memory and not only, bf16=bf16, only_nanogpt=only, **profile)
    s.config()  # fail early on a bad model shape
    return args, s


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    args, s = parse(argv)
    # As `loopnet fit` on CPU runs (the system-malloc row is the contrast).
    if args.system_malloc and s.cuda:
        log("--system-malloc changes nothing on CUDA (the host allocator only matters to CPU training)")
    s.keep_freed_memory = not s.cuda and not args.system_malloc and keep_freed_memory()
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
