"""The FLOP/s MFU divides by: a known GPU's datasheet peak, or this machine's own matmul rate."""

from __future__ import annotations

import time
from typing import Optional

import torch

from loopnet.bench.settings import Settings, sync


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
        what = (
            f"{torch.cuda.get_device_name(self.s.device)} {dtype}"
            if self.s.cuda
            else f"this CPU's {dtype}, {torch.get_num_threads()} threads,"
        )
        unit, scale = ("TFLOP/s", 1e12) if self.s.cuda else ("GFLOP/s", 1e9)
        return (
            f"{what} {self.n}×{self.n} matmul, best of 5 trials at start, between the phases and at the end: "
            f"{self.flops / scale:.1f} {unit} (the probes: " + ", ".join(f"{p / scale:.1f}" for p in self.probes) + ")"
        )
