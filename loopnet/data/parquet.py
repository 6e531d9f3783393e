"""Parquet corpora read by row ranges: balanced parts for every rank and worker, a held-out document range.

A parquet corpus is its documents (rows of the text column) in a fixed order: the files in the order
given (sorted names), their row groups in order. Every file's footer is read once at start (row
counts per row group, the schema), so the corpus's size is known before any text is read, and:

* **Held-out split, a document range.** The last ``ceil(val_fraction × documents)`` documents of that
  order are held out (OpenWebText at 0.05%: the last 4,007 of 8,013,769, a few row groups of the last
  file); the training stream reads only rows before them, so it never yields a held-out document,
  and validation reads only those rows, once (`loopnet.data.valcache`).
* **Balanced parts.** Each epoch the training row groups are put in a seeded order and their rows,
  concatenated, are cut into ``parts = world_size × workers`` contiguous ranges of ``floor`` /
  ``ceil(rows / parts)`` rows: every document is read exactly once per epoch, part sizes differ by at
  most one document, whatever the file and row-group counts. A part reads only the row groups that
  hold its rows; a row group cut by a part boundary is read by both neighbours (parquet decodes whole
  row groups), so the waste is at most two row groups per part per epoch, not the whole stream.

Why not `datasets.distributed.split_dataset_by_node`: it gives each node whole shards (files, or row
groups after `IterableDataset.reshard()`), so parts differ by up to a shard's documents (3 shards over
2 ranks: 722 vs 363 documents, with one batch per rank per step the shorter part repeats), and with
fewer shards than parts every node reads the whole stream and keeps one document in `parts`.

A position in a part is ``{"epoch", "row"}`` (documents of the part already yielded): all a resume needs.

Failed reads. A transient failure (a dropped connection, a timeout, the hub's rate limit or a server
error: `transient`) is retried `RETRIES` times after exponential backoff with jitter (64 readers that
hit a rate limit together do not retry together), the file reopened each time; then, or at once for
anything else (a corrupt row group whose footer is intact, a file changed or gone), one
`DataConfigError` line names the file, the row group and the fix.
"""

from __future__ import annotations

import errno
import math
import os
import random
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from loopnet.data.errors import DataConfigError

RETRIES = 6  # retries of a transient read failure, on top of huggingface_hub's own
BACKOFF_S = 1.0  # the first retry's wait; doubled at each retry, up to BACKOFF_CAP_S
BACKOFF_CAP_S = 60.0

# Errors of a connection, not of the data: retried. HTTP errors are judged by their status instead.
_TRANSIENT_ERRNOS = {
    errno.EIO,
    errno.EAGAIN,
    errno.EINTR,
    errno.ETIMEDOUT,
    errno.ECONNRESET,
    errno.ECONNREFUSED,
    errno.ECONNABORTED,
    errno.ENETDOWN,
    errno.ENETUNREACH,
    errno.EHOSTUNREACH,
    errno.EPIPE,
    errno.ESTALE,
    errno.EBUSY,
}
_TRANSIENT_TYPES = {
    "TransportError",
    "TimeoutException",
    "Timeout",
    "ConnectTimeout",
    "ReadTimeout",
    "ChunkedEncodingError",
    "ProtocolError",
    "IncompleteRead",
    "ClientConnectionError",
    "ClientPayloadError",
    "ServerDisconnectedError",
}  # httpx, requests, urllib3, aiohttp
_TRANSIENT_STATUS = {408, 425, 429, 500, 502, 503, 504}


def transient(err: BaseException) -> bool:
    """Whether a failed read may succeed when tried again: a connection error, a timeout, an HTTP status
    that says "later" (rate limit, server error). Not corrupt data (pyarrow's OSError carries no errno),
    nor a missing file or a refused access."""
    response = getattr(err, "response", None)
    status = getattr(response, "status_code", None)
    if isinstance(status, int):
        return status in _TRANSIENT_STATUS
    if isinstance(err, (ConnectionError, TimeoutError)):
        return True
    if any(cls.__name__ in _TRANSIENT_TYPES for cls in type(err).__mro__):
        return True
    return isinstance(err, OSError) and err.errno in _TRANSIENT_ERRNOS


def backoff(attempt: int) -> float:
    """Seconds to wait before retry `attempt` (0-based): BACKOFF_S × 2^attempt, capped, times a random
    factor in [0.5, 1] so that readers that failed together retry apart."""
    return min(BACKOFF_CAP_S, BACKOFF_S * 2**attempt) * random.uniform(0.5, 1.0)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".rstrip(": ")


class ParquetCorpus:
    """Documents of parquet files (the `text_column` of every row), in a fixed order.

    Args:
        files: paths of the files, in corpus order; local paths, or paths on `fs`.
        text_column: the column holding the documents' text.
        fs: an fsspec filesystem for remote files (e.g. `huggingface_hub.HfFileSystem`); None: local.
        identity: what names this corpus's contents in caches (e.g. the hub commit); None: local files'
            paths, sizes and modification times.
    """

    def __init__(self, files: list[str], text_column: str, fs: Any = None, identity: Any = None):
        if not files:
            raise DataConfigError("No parquet files to read; fix: check `data.path`")
        self.files, self.text_column, self.fs = list(files), text_column, fs
        self._open: tuple[int, dict[int, Any]] = (os.getpid(), {})  # this process's ParquetFiles, by file
        with ThreadPoolExecutor(min(16, len(self.files))) as pool:  # footers of remote files: one request each
            metas = list(pool.map(self._footer, range(len(self.files))))
        groups = [(f, g, rows) for f, meta in enumerate(metas) for g, rows in enumerate(meta)]
        self.group_file = np.array([f for f, _, _ in groups], dtype=np.int64)
        self.group_index = np.array([g for _, g, _ in groups], dtype=np.int64)
        self.group_rows = np.array([r for _, _, r in groups], dtype=np.int64)
        self.group_start = np.concatenate([[0], np.cumsum(self.group_rows)])  # first row of each group
        self.n_docs = int(self.group_start[-1])
        self.identity = (
            identity
            if identity is not None
            else [(os.path.abspath(f), os.path.getsize(f), os.stat(f).st_mtime_ns) for f in self.files]
        )

    def __getstate__(self) -> dict:  # to spawned workers: no open file travels
        return {**self.__dict__, "_open": (-1, {})}

    def _parquet_file(self, f: int):
        import pyarrow.parquet as pq

        # Opened per process (a DataLoader worker must not share its parent's file positions) and kept
        # open: the epoch's row-group order jumps between files, and reopening a remote one costs a request.
        if self._open[0] != os.getpid():
            self._open = (os.getpid(), {})
        handles = self._open[1]
        if f not in handles:
            path = self.files[f]
            handles[f] = pq.ParquetFile(self.fs.open(path, "rb") if self.fs is not None else path)
        return handles[f]

    def _retrying(self, f: int, what: str, read: Callable[[], Any]) -> Any:
        """`read()`, retried after a transient failure (see the module's docstring) with file `f` reopened;
        a failure that is not transient is raised as it is."""
        for attempt in range(RETRIES + 1):
            try:
                return read()
            except Exception as e:
                self._open[1].pop(f, None)  # a remote file's connection may be broken: reopen it
                if not transient(e):
                    raise
                if attempt == RETRIES:
                    raise DataConfigError(
                        f"Cannot read {what} of {self.files[f]}: {RETRIES + 1} attempts failed over "
                        f"~{sum(min(BACKOFF_CAP_S, BACKOFF_S * 2**k) for k in range(RETRIES)) * 0.75:.0f} s "
                        f"({_first_line(e)}); fix: "
                        + (
                            "check the connection or the hub's rate limit (log in with `hf auth login`, or fewer "
                            "readers: data.num_workers)"
                            if self.fs is not None
                            else "check the disk or the network filesystem it is on"
                        )
                        + ", then resume with --ckpt_path last"
                    ) from e
                time.sleep(backoff(attempt))

    def _footer(self, f: int) -> list[int]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = self.files[f]
        try:
            pf = self._retrying(
                f, "the footer", lambda: pq.ParquetFile(self.fs.open(path, "rb") if self.fs is not None else path)
            )
        except (OSError, pa.ArrowInvalid) as e:
            raise DataConfigError(
                f"{path} is not a readable parquet file ({e}); fix: replace it, or leave it out of `data.path`"
            ) from e
        schema = pf.schema_arrow
        if self.text_column not in schema.names:
            raise DataConfigError(
                f"No text column {self.text_column!r} in {path}; its columns are "
                f"{sorted(schema.names)}. Fix: set `text_column:` to one of them"
            )
        kind = schema.field(self.text_column).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise DataConfigError(
                f"Column {self.text_column!r} of {path} holds {kind} values, not text. Fix: set `text_column:`"
            )
        return [pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)]

    # -- reading ---------------------------------------------------------------------------------

    def read_group(self, group: int) -> list[str | None]:
        """The texts of one row group (parquet decodes a column chunk whole)."""
        f, g = int(self.group_file[group]), int(self.group_index[group])

        def read() -> list[str | None]:
            table = self._parquet_file(f).read_row_group(g, columns=[self.text_column])
            return table.column(0).to_pylist()

        try:
            return self._retrying(f, f"row group {g}", read)
        except DataConfigError:
            raise
        except Exception as e:  # pyarrow's decoding errors: a damaged row group whose footer is intact
            first = int(self.group_start[group] - self.group_start[np.searchsorted(self.group_file, f)])
            raise DataConfigError(
                f"Row group {g} of {self.files[f]} (its rows {first}-{first + int(self.group_rows[group]) - 1}) "
                f"cannot be read ({_first_line(e)}); fix: replace the file (download it again), or leave it out "
                f"of `data.path`"
            ) from e

    def texts(self, pieces: list[tuple[int, int, int]], start: int = 0) -> Iterator[str | None]:
        """The texts of `pieces` [(group, first row, end row) in the group], skipping the first `start`."""
        for group, lo, hi in pieces:
            if start >= hi - lo:
                start -= hi - lo
                continue
            rows = self.read_group(group)
            yield from rows[lo + start : hi]
            start = 0

    def range_pieces(self, begin: int, end: int) -> list[tuple[int, int, int]]:
        """Rows [begin, end) of the corpus order as (group, first, end) pieces."""
        out = []
        g = int(np.searchsorted(self.group_start, begin, side="right")) - 1
        while begin < end and g < len(self.group_rows):
            g0 = int(self.group_start[g])
            hi = min(end, g0 + int(self.group_rows[g]))
            if hi > begin:
                out.append((g, begin - g0, hi - g0))
            begin, g = hi, g + 1
        return out

    # -- the held-out range and the training parts -------------------------------------------------

    def n_held_out(self, fraction: float) -> int:
        """Documents held out: ceil(fraction × documents), at least one; the last ones of the corpus order."""
        return max(1, math.ceil(fraction * self.n_docs))

    def part_pieces(self, part: int, parts: int, n_train: int, seed: int, epoch: int) -> list[tuple[int, int, int]]:
        """The (group, first, end) pieces of training part `part` of `parts` in `epoch`: rows [0, n_train)
        in row groups put in a seeded per-epoch order, cut into `parts` contiguous near-equal ranges."""
        units = self.range_pieces(0, n_train)
        order = np.random.default_rng([seed % 2**32, epoch, 0x5A]).permutation(len(units))
        sizes = np.array([units[i][2] - units[i][1] for i in order], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(sizes)])
        begin, end = part * n_train // parts, (part + 1) * n_train // parts
        out = []
        for k in range(int(np.searchsorted(starts, begin, side="right")) - 1, len(order)):
            if starts[k] >= end:
                break
            g, lo, hi = units[order[k]]
            a, b = max(begin - int(starts[k]), 0), min(end - int(starts[k]), hi - lo)
            if b > a:
                out.append((g, lo + a, lo + b))
        return out

    def part_texts(
        self, part: int, parts: int, n_train: int, seed: int, epoch: int, start: int = 0
    ) -> Iterator[tuple[dict, str | None]]:
        """(position, text) of the part's documents in `epoch`, from its `start`-th document."""
        for i, text in enumerate(self.texts(self.part_pieces(part, parts, n_train, seed, epoch), start), start):
            yield {"epoch": epoch, "row": i}, text
