"""What a hub dataset repository holds (or a local folder laid out as one), and which parquet files to read.

`datasets` ≥ 4 runs no loading scripts, so a hub dataset is read from its parquet files: the
repository's own (e.g. ``plain_text/train-00000-of-00080.parquet``, ``data/train-*.parquet``) or the
hub's conversion at revision ``refs/convert/parquet``, laid out ``<config>/<split>/NNNN.parquet``,
or ``<config>/partial-<split>/NNNN.parquet`` when the converter stopped early (it converts the first
~5 GB of a large script dataset): then the split is a part of the corpus, and loopnet says how much.

One listing of the repository at one commit (`HfApi.list_repo_files`, or a walk of the local folder)
decides, before any data is read:

* parquet files for `name`/`split`: read by `loopnet.data.parquet.ParquetCorpus` (row ranges);
* other data files only (json/csv/txt/arrow): left to `datasets.load_dataset` (None here);
* a loading script only: one `DataConfigError` line naming the fix (the conversion's revision, or
  a local folder of parquet files).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from loopnet.data.errors import LOCAL_ALTERNATIVES, DataConfigError

CONVERSION = "refs/convert/parquet"  # the hub's parquet conversion of every public dataset
_DATA_EXT = (".parquet", ".arrow", ".json", ".jsonl", ".csv", ".tsv", ".txt", ".json.gz", ".jsonl.gz", ".jsonl.zst")
# Files of a dataset repository that describe it, not data (a script repository's, a saved dataset's).
_METADATA = {"dataset_infos.json", "dataset_info.json", "dataset_dict.json", "state.json"}
_SPLITS = ("train", "validation", "valid", "val", "dev", "test", "eval")


@dataclass(frozen=True)
class ParquetLayout:
    """The parquet files of one config and split: `files` relative to the repository root, in order."""

    files: tuple[str, ...]
    config: str | None
    split: str
    folder: str  # where they sit, e.g. "plain_text/partial-train" (for messages)
    partial: bool  # the conversion's `partial-<split>`: only the first part of the split


def local_listing(folder: str) -> list[str]:
    """Every file of a local dataset folder, relative and '/'-separated (hidden folders, e.g. .git or
    .cache, left out as the hub leaves them out)."""
    out = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        rel = os.path.relpath(root, folder)
        out += [f if rel == "." else f"{Path(rel).as_posix()}/{f}" for f in sorted(files) if not f.startswith(".")]
    return out


def hub_listing(repo: str, revision: str, timeout: float = 10.0) -> list[str]:
    """Every file of hub dataset `repo` at commit `revision` (one request)."""
    from huggingface_hub import HfApi

    try:
        return sorted(HfApi().list_repo_files(repo, repo_type="dataset", revision=revision))
    except Exception as e:  # network errors, 404, 401: all mean we cannot read it
        raise DataConfigError(
            f"Cannot list the files of {repo!r} at {revision} on the Hugging Face hub "
            f"({type(e).__name__}: {e}). {LOCAL_ALTERNATIVES}"
        ) from e


def _words(path: str) -> set[str]:
    return set(re.split(r"[-._ 0-9/]+", path.lower()))


def parquet_layout(
    listing: list[str], *, name: str | None, split: str, where: str, local: bool, script: str | None = None
) -> ParquetLayout | None:
    """The parquet files to read for `name`/`split` from a repository's `listing`; None when it holds
    other data files only (read by `datasets`); a `DataConfigError` naming the fix otherwise.

    `where` names the repository in messages (id and revision, or folder); `local`: a local folder;
    `script`: the loading script's name `datasets` looks for (`<dataset name>.py`), which it refuses
    even beside data files (e.g. dataset_infos.json)."""
    parquet = sorted(p for p in listing if p.endswith(".parquet"))
    if not parquet:
        scripts = [p for p in listing if p.endswith(".py") and "/" not in p]
        data = [p for p in listing if p.lower().endswith(_DATA_EXT) and p.rsplit("/", 1)[-1] not in _METADATA]
        if script not in listing and data:
            return None
        if scripts:
            scripts = [script] if script in listing else scripts
            fix = (
                "point `data.path` at a folder of its parquet files (e.g. `huggingface-cli download <id> "
                f"--repo-type dataset --revision {CONVERSION} --local-dir <folder>`), or use `data.source: files` "
                "with `data.path: '<folder>/**/*.parquet'`"
                if local
                else f"read the hub's parquet conversion with `data.revision: {CONVERSION}` (configs/base.yaml pins it), "
                "or point `data.path` at a local folder of its parquet files"
            )
            raise DataConfigError(
                f"{where} holds only the loading script {scripts[0]}, which `datasets` ≥ 4 no longer runs; fix: {fix}"
            )
        raise DataConfigError(
            f"{where} holds no data files (parquet, json, csv, txt); fix: check `data.path` (and `data.revision`)"
        )
    # Config folders: the conversion's <config>/<split>/, or the repository's own <config>/... .
    configs = sorted({p.split("/")[0] for p in parquet if "/" in p})
    root_files = [p for p in parquet if "/" not in p]
    if name is not None:
        if name not in configs:
            raise DataConfigError(
                f"{where} has no config {name!r} with parquet files (configs: "
                f"{', '.join(configs) or 'none, files at the top level'}); fix: set `data.name` to "
                f"one of them" + (" or to null" if not configs or root_files else "")
            )
        config = name
    elif root_files or not configs:
        config = None
    elif len(configs) == 1:
        config = configs[0]
    elif "default" in configs:
        config = "default"
    else:
        raise DataConfigError(f"{where} holds several configs ({', '.join(configs)}); fix: choose one with `data.name`")
    chosen = root_files if config is None else [p for p in parquet if p.startswith(config + "/")]
    rel = {p: p if config is None else p[len(config) + 1 :] for p in chosen}
    base = f"{config}/" if config else ""
    for folder, partial in ((split, False), (f"partial-{split}", True)):  # the conversion's layout
        files = [p for p in chosen if rel[p].startswith(folder + "/")]
        if files:
            return ParquetLayout(tuple(files), config, split, base + folder, partial)
    # The repository's own layout: a file belongs to the split its name or folders say, as `datasets` infers
    # it (train-00000-of-00008.parquet, data/validation/...); none named: every file is `train`.
    named = {p: _words(rel[p]) & set(_SPLITS) for p in chosen}
    files = [p for p in chosen if split in named[p]]
    if not files and split == "train" and not any(named.values()):
        files = chosen
    if not files:
        splits = sorted({s for w in named.values() for s in w} | {d.split("/")[0] for d in rel.values() if "/" in d})
        raise DataConfigError(
            f"{where} has no split {split!r} in {base or 'its parquet files'} (found: "
            f"{', '.join(splits) or 'none'}); fix: set `data.split`"
        )
    return ParquetLayout(tuple(files), config, split, base.rstrip("/") or ".", False)
