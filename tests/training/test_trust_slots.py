"""A config names a class only where the parameter's declared type expects one (loopnet.training.trust):
every parameter of every command's parser, at every depth of init_args, is tried with classes and
callables that start a process, and none may run. The parameters are enumerated from the signatures
jsonargparse reads (the parser's own source of truth), not sampled; a payload that gets past the check
is built as LightningCLI would build it, so a hole shows as the marker file it leaves."""

from __future__ import annotations

import collections.abc
import contextlib
import functools
import inspect
import os
import sys
import types
import typing
from pathlib import Path

import pytest

from loopnet.compat import get_signature_parameters

SUBCOMMANDS = ("fit", "validate", "test", "predict")
# Classes whose constructor starts a process, and a function that runs a shell command: the standard
# library's, and torch's own (an allowed package: only the slot check stops them).
TORCH_POPEN = "torch.distributed.elastic.multiprocessing.subprocess_handler.SubprocessHandler"


def payloads(marker: Path) -> dict[str, dict]:
    command = f"touch {marker}"
    return {
        "torch": {
            "class_path": TORCH_POPEN,
            "init_args": {
                "entrypoint": "sh",
                "args": ["-c", command],
                "env": {},
                "stdout": None,
                "stderr": None,
                "local_rank_id": 0,
                "numa_options": None,
            },
        },
        "subprocess": {"class_path": "subprocess.Popen", "init_args": {"args": ["sh", "-c", command]}},
        "os.system": {"class_path": "os.system", "init_args": {"command": command}},
    }


def _members(hint, listed: bool = False) -> list[tuple]:
    """The types a value of `hint` may have, each with whether it comes as a list's item."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return [m for a in typing.get_args(hint) for m in _members(a, listed)]
    if origin in (list, set, collections.abc.Iterable, collections.abc.Sequence) and typing.get_args(hint):
        return _members(typing.get_args(hint)[0], True)
    return [(hint, listed)]


def _concrete(base: type) -> list[type]:
    """The public, non-abstract subclasses of `base` defined in the allowed packages (imported so far)."""
    from loopnet.training.trust import ALLOWED

    found, todo = set(), [base]
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        module = cls.__module__
        if (
            module.split(".")[0] in ALLOWED
            and not inspect.isabstract(cls)
            and not cls.__name__.startswith("_")
            and "._" not in module
            and not module.startswith("tests")
        ):
            found.add(cls)
    return sorted(found, key=lambda c: f"{c.__module__}.{c.__qualname__}")


@functools.cache
def _hierarchies() -> tuple[type, ...]:
    """The class hierarchies whose members the walk follows into: the Trainer's slots for classes."""
    from lightning.fabric.plugins.environments import ClusterEnvironment
    from lightning.fabric.plugins.io import CheckpointIO
    from lightning.pytorch.accelerators import Accelerator
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.loggers import Logger
    from lightning.pytorch.plugins import LayerSync
    from lightning.pytorch.plugins.precision import Precision
    from lightning.pytorch.profilers import Profiler
    from lightning.pytorch.strategies import Strategy

    return Callback, Logger, Strategy, Accelerator, Precision, Profiler, ClusterEnvironment, CheckpointIO, LayerSync


@functools.cache
def slots(cls: type, depth: int) -> list[tuple[list, str, str]]:
    """Every parameter of `cls` that can take a class, as (chain, name, kind): `chain` the classes and
    positions leading to it ([] at `cls` itself, then (parameter, class) pairs), `kind` "open" (typed
    Any, object, not at all, or Callable: any class fits there) or "typed" (a class type). The classes
    a typed parameter accepts are followed `depth` levels down."""
    out = []
    for p in get_signature_parameters(cls, None, logger=False):
        members = _members(p.annotation)
        open_ = any(
            m in (typing.Any, object, inspect.Parameter.empty)
            or not (inspect.isclass(m) or typing.get_origin(m))
            or typing.get_origin(m) is collections.abc.Callable
            or m is collections.abc.Callable
            for m, _ in members
        )
        bases = [(m, listed) for m, listed in members if inspect.isclass(m) and issubclass(m, _hierarchies())]
        if open_:
            out.append(([], p.name, "open"))
        if bases:
            out.append(([], p.name, "typed"))
            listed = any(listed for _, listed in bases)
            for sub in _concrete(bases[0][0]) if depth else []:
                out += [([(p.name, sub, listed), *chain], name, kind) for chain, name, kind in slots(sub, depth - 1)]
    return out


def settings(root: str, chain: list, name: str, value) -> tuple[dict, str]:
    """The settings that give `value` to parameter `name` down `chain` from `root`, and its key path."""
    inner, key = {name: value}, name
    for param, cls, listed in reversed(chain):
        spec = {"class_path": f"{cls.__module__}.{cls.__qualname__}", "init_args": inner}
        inner, key = (
            ({param: [spec]}, f"{param}[0].init_args.{key}") if listed else ({param: spec}, f"{param}.init_args.{key}")
        )
    return {root: inner}, f"{root}.{key}"


@pytest.fixture(scope="module")
def parsers():
    """Each subcommand's LightningCLI parser, as `loopnet <subcommand>` builds it (nothing parsed)."""
    from loopnet.training.dry_run import CheckOnly
    from loopnet.training.cli import build

    got = {}

    class ParserOnly(CheckOnly):
        def parse_arguments(self, parser, args) -> None:
            got[self._only] = parser
            raise StopIteration

    argv, sys.argv = sys.argv, sys.argv[:1]
    try:
        for sub in SUBCOMMANDS:
            with pytest.raises(StopIteration):
                build([sub], ParserOnly)
    finally:
        sys.argv = argv
    return got


@pytest.fixture
def untrusted(monkeypatch, tmp_path):
    monkeypatch.delenv("LOOPNET_TRUST_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    from loopnet.training import trust

    trust.apply()
    yield
    monkeypatch.setenv("LOOPNET_TRUST_CONFIG", "1")
    trust.apply()


def _build(parser, sub: str, given: dict) -> None:
    """Build the classes of `given` as LightningCLI does after its checks (a payload that got past them runs)."""
    cfg = parser.parse_object({"subcommand": sub, sub: {"data": {"batch_size": 4}, **given}})
    parser.instantiate_classes(cfg)


@pytest.mark.parametrize("sub", SUBCOMMANDS)
def test_no_parameter_of_a_command_builds_a_class_it_does_not_expect(parsers, sub, untrusted, tmp_path):
    from loopnet.training import trust
    from loopnet.training.cli import LoopnetCLI

    parser = parsers[sub]
    roots = LoopnetCLI.roots()
    cfg = parser.parse_args([sub, "--data.batch_size", "4"])[sub]
    keys = [key for key in vars(cfg) if key not in roots and key != "config"]
    assert {"trainer", "model", "data", "checkpoint"} <= set(vars(cfg)) and "ckpt_path" in keys
    cases = [
        (functools.partial(settings, root, chain, name), kind)
        for root, cls in roots.items()
        for chain, name, kind in slots(cls, depth=2)
    ]
    cases += [(lambda value, key=key: ({key: value}, key), "open") for key in keys]  # the command's own options
    paths = {place(None)[1] for place, _ in cases}
    # the walk reaches what the probe found: an `object` parameter in an allowed strategy's init_args
    assert (
        "trainer.strategy.init_args.ddp_comm_state" in paths and "trainer.callbacks[0].init_args.on_fit_start" in paths
    )
    marker, holes, tried = tmp_path / "marker", [], 0
    for place, _ in cases:
        for name, payload in payloads(marker).items():
            given, path = place(payload)
            try:
                trust.check_config(given, roots)
            except ValueError as err:
                message = str(err)
                assert path in message and "--trust_config" in message and "\n" not in message, (path, message)
            else:
                with contextlib.suppress(Exception, SystemExit):  # failing or not, the marker tells if it ran
                    _build(parser, sub, given)
                holes.append(f"{path} <- {name} ({'RAN' if marker.exists() else 'not built'})")
                marker.unlink(missing_ok=True)
            tried += 1
    assert tried == 3 * len(cases)
    assert not holes, f"{sub}: {len(holes)} payloads not refused: " + "; ".join(
        sorted(holes, key=lambda hole: "RAN" not in hole)[:8]
    )


# ------------------------------------------------------------------ every place a config is read
# The probe's payload: torch's process-starting class in the `object`-typed parameter of an allowed strategy.
def _strategy(marker: Path) -> dict:
    return {
        "class_path": "lightning.pytorch.strategies.DDPStrategy",
        "init_args": {"ddp_comm_state": payloads(marker)["torch"]},
    }


SLOT = "trainer.strategy.init_args.ddp_comm_state"


def _refused(line: str | None, marker: Path, key: str = SLOT) -> None:
    assert line and key in line and TORCH_POPEN in line and "--trust_config" in line, line
    assert "\n" not in line.strip()
    assert not marker.exists()


@pytest.fixture
def checked(untrusted, tmp_path, monkeypatch):
    """`check_command`: a `loopnet` command line through every check it passes before running (precheck,
    LightningCLI's parse, the CLI's own checks), nothing built."""
    from loopnet.training.dry_run import check_command

    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    return check_command


def test_a_config_file_and_the_command_line_are_refused_by_slot(checked, tmp_path):
    import json

    import yaml

    from tests.reliability.helpers import SHORT

    marker = tmp_path / "marker"
    (tmp_path / "evil.yaml").write_text(yaml.safe_dump({"trainer": {"strategy": _strategy(marker)}}))
    _refused(checked(["fit", *SHORT, "--config", str(tmp_path / "evil.yaml")]), marker)
    _refused(checked(["fit", *SHORT, f"--trainer.strategy={json.dumps(_strategy(marker))}"]), marker)
    # an included file, and the payload one level deeper: in the strategy's precision plugin's init_args
    (tmp_path / "top.yaml").write_text("config: evil.yaml\n")
    _refused(checked(["fit", *SHORT, "--config", str(tmp_path / "top.yaml")]), marker)
    plugin = {
        "class_path": "lightning.pytorch.plugins.precision.TransformerEnginePrecision",
        "init_args": {"weights_dtype": "torch.float32", "recipe": payloads(marker)["torch"]},
    }
    deeper = {"class_path": "lightning.pytorch.strategies.DDPStrategy", "init_args": {"precision_plugin": plugin}}
    _refused(
        checked(["fit", *SHORT, f"--trainer.strategy={json.dumps(deeper)}"]),
        marker,
        "trainer.strategy.init_args.precision_plugin.init_args.recipe",
    )


def test_an_evaluation_is_refused_by_slot(checked, tmp_path):
    """`loopnet test` (and validate, predict) with a checkpoint: refused before anything is built."""
    import json

    import torch

    from loopnet.training.dry_run import parse_fit
    from tests.reliability.helpers import SHORT

    marker = tmp_path / "marker"
    ckpt = tmp_path / "last.ckpt"
    os.environ["LOOPNET_TRUST_CONFIG"] = "1"  # the checkpoint's config, read with the session's opt-in
    try:
        config = parse_fit(SHORT).model.config.as_dict()
    finally:
        del os.environ["LOOPNET_TRUST_CONFIG"]
    torch.save({"state_dict": {}, "hyper_parameters": {"config": config}, "global_step": 2}, ckpt)
    for sub in ("test", "validate", "predict"):
        _refused(
            checked([sub, *SHORT, "--ckpt_path", str(ckpt), f"--trainer.strategy={json.dumps(_strategy(marker))}"]),
            marker,
        )


def test_a_sweeps_overrides_and_grid_are_refused_by_slot(untrusted, tmp_path, monkeypatch):
    import yaml

    from loopnet.study.grid import SweepError, expand, load_sweep
    from loopnet.study.sweep import check_cells
    from tests.reliability.helpers import ROOT

    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    marker = tmp_path / "marker"
    base = [str(ROOT / "configs/deeploop_r6.yaml"), str(ROOT / "configs/cpu.yaml")]
    for spec in (
        {"overrides": {"trainer.strategy": _strategy(marker)}, "grid": {"model.optim.lr": [0.1]}},
        {"grid": {"trainer.strategy": [_strategy(marker)]}},
    ):
        grid = tmp_path / "grid.yaml"
        grid.write_text(yaml.safe_dump({"base": base, "out": str(tmp_path / "out"), **spec}))
        sweep = load_sweep(grid)
        with pytest.raises(SweepError) as refused:  # `loopnet sweep` checks every cell before any runs
            check_cells(sweep, expand(sweep))
        _refused(str(refused.value), marker)


def test_probe_reads_its_config_under_the_same_rule(untrusted, tmp_path, monkeypatch, capsys):
    import yaml

    from loopnet.study.probe import main
    from tests.reliability.helpers import ROOT

    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    marker = tmp_path / "marker"
    (tmp_path / "evil.yaml").write_text(yaml.safe_dump({"trainer": {"strategy": _strategy(marker)}}))
    with pytest.raises(SystemExit) as exit_:
        main(
            [
                "--config",
                str(ROOT / "configs/deeploop_r6.yaml"),
                "--config",
                str(ROOT / "configs/cpu.yaml"),
                "--config",
                str(tmp_path / "evil.yaml"),
                "--out",
                str(tmp_path / "probe"),
                "--steps",
                "1",
            ]
        )
    assert exit_.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1
    _refused(errors[0], marker)


# ------------------------------------------------------------------ a package named like an allowed one
@pytest.mark.parametrize("package", ["loopnet", "torch"])
def test_a_package_whose_name_starts_with_an_allowed_one_is_not_allowed(untrusted, tmp_path, monkeypatch, package):
    """`loopnetevil` is not `loopnet`: refused by name, never imported (its import would leave the marker),
    by every reader of a config (the early walk, the slot check, the whole command)."""
    from loopnet.training import trust
    from loopnet.training.dry_run import check_command
    from loopnet.training.cli import LoopnetCLI
    from tests.reliability.helpers import SHORT

    name = f"{package}evil"
    marker = tmp_path / "marker"
    (tmp_path / f"{name}.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).touch()\n\n"
        "from lightning.pytorch.callbacks import Callback\n\nclass Foo(Callback):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    spec = {"trainer": {"callbacks": [{"class_path": f"{name}.Foo"}]}}
    with pytest.raises(ValueError, match=rf"{name}\.Foo.*--trust_config"):
        trust.check_config(spec, LoopnetCLI.roots())  # the slot fits (a Callback): only the name refuses it
    assert not marker.exists() and name not in sys.modules
    with pytest.raises(ValueError, match=rf"{name}\.Foo.*--trust_config"):
        trust.refuse_untrusted(spec)
    line = check_command(["fit", *SHORT, f"--trainer.callbacks+={name}.Foo"])
    assert line and f"{name}.Foo" in line and "--trust_config" in line, line
    assert not marker.exists() and name not in sys.modules
    assert not trust.allowed(f"{name}.Foo") and trust.allowed(f"{package}.nn.Linear")


def test_eval_task_yaml_that_names_python_needs_the_opt_in(untrusted, tmp_path):
    """`loopnet eval --include_path`: a task YAML (or a file it includes) whose `!function` the harness would
    import from a Python file beside it is refused before the harness reads the folder."""
    from loopnet.eval.tasks import TaskSetupError, make_task_manager, refuse_task_code

    marker = tmp_path / "marker"
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "utils.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).touch()\n\ndef docs(d):\n    return d\n"
    )
    (tasks / "common.yaml").write_text("process_docs: !function utils.docs\n")
    (tasks / "mytask.yaml").write_text("task: mytask\ninclude: common.yaml\ndataset_path: json\n")
    with pytest.raises(TaskSetupError, match=r"common\.yaml \(line 1\) names the function utils\.docs.*--trust_config"):
        make_task_manager(["mytask"], [str(tasks)])
    assert not marker.exists() and "utils" not in sys.modules
    os.environ["LOOPNET_TRUST_CONFIG"] = "1"
    refuse_task_code(tasks)  # trusted: the harness's own rules apply


def test_a_class_named_by_its_short_name_is_walked_too(untrusted, tmp_path):
    """jsonargparse resolves `class_path: DDPStrategy` among the slot's subclasses; the check follows it into
    that class's init_args, and passes what fits."""
    from loopnet.training import trust
    from loopnet.training.cli import LoopnetCLI

    marker = tmp_path / "marker"
    short = {"class_path": "DDPStrategy", "init_args": {"ddp_comm_state": payloads(marker)["torch"]}}
    with pytest.raises(ValueError, match=rf"^{SLOT.replace('.', '[.]')} names {TORCH_POPEN}.*--trust_config"):
        trust.check_config({"trainer": {"strategy": short}}, LoopnetCLI.roots())
    fine = {
        "callbacks": [{"class_path": "LearningRateMonitor", "init_args": {"logging_interval": "step"}}],
        "strategy": {"class_path": "DDPStrategy", "init_args": {"find_unused_parameters": True}},
        "plugins": [{"class_path": "lightning.fabric.plugins.environments.LightningEnvironment"}],
        "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": "logs"}},
    }
    trust.check_config({"trainer": fine}, LoopnetCLI.roots())
    assert not marker.exists()
