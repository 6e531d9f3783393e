"""Training wiring: the LightningModule, the callbacks and the defaults `loopnet fit` runs with, the
LightningCLI (`cli`) and its check-only mode (`check`)."""

from loopnet.lazy import lazy_attributes

# Imported on first use (PEP 562): `loopnet.training.host_memory` and the like load without Lightning.
_WHERE = {"GenerateConfig": ".options", "LoopedLM": ".module", "OptimConfig": ".options"}

__getattr__, __dir__, __all__ = lazy_attributes(__name__, _WHERE)
