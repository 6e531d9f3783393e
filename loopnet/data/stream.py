"""Token streams: documents → tokens → windows → batches, for training (infinite) and validation (finite).

Scale-out: every (rank, DataLoader worker) "slot" reads a disjoint part of the corpus. A parquet
corpus (`loopnet.data.parquet.ParquetCorpus`: OpenWebText, hub datasets, local .parquet files) is cut
by row ranges into world_size × workers near-equal parts (within one document), each read once per
epoch; other sources (text, json) go through `datasets.distributed.split_dataset_by_node`, first by
rank, then by worker (whole files when there are enough, else every part keeps every n-th document).
Each slot cycles over its part epoch after epoch, with the order reshuffled per epoch from the seed,
and emits windows in seeded shuffled blocks. The validation windows are sharded by window.

Resume: a slot's whole state is small — where its current block of windows starts (a document
position: a row of its part, or a `datasets` state dict and a row; and a token offset), the block
number and how many windows of the block were already emitted — so it travels with every batch, and
`ResumableLoader` turns the states of the batches the trainer consumed into a checkpointable state dict.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from loopnet.data.errors import DataConfigError
from loopnet.data.packing import Packer, block_permutation
from loopnet.data.parquet import ParquetCorpus
from loopnet.data.sources import ValSelector
from loopnet.data.bytelevel import ByteVocab
from loopnet.data.tokenizer import gpt2_encoding
from loopnet.data.token_ids import EOT_ID

if TYPE_CHECKING:  # imported where documents are read: `datasets` (with pandas) costs ~0.8 s of every start-up
    import datasets

DOC_BATCH = 64  # documents fetched from `datasets` at a time (its batched reader is much faster)


def split_strategy(docs: datasets.IterableDataset, parts: int) -> str:
    """Whole shards to each of `parts` when there are enough shards (uneven counts are fine: each
    part cycles on its own); otherwise every part reads all and keeps every parts-th document."""
    return "shards" if docs.num_shards >= parts else "examples"


def encode(text: str, table: np.ndarray | None = None) -> np.ndarray:
    """GPT-2 tokens of one document followed by end-of-text; with `table` (GPT-2 id -> compact id,
    see `TokenStreamDataModule`'s `vocab: compact`) the compact ids."""
    if isinstance(table, ByteVocab) or hasattr(table, "document"):  # bytes, or an imported model's tokenizer
        return table.document(text)
    ids = gpt2_encoding().encode_ordinary(text)
    ids.append(EOT_ID)
    ids = np.asarray(ids, dtype=np.int32)
    return ids if table is None else table[ids]


def iter_texts(
    docs: datasets.IterableDataset, column: str, epoch: int = 0, ds_state: dict | None = None, row: int = 0
) -> Iterator[tuple[dict, str | None]]:
    """(position, text) of every document of `docs`, starting at a position from a previous run.

    A position is {"epoch", "ds": the `datasets` state before the batch holding it, "row": index in that batch}.
    """
    if ds_state is not None:
        docs.load_state_dict(copy.deepcopy(ds_state))
    before = ds_state
    try:
        for batch in docs.iter(batch_size=DOC_BATCH):
            if column not in batch:
                raise DataConfigError(
                    f"No text column {column!r} in the data; its columns are {sorted(batch)}. "
                    "Fix: set `text_column:` to one of them"
                )
            texts = batch[column]
            for i in range(row, len(texts)):
                text = texts[i]
                if text is not None and not isinstance(text, str):
                    raise DataConfigError(
                        f"Column {column!r} holds {type(text).__name__} values, not text. Fix: set `text_column:`"
                    )
                yield {"epoch": epoch, "ds": before, "row": i}, text
            row = 0
            before = docs.state_dict()
    except UnicodeDecodeError as e:
        raise DataConfigError(
            f"A data file is not valid UTF-8 ({e}). Fix: re-encode it as UTF-8 (e.g. with iconv)"
        ) from e


def _epoch_key(seed: int, epoch: int) -> int:
    # `datasets` reshuffles the shard order from its epoch number (and only when it is non-zero),
    # so feed it one derived from both our seed and the epoch.
    return int(np.random.SeedSequence([seed % 2**32, epoch]).generate_state(1)[0]) + 1


class TrainStream(IterableDataset):
    """Infinite training batches ``(windows, meta)`` for one rank; one slot per DataLoader worker.

    `windows`: int32 array [batch_size, seq_len + 1] (NumPy: cheaper to pass between processes
    than tensors); `meta` = {"slot", "state"}: the slot that made the batch and its state after it.
    Set `start` (see `ResumableLoader.load_state_dict`) to continue from saved slot states.
    """

    def __init__(
        self,
        docs: datasets.IterableDataset,
        *,
        text_column: str,
        seq_len: int,
        batch_size: int,
        seed: int,
        val: ValSelector | None,
        shuffle_buffer: int,
        rank: int = 0,
        world_size: int = 1,
        num_slots: int = 1,
        config: dict | None = None,
        table: np.ndarray | None = None,
        train_rows: int | None = None,
    ):
        # A ParquetCorpus trains on its rows [0, train_rows) (the held-out range follows; `val` is None);
        # a `datasets` stream on the documents `val` does not hold out.
        if isinstance(docs, ParquetCorpus) and (train_rows is None or val is not None):
            raise ValueError("a ParquetCorpus is read with train_rows (its held-out range) and no ValSelector")
        self.docs, self.text_column, self.val, self.table, self.train_rows = docs, text_column, val, table, train_rows
        self.seq_len, self.batch_size, self.seed, self.shuffle_buffer = seq_len, batch_size, seed, shuffle_buffer
        self.rank, self.world_size, self.num_slots = rank, world_size, num_slots
        self.config = dict(config or {}, num_slots=num_slots, world_size=world_size)
        self.start: dict[str, Any] = {"next_slot": 0, "slots": [None] * num_slots}

    def slot_docs(self, slot: int, epoch: int) -> datasets.IterableDataset:
        """The documents slot `slot` of this rank reads in `epoch`, in order."""
        from datasets.distributed import split_dataset_by_node

        # Split by rank, then by worker: `datasets` composes the two into one split over all slots.
        strategy = split_strategy(self.docs, self.world_size * self.num_slots)
        node = split_dataset_by_node(self.docs, rank=self.rank, world_size=self.world_size, strategy=strategy)
        part = split_dataset_by_node(node, rank=slot, world_size=self.num_slots, strategy=strategy)
        part.set_epoch(_epoch_key(self.seed, epoch))
        return part

    def slot_texts(self, slot: int, epoch: int, pos: dict | None = None) -> Iterator[tuple[dict, str | None]]:
        """(position, text) of the documents slot `slot` of this rank reads in `epoch`, from `pos` on."""
        if isinstance(self.docs, ParquetCorpus):
            parts, part = self.world_size * self.num_slots, self.rank * self.num_slots + slot
            start = 0 if pos is None else pos["row"]
            return self.docs.part_texts(part, parts, self.train_rows, self.seed, epoch, start)
        ds_state, row = (None, 0) if pos is None else (pos["ds"], pos["row"])
        return iter_texts(self.slot_docs(slot, epoch), self.text_column, epoch, ds_state, row)

    def documents(self, slot: int, pos: dict | None = None) -> Iterator[tuple[dict, np.ndarray]]:
        """(position, tokens) of the slot's training documents, cycling over epochs forever."""
        epoch = 0 if pos is None else pos["epoch"]
        while True:
            full_epoch, n_tokens = pos is None or (pos.get("ds") is None and pos["row"] == 0), 0
            for p, text in self.slot_texts(slot, epoch, pos):
                if not text or (self.val is not None and self.val(text)):  # empty documents: no lone end-of-text
                    continue
                tokens = encode(text, self.table)
                n_tokens += len(tokens)
                yield p, tokens
            if full_epoch and n_tokens < self.seq_len + 1:
                where = (
                    f"rank {self.rank}/{self.world_size}, worker {slot}/{self.num_slots}: "
                    if self.num_slots * self.world_size > 1
                    else ""
                )
                raise DataConfigError(
                    f"{where}the training split has {n_tokens} tokens per epoch, fewer than one window of "
                    f"seq_len + 1 = {self.seq_len + 1}. Fix: add data, lower seq_len"
                    + (", or use fewer workers/devices" if where else "")
                )
            epoch, pos = epoch + 1, None

    def windows(self, slot: int, state: dict | None = None) -> Iterator[tuple[np.ndarray, dict]]:
        """(window, state after it): windows in seeded shuffled blocks of `shuffle_buffer`.

        The yielded array is reused once the next block is built: copy it before asking for more.
        """
        size, packer = self.shuffle_buffer, Packer(self.seq_len)
        if state is None:
            block, skip, docs, offset = 0, 0, self.documents(slot), 0
        else:
            block, skip, offset = state["block"], state["emitted"], state["offset"]
            docs = self.documents(slot, state["pos"])
        rows = np.empty((size, self.seq_len + 1), dtype=np.int32)
        while True:
            for i in range(size):
                while packer.available < self.seq_len + 1:
                    p, tokens = next(docs)
                    packer.push(p, tokens, offset)  # offset ≠ 0 only for the first document of a resume
                    offset = 0
                if i == 0:
                    start_pos, start_offset = packer.position()
                rows[i] = packer.pop()
            order = block_permutation(size, self.seed, self.rank, self.world_size, slot, self.num_slots, block)
            for j in range(skip, size):
                yield rows[order[j]], {"pos": start_pos, "offset": int(start_offset), "block": block, "emitted": j + 1}
            block, skip = block + 1, 0

    def batches(self, slot: int, state: dict | None = None) -> Iterator[tuple[np.ndarray, dict]]:
        """(windows [batch_size, seq_len + 1] int32, state after the batch)."""
        buf, i = np.empty((self.batch_size, self.seq_len + 1), dtype=np.int32), 0
        for window, st in self.windows(slot, state):
            buf[i] = window
            i += 1
            if i == self.batch_size:
                yield buf.copy(), st
                i = 0

    def __iter__(self):
        info = get_worker_info()
        n_workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        if n_workers != self.num_slots:
            raise DataConfigError(f"TrainStream was built for {self.num_slots} workers but runs in {n_workers}")
        # After a resume, worker 0 must serve the slot whose batch comes next.
        slot = (self.start["next_slot"] + worker) % self.num_slots
        for windows, st in self.batches(slot, self.start["slots"][slot]):
            yield windows, {"slot": slot, "state": st}


def val_windows(
    docs: datasets.IterableDataset,
    *,
    text_column: str,
    seq_len: int,
    val: ValSelector,
    rank: int = 0,
    world_size: int = 1,
    max_tokens: int | None = None,
    table: np.ndarray | None = None,
) -> torch.Tensor:
    """This rank's held-out windows, in the source's natural order: LongTensor [n, seq_len + 1].

    The final partial window is dropped; `max_tokens` keeps only the first windows (≥ that many
    tokens). Under DDP every rank packs the whole split and keeps every world_size-th window, so
    all ranks get the same number of windows (up to world_size - 1 are dropped) even when the
    split is a handful of documents (the embedded corpus holds out one play).
    """
    counts = {"docs": 0, "text": 0, "held": 0}

    def held_out() -> Iterator[str]:
        for _, text in iter_texts(docs, text_column):
            counts["docs"] += 1
            counts["text"] += bool(text and text.strip())
            if text and val(text):
                counts["held"] += 1
                yield text

    rows = pack_windows(held_out(), seq_len, max_tokens, table)
    n_docs, n_text, n_held = counts["docs"], counts["text"], counts["held"]
    n = len(rows) // world_size * world_size
    if n_text == 0:
        raise DataConfigError(
            f"The corpus is empty: {n_docs} document(s), none with text in column {text_column!r}. "
            "Fix: point data.path at files that hold text (or set text_column:)"
        )
    if n == 0:
        few = ""
        if n_held == 0 and n_docs * val.fraction < 1:  # the hold-out is drawn per document
            few = (
                f"; the hold-out is chosen per document and this corpus is {n_docs} document(s) "
                f"(a .txt/.md file is one), so val_fraction {val.fraction:g} selects none. Fix: cut the files "
                f"into documents with data.sample_by: paragraph (or line), or raise val_fraction"
            )
        raise DataConfigError(
            f"The validation split holds {len(rows)} windows of seq_len + 1 = {seq_len + 1} tokens "
            f"({n_held} held-out document(s)), fewer than the {world_size} device(s)"
            + (few or ". Fix: raise val_fraction, lower seq_len, or add data")
        )
    return torch.from_numpy(np.stack(rows[rank:n:world_size])).long()


def pack_windows(
    texts: Iterator[str | None], seq_len: int, max_tokens: int | None = None, table: np.ndarray | None = None
) -> list[np.ndarray]:
    """The windows of seq_len + 1 tokens packed from `texts` in order (the final partial window dropped),
    stopping once they hold `max_tokens` (None: all); empty documents are skipped."""
    packer, rows = Packer(seq_len), []
    for text in texts:
        if not text:
            continue
        packer.push(None, encode(text, table))
        while (w := packer.pop()) is not None:
            rows.append(w.copy())
        if max_tokens is not None and len(rows) * seq_len >= max_tokens:
            break
    return rows


class WindowBatches(IterableDataset):
    """Fixed-order batches (inputs, targets) over precomputed windows; the last batch may be smaller.

    Iterable, so Lightning injects no DistributedSampler (the windows are this rank's already);
    no `__len__`, which Lightning warns about on an IterableDataset.
    """

    def __init__(self, windows: torch.Tensor, batch_size: int):
        self.windows, self.batch_size = windows, batch_size

    def __iter__(self):
        for i in range(0, len(self.windows), self.batch_size):
            w = self.windows[i : i + self.batch_size]
            yield w[:, :-1].contiguous(), w[:, 1:].contiguous()


def _identity(batch: Any) -> Any:
    return batch


def stream_config_diff(saved: dict, now: dict, keys=None) -> dict:
    """{key: (saved, now)} for the stream settings that differ (over `keys`, default all of either)."""
    keys = dict.fromkeys([*saved, *now]) if keys is None else keys
    return {k: (saved.get(k), now.get(k)) for k in keys if saved.get(k) != now.get(k)}


def _own_errors(batches: Iterator) -> Iterator:
    """`batches`, with a `DataConfigError` of a worker process said in its own line: torch re-raises it
    in the main process with the worker's whole traceback in its message."""
    try:
        yield from batches
    except DataConfigError as err:
        text = str(err).rstrip()
        if "\nOriginal Traceback" not in text:
            raise
        raise DataConfigError(text.splitlines()[-1].split(": ", 1)[-1]) from None


class ResumableLoader(DataLoader):
    """DataLoader over a `TrainStream`: (inputs, targets) LongTensors [batch_size, seq_len], and a
    `state_dict()` that resumes at the next unconsumed batch.

    Lightning (≥ 2.3) saves `state_dict()` of a training DataLoader that has one into every
    checkpoint and calls `load_state_dict()` before iterating on resume. Batches are counted as
    consumed when `mark_consumed()` is called (the data module does it from `on_before_batch_transfer`,
    so batches Lightning prefetched but did not train on are not skipped); without it, every
    yielded batch counts. Workers serve batches round-robin, so the slot states of the last
    consumed batch of each worker are the exact place to resume, for any `num_workers`.
    """

    def __init__(self, dataset: TrainStream, *, pin_memory: bool = False, **kwargs: Any):
        # TrainStream yields whole batches as NumPy arrays; they become tensors (and are pinned)
        # here in the main process: a tensor made in a worker costs a shared-memory segment.
        kwargs.update(batch_size=None, collate_fn=_identity)
        super().__init__(dataset, **kwargs)
        self.pin = pin_memory
        self.count_consumed = False
        self._base = 0  # global index of the first batch of this run (batches consumed before it)
        self._yielded = self._consumed = 0
        self._history: deque = deque(maxlen=2 * dataset.num_slots + 16)

    def __iter__(self):
        self._yielded = self._consumed = 0
        self._history.clear()
        for windows, meta in _own_errors(super().__iter__()):
            self._history.append((self._base + self._yielded, meta["slot"], meta["state"]))
            self._yielded += 1
            w = torch.from_numpy(windows).long()
            x, y = w[:, :-1].contiguous(), w[:, 1:].contiguous()
            yield (x.pin_memory(), y.pin_memory()) if self.pin else (x, y)

    def mark_consumed(self) -> None:
        self._consumed += 1

    def _local_state(self) -> dict:
        stream: TrainStream = self.dataset
        done = self._consumed if self.count_consumed else self._yielded
        n = self._base + done
        slots = list(stream.start["slots"])
        if self._history and done and self._history[0][0] > max(self._base, n - stream.num_slots):
            raise RuntimeError("ResumableLoader lost track of consumed batches (more than its history prefetched)")
        for g, slot, state in self._history:
            if g < n:
                slots[slot] = state
        return {
            "version": 1,
            "config": stream.config,
            "consumed": n,
            "next_slot": (stream.start["next_slot"] + done) % stream.num_slots,
            "slots": slots,
        }

    def state_dict(self) -> dict:
        """{"ranks": [state of rank 0, rank 1, ...]}; under DDP every rank must call it (Lightning does)."""
        local = self._local_state()
        if torch.distributed.is_available() and torch.distributed.is_initialized() and self.dataset.world_size > 1:
            gathered: list = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(gathered, local)
            return {"ranks": gathered}
        return {"ranks": [local]}

    def load_state_dict(self, state_dict: dict) -> None:
        stream: TrainStream = self.dataset
        ranks = state_dict["ranks"]
        if len(ranks) != stream.world_size:
            raise DataConfigError(
                f"The checkpoint's data state is for {len(ranks)} ranks, this run has {stream.world_size}. "
                "Exact data resume needs the same number of devices"
            )
        local = ranks[stream.rank]
        diff = stream_config_diff(local["config"], stream.config)
        if diff:
            moved = diff.get("revision", (None, None))[0]  # the hub branch or tag moved to another commit
            raise DataConfigError(
                f"The checkpoint's data stream differs from this run's (checkpoint, now): {diff}. "
                "Exact data resume needs the same data settings, num_workers and devices"
                + (f"; fix: read the commit it was trained on with `--data.revision {moved}`" if moved else "")
            )
        stream.start = {"next_slot": local["next_slot"], "slots": list(local["slots"])}
        self._base = local["consumed"]
