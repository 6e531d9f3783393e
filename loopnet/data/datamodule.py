"""TokenStreamDataModule: stream documents, tokenize with GPT-2 BPE, pack into training windows."""

from __future__ import annotations

import inspect
import weakref
from typing import Any, Literal

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch.utils.data import DataLoader

from loopnet.data.errors import DataConfigError
from loopnet.data.sources import (
    HUB_VAL_FRACTION,
    OPENWEBTEXT,
    SHAKESPEARE_VAL_FRACTION,
    ValSelector,
    builder_for,
    check_revision,
    hub_revision,
    is_hub_id,
    load_documents,
    resolve_files,
)
from loopnet.data.stream import ResumableLoader, TrainStream, WindowBatches, encode, stream_config_diff, val_windows
from loopnet.data.tokenizer import gpt2_encoding
from loopnet.data.vocab import EOT_ID, N_VOCAB


class TokenStreamDataModule(L.LightningDataModule):
    """GPT-2-tokenized text streamed through `datasets`, packed into (inputs, targets) windows.

    Training batches are infinite (the corpus is cycled, reshuffled per epoch from `seed`);
    validation and test iterate the same finite held-out split in a fixed order. Documents are
    held out by a stable hash of their text, so the split does not depend on order or world size.
    Training documents are sharded by rank under DDP and by DataLoader worker; the held-out
    windows are sharded by rank (equal counts). Every rank reads the whole stream once to find
    the held-out documents (cheap for files; bound it with `val_max_tokens` on OpenWebText).

    Exact resume: the training DataLoader has `state_dict`/`load_state_dict`, which Lightning
    stores in checkpoints; a run resumed with `ckpt_path` continues with exactly the batch after
    the last one trained on, for any `num_workers`, provided the data settings, `num_workers`
    and the number of devices are unchanged (otherwise resuming raises `DataConfigError`).

    Args:
        seq_len: tokens per training sequence (each window holds seq_len + 1 tokens).
        batch_size: sequences per batch (per device).
        num_workers: DataLoader worker processes for the training stream (0: main process).
        seed: seed of the per-epoch shard order and the window shuffle.
        source: `shakespeare` (embedded corpus, offline), `files` (local files/globs) or `hub`
            (a Hugging Face hub dataset, or a local dataset folder).
        path: for `files`: a path or glob or a list of them (.txt/.md, .json/.jsonl, .parquet);
            for `hub`: a dataset id or local folder (default Skylion007/openwebtext).
        name: dataset configuration name (`hub` only).
        split: dataset split to read (`hub` only).
        revision: hub dataset revision: a commit sha pins it, so that the stream, the validation split
            and exact resume cannot change when the dataset is updated upstream; a tag or branch, or
            None (the latest), is resolved to its commit at start. The resolved commit is part of the
            stream identity a resume checks, so a resume after an upstream change fails, naming both
            commits, instead of silently reading other data (`hub` only).
        text_column: column holding the document text.
        sample_by: how .txt/.md files are cut into documents: `document` (whole file),
            `paragraph` (blank-line separated) or `line`.
        val_fraction: fraction of documents held out for validation; default 0.05 for
            `shakespeare` (one play, ~45k tokens), 0.0005 (nanoGPT's) otherwise.
        val_max_tokens: keep only the first windows of the held-out split, up to this many
            tokens (None: all). Finding held-out documents means reading the whole stream once,
            so this bounds the first validation's cost on large streamed corpora.
        shuffle_buffer: windows shuffled together (in seeded blocks); 1 disables shuffling.
        vocab: `gpt2` (GPT-2's 50257 ids) or `compact`: only the GPT-2 tokens that occur in the
            corpus (training and held-out documents; end-of-text included), renumbered 0..V-1 in
            GPT-2 order. Lossless (the same tokens, so losses stay comparable up to the head's
            size) and the LM head shrinks with it: the 38 plays use 19,083 of GPT-2's ids, so a
            tiny model's 50k-way head, most of its compute on CPU, becomes 2.6x smaller. Local
            corpora only (`shakespeare`, `files`); the model's vocab_size must be at least
            `vocab_size` (`loopnet fit` checks before training).
    """

    def __init__(
        self,
        seq_len: int,
        batch_size: int,
        num_workers: int = 0,
        seed: int = 1337,
        source: Literal["shakespeare", "files", "hub"] = "shakespeare",
        path: str | list[str] | None = None,
        name: str | None = None,
        split: str = "train",
        revision: str | None = None,
        text_column: str = "text",
        sample_by: Literal["document", "paragraph", "line"] = "document",
        val_fraction: float | None = None,
        val_max_tokens: int | None = None,
        shuffle_buffer: int = 1024,
        vocab: Literal["gpt2", "compact"] = "gpt2",
    ):
        super().__init__()
        # Same as save_hyperparameters(), but handing over this frame inline: Lightning's default
        # stores inspect.currentframe() in a local, a cycle that keeps the caller's whole stack
        # (and any DataLoader workers in it) alive until the cyclic garbage collector runs.
        self.save_hyperparameters(frame=inspect.currentframe())
        for arg, value, low in (
            ("seq_len", seq_len, 1),
            ("batch_size", batch_size, 1),
            ("num_workers", num_workers, 0),
            ("shuffle_buffer", shuffle_buffer, 1),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise DataConfigError(f"{arg} must be an integer ≥ {low}, got {value!r}")
        if val_max_tokens is not None and val_max_tokens < 1:
            raise DataConfigError(f"val_max_tokens must be ≥ 1 or None, got {val_max_tokens!r}")
        if source not in ("shakespeare", "files", "hub"):
            raise DataConfigError(f"Unknown source {source!r}; choose shakespeare, files or hub")
        if source == "files":
            builder_for(resolve_files(path if path is not None else []))  # fail now on a bad path or type
        check_revision(source, path, revision)
        if vocab not in ("gpt2", "compact"):
            raise DataConfigError(f"data.vocab={vocab!r} is not known; choose gpt2 or compact")
        if vocab == "compact" and source == "hub":
            raise DataConfigError("data.vocab: compact reads the whole corpus to find its tokens, so it needs a "
                                  "local corpus; fix: use source shakespeare or files, or vocab: gpt2")
        if val_fraction is None:
            val_fraction = SHAKESPEARE_VAL_FRACTION if source == "shakespeare" else HUB_VAL_FRACTION
        self.val = ValSelector(val_fraction)
        self.seq_len, self.batch_size, self.num_workers, self.seed = seq_len, batch_size, num_workers, seed
        self.source, self.path, self.text_column = source, path, text_column
        self.docs = None
        self.revision: str | None = None  # the hub commit streamed, resolved in setup()
        self._train_loader = lambda: None  # weak reference to the last training loader
        self._val_windows: torch.Tensor | None = None
        self._val_for: tuple[int, int] | None = None  # the (rank, world size) _val_windows were cut for
        self.vocab = vocab
        self.vocab_ids: np.ndarray | None = None  # compact: the GPT-2 id of each compact id
        self._table: np.ndarray | None = None  # compact: GPT-2 id -> compact id (-1: not in the corpus)

    # -- setup ---------------------------------------------------------------------------------

    def _rank_world(self) -> tuple[int, int]:
        if self.trainer is not None:
            return self.trainer.global_rank, self.trainer.world_size
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank(), torch.distributed.get_world_size()
        return 0, 1

    def setup(self, stage: str | None = None) -> None:
        if self.docs is None:
            gpt2_encoding()  # load once here, before workers fork, and fail early on bad files
            hp = self.hparams
            path = OPENWEBTEXT if self.source == "hub" and self.path is None else self.path
            # The commit streamed (hub datasets only): part of the stream identity checked on resume.
            self.revision = hub_revision(path, hp.revision) if is_hub_id(self.source, path) else None
            self.docs = load_documents(self.source, path, hp.name, hp.split, hp.sample_by, self.revision)
            if self.vocab == "compact":
                self._build_compact_vocab()

    def _build_compact_vocab(self) -> None:
        """The corpus's own GPT-2 ids (all documents, so held-out tokens have a row too)."""
        seen = np.zeros(N_VOCAB, dtype=bool)
        seen[EOT_ID] = True
        try:
            for doc in self.docs:
                text = doc.get(self.text_column)
                if text:
                    seen[encode(text)] = True
        except UnicodeDecodeError as e:  # named as the GPT-2 path names it (stream.documents)
            raise DataConfigError(f"A data file of data.path {self.path!r} is not valid UTF-8 ({e}). "
                                  "Fix: re-encode it as UTF-8 (e.g. with iconv)") from e
        self.vocab_ids = np.flatnonzero(seen).astype(np.int32)
        self._table = np.full(N_VOCAB, -1, dtype=np.int32)
        self._table[self.vocab_ids] = np.arange(len(self.vocab_ids), dtype=np.int32)

    @property
    def vocab_size(self) -> int:
        """Token ids the batches use: GPT-2's 50257, or the corpus's own count with `vocab: compact`."""
        if self.vocab == "gpt2":
            return N_VOCAB
        self.setup("fit")
        return len(self.vocab_ids)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` as this module's batches hold them (a token outside a compact
        vocabulary becomes end-of-text)."""
        ids = gpt2_encoding().encode_ordinary(text)
        if self.vocab == "gpt2":
            return ids
        self.setup("fit")
        compact = self._table[np.asarray(ids, dtype=np.int64)] if ids else np.zeros(0, dtype=np.int32)
        return np.where(compact < 0, self._table[EOT_ID], compact).tolist()

    def decode(self, ids: list[int]) -> str:
        """Text of token ids as this module's batches hold them."""
        if self.vocab == "compact":
            self.setup("fit")
            ids = self.vocab_ids[np.asarray(ids, dtype=np.int64)].tolist()
        return gpt2_encoding().decode(ids)

    @property
    def num_slots(self) -> int:
        """Independent stream positions of the training stream: one per loader worker (or one)."""
        return max(1, self.num_workers)

    def _config(self) -> dict:
        hp = self.hparams
        keys = (
            "seq_len",
            "batch_size",
            "seed",
            "source",
            "path",
            "name",
            "split",
            "text_column",
            "sample_by",
            "shuffle_buffer",
        )
        config = {k: hp[k] for k in keys} | {"val_fraction": self.val.fraction}
        if self.revision is not None:  # absent otherwise: checkpoints from before `revision` still resume
            config["revision"] = self.revision
        if self.vocab != "gpt2":  # likewise
            config["vocab"] = self.vocab
        return config

    @staticmethod
    def saved_config(checkpoint: dict) -> dict | None:
        """The data settings a checkpoint's training stream was read with (rank 0's loader state, which
        Lightning keeps under the fit loop's combined loader), if any: for `check_resume`."""
        try:
            return checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["ranks"][0]["config"]
        except (KeyError, IndexError, TypeError):
            return None

    def check_resume(self, saved: dict, where: str) -> None:
        """Before anything is built: the data settings a checkpoint's training stream was read with
        (`saved`, its loader state's config) must be this module's, else a resume would stop at the
        restore, after logs and the run summary were written. The hub commit and the device count
        are checked at the restore itself (they are known only then)."""
        now = self._config() | {"num_slots": self.num_slots}
        diff = stream_config_diff(saved, now, keys=[k for k in now if k in saved and k != "revision"])
        if diff:
            raise DataConfigError(
                f"{where} was trained on another data stream (checkpoint, now): {diff}; fix: resume with the data "
                "settings it was trained with (config.yaml beside it; num_workers counts too), or leave out "
                "--ckpt_path to start a new run")

    # -- loaders -------------------------------------------------------------------------------

    def train_dataloader(self) -> ResumableLoader:
        """Infinite (inputs, targets) LongTensor batches [batch_size, seq_len], resumable."""
        self.setup("fit")
        stream = self._train_stream(*self._rank_world())
        loader = ResumableLoader(
            stream,
            num_workers=self.num_workers,
            pin_memory=torch.cuda.is_available(),
            persistent_workers=self.num_workers > 0,
        )
        # Under a Trainer, count batches as consumed when they reach the training step
        # (Lightning prefetches one more); see on_before_batch_transfer.
        loader.count_consumed = self.trainer is not None
        # Weak: a data module sits in reference cycles, and a DataLoader freed by the cyclic
        # garbage collector instead of by reference counting stalls 5 s per worker on shutdown.
        self._train_loader = weakref.ref(loader)
        return loader

    def _train_stream(self, rank: int, world: int) -> TrainStream:
        return TrainStream(
            self.docs,
            text_column=self.text_column,
            seq_len=self.seq_len,
            batch_size=self.batch_size,
            seed=self.seed,
            val=self.val,
            shuffle_buffer=self.hparams.shuffle_buffer,
            rank=rank,
            world_size=world,
            num_slots=self.num_slots,
            config=self._config(),
            table=self._table,
        )

    def val_windows(self, rank: int | None = None, world_size: int | None = None) -> torch.Tensor:
        """This rank's held-out windows [n, seq_len + 1], computed once (per rank and world size) and kept
        in memory. `rank`/`world_size` default to the Trainer's (or torch.distributed's)."""
        if rank is None or world_size is None:
            rank, world_size = self._rank_world()
        if self._val_windows is None or self._val_for != (rank, world_size):
            self.setup("validate")
            self._val_windows = val_windows(
                self.docs,
                text_column=self.text_column,
                seq_len=self.seq_len,
                val=self.val,
                rank=rank,
                world_size=world_size,
                max_tokens=self.hparams.val_max_tokens,
                table=self._table,
            )
            self._val_for = (rank, world_size)
        return self._val_windows

    def check(self, rank: int = 0, world_size: int = 1, train: bool = True) -> None:
        """Read what the first steps would, so that a corpus that cannot be used (empty, whitespace,
        binary or not UTF-8, too small to hold out a split or to fill one training window, or a hub
        dataset out of reach) fails with its `DataConfigError` before a run writes anything. The
        held-out windows are kept for validation; the training check reads up to its first document."""
        self.val_windows(rank, world_size)
        if train:
            next(self._train_stream(rank, world_size).documents(0))

    def val_dataloader(self) -> DataLoader:
        """The held-out split, finite and in a fixed order (the same on every run)."""
        # In memory already, so no worker processes are needed.
        return DataLoader(
            WindowBatches(self.val_windows(), self.batch_size), batch_size=None, pin_memory=torch.cuda.is_available()
        )

    def test_dataloader(self) -> DataLoader:
        """The same held-out split as val_dataloader (test reports loss on the split training validated on)."""
        return self.val_dataloader()

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        # Called by the Trainer right before a batch goes to the training step: that, not the
        # DataLoader's yield (Lightning prefetches), is when a batch is consumed.
        loader = self._train_loader()
        if loader is not None and self.trainer is not None and self.trainer.training:
            loader.mark_consumed()
        # Lightning calls only the data module's hook when both define it: run the model's too.
        model = self.trainer.lightning_module if self.trainer is not None else None
        if model is not None and is_overridden("on_before_batch_transfer", model, parent=L.LightningModule):
            batch = model.on_before_batch_transfer(batch, dataloader_idx)
        return batch
