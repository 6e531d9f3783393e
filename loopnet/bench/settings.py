"""What a benchmark run measures with: its settings (`Settings`, the device profiles) and the batches
every variant trains on (random in memory, or the real data module)."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader

from loopnet.data.token_ids import N_VOCAB
from loopnet.model import LoopConfig


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
        base = dict(
            vocab_size=self.vocab_size,
            seq_len=self.seq_len,
            d_model=self.d_model,
            n_heads=self.n_heads,
            n_blocks=self.n_blocks,
            n_rounds=self.n_rounds,
            residual=self.residual,
            wiring=self.wiring,
        )
        return LoopConfig(**(base | kw))


PROFILES = {
    # CPU: the CLI's cpu.yaml model (d 128, 4 heads, T 128, batch 8, K 2 x R 6) with a 8192-token
    # vocabulary, so that the blocks, not a 50k-way head, dominate a step (--vocab-size 50304: GPT-2's).
    "cpu": dict(
        vocab_size=8192,
        seq_len=128,
        d_model=128,
        n_heads=4,
        n_blocks=2,
        n_rounds=6,
        batch_size=8,
        steps=10,
        warmup=2,
        reps=3,
        workers=0,
    ),
    # GPU: configs/base.yaml, GPT-2-small width.
    "cuda": dict(
        vocab_size=50304,
        seq_len=1024,
        d_model=768,
        n_heads=12,
        n_blocks=2,
        n_rounds=6,
        batch_size=16,
        steps=20,
        warmup=3,
        reps=3,
        workers=4,
    ),
    "smoke": dict(
        vocab_size=256,
        seq_len=32,
        d_model=32,
        n_heads=2,
        n_blocks=2,
        n_rounds=6,
        batch_size=2,
        steps=2,
        warmup=1,
        reps=1,
        workers=0,
    ),
}


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


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
