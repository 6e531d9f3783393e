"""The checks of a Trainer command's input (`loopnet fit/validate/test/predict`) that need no Lightning,
run before its import (seconds under load) so that a typo is reported at once: the config files (exist,
valid YAML), the keys and values of the model's typed configs (`LoopConfig`, `OptimConfig`,
`GenerateConfig`), the batch size, `--trainer.max_steps` and the `--ckpt_path` file. Light to import
(yaml and loopnet's dataclasses only). What it cannot see (the Trainer's and the callbacks' options,
types of other groups) LightningCLI's parser checks after the import, as before; nothing here refuses
what that parser accepts.

    normalize_argv   `--key -1e-3` -> `--key=-1e-3` (argparse takes `-1e-3` for an option)
    precheck         raises ValueError (`<problem>; fix: <what to do>`) for the first problem found
"""

from __future__ import annotations

import difflib
import os
import re
import typing
from typing import Any, Literal, Union

import yaml

from loopnet import checkpoints
from loopnet.model.config import LoopConfig
from loopnet.training.options import GenerateConfig, OptimConfig

SUBCOMMANDS = ("fit", "validate", "test", "predict")
# The typed groups checked here: option prefix -> dataclass.
GROUPS = {"model.config": LoopConfig, "model.optim": OptimConfig, "model.generate": GenerateConfig}
NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


def normalize_argv(argv: list[str]) -> list[str]:
    """A negative number given as an option's value, `--model.optim.lr -1e-3`, as `--model.optim.lr=-1e-3`:
    argparse reads `-1e-3` (unlike `-5`) as an option of its own and says "expected one argument"."""
    out = []
    for arg in argv:
        if out and NUMBER.match(arg) and out[-1].startswith("--") and "=" not in out[-1]:
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def _load_yaml(path: str) -> Any:
    """A config file's YAML; a file that is not valid YAML gets one line naming it and the line."""
    try:
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ValueError(f"the config file {path} is not valid YAML ({problem}{where}); "
                         "fix its syntax there (brackets, quotes, indentation with spaces)") from None
    except UnicodeDecodeError:
        raise ValueError(f"the config file {path} is not UTF-8 text; fix: give a YAML file") from None


def _options(argv: list[str]) -> list[tuple[str, str]]:
    """(key, value) of the `--key value` / `--key=value` / `-c value` options, in order."""
    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--") and "=" in arg:
            key, value = arg[2:].split("=", 1)
            out.append((key, value))
        elif arg in ("-c", "--config") or (arg.startswith("--") and i + 1 < len(argv)
                                           and not argv[i + 1].startswith("-")):
            if i + 1 < len(argv):
                out.append(("config" if arg == "-c" else arg[2:], argv[i + 1]))
            i += 1
        i += 1
    return out


def max_steps_problem(subcommand: str | None, max_steps: Any) -> str | None:
    """Why `--trainer.max_steps` cannot work for `subcommand`, or None (one place for both checks)."""
    if not isinstance(max_steps, int) or isinstance(max_steps, bool):
        return None  # the parser reports a wrong type
    if subcommand == "fit" and max_steps == 0:
        return ("--trainer.max_steps 0 trains no step (the run would end at once, with an empty run folder); "
                "fix: give max_steps ≥ 1 (the number of optimiser steps to train)")
    if max_steps < -1:
        return (f"--trainer.max_steps {max_steps} is not a step count; fix: give max_steps ≥ 1 (the number of "
                f"optimiser steps to train), or -1 for no limit with --trainer.max_epochs")
    return None


def _coerce(value: Any, hint: Any) -> tuple[bool, Any]:
    """(True, value as `hint` holds it) when `value` fits the type, (False, None) when it does not;
    a type this check does not know counts as fitting (the parser decides)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Union:
        if value is None and type(None) in args:
            return True, None
        for arg in (a for a in args if a is not type(None)):
            ok, got = _coerce(value, arg)
            if ok:
                return True, got
        return False, None
    if origin is Literal:
        return True, value  # the dataclass names the allowed values itself
    if hint is bool:
        return (True, value) if isinstance(value, bool) else (False, None)
    if hint is int:
        if isinstance(value, str):
            try:
                return True, int(value)
            except ValueError:
                return False, None
        return (True, value) if isinstance(value, int) and not isinstance(value, bool) else (False, None)
    if hint is float:
        if isinstance(value, str):
            try:
                return True, float(value)
            except ValueError:
                return False, None
        return (True, float(value)) if isinstance(value, (int, float)) and not isinstance(value, bool) else (False, None)
    if hint is str:
        return (True, value) if isinstance(value, str) else (False, None)
    if origin is tuple and isinstance(value, (list, tuple)) and len(value) == len(args):
        items = [_coerce(v, a) for v, a in zip(value, args)]
        return (True, tuple(v for _, v in items)) if all(ok for ok, _ in items) else (False, None)
    if origin is tuple:
        return False, None
    return True, value


def _nested(config: dict, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(config, dict) or part not in config:
            return None
        config = config[part]
    return config


def _set(config: dict, dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for part in parents:
        if not isinstance(config.get(part), dict):
            config[part] = {}
        config = config[part]
    if isinstance(value, dict) and isinstance(config.get(leaf), dict):
        _merge(config[leaf], value)
    else:
        config[leaf] = value


def _merge(into: dict, new: dict) -> None:
    for key, value in new.items():
        _set(into, key, value)


def _typed_leaf(key: str) -> Any:
    """The type of option `key` when it is a field of a group checked here, else None."""
    group, _, field = key.rpartition(".")
    cls = GROUPS.get(group)
    return typing.get_type_hints(cls).get(field) if cls else None


def _read(argv: list[str]) -> tuple[dict, dict]:
    """The config that the command line `argv` (after the subcommand) gives, files and options merged in
    order as jsonargparse does, as far as this check reads it; and where each checked key came from."""
    config: dict = {}
    where: dict[str, str] = {}
    for key, value in _options(argv):
        if key == "config":
            if os.path.isfile(value):
                loaded = _load_yaml(value)
            else:
                loaded = yaml.safe_load(value) if ("\n" in value or ":" in value) else None
                if not isinstance(loaded, dict):
                    raise FileNotFoundError(f"the config file {value} does not exist; fix: check the path given with "
                                            f"--config (relative paths start from the current folder)")
            if isinstance(loaded, dict):
                _merge(config, loaded)
                for group in GROUPS:
                    for field in _nested(loaded, group) or {}:
                        where[f"{group}.{field}"] = f"in the config file {value}"
            continue
        hint = _typed_leaf(key)
        if hint is str or (typing.get_origin(hint) is Union and str in typing.get_args(hint)):
            parsed = value  # a prompt such as "ROMEO:" is text, not YAML
        elif key in (*GROUPS, "model", "data", "trainer", "data.batch_size", "trainer.max_steps",
                     "trainer.enable_checkpointing", "ckpt_path") or hint:
            try:
                parsed = yaml.safe_load(value)
            except yaml.YAMLError:
                parsed = value
        elif any(key.startswith(group + ".") for group in GROUPS):
            parsed = value  # an unknown key of a checked group: reported below
        else:
            continue  # an option this check does not read
        _set(config, key, parsed)
        where[key] = f"on the command line: {key} {value}"
    return config, where


def _check_group(subcommand: str, config: dict, where: dict, group: str, cls: type) -> Any:
    """The dataclass `cls` built from its options `config[group]`: unknown keys, types and its own checks."""
    given = _nested(config, group)
    if given is None:
        return cls()
    if not isinstance(given, dict):
        return None  # a class_path or other form: the parser's
    hints = typing.get_type_hints(cls)
    values = {}
    for key, value in given.items():
        name = f"{group}.{key}"
        if key not in hints:
            close = difflib.get_close_matches(key, list(hints), n=1, cutoff=0.75)
            hint = f"did you mean '{group}.{close[0]}'? " if close else "check the key's spelling and nesting; "
            source = where.get(name, "in a config file")
            problem = (f"unrecognized arguments: --{source.split(': ', 1)[1]}" if source.startswith("on the command line")
                       else f"--{name} ({source}) is not an option of `loopnet {subcommand}`")  # as the parser says it
            raise ValueError(f"{problem}; fix: {hint}`loopnet {subcommand} --help` lists every option and its type")
        ok, values[key] = _coerce(value, hints[key])
        if not ok:
            raise ValueError(f"--{name} {value!r} ({where.get(name, 'in a config file').split(':')[0]}) is not of the type "
                             f"{_type_name(hints[key])}; fix: give the option a value of the expected type; "
                             f"`loopnet {subcommand} --help` lists every option and its type")
    return cls(**values)  # its __post_init__ checks the values: ValueError with the fix


def _type_name(hint: Any) -> str:
    text = str(hint).replace("typing.", "").replace("NoneType", "None")
    return re.sub(r"<class '(\w+)'>", r"\1", text)


def precheck(argv: list[str]) -> None:
    """Check `loopnet <argv>` (a Trainer subcommand first) as far as that needs no Lightning; raises
    ValueError / FileNotFoundError with the one-line error (problem and fix)."""
    if not argv or argv[0] not in SUBCOMMANDS or any(a in ("-h", "--help") or a.startswith("--print_config")
                                                     for a in argv):
        return
    subcommand = argv[0]
    config, where = _read(normalize_argv(argv[1:]))
    for group, cls in GROUPS.items():
        _check_group(subcommand, config, where, group, cls)
    batch_size = _nested(config, "data.batch_size")
    if isinstance(batch_size, int) and not isinstance(batch_size, bool) and batch_size < 1:
        raise ValueError(f"--data.batch_size {batch_size} gives no sequence to a step; fix: give data.batch_size ≥ 1 "
                         f"(sequences per step and device, e.g. 8)")
    problem = max_steps_problem(subcommand, _nested(config, "trainer.max_steps"))
    if problem:
        raise ValueError(problem)
    if subcommand == "fit" and _nested(config, "trainer.enable_checkpointing") is False:
        # loopnet fit's ModelCheckpoint is part of the run (resume, interruption, best); Lightning refuses
        # the pair with a MisconfigurationException traceback after its import.
        raise ValueError("--trainer.enable_checkpointing false: loopnet fit always keeps last.ckpt (resume, "
                         "interruption) and the best checkpoint; fix: drop the option (to write fewer files, "
                         "--checkpoint.save_top_k 0 keeps no best checkpoint)")
    ckpt_path = _nested(config, "ckpt_path")
    if isinstance(ckpt_path, str) and ckpt_path not in ("last", "best", "hpc"):
        checkpoints.check_checkpoint_file(ckpt_path)

