"""On CPU, freed memory kept for the next step (`loopnet.training.host_memory`), as a callback."""

from __future__ import annotations

from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.callbacks import Callback


class HostMemory(Callback):
    """On CPU, make glibc keep freed memory for the next step instead of page-faulting the step's
    large activations in again (`loopnet.training.host_memory`): +17% tokens/s on the CPU
    benchmark, 1.5x on `make fit`; resident memory then stays at the run's peak.

    Args:
        keep_freed: apply it when the Trainer runs on CPU (False: glibc's defaults).
    """

    def __init__(self, keep_freed: bool = True):
        self.keep_freed = keep_freed
        self.applied = False

    def setup(self, trainer, pl_module, stage: str) -> None:
        from loopnet.training.host_memory import keep_freed_memory

        if self.keep_freed and isinstance(trainer.accelerator, CPUAccelerator):
            self.applied = keep_freed_memory()  # in every process of the run: each rank calls setup
