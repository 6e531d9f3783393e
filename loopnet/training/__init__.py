"""Training wiring: the LightningModule (`module`), the callbacks (`callbacks/`) and the defaults
(`defaults`) `loopnet fit` runs with; the LightningCLI (`cli`), the checks it runs before Lightning
loads (`precheck`), its run folders (`run_folders`), the checkpoint a command loads (`resume`), how it
says an error (`errors`), and its check-only mode (`check`)."""

from loopnet.lazy import lazy_attributes

# Imported on first use (PEP 562): `loopnet.training.host_memory` and the like load without Lightning.
_WHERE = {"GenerateConfig": ".options", "LoopedLM": ".module", "OptimConfig": ".options"}

__getattr__, __dir__, __all__ = lazy_attributes(__name__, _WHERE)
