"""Downstream evaluation of loopnet checkpoints with lm-evaluation-harness, at any round count R'.

- `LoopnetLM` (``loopnet.eval.adapter``): the harness model ``loopnet`` for a checkpoint at a given R'.
- `run_eval` / `main` (``loopnet.eval.cli``): ``loopnet eval --ckpt_path X --tasks ... --rounds 1,3,6``
  runs the harness for each R' and writes a task × R' table as JSON and markdown.
- `DEEPLOOP_TASKS`: the eight zero-shot tasks of the DeepLoop paper (``--tasks deeploop``).

The harness (PyPI ``lm-eval``) is imported only when an evaluation runs, so importing this package
is cheap and works without it.
"""

from loopnet.eval.tasks import DEEPLOOP_TASKS, PRESETS

__all__ = ["DEEPLOOP_TASKS", "PRESETS", "LoopnetLM", "load_checkpoint", "main", "run_eval"]


def __getattr__(name: str):
    # Lazy: importing the adapter imports lm_eval, which takes a second and may not be installed.
    if name in ("LoopnetLM", "load_checkpoint"):
        from loopnet.eval import adapter

        return getattr(adapter, name)
    if name in ("main", "run_eval"):
        from loopnet.eval import cli

        return getattr(cli, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
