"""The callbacks `loopnet fit` adds besides Lightning's own (`loopnet.training.defaults`), one per file."""

from loopnet.lazy import lazy_attributes

# Imported on first use: each imports Lightning.
_WHERE = {
    "GracefulInterrupt": ".interrupt",
    "HostMemory": ".memory",
    "TokenThroughput": ".throughput",
    "gpu_bf16_peak": ".throughput",
}

__getattr__, __dir__, __all__ = lazy_attributes(__name__, _WHERE)
