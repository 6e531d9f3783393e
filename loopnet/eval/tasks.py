"""Task names, presets, and the offline check that runs before the harness loads any dataset.

Without the Hugging Face hub, `datasets` fails late and verbosely on a standard task such as
``arc_easy``. `check_datasets` fails first, in one line naming the task and saying how to point it
at local files: a task YAML with ``dataset_path: json`` and ``dataset_kwargs: {data_files: ...}``
in a folder given to ``--include_path``.
"""

from __future__ import annotations

import glob
import os
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable
from urllib.parse import urlparse

from loopnet.env import hub_offline

if TYPE_CHECKING:
    from lm_eval.tasks import TaskManager

# DeepLoop's zero-shot suite (lm-evaluation-harness task names), scored with `acc`.
DEEPLOOP_TASKS = (
    "arc_challenge",
    "arc_easy",
    "hellaswag",
    "openbookqa",
    "piqa",
    "sciq",
    "social_iqa",
    "winogrande",
)
PRESETS: dict[str, tuple[str, ...]] = {"deeploop": DEEPLOOP_TASKS}

# `datasets` builders that read local files named in data_files / data_dir (no hub needed).
FILE_BUILDERS = frozenset({"json", "csv", "parquet", "text", "arrow", "pandas", "xml", "webdataset"})


class TaskSetupError(ValueError):
    """A requested task cannot run here (unknown name, missing local file, hub unavailable)."""


def expand_tasks(tasks: str | Iterable[str]) -> list[str]:
    """Split comma-separated names, expand presets (``deeploop``), drop duplicates, keep order."""
    items = tasks.split(",") if isinstance(tasks, str) else [t for item in tasks for t in item.split(",")]
    names: list[str] = []
    for item in (i.strip() for i in items):
        for name in PRESETS.get(item, (item,)) if item else ():
            if name not in names:
                names.append(name)
    if not names:
        raise TaskSetupError("no task given; pass e.g. --tasks arc_easy,hellaswag or --tasks deeploop")
    return names


# ----------------------------------------------------------------------------- hub availability
def hub_reachable(timeout: float = 2.0) -> bool:
    """Whether a TCP connection to the hub (HF_ENDPOINT, default huggingface.co) opens within `timeout` s.

    Run in a thread because name resolution is not bounded by the socket timeout.
    """
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = url.port or (80 if url.scheme == "http" else 443)
    ok = threading.Event()

    def probe():
        try:
            with socket.create_connection((url.hostname, port), timeout=timeout):
                ok.set()
        except OSError:
            pass

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    return ok.is_set()


# ----------------------------------------------------------------------------- task configs
@dataclass
class LeafTask:
    """A task (not a group or tag) as the harness's index knows it, includes resolved."""

    name: str
    cfg: dict[str, Any]
    yaml_path: Path | None


def leaf_tasks(manager: "TaskManager", name: str, overrides: dict | None = None, _seen=None) -> list[LeafTask]:
    """The tasks behind a task, group or tag name (or a task YAML path)."""
    from lm_eval.tasks._index import Kind, TaskIndex

    seen = set() if _seen is None else _seen
    entry = manager.task_index.get(name)
    if entry is None and Path(name).suffix in (".yaml", ".yml"):
        entry = TaskIndex.entry_from_path(Path(name))
        if entry is not None:
            from lm_eval.tasks._yaml_loader import load_yaml

            entry.cfg = load_yaml(entry.yaml_path, resolve_func=False)
    if entry is None:
        raise TaskSetupError(
            f"unknown task '{name}': not an lm-eval task, group or tag, nor a task YAML under --include_path "
            f"(list them with: lm-eval ls tasks --include_path DIR)"
        )
    if name in seen:
        return []
    seen.add(name)
    if entry.kind in (Kind.TASK, Kind.PY_TASK):
        return [LeafTask(entry.name, {**(entry.cfg or {}), **(overrides or {})}, entry.yaml_path)]
    children = sorted(entry.tags) if entry.kind == Kind.TAG else (entry.cfg or {}).get("task", [])
    leaves = []
    for child in children if isinstance(children, list) else [children]:
        if isinstance(child, dict):
            child_name = child.get("task")
            if child_name in manager.task_index:
                leaves += leaf_tasks(manager, child_name, child, seen)
            elif isinstance(child_name, str):  # a task defined inline in the group
                leaves.append(LeafTask(child_name, child, entry.yaml_path))
        else:
            leaves += leaf_tasks(manager, child, None, seen)
    return leaves


def _is_remote(path: str) -> bool:
    return "://" in path


def _data_paths(data_files: Any) -> list[str]:
    """Flatten data_files (a path, a list, or {split: path(s)}) into a list of paths/globs."""
    if isinstance(data_files, str):
        return [data_files]
    if isinstance(data_files, dict):
        return [p for v in data_files.values() for p in _data_paths(v)]
    if isinstance(data_files, (list, tuple)):
        return [p for v in data_files for p in _data_paths(v)]
    return []


def _hub_cached(dataset: str) -> bool:
    """Whether a hub dataset has been downloaded before (then `datasets` can load it offline)."""
    try:
        from datasets import config as ds_config
        from huggingface_hub import constants as hub_constants
    except ImportError:  # pragma: no cover - both come with lm-eval
        return False
    return (Path(hub_constants.HF_HUB_CACHE) / f"datasets--{dataset.replace('/', '--')}").is_dir() or (
        Path(ds_config.HF_DATASETS_CACHE) / dataset.replace("/", "___")
    ).is_dir()


def needs_hub(task: LeafTask) -> str | None:
    """The hub dataset a task must download, or None when its data is local (or not ours to judge).

    Raises TaskSetupError when a local data file the task names does not exist.
    """
    cfg = task.cfg
    path = cfg.get("dataset_path")
    if not isinstance(path, str) or "class" in cfg or cfg.get("custom_dataset"):
        return None  # Python-defined or custom loaders: the harness decides
    kwargs = cfg.get("dataset_kwargs") or {}
    if path in FILE_BUILDERS:
        files = _data_paths(kwargs.get("data_files")) + _data_paths(kwargs.get("data_dir"))
        for file in files:
            if _is_remote(file):
                return file
            if not glob.glob(os.path.expanduser(file)):
                raise TaskSetupError(
                    f"task '{task.name}': data file '{file}' not found (relative paths are read from the working "
                    f"directory {os.getcwd()}; prefer absolute paths in the task YAML {task.yaml_path})"
                )
        return None
    if _is_remote(path):
        return path
    if Path(os.path.expanduser(path)).exists():  # a local dataset folder or loading script
        return None
    return None if _hub_cached(path) else path


def offline_help(task: LeafTask) -> str:
    """How to run `task` from local JSON lines instead of the hub, in one line."""
    cfg = task.cfg
    split_key = "test_split" if cfg.get("test_split") else "validation_split"
    split = cfg.get(split_key) or "test"
    include = f"`include: {task.yaml_path}`, " if task.yaml_path else ""
    # The other splits the task declares would be looked for in the local files too.
    others = [k for k in ("training_split", "validation_split", "fewshot_split") if k != split_key and cfg.get(k)]
    nulls = "".join(f"`{k}: null`, " for k in others)
    return (
        f"write a task YAML with {include}`task: {task.name}`, `dataset_path: json`, `dataset_name: null`, "
        f"{nulls}`dataset_kwargs: {{data_files: {{{split}: /abs/path/{task.name}.jsonl}}}}` (records with the "
        f"dataset's own fields) into a folder and pass --include_path FOLDER"
    )


def check_datasets(manager: "TaskManager", names: Iterable[str], probe_timeout: float = 2.0) -> None:
    """Fail fast, before the harness loads anything, if a requested task needs an unavailable hub.

    The hub counts as unavailable when HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set or when it does
    not answer within `probe_timeout` seconds; it is only probed if some task needs it.
    """
    remote = [(leaf, ds) for name in names for leaf in leaf_tasks(manager, name) if (ds := needs_hub(leaf))]
    if not remote:
        return
    if hub_offline():
        why = "the hub is disabled (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE)"
    elif not hub_reachable(probe_timeout):
        why = f"the hub did not answer within {probe_timeout:g} s"
    else:
        return
    leaf, dataset = remote[0]
    others = f" (also: {', '.join(sorted({t.name for t, _ in remote[1:]}))})" if len(remote) > 1 else ""
    raise TaskSetupError(
        f"task '{leaf.name}' needs dataset '{dataset}' from the Hugging Face hub but {why}{others}; "
        f"to run it offline, {offline_help(leaf)}"
    )


def refuse_task_code(folder: Path) -> None:
    """Raise TaskSetupError for the first task YAML under `folder` (or a file it `include`s) whose `!function`
    tag makes the harness import and run a Python file, unless the user trusts it (`--trust_config`, as a
    config that names code: loopnet.training.trust); read as YAML nodes, nothing constructed."""
    import yaml

    from loopnet.training.trust import ENV, FLAG, trusted

    if trusted():
        return
    files, seen = sorted(folder.rglob("*.yaml")) + sorted(folder.rglob("*.yml")), set()
    while files:
        file = files.pop(0).resolve()
        if file in seen:
            continue
        seen.add(file)
        try:
            nodes = [yaml.compose(file.read_text(encoding="utf-8"), Loader=yaml.SafeLoader)]
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue  # the harness says what is wrong with it
        while nodes:
            node = nodes.pop()
            if node is None:
                continue
            if node.tag == "!function":
                raise TaskSetupError(
                    f"{file} (line {node.start_mark.line + 1}) names the function {node.value}, which the harness "
                    f"would import from a Python file and run; fix: if you trust these tasks and their author, rerun "
                    f"with {FLAG} (or {ENV}=1), or use tasks without !function"
                )
            if isinstance(node, yaml.MappingNode):
                for key, value in node.value:
                    if key.value == "include" and isinstance(value, yaml.ScalarNode):
                        files.append(file.parent / value.value)
                    nodes.append(value)
            elif isinstance(node, yaml.SequenceNode):
                nodes += node.value


def make_task_manager(names: list[str], include_path: list[str] | None) -> "TaskManager":
    """The harness's TaskManager; indexes only `include_path` when every name is defined there.

    Indexing the ~15k built-in task configs takes seconds, and a run on local task YAMLs does not
    need them. A local task overrides a built-in one of the same name either way.
    """
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._index import Kind

    paths = [str(Path(p).expanduser()) for p in include_path or []]
    for path in paths:
        if not Path(path).is_dir():
            raise TaskSetupError(f"--include_path {path} is not a folder")
        refuse_task_code(Path(path))
    if paths:
        local = TaskManager(include_path=paths, include_defaults=False)
        index = local.task_index
        if all(n in index and index[n].kind in (Kind.TASK, Kind.PY_TASK) for n in names):
            return local
    return TaskManager(include_path=paths or None)
