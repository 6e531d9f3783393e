"""What a config may make Python import and run: classes of loopnet, Lightning, torch and torchmetrics,
nothing else, unless the user trusts the config (`--trust_config` or `LOOPNET_TRUST_CONFIG=1`).

jsonargparse imports every `class_path` a config names, and every dotted name it reads as a callable,
then calls it while it builds the classes: `class_path: os.system` with `init_args: {command: ...}` runs a
shell command, and importing a module runs its top-level code. Configs travel (a paper's repository, a
colleague's sweep), so a config is read as data: jsonargparse's own import-path policy denies every path
outside `ALLOWED` before anything is imported (`apply`), `refuse_untrusted` walks the settings read
without Lightning for the class paths it leaves unresolved, and `check_classes` refuses a bare function
named where a class is expected, after the (allowed) import and before anything is called.

    apply              set jsonargparse's policy (deny all but ALLOWED) unless the config is trusted
    take_flag          remove `--trust_config` from argv, recording the opt-in in the environment
    refuse_untrusted   raise ValueError for the first disallowed import path in settings (dicts, lists)
    check_classes      raise ValueError for a class_path that names no class, or a class of the wrong base
"""

from __future__ import annotations

import importlib.util
import inspect
import os
from typing import Any

from jsonargparse import Namespace, set_parsing_settings
from jsonargparse import _common

# jsonargparse's own import-path setting, restored for a trusted config (it has no public reset).
_DEFAULT = {key: _common.parsing_settings[key] for key in ("import_path_verdicts", "import_paths_enforced")}

ALLOWED = ("loopnet", "lightning", "torch", "torchmetrics")
FLAG = "--trust_config"
ENV = "LOOPNET_TRUST_CONFIG"
# Where LightningCLI builds a class of a known base from a config: key -> (module, base class name).
BASES = {"callbacks": ("lightning.pytorch.callbacks", "Callback"),
         "logger": ("lightning.pytorch.loggers", "Logger"),
         "strategy": ("lightning.pytorch.strategies", "Strategy"),
         "profiler": ("lightning.pytorch.profilers", "Profiler"),
         "accelerator": ("lightning.pytorch.accelerators", "Accelerator")}


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
    config gets jsonargparse's own default back (the setting is global: one process may check both)."""
    if not trusted():
        set_parsing_settings(import_path_denylist=["*"], import_path_allowlist=list(ALLOWED))
    else:
        _common.parsing_settings.update(_DEFAULT)


def allowed(path: str) -> bool:
    return path.split(".", 1)[0] in ALLOWED


def refusal(path: str, where: str) -> str:
    return (f"{where} names {path}, which a config may not import or run (configs may name only classes of "
            f"{', '.join(ALLOWED)}); fix: if you trust this config and its author, rerun with {FLAG} "
            f"(or {ENV}=1)")


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


def check_classes(settings: Any, where: str = "", key: str = "") -> None:
    """After LightningCLI's parse (the allowed modules imported, nothing called): every `class_path` names
    a class, not a function (a function named there is called with the init_args), and under the
    Trainer's callbacks, logger, strategy, profiler and accelerator a class of that base."""
    if trusted():
        return
    from jsonargparse._util import import_object

    if isinstance(settings, Namespace):
        settings = settings.as_dict()
    if isinstance(settings, dict):
        path = settings.get("class_path")
        if isinstance(path, str) and "." in path:
            obj = import_object(path)
            if not inspect.isclass(obj):
                raise ValueError(refusal(path, where) + " (it is not a class)")
            if key in BASES:
                module, name = BASES[key]
                base = getattr(importlib.import_module(module), name)
                if not issubclass(obj, base):
                    raise ValueError(f"{where} names {path}, which is not a {name}; fix: give a subclass of "
                                     f"{module}.{name} there")
        for k, value in settings.items():
            check_classes(value, f"{where}.{k}" if where else str(k), k)
    elif inspect.isroutine(settings):  # a dotted name read as a callable: imported, to be called later
        path = f"{getattr(settings, '__module__', None) or '?'}.{getattr(settings, '__qualname__', settings)}"
        raise ValueError(refusal(path, where) + " (it is a function, not a class)")
    elif isinstance(settings, (list, tuple)):
        for i, value in enumerate(settings):
            check_classes(value, f"{where}[{i}]", key)


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
            for key, value in (entry.items() if isinstance(entry, dict) else ()):
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
            files += [file.parent / name for name in ([included] if isinstance(included, str) else included or [])
                      if isinstance(name, str)]


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
        files += [path.parent / name for name in ([included] if isinstance(included, str) else included or [])
                  if isinstance(name, str)]


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
