"""Downstream evaluation of loopnet checkpoints with lm-evaluation-harness, at any round count R'.

- `LoopnetLM` (``loopnet.eval.adapter``): the harness model ``loopnet`` for a checkpoint at a given R'.
- `run_eval` / `main` (``loopnet.eval.cli``): ``loopnet eval --ckpt_path X --tasks ... --rounds 1,3,6``
  runs the harness for each R' and writes a task × R' table as JSON and markdown.
- `DEEPLOOP_TASKS`: the eight zero-shot tasks of the DeepLoop paper (``--tasks deeploop``).

The harness (PyPI ``lm-eval``) is imported only when an evaluation runs, so importing this package
is cheap and works without it.
"""

from loopnet.lazy import lazy_attributes

# Imported on first use: the adapter imports lm_eval, which takes a second and may not be installed.
_WHERE = {
    "DEEPLOOP_TASKS": ".tasks",
    "PRESETS": ".tasks",
    "LoopnetLM": ".adapter",
    "load_checkpoint": ".adapter",
    "main": ".cli",
    "run_eval": ".cli",
}

__getattr__, __dir__, __all__ = lazy_attributes(__name__, _WHERE)
