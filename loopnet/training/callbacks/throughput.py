"""Tokens/s, sequences/s and MFU of `loopnet fit` (Lightning's ThroughputMonitor, for token batches)."""

from __future__ import annotations

import warnings

import torch
from lightning.pytorch.callbacks import ThroughputMonitor

from loopnet.compat import compute_dtype


def _sequences(batch) -> int:
    return batch[0].size(0)


def _tokens(batch) -> int:
    return batch[0].numel()


# Dense (no sparsity) bf16 (= fp16) peak FLOP/s per GPU; the first key found in the device name
# counts. Lightning's table has no entry that "NVIDIA H200" matches, and lists the with-sparsity
# figures for H200 and H100 NVL. "HBM2e": the H100 PCIe as some clouds name it.
GPU_BF16_PEAK = [
    ("H100 PCIe", 756e12),
    ("H100 80GB HBM2e", 756e12),
    ("H100 NVL", 835e12),
    ("H200 NVL", 835e12),
    ("H200", 989e12),
    ("H100", 989e12),
    ("A100", 312e12),
]


def gpu_bf16_peak(device_name: str) -> float | None:
    """Dense bf16 peak FLOP/s of a GPU by its `torch.cuda.get_device_name`, None if unknown."""
    return next((flops for key, flops in GPU_BF16_PEAK if key in device_name), None)


class TokenThroughput(ThroughputMonitor):
    """Lightning's ThroughputMonitor for (inputs, targets) token batches: reports sequences/s,
    tokens/s and, where the device's peak is known, MFU from `LoopedLM.flops_per_batch`
    (bf16/fp16 on GPUs in `GPU_BF16_PEAK`: that dense peak; otherwise Lightning's table).

    Args:
        window_size: Number of batches the rolling averages cover.
    """

    def __init__(self, window_size: int = 50):
        super().__init__(batch_size_fn=_sequences, length_fn=_tokens, window_size=window_size)

    def setup(self, trainer, pl_module, stage: str) -> None:
        device, peak = trainer.strategy.root_device, None
        if device.type == "cuda" and compute_dtype(trainer.precision_plugin) in (torch.bfloat16, torch.half):
            peak = gpu_bf16_peak(torch.cuda.get_device_name(device))
        with warnings.catch_warnings():
            if peak is not None:  # Lightning's table misses the device and says so; loopnet's has it
                warnings.filterwarnings("ignore", message="FLOPs not found for")
            super().setup(trainer, pl_module, stage)
        if peak is not None:
            self.available_flops = peak
            for throughput in self._throughputs.values():
                throughput.available_flops = peak
