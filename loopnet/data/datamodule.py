"""TokenStreamDataModule: stream documents, tokenize with GPT-2 BPE, pack into training windows."""

from __future__ import annotations

import inspect
import sys
import weakref
from typing import Any, Literal, get_args

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch.utils.data import DataLoader

from loopnet.data.errors import DataConfigError
from loopnet.data.parquet import ParquetCorpus
from loopnet.data.sources import (
    HUB_VAL_FRACTION,
    OPENWEBTEXT,
    SHAKESPEARE_VAL_FRACTION,
    Source,
    ValSelector,
    builder_for,
    check_revision,
    hub_revision,
    is_hub_id,
    open_corpus,
    resolve_files,
)
from loopnet.data.stream import (
    ResumableLoader,
    TrainStream,
    WindowBatches,
    pack_windows,
    stream_config_diff,
    val_windows,
)
from loopnet.data.textfiles import check_documents
from loopnet.data.valcache import cache_root, cached_windows
from loopnet.data.tokenizer import gpt2_encoding
from loopnet.data.token_ids import DEFAULT as DEFAULT_VOCAB
from loopnet.data.token_ids import VocabName
from loopnet.data.vocabulary import VOCABULARIES, CompactVocab, TokenizerVocab, Vocabulary


def _arguments(frame) -> dict[str, Any]:
    """The arguments of the method running in `frame`, by name, without `self`. A helper, so that no
    local of that frame holds the frame or its locals (a reference cycle)."""
    info = inspect.getargvalues(frame)
    return {name: info.locals[name] for name in info.args[1:]}


class TokenStreamDataModule(L.LightningDataModule):
    """GPT-2-tokenized text streamed through `datasets`, packed into (inputs, targets) windows.

    Training batches are infinite (the corpus is cycled, reshuffled per epoch from `seed`);
    validation and test iterate the same finite held-out split in a fixed order. The split rule:

    * parquet corpora (hub datasets, .parquet files; `loopnet.data.parquet`): the last
      ceil(val_fraction × documents) documents of the corpus order (files by name, rows in order),
      read once, tokenized once and kept on disk (`loopnet.data.valcache`, keyed by the corpus's
      commit or files, the rule, the tokenizer, seq_len and val_max_tokens), shared by the ranks;
      training reads only the rows before them, cut into near-equal row ranges per rank and worker.
    * other corpora (the embedded plays, text and json files): documents whose stable text hash falls
      below val_fraction, found by reading the corpus once per rank (small corpora).

    The held-out windows are sharded by rank (equal counts).

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
        cache_dir: where a parquet corpus's held-out windows are kept (None: $LOOPNET_CACHE_DIR, else
            ~/.cache/loopnet); not part of the stream's identity.
        sample_by: how .txt/.md files are cut into documents: `document` (whole file),
            `paragraph` (blank-line separated) or `line`.
        val_fraction: fraction of documents held out for validation; default 0.05 for
            `shakespeare` (one play, ~45k tokens), 0.0005 (nanoGPT's) otherwise.
        val_max_tokens: validate on the first windows of the held-out split only, up to this many
            tokens (None: all); the held-out documents are never trained on either way.
        shuffle_buffer: windows shuffled together (in seeded blocks); 1 disables shuffling.
        vocab: `gpt2` (GPT-2's 50257 ids) or `compact`: only the GPT-2 tokens that occur in the
            corpus (training and held-out documents; end-of-text included), renumbered 0..V-1 in
            GPT-2 order. Lossless (the same tokens, so losses stay comparable up to the head's
            size) and the LM head shrinks with it: the 38 plays use 19,083 of GPT-2's ids, so a
            tiny model's 50k-way head, most of its compute on CPU, becomes 2.6x smaller. Local
            corpora only (`shakespeare`, `files`); the model's vocab_size must be at least
            `vocab_size` (`loopnet fit` checks before training). `bytes`: UTF-8 bytes, 257 ids
            (`loopnet.data.bytelevel`; losses in nats per byte), any source. `tokenizer`: the ids of
            the tokenizer.json at `tokenizer` (an imported model's own; `loopnet.formats.tokenizer`).
        tokenizer: with `vocab: tokenizer`, a tokenizer.json or a model folder holding one (`loopnet import`'s).
    """

    def __init__(
        self,
        seq_len: int,
        batch_size: int,
        num_workers: int = 0,
        seed: int = 1337,
        source: Source = "shakespeare",
        path: str | list[str] | None = None,
        name: str | None = None,
        split: str = "train",
        revision: str | None = None,
        text_column: str = "text",
        sample_by: Literal["document", "paragraph", "line"] = "document",
        val_fraction: float | None = None,
        val_max_tokens: int | None = None,
        shuffle_buffer: int = 1024,
        vocab: VocabName = DEFAULT_VOCAB,
        cache_dir: str | None = None,
        tokenizer: str | None = None,
    ):
        super().__init__()
        # Same as save_hyperparameters(), with this frame handed over inline and the arguments read off
        # its own code: Lightning's default keeps inspect.currentframe() in a local (a cycle that holds
        # the caller's whole stack, and any DataLoader workers in it, until the cyclic collector runs) and
        # names the arguments from type(self).__init__'s signature, which a wrapper (mutation testing's
        # trampolines) hides.
        self.save_hyperparameters(_arguments(inspect.currentframe()), frame=inspect.currentframe())
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
        if source not in get_args(Source):
            raise DataConfigError(f"Unknown source {source!r}; choose {', '.join(get_args(Source))}")
        if source == "files":
            builder_for(resolve_files(path if path is not None else []))  # fail now on a bad path or type
        check_revision(source, path, revision)
        if vocab not in VOCABULARIES:
            raise DataConfigError(f"data.vocab={vocab!r} is not known; choose {', '.join(VOCABULARIES)}")
        if (vocab == "tokenizer") != (tokenizer is not None):
            raise DataConfigError(
                "data.vocab: tokenizer and data.tokenizer go together; fix: give both (data.tokenizer: "
                "an imported model's folder or its tokenizer.json), or neither"
            )
        if VOCABULARIES[vocab].reads_corpus and source == "hub":
            raise DataConfigError(
                f"data.vocab: {vocab} reads the whole corpus to find its tokens, so it needs a "
                f"local corpus; fix: use source shakespeare or files, or vocab: {DEFAULT_VOCAB}"
            )
        if val_fraction is None:
            val_fraction = SHAKESPEARE_VAL_FRACTION if source == "shakespeare" else HUB_VAL_FRACTION
        self.val = ValSelector(val_fraction)
        self.seq_len, self.batch_size, self.num_workers, self.seed = seq_len, batch_size, num_workers, seed
        self.source, self.path, self.text_column = source, path, text_column
        self.docs: ParquetCorpus | Any = None  # or a `datasets` IterableDataset
        self.layout = None  # the hub layout read (loopnet.data.hub.ParquetLayout), for hub sources
        self.val_cache: str | None = None  # the file the held-out windows of a parquet corpus are kept in
        self.revision: str | None = None  # the hub commit streamed, resolved in setup()
        self._train_loader = lambda: None  # weak reference to the last training loader
        self._val_windows: torch.Tensor | None = None
        self._val_for: tuple[int, int] | None = None  # the (rank, world size) _val_windows were cut for
        self.vocab = vocab
        # Built here, or from the corpus in setup() (compact).
        self._vocabulary: Vocabulary | None = (
            TokenizerVocab(tokenizer)
            if tokenizer is not None
            else None
            if VOCABULARIES[vocab].reads_corpus
            else VOCABULARIES[vocab]()
        )

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
            if self.source == "files":  # a huge line or file: one line now, not gigabytes in the tokenizer
                check_documents(resolve_files(path if path is not None else []), hp.sample_by)
            # The commit streamed (hub datasets only): part of the stream identity checked on resume.
            self.revision = hub_revision(path, hp.revision) if is_hub_id(self.source, path) else None
            self.docs, self.layout = open_corpus(
                self.source,
                path,
                text_column=self.text_column,
                name=hp.name,
                split=hp.split,
                sample_by=hp.sample_by,
                revision=self.revision,
                asked=hp.revision,
            )
            if self.layout is not None and self.layout.partial and self._rank_world()[0] == 0:
                print(f"loopnet: warning: {self.partial_note()}", file=sys.stderr)
            if self._vocabulary is None:
                self._vocabulary = self._corpus_vocabulary()

    def _corpus_vocabulary(self) -> Vocabulary:
        """The corpus's own GPT-2 ids (all documents, so held-out tokens have a row too)."""
        if isinstance(self.docs, ParquetCorpus):
            texts = self.docs.texts(self.docs.range_pieces(0, self.docs.n_docs))
        else:
            texts = (doc.get(self.text_column) for doc in self.docs)
        try:
            return CompactVocab.of_texts(texts)
        except UnicodeDecodeError as e:  # named as the GPT-2 path names it (stream.documents)
            raise DataConfigError(
                f"A data file of data.path {self.path!r} is not valid UTF-8 ({e}). "
                "Fix: re-encode it as UTF-8 (e.g. with iconv)"
            ) from e

    @property
    def vocabulary(self) -> Vocabulary:
        """The ids the batches hold (`data.vocab`); a compact one is read from the corpus on first use."""
        if self._vocabulary is None:
            self.setup("fit")
        return self._vocabulary

    @property
    def vocab_size(self) -> int:
        """Token ids the batches use: GPT-2's 50257, 257 bytes, or the corpus's own count with `vocab: compact`."""
        return self.vocabulary.size

    @property
    def vocab_ids(self) -> np.ndarray | None:
        """compact: the GPT-2 id of each compact id."""
        return getattr(self.vocabulary, "ids", None)

    @property
    def _table(self):
        """What the stream maps documents with (None: GPT-2's ids as they are)."""
        return None if self._vocabulary is None else self._vocabulary.table

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` as this module's batches hold them (a token outside a compact
        vocabulary becomes end-of-text)."""
        return self.vocabulary.encode(text)

    def decode(self, ids: list[int]) -> str:
        """Text of token ids as this module's batches hold them."""
        return self.vocabulary.decode(ids)

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
        if self.vocab != DEFAULT_VOCAB:  # likewise
            config["vocab"] = self.vocab
        if self.hparams.get("tokenizer") is not None:  # likewise: the ids of this file
            config["tokenizer"] = self.vocabulary.cache_key
        if isinstance(self.docs, ParquetCorpus):  # the split rule (the hash rule, absent, as before it existed)
            config["val_rule"] = f"last {self.n_held_out} of {self.docs.n_docs} documents"
        return config

    @property
    def n_held_out(self) -> int:
        """Documents held out at the end of a parquet corpus."""
        return self.docs.n_held_out(self.val.fraction)

    def partial_note(self) -> str:
        """What a partial parquet conversion holds (the warning and summary.json say it)."""
        lay, docs, path = self.layout, self.docs, self.path or OPENWEBTEXT
        where = (
            f"{path} at revision {self.hparams.revision or 'main'} is"
            if is_hub_id(self.source, path)
            else f"the folder {path} holds"
        )
        return (
            f"{where} a partial parquet conversion: {lay.folder} holds {docs.n_docs:,} documents in "
            f"{len(lay.files)} shard(s), the first part of split {lay.split!r} only (the converter stops at "
            f"~5 GB); training and validation use those alone. For the whole corpus: the repository's own parquet "
            f"files where it has them (data.revision: main), or data.path a local folder of all its parquet files"
        )

    def summary(self) -> dict:
        """What was read, for the run's summary.json: source, commit, files, documents and split rule."""
        out: dict[str, Any] = {"source": self.source, "path": self.path, "revision": self.revision}
        if isinstance(self.docs, ParquetCorpus):
            out |= {
                "files": len(self.docs.files),
                "documents": self.docs.n_docs,
                "val_rule": self._config()["val_rule"],
                "val_cache": self.val_cache,
            }
        if self.layout is not None:
            out |= {"folder": self.layout.folder, "partial": self.layout.partial}
            if self.layout.partial:
                out["partial_note"] = self.partial_note()
        return out

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
                "--ckpt_path to start a new run"
            )

    # -- loaders -------------------------------------------------------------------------------

    def train_dataloader(self) -> ResumableLoader:
        """Infinite (inputs, targets) LongTensor batches [batch_size, seq_len], resumable."""
        self.setup("fit")
        stream = self.train_stream(*self._rank_world())
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

    def train_stream(self, rank: int, world: int) -> TrainStream:
        """The training batches of rank `rank` of `world`, as `train_dataloader` reads them (without its
        loader's workers and resume state)."""
        parquet = isinstance(self.docs, ParquetCorpus)
        return TrainStream(
            self.docs,
            text_column=self.text_column,
            seq_len=self.seq_len,
            batch_size=self.batch_size,
            seed=self.seed,
            val=None if parquet else self.val,
            train_rows=self.docs.n_docs - self.n_held_out if parquet else None,
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
            if isinstance(self.docs, ParquetCorpus):
                self._val_windows = self._held_out_windows(rank, world_size)
                self._val_for = (rank, world_size)
                return self._val_windows
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

    def _held_out_windows(self, rank: int, world_size: int) -> torch.Tensor:
        """A parquet corpus's held-out range, packed into windows once and kept on disk; this rank's share."""
        docs, n_val = self.docs, self.n_held_out
        max_tokens = self.hparams.val_max_tokens
        key = {
            "corpus": docs.identity,
            "text_column": self.text_column,
            "split_rule": self._config()["val_rule"],
            "tokenizer": self.vocabulary.cache_key,
            "seq_len": self.seq_len,
            "max_tokens": max_tokens,
        }

        def build() -> np.ndarray:
            rows = pack_windows(
                docs.texts(docs.range_pieces(docs.n_docs - n_val, docs.n_docs)), self.seq_len, max_tokens, self._table
            )
            return np.stack(rows) if rows else np.zeros((0, self.seq_len + 1), dtype=np.int32)

        windows, path = cached_windows(key, build, cache_root(self.hparams.cache_dir))
        self.val_cache = None if path is None else str(path)
        n = len(windows) // world_size * world_size
        if n == 0:
            raise DataConfigError(
                f"The validation split holds {len(windows)} windows of seq_len + 1 = {self.seq_len + 1} tokens "
                f"(the last {n_val} of {docs.n_docs} documents), fewer than the {world_size} device(s). "
                "Fix: raise val_fraction, lower seq_len, or add data"
            )
        return torch.from_numpy(windows[rank:n:world_size]).long()

    def check(self, rank: int = 0, world_size: int = 1, train: bool = True) -> None:
        """Read what the first steps would, so that a corpus that cannot be used (empty, whitespace,
        binary or not UTF-8, too small to hold out a split or to fill one training window, or a hub
        dataset out of reach) fails with its `DataConfigError` before a run writes anything. The
        held-out windows are kept for validation; the training check reads up to its first document."""
        self.val_windows(rank, world_size)
        if train:
            next(self.train_stream(rank, world_size).documents(0))

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
