"""Package attributes imported on first use (PEP 562), so that a light command (`loopnet --help`, the
tools, `loopnet report`) does not import Lightning or torch through a package's `__init__`."""

from __future__ import annotations

import importlib
import sys


def lazy_attributes(package: str, where: dict[str, str]):
    """(`__getattr__`, `__dir__`, `__all__`) for `package`, whose names `where` maps to the module that
    defines each (relative to the package, e.g. ".config", or absolute). A name is imported once, then
    kept in the package's namespace."""

    def __getattr__(name: str):
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name], package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(where))

    return __getattr__, __dir__, sorted(where)
