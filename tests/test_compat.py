"""Each private name of a dependency that `loopnet.compat` uses exists, with the signature and the behaviour
relied on: an upgrade that changes one fails here, by name."""

from __future__ import annotations

import copy
import inspect
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import pytest
import torch

from loopnet import compat
from tests.reliability.helpers import env


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env(),
        check=False,
        timeout=300,
    )


# ----------------------------------------------------------------------------- Lightning


def test_lightnings_observer_calls_terminate_all_when_a_rank_dies(monkeypatch):
    from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver

    child = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    child.wait()
    observer = _ChildProcessObserver(main_pid=os.getpid(), child_processes=[child])
    assert observer._child_processes == [child]
    assert observer._termination_signal in (signal.SIGKILL, signal.SIGTERM)
    called = []
    monkeypatch.setattr(_ChildProcessObserver, "_terminate_all", lambda self: called.append(self))
    assert observer._run() is True and called == [observer]


def test_on_rank_death_runs_first_then_ends_the_other_ranks_and_exits_1():
    res = run_python("""
        import subprocess, sys
        from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver
        from loopnet import compat

        rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        print(rank.pid, flush=True)
        compat.on_rank_death(lambda: print("summary first", flush=True))
        _ChildProcessObserver(main_pid=0, child_processes=[rank])._terminate_all()
        print("not reached", flush=True)
    """)
    assert res.returncode == 1, res.stderr[-3000:]
    pid, *lines = res.stdout.splitlines()
    assert lines == ["summary first"]
    wait_until(lambda: not alive(int(pid)), "the other rank ended")  # SIGKILLed, not left running its 300 s


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_until(done, what: str, limit: float = 120.0) -> None:
    end = time.monotonic() + limit
    while not done():
        assert time.monotonic() < end, f"not {what} after {limit:.0f} s"
        time.sleep(0.05)


class _Parsed(Exception):
    pass


def test_lightning_cli_calls_parse_ckpt_path_after_the_parse_before_any_instance(monkeypatch):
    from lightning.pytorch.cli import LightningCLI
    from lightning.pytorch.demos.boring_classes import BoringModel

    assert list(inspect.signature(LightningCLI._parse_ckpt_path).parameters) == ["self"]
    seen = []

    class CLI(compat.CkptPathHook, LightningCLI):
        def check_ckpt_path(self):
            seen.append((self.config.subcommand, self.config.fit.ckpt_path, hasattr(self, "trainer")))
            raise _Parsed

        def instantiate_classes(self):
            seen.append("instantiated")

    monkeypatch.setattr(sys, "argv", ["loopnet"])  # (LightningCLI warns when both argv and args are given)
    with pytest.raises(_Parsed):
        CLI(BoringModel, args=["fit", "--ckpt_path", "some.ckpt"])
    assert seen == [("fit", "some.ckpt", False)]


def test_lightning_cli_seeds_and_runs_through_the_hooks_no_run_hook_empties(monkeypatch, tmp_path):
    import lightning.pytorch.cli as cli_module
    from lightning.pytorch.cli import LightningCLI
    from lightning.pytorch.demos.boring_classes import BoringModel

    assert list(inspect.signature(LightningCLI._set_seed).parameters) == ["self"]
    assert list(inspect.signature(LightningCLI._run_subcommand).parameters) == ["self", "subcommand"]
    seeded, ran = [], []
    monkeypatch.setattr(cli_module, "seed_everything", lambda seed, **kw: seeded.append(seed) or seed)
    monkeypatch.setattr(BoringModel, "training_step", lambda *a: ran.append("step"))
    monkeypatch.setattr(sys, "argv", ["loopnet"])
    args = [
        "fit",
        "--trainer.default_root_dir",
        str(tmp_path),
        "--seed_everything",
        "7",
        "--trainer.max_steps",
        "1",
        "--trainer.logger",
        "false",
        "--trainer.enable_checkpointing",
        "false",
        "--trainer.enable_progress_bar",
        "false",
    ]

    class CLI(compat.NoRunHook, LightningCLI):
        pass

    cli = CLI(BoringModel, args=args, save_config_callback=None)
    assert hasattr(cli, "trainer") and seeded == [] and ran == []  # built; neither seeded nor run
    LightningCLI(BoringModel, args=args, save_config_callback=None)
    assert seeded == [7] and ran  # without the hook: LightningCLI seeds through _set_seed and runs the fit


def test_configured_checkpoint_io_is_none_until_one_is_given():
    from lightning.pytorch import Trainer
    from lightning.pytorch.plugins.io import TorchCheckpointIO

    trainer = Trainer(accelerator="cpu", logger=False, enable_checkpointing=False)
    assert compat.configured_checkpoint_io(trainer.strategy) is None
    assert isinstance(trainer.strategy.checkpoint_io, TorchCheckpointIO)  # the public property makes one
    given = TorchCheckpointIO()
    trainer = Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, plugins=[given])
    assert compat.configured_checkpoint_io(trainer.strategy) is given


def test_rerun_validation_sets_the_restart_stage_the_evaluation_loop_reads():
    from lightning.pytorch import Trainer
    from lightning.pytorch.loops.evaluation_loop import RestartStage

    trainer = Trainer(accelerator="cpu", logger=False, enable_checkpointing=False)
    loop = trainer.fit_loop.epoch_loop.val_loop
    assert hasattr(loop, "_restart_stage") and hasattr(RestartStage, "RESTARTED_MID_EVALUATION")
    compat.rerun_validation(trainer)
    assert loop._restart_stage is RestartStage.RESTARTED_MID_EVALUATION
    assert loop.restarted_mid_evaluation  # what the loop reads when it next runs


def test_compute_dtype_of_each_precision():
    from lightning.pytorch.plugins.precision import HalfPrecision, MixedPrecision, Precision

    assert compat.compute_dtype(Precision()) == torch.float32
    assert compat.compute_dtype(MixedPrecision("bf16-mixed", "cpu")) == torch.bfloat16
    assert compat.compute_dtype(MixedPrecision("16-mixed", "cpu")) == torch.half
    assert compat.compute_dtype(HalfPrecision("bf16-true")) == torch.bfloat16


def test_the_stop_flag_is_what_received_sigterm_reads(tmp_path):
    from lightning.pytorch import Trainer

    trainer = Trainer(
        default_root_dir=tmp_path,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    assert trainer.received_sigterm is False
    compat.set_stop_flag(trainer)
    assert trainer.received_sigterm is True
    compat.set_stop_flag(trainer, False)
    assert trainer.received_sigterm is False


def test_the_stop_flag_stops_a_fit_after_the_batch(tmp_path):
    from lightning.pytorch import Callback, Trainer
    from lightning.pytorch.demos.boring_classes import BoringModel

    class StopAt(Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 2:
                compat.set_stop_flag(trainer)

    trainer = Trainer(
        default_root_dir=tmp_path,
        logger=False,
        enable_checkpointing=False,
        max_steps=10,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[StopAt()],
    )
    with pytest.raises(SystemExit) as stopped:  # Lightning's SIGTERM path: a clean exit
        trainer.fit(BoringModel())
    assert stopped.value.code in (0, None) and trainer.global_step == 2


# ----------------------------------------------------------------------------- jsonargparse


def test_parsing_settings_is_the_dict_set_parsing_settings_writes():
    from jsonargparse import set_parsing_settings

    settings = compat.parsing_settings()
    before = {key: copy.deepcopy(settings[key]) for key in ("import_path_verdicts", "import_paths_enforced")}
    try:
        set_parsing_settings(import_path_denylist=["*"], import_path_allowlist=["loopnet"])
        assert settings["import_paths_enforced"] is True and settings["import_path_verdicts"]["loopnet"] is True
        with pytest.raises(Exception, match="os"):
            compat.import_object("os.path.join")
    finally:
        settings.update(before)  # as trust.apply restores a trusted config's default
    with warnings.catch_warnings():  # jsonargparse's default: `os` warned about, not refused
        warnings.simplefilter("ignore")
        assert compat.import_object("os.path.join") is os.path.join


def test_import_object_takes_a_dotted_path():
    from jsonargparse._util import import_object

    assert list(inspect.signature(import_object).parameters)[0] == "name"
    assert compat.import_object("loopnet.compat.import_object") is compat.import_object


def test_the_settings_the_trust_check_restores_are_keys_of_parsing_settings():
    from jsonargparse import set_parsing_settings

    settings = compat.parsing_settings()
    assert {"import_path_verdicts", "import_paths_enforced", "instantiate_subclass_spec_in_any"} <= settings.keys()
    before = settings["instantiate_subclass_spec_in_any"]
    try:
        set_parsing_settings(instantiate_subclass_spec_in_any=not before)
        assert settings["instantiate_subclass_spec_in_any"] is (not before)
    finally:
        settings["instantiate_subclass_spec_in_any"] = before


def test_get_signature_parameters_follows_kwargs_into_the_class_they_go_to():
    """The trust check judges a config's slot by the annotation jsonargparse reads for it: a Lightning
    strategy's **kwargs go to the torch DDP wrapper, whose `process_group` has no class annotation."""
    from lightning.pytorch.strategies import DDPStrategy

    params = {p.name: p for p in compat.get_signature_parameters(DDPStrategy, None, logger=False)}
    assert {"accelerator", "cluster_environment", "process_group"} <= params.keys()
    assert all(hasattr(p, "annotation") for p in params.values())


# ----------------------------------------------------------------------------- torchmetrics

OPTIONAL_MODULES = ("matplotlib", "scipy.signal", "transformers")  # sorted


def test_torchmetrics_imports_its_optional_backends_without_lean_torchmetrics():
    """The reason for `lean_torchmetrics` (Lightning imports torchmetrics at its own import): should an
    upgrade stop importing them, this fails (drop the patch)."""
    res = run_python(f"""
        import sys
        import torchmetrics

        print(sorted(m for m in {OPTIONAL_MODULES!r} if m in sys.modules))
    """)
    assert res.returncode == 0 and res.stdout.strip() == str(list(OPTIONAL_MODULES)), res.stderr


def test_a_loopnet_process_imports_torchmetrics_lean_and_every_check_stays_as_it_was():
    """`loopnet.training.cli` (every Trainer subcommand, the sweep's fits, DDP's other ranks) calls
    `lean_torchmetrics` before it imports Lightning."""
    res = run_python(f"""
        import sys
        import lightning_utilities.core.imports as checks

        find_spec, version = checks.find_spec, checks._version
        import loopnet.training.cli
        import torch
        from torchmetrics import MeanMetric
        from loopnet.compat import lean_torchmetrics

        print(sorted(m for m in {OPTIONAL_MODULES!r} if m in sys.modules))
        print(checks.find_spec is find_spec, checks._version is version)  # restored
        print(not any(type(f).__name__ == "_LeanTorchmetrics" for f in sys.meta_path))  # the hook is gone
        lean_torchmetrics()  # torchmetrics is imported: no second hook
        print(not any(type(f).__name__ == "_LeanTorchmetrics" for f in sys.meta_path))
        mean = MeanMetric()
        mean.update(torch.tensor([1.0, 3.0]))
        print(float(mean.compute()))
        # the packages stay installed for everyone else, the cached checks included
        print(checks.package_available("scipy"), checks.module_available("transformers"),
              bool(checks.RequirementCache("transformers>=4.4.0")), bool(checks.RequirementCache("scipy")))
        import scipy.signal, transformers, matplotlib
    """)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["[]", "True True", "True", "True", "2.0", "True True True True"], res.stdout


# ----------------------------------------------------------------------------- standard library


def test_run_exit_handlers_runs_the_atexit_handlers_now():
    res = run_python("""
        import atexit, os
        from loopnet.compat import run_exit_handlers

        atexit.register(print, "handler ran", flush=True)
        run_exit_handlers()
        print("then exits", flush=True)
        os._exit(0)  # no interpreter exit: the handler ran only by run_exit_handlers
    """)
    assert res.returncode == 0 and res.stdout.splitlines() == ["handler ran", "then exits"], res.stderr
