"""Training wiring: the LightningModule, the default callbacks and the `loopnet` CLI."""

from .module import GenerateConfig, LoopedLM, OptimConfig

__all__ = ["GenerateConfig", "LoopedLM", "OptimConfig"]
