"""The checks of a Trainer command's input (`loopnet fit/validate/test/predict`) that need no Lightning,
run before its import (seconds, tens under load) so that a typo is refused at once.

They read the command line with the parser LightningCLI builds, less Lightning: jsonargparse, from the
same signatures. `model` and `data` are the arguments of `LoopedLM.__init__` and
`TokenStreamDataModule.__init__`, read from their source files (`signature`) rather than imported (their
modules import Lightning); the typed configs they take (`LoopConfig`, `OptimConfig`, `GenerateConfig`) and
the names of the data sources and vocabularies are imported as they are. So config files, their
`config:` includes, option names, types and defaults are read as LightningCLI reads them. The Trainer's
and the callbacks' options (Lightning's signatures) are taken as they come (a mapping); LightningCLI's
own parser checks them after the import. Nothing here refuses what that parser accepts
(tests/training/test_precheck.py).

    normalize_argv   `--key -1e-3` -> `--key=-1e-3` (argparse takes `-1e-3` for an option)
    parser           the Lightning-free parser of a subcommand
    precheck         parse and check; raises ValueError (`<problem>; fix: <what to do>`) for the first problem
    check_settings   the checks of parsed settings that LightningCLI runs too (`before_instantiate_classes`)
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
import sys
from pathlib import Path
from typing import Any, Literal, Optional, Union

from jsonargparse import ActionConfigFile, ArgumentError, ArgumentParser, Namespace
from jsonargparse.typing import Path_fr

from loopnet import checkpoints
from loopnet.data.sources import Source
from loopnet.data.token_ids import DEFAULT as DEFAULT_VOCAB
from loopnet.data.token_ids import VocabName, check_fits
from loopnet.data.vocabulary import known_size
from loopnet.model.config import LoopConfig
from loopnet.model.parametrization import check_optimizer
from loopnet.training.defaults import CALLBACK_GROUPS
from loopnet.training.errors import OneLineErrors
from loopnet.training import trust
from loopnet.training.options import FrontierConfig, GenerateConfig, OptimConfig
from loopnet.training.subcommands import EVALUATION, READ_DATA, SUBCOMMANDS

PACKAGE = Path(__file__).resolve().parent.parent
# The classes LightningCLI builds `model` and `data` from: (source file, class name).
MODEL = (PACKAGE / "training" / "module.py", "LoopedLM")
DATA = (PACKAGE / "data" / "datamodule.py", "TokenStreamDataModule")
# What their signatures' annotations and defaults name (each module imports these under these names).
NAMES = {
    "Any": Any,
    "Literal": Literal,
    "Optional": Optional,
    "Union": Union,
    "LoopConfig": LoopConfig,
    "OptimConfig": OptimConfig,
    "GenerateConfig": GenerateConfig,
    "FrontierConfig": FrontierConfig,
    "Source": Source,
    "VocabName": VocabName,
    "DEFAULT_VOCAB": DEFAULT_VOCAB,
}
# Arguments one takes from another (LightningCLI's `link_arguments` too): (source, target).
LINKS = (("model.config.seq_len", "data.seq_len"),)
# Options of LightningCLI's subcommand parsers beside model, data, the Trainer and the callbacks (Trainer
# method arguments and the CLI's own): name -> (type, default), per subcommand.
CKPT_PATH = (Optional[Union[str, Path]], None)
METHOD_ARGS = {
    "fit": {"ckpt_path": CKPT_PATH, "weights_only": (Optional[bool], None)},
    "validate": {"ckpt_path": CKPT_PATH, "verbose": (bool, True), "weights_only": (Optional[bool], None)},
    "test": {"ckpt_path": CKPT_PATH, "verbose": (bool, True), "weights_only": (Optional[bool], None)},
    "predict": {
        "return_predictions": (Optional[bool], None),
        "ckpt_path": CKPT_PATH,
        "weights_only": (Optional[bool], None),
    },
}
# Lightning's option groups (the Trainer's, the callbacks'), taken as given: their keys and values, or a
# file of them (read by LightningCLI's parser, unchecked here).
MAPPING = Optional[Union[dict[str, Any], Path_fr]]
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


@functools.cache
def signature(path: Path, name: str) -> type:
    """A stand-in for class `name` of the file `path` whose `__init__` has that class's signature (names,
    annotations, defaults, read from the source with `ast`, evaluated with `NAMES`) and whose docstring
    is the class's: what jsonargparse reads from the class itself, without importing its module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    cls = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name)
    init = next(node for node in cls.body if isinstance(node, ast.FunctionDef) and node.name == "__init__")
    args = init.args.args
    defaults = [None] * (len(args) - len(init.args.defaults)) + list(init.args.defaults)
    P = inspect.Parameter
    params = [P("self", P.POSITIONAL_OR_KEYWORD)]
    for arg, default in zip(args[1:], defaults[1:]):
        params.append(
            P(
                arg.arg,
                P.POSITIONAL_OR_KEYWORD,
                annotation=eval(ast.unparse(arg.annotation), dict(NAMES)),
                default=P.empty if default is None else eval(ast.unparse(default), dict(NAMES)),
            )
        )

    def __init__(self, *args, **kwargs):
        pass

    __init__.__signature__ = inspect.Signature(params)
    # Named apart from the class itself: jsonargparse looks a class up by its import path, and
    # `loopnet.training.LoopedLM` would import the module (and Lightning) on first use.
    return type(
        name,
        (),
        {
            "__init__": __init__,
            "__doc__": ast.get_docstring(cls),
            "__module__": __name__,
            "__qualname__": f"{name}Signature",
        },
    )


class PrecheckParser(OneLineErrors, ArgumentParser):
    """jsonargparse's parser; errors said as LightningCLI's parser says them (`OneLineErrors`)."""


@functools.cache
def parser(subcommand: str) -> PrecheckParser:
    """The options of `loopnet <subcommand>` as LightningCLI's parser has them, built without Lightning."""
    p = PrecheckParser(prog=f"loopnet {subcommand}", exit_on_error=False)
    p.add_argument("-c", "--config", action=ActionConfigFile)
    p.add_argument("--seed_everything", type=Union[bool, int], default=True)
    p.add_argument("--trainer", type=MAPPING, default=None)
    p.add_class_arguments(signature(*MODEL), "model", fail_untyped=False, sub_configs=True)
    p.add_class_arguments(signature(*DATA), "data", fail_untyped=False, sub_configs=True)
    for group in CALLBACK_GROUPS:
        p.add_argument(f"--{group}", type=MAPPING, default=None)
    for name, (hint, default) in METHOD_ARGS[subcommand].items():
        p.add_argument(f"--{name}", type=hint, default=default)
    for source, target in LINKS:
        p.link_arguments(source, target)
    return p


def max_steps_problem(subcommand: str | None, max_steps: Any) -> str | None:
    """Why `--trainer.max_steps` cannot work for `subcommand`, or None (one place for both checks)."""
    if not isinstance(max_steps, int) or isinstance(max_steps, bool):
        return None  # the parser reports a wrong type
    if subcommand == "fit" and max_steps == 0:
        return (
            "--trainer.max_steps 0 trains no step (the run would end at once, with an empty run folder); "
            "fix: give max_steps ≥ 1 (the number of optimiser steps to train)"
        )
    if max_steps < -1:
        return (
            f"--trainer.max_steps {max_steps} is not a step count; fix: give max_steps ≥ 1 (the number of "
            f"optimiser steps to train), or -1 for no limit with --trainer.max_epochs"
        )
    return None


def ckpt_path_problem(subcommand: str, path: Any, init_weights: Any = None) -> str | None:
    """Why `--ckpt_path` cannot work for `subcommand` whatever the files hold, or None: an evaluation
    needs one (or a model folder's weights, `model.init_weights`), and one that names a checkpoint in this
    process (`best`, `hpc`) only a fit has."""
    if subcommand in EVALUATION and not path and not init_weights:
        return (
            f"`loopnet {subcommand}` needs --ckpt_path: without one it would run the model with its random "
            f"initial weights; fix: --ckpt_path runs/<run>/version_N/checkpoints/last.ckpt (or a best-*.ckpt), "
            f"or 'last' for the newest last.ckpt of this config's run, or --model.init_weights <a folder of "
            f"loopnet import or retrofit>"
        )
    if subcommand in EVALUATION and path in checkpoints.IN_PROCESS:
        return (
            f"--ckpt_path {path} names a checkpoint of a fit in this process, which `loopnet {subcommand}` "
            f"does not have; fix: give the .ckpt file (runs/<run>/version_N/checkpoints/best-*.ckpt) or 'last'"
        )
    return None


def _get(cfg: Any, *keys: str) -> Any:
    """cfg[k1][k2]... of a Namespace or dict (the Trainer's options are a dict here), None when absent."""
    for key in keys:
        if not isinstance(cfg, (Namespace, dict)):
            return None
        cfg = cfg.get(key)
    return cfg


def check_settings(subcommand: str | None, cfg: Namespace) -> None:
    """Settings that cannot work, refused before anything is built or written: the same checks on
    this module's parse and on LightningCLI's (`cfg`: one subcommand's settings)."""
    problem = max_steps_problem(subcommand, _get(cfg, "trainer", "max_steps"))
    if problem:
        raise ValueError(problem)
    if subcommand == "fit" and _get(cfg, "trainer", "enable_checkpointing") is False:
        # loopnet fit's ModelCheckpoint is part of the run (resume, interruption, best); Lightning refuses
        # the pair with a MisconfigurationException traceback after its import.
        raise ValueError(
            "--trainer.enable_checkpointing false: loopnet fit always keeps last.ckpt (resume, "
            "interruption) and the best checkpoint; fix: drop the option (to write fewer files, "
            "--checkpoint.save_top_k 0 keeps no best checkpoint)"
        )
    batch_size = _get(cfg, "data", "batch_size")
    if isinstance(batch_size, int) and not isinstance(batch_size, bool) and batch_size < 1:
        raise ValueError(
            f"--data.batch_size {batch_size} gives no sequence to a step; fix: give data.batch_size ≥ 1 "
            f"(sequences per step and device, e.g. 8)"
        )
    problem = accelerator_problem(_get(cfg, "trainer", "accelerator"))
    if subcommand in READ_DATA and _get(cfg, "data") is not None:
        problem = problem or data_problem(_get(cfg, "data"))
    if problem:
        raise ValueError(problem)
    vocab = _get(cfg, "data", "vocab") or DEFAULT_VOCAB
    if _get(cfg, "data") is not None and known_size(vocab) is not None:  # a compact one's size is known later
        check_fits(_get(cfg, "model", "config", "vocab_size"), known_size(vocab), vocab)


def validation_warning(subcommand: str | None, cfg: Namespace) -> str | None:
    """Why a fit would never validate (no val/loss, no best checkpoint), or None: it ends before the first
    validation (Lightning validates every val_check_interval steps, not at the end of a step-limited run)."""
    max_steps, every = _get(cfg, "trainer", "max_steps"), _get(cfg, "trainer", "val_check_interval")
    if subcommand != "fit" or _get(cfg, "trainer", "limit_val_batches") == 0:
        return None
    if all(isinstance(v, int) and not isinstance(v, bool) for v in (max_steps, every)) and 0 < max_steps < every:
        return (
            f"--trainer.max_steps {max_steps} < --trainer.val_check_interval {every}: the run ends before its "
            f"first validation (no val/loss, no best checkpoint); fix: --trainer.val_check_interval {max_steps} "
            f"(or fewer) to validate at the end"
        )
    return None


def accelerator_problem(accelerator: Any) -> str | None:
    """Why `--trainer.accelerator` names a device this machine lacks, or None (torch says, not Lightning)."""
    import torch

    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        return (
            f"--trainer.accelerator {accelerator}: this machine has no CUDA GPU that torch can use "
            f"(torch {torch.__version__}); fix: --trainer.accelerator cpu (e.g. --config configs/cpu.yaml), "
            f"or run on a machine with a GPU and a CUDA build of torch"
        )
    if accelerator == "mps" and not torch.backends.mps.is_available():
        return "--trainer.accelerator mps: this machine has no Apple GPU (MPS); fix: --trainer.accelerator cpu"
    return None


def data_problem(data: Any) -> str | None:
    """Why the data settings cannot give the corpus asked for, known without reading it: a path the
    source ignores, local files that are missing or all empty, a local folder that is not there."""
    from loopnet.data.errors import DataConfigError
    from loopnet.data.sources import resolve_files

    source, path = _get(data, "source"), _get(data, "path")
    if source == "shakespeare" and path not in (None, "", []):
        return (
            f"--data.path {path} is ignored by the source 'shakespeare' (the embedded corpus), so the run would "
            f"train on Shakespeare; fix: --data.source files (local text, json or parquet files), or "
            f"--data.source hub (a hub dataset or a local folder of its parquet files)"
        )
    if source == "files":
        try:
            files = resolve_files(path if path is not None else [])
        except DataConfigError as err:
            return str(err)
        if all(Path(f).stat().st_size == 0 for f in files):
            # worded as the data module's own check words it (loopnet.data.stream), which reads the files
            return (
                f"The corpus is empty: {len(files)} document(s), none with text (every file of data.path is "
                f"0 bytes: {', '.join(files[:3])}). Fix: point data.path at files that hold text"
            )
    if source == "hub" and isinstance(path, str) and not Path(path).is_dir() and "/" not in path.strip("/"):
        return (
            f"--data.path {path} is not a local folder (no {Path(path).absolute()}) nor a hub dataset id "
            f"(owner/name, e.g. Skylion007/openwebtext); fix: give the folder that holds the dataset's "
            f"parquet files, or its hub id"
        )
    return None


def _name_invalid_yaml(argv: list[str]) -> None:
    """Raise ValueError naming the first config file of `argv` (or one it includes) that is not valid YAML,
    with the line; nothing when each is."""
    import yaml

    files = [value for key, value in zip(argv, argv[1:]) if key in ("-c", "--config")]
    files += [arg.split("=", 1)[1] for arg in argv if arg.startswith("--config=")]
    while files:
        path = Path(files.pop(0))
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(err, "problem", None) or str(err).splitlines()[0]
            raise ValueError(
                f"the config file {path} is not valid YAML ({problem}{where}); "
                "fix: correct its syntax there (brackets, quotes, indentation with spaces)"
            ) from None
        except (OSError, UnicodeDecodeError):
            continue
        included = loaded.get("config") if isinstance(loaded, dict) else None
        files += [str(path.parent / name) for name in ([included] if isinstance(included, str) else included or [])]


def precheck(argv: list[str]) -> Namespace | None:
    """Check `loopnet <argv>` (a Trainer subcommand first) as far as that needs no Lightning; raises
    ValueError / FileNotFoundError with the one-line error (problem and fix). Returns the settings read
    (the Trainer's and callbacks' as given), or None for a command this does not check (help)."""
    if (
        not argv
        or argv[0] not in SUBCOMMANDS
        or any(a in ("-h", "--help") or a.startswith("--print_config") for a in argv)
    ):
        return None
    trust.apply()  # before any parse: a config names only classes of loopnet, Lightning, torch, torchmetrics
    trust.refuse_in_argv(argv)
    subcommand, p = argv[0], parser(argv[0])
    try:
        cfg = p.parse_args(normalize_argv(argv[1:]))
    except ArgumentError as err:
        if "Problems parsing config" in str(err):
            _name_invalid_yaml(argv)  # jsonargparse does not say which file
        raise ValueError(p.one_line(str(err), err)) from None
    for group in ("trainer", *CALLBACK_GROUPS):  # Lightning's options, read here as plain mappings
        trust.refuse_untrusted(cfg.get(group), group)
    for group, cls in (
        ("config", LoopConfig),
        ("optim", OptimConfig),
        ("generate", GenerateConfig),
        ("frontier", FrontierConfig),
    ):
        cls(**cfg.model[group].as_dict())  # each checks its values: ValueError with the fix
    check_optimizer(cfg.model.config.parametrization, cfg.model.optim.optimizer)
    check_settings(subcommand, cfg)
    warning = validation_warning(subcommand, cfg)
    if warning:  # here, not in check_settings: said once per command
        print(f"loopnet: warning: {warning}", file=sys.stderr)
    problem = ckpt_path_problem(subcommand, cfg.ckpt_path, cfg.model.get("init_weights"))
    if problem:
        raise ValueError(problem)
    if cfg.ckpt_path and cfg.ckpt_path not in checkpoints.SENTINELS:
        checkpoints.check_checkpoint_file(cfg.ckpt_path)
        # its pickle (torch's restricted unpickler) and its model's shape against this config: torch, not Lightning
        checkpoints.check_checkpoint(str(cfg.ckpt_path), cfg.model.config.as_dict())
    return cfg
