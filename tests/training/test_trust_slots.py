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
        "torch": {"class_path": TORCH_POPEN, "init_args": {
            "entrypoint": "sh", "args": ["-c", command], "env": {}, "stdout": None, "stderr": None,
            "local_rank_id": 0, "numa_options": None}},
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
        if (module.split(".")[0] in ALLOWED and not inspect.isabstract(cls) and not cls.__name__.startswith("_")
                and "._" not in module and not module.startswith("tests")):
            found.add(cls)
    return sorted(found, key=lambda c: f"{c.__module__}.{c.__qualname__}")


@functools.cache
def slots(cls: type, depth: int) -> list[tuple[list, str, str]]:
    """Every parameter of `cls` that can take a class, as (chain, name, kind): `chain` the classes and
    positions leading to it ([] at `cls` itself, then (parameter, class) pairs), `kind` "open" (typed
    Any, object, not at all, or Callable: any class fits there) or "typed" (a class type). The classes
    a typed parameter accepts are followed `depth` levels down."""
    from loopnet.training.trust import _expected

    out = []
    for p in get_signature_parameters(cls, None, logger=False):
        members = _members(p.annotation)
        open_ = any(m in (typing.Any, object, inspect.Parameter.empty) or not (inspect.isclass(m) or typing.get_origin(m))
                    or typing.get_origin(m) is collections.abc.Callable or m is collections.abc.Callable
                    for m, _ in members)
        bases = [(m, listed) for m, listed in members if inspect.isclass(m) and issubclass(m, _expected())]
        if open_:
            out.append(([], p.name, "open"))
        if bases:
            out.append(([], p.name, "typed"))
            listed = any(listed for _, listed in bases)
            for sub in (_concrete(bases[0][0]) if depth else []):
                out += [([(p.name, sub, listed), *chain], name, kind) for chain, name, kind in slots(sub, depth - 1)]
    return out


def settings(root: str, chain: list, name: str, value) -> tuple[dict, str]:
    """The settings that give `value` to parameter `name` down `chain` from `root`, and its key path."""
    inner, key = {name: value}, name
    for param, cls, listed in reversed(chain):
        spec = {"class_path": f"{cls.__module__}.{cls.__qualname__}", "init_args": inner}
        inner, key = ({param: [spec]}, f"{param}[0].init_args.{key}") if listed else (
            {param: spec}, f"{param}.init_args.{key}")
    return {root: inner}, f"{root}.{key}"


@pytest.fixture(scope="module")
def parsers():
    """Each subcommand's LightningCLI parser, as `loopnet <subcommand>` builds it (nothing parsed)."""
    from loopnet.training.check import CheckOnly
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
    cases = [(functools.partial(settings, root, chain, name), kind)
             for root, cls in roots.items() for chain, name, kind in slots(cls, depth=2)]
    cases += [(lambda value, key=key: ({key: value}, key), "open") for key in keys]  # the command's own options
    paths = {place(None)[1] for place, _ in cases}
    # the walk reaches what the probe found: an `object` parameter in an allowed strategy's init_args
    assert "trainer.strategy.init_args.ddp_comm_state" in paths and "trainer.callbacks[0].init_args.on_fit_start" in paths
    tried = 0
    for place, kind in cases:
        for name, payload in payloads(tmp_path / "marker").items():
            given, path = place(payload)
            try:
                trust.check_config(given, roots)
            except ValueError as err:
                message = str(err)
                assert path in message and "--trust_config" in message and "\n" not in message, (path, message)
            else:
                with contextlib.suppress(Exception):  # whether it fails later or not, the marker tells if it ran
                    _build(parser, sub, given)
                pytest.fail(f"{sub}: {path} given {name}'s {payload['class_path']} was not refused "
                            f"(ran: {(tmp_path / 'marker').exists()})")
            assert not (tmp_path / "marker").exists(), (path, name)
            tried += 1
    assert tried == 3 * len(cases)
