"""What a config may make Python import and run. A config names a class only where the parameter it
sets is declared with a class hierarchy loopnet expects (callbacks, loggers, strategies, accelerators,
precision and the Trainer's other plugins, profilers, optimizers, schedulers, data and model classes:
`EXPECTED`), the class a subclass of it and defined under loopnet, Lightning, torch or torchmetrics
(`ALLOWED`); anything else needs the user's trust (`--trust_config` or `LOOPNET_TRUST_CONFIG=1`).

jsonargparse imports every `class_path` a config names, and every dotted name it reads as a callable,
then calls it while it builds the classes: `class_path: os.system` with `init_args: {command: ...}` runs a
shell command, importing a module runs its top-level code, and torch's own classes include some whose
constructor starts a process. Lightning types some parameters `object` or `Any` (DDPStrategy's
`ddp_comm_state`, the DDP keywords it passes on), where any class fits. Configs travel (a paper's
repository, a colleague's sweep), so a config is read as data:

- by name, before any import: jsonargparse's own import-path policy denies every path outside ALLOWED
  (`apply`), and `refuse_untrusted` walks the settings read without Lightning for such paths;
- by slot, after LightningCLI's parse (which imports only ALLOWED modules) and before anything is built:
  `check_config` walks the settings against each class's own signature, at any depth of init_args.

    apply              set jsonargparse's policy (deny all but ALLOWED) unless the config is trusted
    take_flag          remove `--trust_config` from argv, recording the opt-in in the environment
    refuse_untrusted   raise ValueError for the first disallowed import path in settings (dicts, lists)
    check_config       raise ValueError for the first class or callable that a key's declared type does not expect
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import os
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from jsonargparse import Namespace, set_parsing_settings

from loopnet.compat import parsing_settings

# jsonargparse's own settings that `apply` changes, restored for a trusted config (they have no public reset).
_DEFAULT = {
    key: parsing_settings()[key]
    for key in ("import_path_verdicts", "import_paths_enforced", "instantiate_subclass_spec_in_any")
}

ALLOWED = ("loopnet", "lightning", "torch", "torchmetrics")
FLAG = "--trust_config"
ENV = "LOOPNET_TRUST_CONFIG"


def trusted() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


def take_flag(argv: list[str]) -> list[str]:
    """argv without `--trust_config`; its presence sets LOOPNET_TRUST_CONFIG=1 (inherited by DDP's and
    a sweep's processes, which read their own command lines)."""
    if FLAG in argv:
        os.environ[ENV] = "1"
    return [a for a in argv if a != FLAG]


def apply() -> None:
    """Deny every import path a config value names outside ALLOWED (jsonargparse checks each before
    importing it, and again where the object is defined: `torch.os.system` is `posix.system`); a trusted
    config gets jsonargparse's own defaults back (the settings are global: one process may check both)."""
    if not trusted():
        # and a class spec given where any value goes is kept as data, never built (`check_config` refuses it)
        set_parsing_settings(
            import_path_denylist=["*"], import_path_allowlist=list(ALLOWED), instantiate_subclass_spec_in_any=False
        )
    else:
        parsing_settings().update(_DEFAULT)


def allowed(path: str) -> bool:
    """Whether `path`'s package is one of ALLOWED: its first name whole (`loopnetevil` is not `loopnet`)."""
    return path.split(".", 1)[0] in ALLOWED


def refusal(path: str, where: str) -> str:
    return (
        f"{where} names {path}, which a config may not import or run (configs may name only classes of "
        f"{', '.join(ALLOWED)}); fix: if you trust this config and its author, rerun with {FLAG} "
        f"(or {ENV}=1)"
    )


def _names_module(value: str) -> bool:
    """Whether a string reads as `module.attribute` of an installed module (found without importing it)."""
    parts = value.split(".")
    if len(parts) < 2 or not all(p.isidentifier() for p in parts):
        return False
    try:
        return importlib.util.find_spec(parts[0]) is not None
    except (ImportError, ValueError):
        return False


def refuse_untrusted(settings: Any, where: str = "the config") -> None:
    """Raise ValueError naming the first import path in `settings` (nested dicts, Namespaces, lists, as
    read from config files and the command line) that is not allowed: a `class_path`, or a string that
    names an installed module's attribute (what jsonargparse imports for a callable or a class)."""
    if trusted():
        return
    if isinstance(settings, Namespace):
        settings = settings.as_dict()
    if isinstance(settings, dict):
        for key, value in settings.items():
            here = f"{where}.{key}" if where else str(key)
            if key == "class_path" and isinstance(value, str) and "." in value and not allowed(value):
                raise ValueError(refusal(value, where))
            refuse_untrusted(value, here)
    elif isinstance(settings, (list, tuple)):
        for i, value in enumerate(settings):
            refuse_untrusted(value, f"{where}[{i}]")
    elif isinstance(settings, str) and _names_module(settings) and not allowed(settings):
        raise ValueError(refusal(settings, where))


# The class hierarchies a config may name a class of, each where a parameter is declared with it (or a
# subclass of it): (module, class name). The Trainer's own plugin types are here as its `plugins` takes them.
EXPECTED = (
    ("lightning.pytorch.callbacks", "Callback"),
    ("lightning.pytorch.loggers", "Logger"),
    ("lightning.pytorch.strategies", "Strategy"),
    ("lightning.pytorch.accelerators", "Accelerator"),
    ("lightning.pytorch.plugins.precision", "Precision"),
    ("lightning.pytorch.profilers", "Profiler"),
    ("lightning.fabric.plugins.environments", "ClusterEnvironment"),
    ("lightning.fabric.plugins.io", "CheckpointIO"),
    ("lightning.pytorch.plugins", "LayerSync"),
    ("torch.optim", "Optimizer"),
    ("torch.optim.lr_scheduler", "LRScheduler"),
    ("lightning.pytorch", "LightningModule"),
    ("lightning.pytorch", "LightningDataModule"),
)
# Where a parameter is declared `type[X]`, the class itself, never built: FSDP's wrapping policies name
# the model's blocks (`auto_wrap_policy: [loopnet.model.layers.Block]`).
TYPES = (("torch.nn", "Module"),)


@functools.cache
def _expected(names: tuple = EXPECTED) -> tuple[type, ...]:
    return tuple(getattr(importlib.import_module(module), name) for module, name in names)


@dataclass
class _Slot:
    """What a parameter's declared type lets a config give it: instances of `bases` (a class spec), the
    classes `types` themselves (`type[X]`), items of `items` (a list), values of `values` (a mapping),
    the fields of `fields` (a dataclass); `anything`: typed Any, object or not at all."""

    bases: list[type] = field(default_factory=list)
    types: list[type] = field(default_factory=list)
    items: list[Any] = field(default_factory=list)
    values: list[Any] = field(default_factory=list)
    fields: list[type] = field(default_factory=list)
    anything: bool = False


class _OneOf(tuple):
    """Several declared types of one value (the items of two list types in a Union)."""


def _slot(hint: Any) -> _Slot:
    slot, todo = _Slot(), [hint]
    while todo:
        hint = todo.pop()
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        if isinstance(hint, _OneOf):
            todo += hint
        elif origin in (typing.Union, types.UnionType):
            todo += args
        elif origin is typing.Annotated:
            todo.append(args[0])
        elif origin is typing.Literal or hint is type(None):
            pass
        elif origin is type:
            slot.types += [t for a in args for t in _classes(a)]
        elif origin is collections.abc.Callable:  # jsonargparse builds a class spec given to Callable[..., X]
            slot.bases += [c for c in _classes(args[-1] if args else None) if issubclass(c, _expected())]
        elif inspect.isclass(origin) and issubclass(origin, collections.abc.Mapping):
            slot.values.append(args[-1] if args else Any)
        elif inspect.isclass(origin) and issubclass(origin, collections.abc.Iterable):
            slot.items += [a for a in args if a is not Ellipsis] or [Any]
        elif not inspect.isclass(hint) or hint is object:  # Any, no annotation, a name left unresolved
            slot.anything = True
        elif issubclass(hint, _expected()):
            slot.bases.append(hint)
        elif dataclasses.is_dataclass(hint):
            slot.fields.append(hint)
        elif issubclass(hint, collections.abc.Mapping):
            slot.values.append(Any)
        elif issubclass(hint, (list, tuple, set, frozenset)):
            slot.items.append(Any)
    return slot


def _classes(hint: Any) -> list[type]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return [c for a in typing.get_args(hint) for c in _classes(a)]
    return [hint] if inspect.isclass(hint) else []


def _type_name(hint: Any) -> str:
    if hint is inspect.Parameter.empty:
        return "(no type declared)"
    name = hint.__name__ if inspect.isclass(hint) else str(hint).replace("typing.", "")
    return f"(typed {name})"


def untrusted(where: str, path: str, why: str, fix: str = "") -> str:
    """The one-line refusal of `path` named at the key `where`."""
    return (
        f"{where} names {path}, but {why}; fix: {fix + ', or ' if fix else ''}if you trust this config and "
        f"its author, rerun with {FLAG} (or {ENV}=1)"
    )


def _import(path: str, where: str) -> type:
    """The class `path` names, imported only when its package is one of ALLOWED (by name: `loopnetevil` is
    not `loopnet`) and checked to be defined there too (`torch.os.system` is `posix.system`)."""
    if not allowed(path):
        raise ValueError(refusal(path, where))
    module, _, name = path.rpartition(".")
    try:
        try:
            obj = getattr(importlib.import_module(module), name)
        except ModuleNotFoundError:  # a class nested in a class: module.Outer.Inner
            parent, _, outer = module.rpartition(".")
            obj = getattr(getattr(importlib.import_module(parent), outer), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise ValueError(f"{where} names {path}, which cannot be imported ({err}); fix: check its spelling") from None
    defined = f"{getattr(obj, '__module__', None)}.{getattr(obj, '__qualname__', '')}"
    if not allowed(defined):
        raise ValueError(refusal(defined, where))
    if not inspect.isclass(obj):
        raise ValueError(refusal(path, where) + " (it is a function, not a class)")
    return obj


def _by_name(name: str, bases: list[type]) -> type | None:
    """The subclass of `bases` named `name` (jsonargparse's short form, `class_path: DDPStrategy`)."""
    todo, seen = list(bases), set()
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        if cls.__name__ == name:
            return cls
        todo += cls.__subclasses__()
    return None


@functools.cache
def _params(cls: type) -> dict[str, Any]:
    """The parameters a config gives `cls` (its signature, following **kwargs as jsonargparse does) and their
    declared types."""
    from loopnet.compat import get_signature_parameters

    return {p.name: p.annotation for p in get_signature_parameters(cls, None, logger=False)}


def check_tree(value: Any, hint: Any, where: str) -> None:
    """Raise ValueError for the first class or callable in `value` (a config's settings, parsed or as
    read) that the declared type `hint` of its key does not expect: a class spec (`class_path`) or a class
    is accepted only where `hint` names a class hierarchy of EXPECTED, and must be a subclass of it; its
    `init_args` are checked against its own signature, at any depth. A function is never accepted."""
    if isinstance(value, Namespace):
        value = value.as_dict()
    slot = _slot(hint)
    if isinstance(value, dict) and "class_path" in value:
        path = value["class_path"]
        if not isinstance(path, str):
            path = f"{getattr(path, '__module__', '?')}.{getattr(path, '__qualname__', path)}"
        if not slot.bases:
            why = f"that option {_type_name(hint)} " + (
                "takes any value, so no class named there is checked"
                if slot.anything
                else "takes no class from a config"
            )
            raise ValueError(untrusted(where, path, why))
        if "." not in path:
            cls = _by_name(path, slot.bases)
            if cls is None:
                raise ValueError(
                    untrusted(
                        where, path, "no class of that name is known there", "give the full import path of the class"
                    )
                )
            if not allowed(cls.__module__):  # a class of that name imported from elsewhere
                raise ValueError(refusal(f"{cls.__module__}.{cls.__qualname__}", where))
        else:
            cls = _import(path, where)
        if not issubclass(cls, tuple(slot.bases)):
            want = " or ".join(f"{b.__module__}.{b.__qualname__}" for b in slot.bases)
            raise ValueError(
                untrusted(where, path, f"it is not a {slot.bases[0].__name__}", f"give a subclass of {want} there")
            )
        params = _params(cls)
        for group in ("init_args", "dict_kwargs"):
            args = value.get(group)
            if isinstance(args, Namespace):
                args = args.as_dict()
            for key, arg in args.items() if isinstance(args, dict) else ():
                hint_ = params.get(key, Any) if group == "init_args" else Any
                check_tree(arg, hint_, f"{where}.{group}.{key}")
        return
    if inspect.isclass(value):  # a class itself, as a parse leaves one given to type[X]
        path = f"{value.__module__}.{value.__qualname__}"
        if not allowed(path):
            raise ValueError(refusal(path, where))
        if not any(issubclass(value, t) and issubclass(t, _expected() + _expected(TYPES)) for t in slot.types):
            raise ValueError(untrusted(where, path, f"that option {_type_name(hint)} takes no class from a config"))
        return
    if callable(value):  # a function (or any callable object) named by its import path
        path = f"{getattr(value, '__module__', None) or '?'}.{getattr(value, '__qualname__', type(value).__name__)}"
        raise ValueError(refusal(path, where) + " (it is a function, not a class)")  # noqa: TRY004
    if isinstance(value, dict):
        params = {}
        for cls in slot.fields:
            params.update(_params(cls))
        for key, item in value.items():
            if isinstance(key, str) and key.startswith("__"):  # jsonargparse's own (__path__)
                continue
            inner = params.get(key) if key in params else (_OneOf(slot.values) if slot.values and not params else Any)
            check_tree(item, inner, f"{where}.{key}" if where else str(key))
    elif isinstance(value, (list, tuple, set)):
        inner = _OneOf(slot.items) if slot.items else (hint if slot.bases or slot.types else Any)
        for i, item in enumerate(value):
            check_tree(item, inner, f"{where}[{i}]")


def check_config(cfg: Any, roots: dict[str, type]) -> None:
    """check_tree on a command's settings: each key of `roots` against that class's signature (the Trainer,
    the model, the data module, a callback's group), any other key as typed Any. Nothing with a trusted
    config (`--trust_config`)."""
    if trusted():
        return
    if isinstance(cfg, Namespace):
        cfg = cfg.as_dict()
    for key, value in (cfg or {}).items():
        if key.startswith("__") or key == "config":  # the config files' paths
            continue
        if key in roots:
            params = _params(roots[key])
            if isinstance(value, dict):
                for name, item in value.items():
                    if not name.startswith("__"):
                        check_tree(item, params.get(name, Any), f"{key}.{name}")
                continue
        check_tree(value, Any, key)


def refuse_sweep(spec: Any, path: Any) -> None:
    """The same rule for a sweep file (`loopnet sweep`): its `overrides`, `grid` and `include` values of
    Lightning's options, and the Trainer's settings in its `base` configs and their `config:` includes;
    raises ValueError (a SweepError's base)."""
    if trusted() or not isinstance(spec, dict):
        return
    from pathlib import Path

    import yaml

    from loopnet.training.defaults import CALLBACK_GROUPS

    lightning_keys = ("trainer", *CALLBACK_GROUPS)
    for section in ("overrides", "grid", "include"):
        entries = spec.get(section) or {}
        for entry in entries if isinstance(entries, list) else [entries]:
            for key, value in entry.items() if isinstance(entry, dict) else ():
                if str(key).split(".", 1)[0] in lightning_keys:
                    refuse_untrusted(value, f"{path}: {section}.{key}")
    base = spec.get("base") or []
    files = [Path(f) for f in ([base] if isinstance(base, str) else base) if isinstance(f, str)]
    while files:
        file = files.pop(0)
        try:
            loaded = yaml.safe_load(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue  # the sweep and the cells' checks say what is wrong with the file
        if isinstance(loaded, dict):
            for key in lightning_keys:
                refuse_untrusted(loaded.get(key), f"{file}: {key}")
            included = loaded.get("config")
            files += [
                file.parent / name
                for name in ([included] if isinstance(included, str) else included or [])
                if isinstance(name, str)
            ]


def _walk_file(file: Any, keys: tuple[str, ...], where: str = "") -> None:
    """refuse_untrusted on the `keys` sections of a YAML config file and of the files its `config:` names."""
    from pathlib import Path

    import yaml

    files = [Path(file)]
    while files:
        path = files.pop(0)
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue  # the parser says what is wrong with the file
        if not isinstance(loaded, dict):
            continue
        for key in keys:
            refuse_untrusted(loaded.get(key), f"{where}{path}: {key}")
        included = loaded.get("config")
        files += [
            path.parent / name
            for name in ([included] if isinstance(included, str) else included or [])
            if isinstance(name, str)
        ]


def refuse_in_argv(argv: list[str]) -> None:
    """refuse_untrusted on what a command line gives Lightning's options (the Trainer's, the callbacks'),
    read as jsonargparse reads them (a value is YAML), and on its config files and their includes: before
    any parse, since jsonargparse imports a `class_path` it reads even in an untyped mapping."""
    if trusted():
        return
    import yaml

    from loopnet.training.defaults import CALLBACK_GROUPS

    keys = ("trainer", *CALLBACK_GROUPS)
    options = []
    for i, arg in enumerate(argv):
        if arg.startswith("-") and "=" in arg:
            options.append(tuple(arg.split("=", 1)))
        elif arg.startswith("-") and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            options.append((arg, argv[i + 1]))
    for option, value in options:
        key = option.lstrip("-")
        if key in ("c", "config"):
            _walk_file(value, keys)
        elif key.split(".", 1)[0].removesuffix("+") in keys:
            try:
                value = yaml.safe_load(value)
            except yaml.YAMLError:
                pass
            if key.rstrip("+").endswith("class_path") and isinstance(value, str) and not allowed(value):
                raise ValueError(refusal(value, key.rsplit(".", 1)[0]))
            refuse_untrusted(value, key)
