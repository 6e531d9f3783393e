"""Training wiring: the LightningModule, the callbacks and the defaults `loopnet fit` runs with, the
LightningCLI (`cli`) and its check-only mode (`check`)."""

from .module import GenerateConfig, LoopedLM, OptimConfig

__all__ = ["GenerateConfig", "LoopedLM", "OptimConfig"]
