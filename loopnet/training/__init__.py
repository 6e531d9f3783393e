"""Training wiring: the LightningModule, the default callbacks and the `loopnet` CLI."""

import importlib

# Imported on first use (PEP 562): `loopnet.training.host_memory` and the like load without Lightning.
_WHERE = {"GenerateConfig": ".module", "LoopedLM": ".module", "OptimConfig": ".module"}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
