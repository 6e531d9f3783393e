"""loopnet: train and study looped Transformers.

    import loopnet
    model = loopnet.load("runs/<run name>")  # a .ckpt, a run folder or an exported folder -> loopnet.Model

The Python API is `loopnet.api` (docs/python.md); the commands are `loopnet --help`.
"""

from loopnet.lazy import lazy_attributes

# Imported on first use (PEP 562): `import loopnet` and `loopnet --help` load neither torch nor Lightning.
_WHERE = {"load": ".api", "Model": ".api"}

__getattr__, __dir__, __all__ = lazy_attributes(__name__, _WHERE)
