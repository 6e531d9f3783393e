"""Every use of a dependency's private API, in one place.

loopnet reaches past the public API of Lightning, jsonargparse and the standard library where no public
path does what it needs; each such use is a function here, saying what it relies on. tests/test_compat.py
checks each one (the private name exists, with the signature and the behaviour relied on), so an upgrade
that changes one fails there, by name, rather than somewhere in `loopnet fit`. pyproject.toml pins
Lightning and jsonargparse to the minor versions those tests cover.

    Lightning     on_rank_death, CkptPathHook, NoRunHook, compute_dtype, set_stop_flag, configured_checkpoint_io,
                  rerun_validation
    jsonargparse  parsing_settings, import_object, get_signature_parameters
    torchmetrics  lean_torchmetrics (through lightning_utilities)
    stdlib        run_exit_handlers
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable

# ----------------------------------------------------------------------------- Lightning


def on_rank_death(before: Callable[[], None]) -> None:
    """When a rank that Lightning's launcher started dies, run `before()` first (it must not raise: an error
    there is printed), then end as Lightning does, sending every other rank its termination signal, except
    that rank 0 exits with status 1 instead of its own SIGKILL (-9 reads as if something outside killed it).

    Relies on `_ChildProcessObserver` (lightning.fabric's subprocess launcher, rank 0's watcher thread):
    its `_run` calls `self._terminate_all()` when a child ended with a non-zero status, and the instance
    holds `_child_processes` (Popen list) and `_termination_signal`."""
    from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver

    def terminate_all(observer) -> None:
        try:
            before()
        except Exception as err:  # the termination goes on whatever happens there
            print(f"loopnet: could not write the run summary ({err!r})", file=sys.stderr, flush=True)
        for child in observer._child_processes:
            child.send_signal(observer._termination_signal)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)

    _ChildProcessObserver._terminate_all = terminate_all


class CkptPathHook:
    """A LightningCLI mixin: `check_ckpt_path()` runs where LightningCLI would merge a checkpoint's saved
    hyperparameters into the parsed config (`--ckpt_path`), instead of that merge.

    Relies on `LightningCLI.__init__` calling the private `self._parse_ckpt_path()` once, after the parse
    (`self.config` set) and before any class is instantiated."""

    def _parse_ckpt_path(self) -> None:
        self.check_ckpt_path()

    def check_ckpt_path(self) -> None:
        raise NotImplementedError


class NoRunHook:
    """A LightningCLI mixin that parses and checks but neither seeds the global RNGs nor runs the subcommand
    (`loopnet sweep` checks every cell's command line in its own process).

    Relies on `LightningCLI.__init__` calling the private `self._set_seed()` after the parse and
    `self._run_subcommand(subcommand)` last, each with no other effect this mixin needs."""

    def _set_seed(self) -> None:
        pass

    def _run_subcommand(self, subcommand: str) -> None:
        pass


def configured_checkpoint_io(strategy):
    """The CheckpointIO plugin a Trainer was configured with, None when none was (the public
    `strategy.checkpoint_io` creates a default one on read). Relies on `Strategy._checkpoint_io`."""
    return strategy._checkpoint_io


def rerun_validation(trainer) -> None:
    """Make a resumed fit run the validation it had started (and abandoned) before its checkpoint, which the
    loop's restart logic, working from its progress counters, would take as completed and skip. Relies on
    `trainer.fit_loop.epoch_loop.val_loop._restart_stage` and `RestartStage.RESTARTED_MID_EVALUATION`
    (lightning.pytorch.loops.evaluation_loop), read by the loop when it next runs."""
    from lightning.pytorch.loops.evaluation_loop import RestartStage

    trainer.fit_loop.epoch_loop.val_loop._restart_stage = RestartStage.RESTARTED_MID_EVALUATION


def compute_dtype(precision_plugin):
    """The dtype a Trainer's precision plugin computes in (torch.float32, torch.bfloat16, torch.half, ...).
    Relies on `lightning.pytorch.callbacks.throughput_monitor._plugin_to_compute_dtype(plugin)`."""
    from lightning.pytorch.callbacks.throughput_monitor import _plugin_to_compute_dtype

    return _plugin_to_compute_dtype(precision_plugin)


def set_stop_flag(trainer, stop: bool = True) -> None:
    """Set the flag behind the public `trainer.received_sigterm`, which Lightning's own SIGTERM handler sets:
    its loops then stop after the current batch (raising `SIGTERMException` in a validation).
    Relies on `trainer._signal_connector.received_sigterm`, a plain attribute that property reads."""
    trainer._signal_connector.received_sigterm = stop


# ----------------------------------------------------------------------------- jsonargparse


def parsing_settings() -> dict:
    """jsonargparse's global parsing settings, the live dict that `set_parsing_settings` writes (it has no
    public getter or reset). Relies on `jsonargparse._common.parsing_settings`, with the keys
    `import_path_verdicts` and `import_paths_enforced`."""
    from jsonargparse import _common

    return _common.parsing_settings


def import_object(path: str):
    """The object a dotted path names, imported as jsonargparse imports a `class_path` (so under its import
    settings). Relies on `jsonargparse._util.import_object(path)`."""
    from jsonargparse._util import import_object as imported

    return imported(path)


def get_signature_parameters(cls, method: str | None = None, **kwargs) -> list:
    """The parameters of `cls`'s `method` (None: its constructor) as jsonargparse's parsers read them: each
    with `.name` and `.annotation`, following `**kwargs` into the classes they are passed to (the trust
    check judges each slot by this). Relies on `jsonargparse._parameter_resolvers.get_signature_parameters`
    (function, method_or_property, logger=...)."""
    from jsonargparse._parameter_resolvers import get_signature_parameters as parameters

    return parameters(cls, method, **kwargs)


# ----------------------------------------------------------------------------- torchmetrics

# What torchmetrics imports at its own import when installed, for metrics loopnet does not use: scipy.signal
# (audio), transformers (BERTScore, InfoLM, CLIP) and matplotlib (`Metric.plot`). The test extra installs
# all three (lm-eval, the formats, the reports), and Lightning imports torchmetrics at its own import.
TORCHMETRICS_OPTIONAL = ("scipy", "transformers", "matplotlib")


def lean_torchmetrics() -> None:
    """Make this process's first import of torchmetrics (Lightning's, at its import) leave out its optional
    back-ends (`TORCHMETRICS_OPTIONAL`): the import of Lightning and loopnet's CLI takes ~4.1 s instead of
    ~7.5 s on a 2-core CPU (docs/benchmarks/startup.md). Called by loopnet's own processes (`loopnet`,
    `loopnet.training.cli`) before they import Lightning; nothing when torchmetrics is imported already. The
    packages stay importable, and are imported where loopnet uses them; only torchmetrics' audio,
    BERTScore/InfoLM/CLIP metrics and `Metric.plot` are off in such a process.

    torchmetrics decides at its import, through lightning_utilities: `package_available(name)` and
    `module_available(name)` (both lru-cached, reading the module-level `find_spec`) and
    `RequirementCache(req)` (reading the module-level `_version`). For the length of torchmetrics' import
    those two names say "not installed" for the optional packages; then they are restored and the caches
    cleared. Relies on `lightning_utilities.core.imports.find_spec`, `._version`, `.package_available` and
    `.module_available`."""
    if "torchmetrics" in sys.modules or any(isinstance(f, _LeanTorchmetrics) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _LeanTorchmetrics())


class _LeanTorchmetrics:
    """A one-shot import hook (`lean_torchmetrics`): torchmetrics' own spec, its module run with the optional
    back-ends hidden."""

    def find_spec(self, name, path=None, target=None):
        import importlib.util

        if name != "torchmetrics":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)  # as the other finders see it
        if spec is not None and spec.loader is not None:
            run = spec.loader.exec_module

            def exec_module(module):
                with _optional_hidden():
                    run(module)

            spec.loader.exec_module = exec_module
        return spec


@contextlib.contextmanager
def _optional_hidden():
    """lightning_utilities' availability checks say "not installed" for `TORCHMETRICS_OPTIONAL` while held."""
    from importlib.metadata import PackageNotFoundError

    import lightning_utilities.core.imports as checks

    real_find_spec, real_version = checks.find_spec, checks._version

    def find_spec(name, *args, **kwargs):
        return None if name.partition(".")[0] in TORCHMETRICS_OPTIONAL else real_find_spec(name, *args, **kwargs)

    def version(name):
        if name in TORCHMETRICS_OPTIONAL:
            raise PackageNotFoundError(name)
        return real_version(name)

    checks.find_spec, checks._version = find_spec, version
    checks.package_available.cache_clear()
    checks.module_available.cache_clear()
    try:
        yield
    finally:
        checks.find_spec, checks._version = real_find_spec, real_version
        checks.package_available.cache_clear()  # what was cached while held said "not installed"
        checks.module_available.cache_clear()


# ----------------------------------------------------------------------------- standard library


def run_exit_handlers() -> None:
    """Run (and clear) the atexit handlers now, as the interpreter does at its exit: for a forked process
    that runs a program and then leaves by `os._exit`. Relies on `atexit._run_exitfuncs()`."""
    import atexit

    atexit._run_exitfuncs()
