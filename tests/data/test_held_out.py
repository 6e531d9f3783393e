"""Through the data module itself: its training stream never yields a held-out document, and reads
every other one (parquet: the last documents held out; text files: the hash rule); a resumed stream
starts at the first batch not consumed (counted, with batches prefetched but not consumed)."""

import itertools
import math
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from loopnet.data import EOT_ID, TokenStreamDataModule, gpt2_encoding
from loopnet.data.errors import DataConfigError

from .conftest import make_docs

N_DOCS, WORDS, SEQ, BATCH = 60, 30, 16, 2
TEXTS = make_docs(N_DOCS, words=WORDS)  # document i repeats "doc{i} word{j}" WORDS times
DOC = re.compile(r"\bdoc(\d+) word")


def doc_ids(windows: torch.Tensor) -> set[int]:
    """The documents whose text shows in any of `windows` (each names its document ~WORDS times, so a
    document that is read at all shows whole "doc<i> word" inside some window of SEQ tokens)."""
    enc = gpt2_encoding()
    return {int(m) for row in windows.tolist() for m in DOC.findall(enc.decode([t for t in row if t != EOT_ID]))}


def training_windows(dm: TokenStreamDataModule, epochs: float) -> torch.Tensor:
    """The training stream's windows for about `epochs` passes over the corpus."""
    enc = gpt2_encoding()
    tokens = sum(len(enc.encode_ordinary(t)) + 1 for t in TEXTS)
    n = math.ceil(epochs * tokens / (BATCH * (SEQ + 1)))
    return torch.cat([x for x, _ in itertools.islice(iter(dm.train_dataloader()), n)])


def parquet_source(tmp_path):
    for k in range(3):
        pq.write_table(pa.table({"text": TEXTS[k * 20 : (k + 1) * 20]}), tmp_path / f"{k}.parquet", row_group_size=6)
    return dict(source="files", path=str(tmp_path / "*.parquet"))


def text_source(tmp_path):
    d = tmp_path / "txt"
    d.mkdir()
    for i, t in enumerate(TEXTS):
        (d / f"f{i:02d}.txt").write_text(t, encoding="utf-8")
    return dict(source="files", path=str(d / "*.txt"))


@pytest.mark.parametrize("make_source", [parquet_source, text_source], ids=["parquet", "text"])
def test_training_never_reads_a_held_out_document(tmp_path, make_source):
    dm = TokenStreamDataModule(
        seq_len=SEQ,
        batch_size=BATCH,
        seed=0,
        val_fraction=0.1,
        shuffle_buffer=4,
        cache_dir=str(tmp_path / "cache"),
        **make_source(tmp_path),
    )
    held = doc_ids(dm.val_windows())
    trained = doc_ids(training_windows(dm, epochs=2.5))  # past two epoch boundaries
    assert held and not held & trained, sorted(held & trained)
    assert held | trained == set(range(N_DOCS))  # and every other document is trained on
    if make_source is parquet_source:  # the split rule: the last ⌈0.1·60⌉ = 6 documents
        assert dm.n_held_out == 6 and held == set(range(N_DOCS - 6, N_DOCS))


@pytest.mark.parametrize("make_source", [parquet_source, text_source], ids=["parquet", "text"])
def test_resume_starts_at_the_first_batch_not_consumed(tmp_path, make_source):
    """Under Lightning the loader yields a batch ahead of the one trained on (prefetch): the state
    counts consumed batches only, and a resumed loader yields batch k next, not k + 1; also in the
    second epoch (k = 230: past the ~190 batches of one)."""
    kw = dict(seq_len=SEQ, batch_size=BATCH, seed=5, val_fraction=0.2, shuffle_buffer=7, **make_source(tmp_path))
    n = 260
    full = [x for x, _ in itertools.islice(iter(TokenStreamDataModule(**kw).train_dataloader()), n)]
    assert all(not torch.equal(a, b) for a, b in zip(full, full[1:]))  # a shift by one shows
    for k in (1, 17, 45, 230):
        loader = TokenStreamDataModule(**kw).train_dataloader()
        loader.count_consumed = True  # as under a Trainer
        it = iter(loader)
        head = [next(it)[0] for _ in range(k + 1)]  # k consumed, one more prefetched
        for _ in range(k):
            loader.mark_consumed()
        state = loader.state_dict()
        assert state["ranks"][0]["consumed"] == k and state["ranks"][0]["version"] == 1
        resumed = TokenStreamDataModule(**kw).train_dataloader()
        resumed.load_state_dict(state)
        tail = [x for x, _ in itertools.islice(iter(resumed), n - k)]
        assert len(head[:k] + tail) == n
        for i, (x, f) in enumerate(zip(head[:k] + tail, full)):
            assert torch.equal(x, f), (k, i)
        assert resumed.state_dict()["ranks"][0]["consumed"] == n  # counts on from k


@pytest.mark.parametrize("make_source", [parquet_source, text_source], ids=["parquet", "text"])
def test_validation_windows_are_kept_per_rank_and_world_size(tmp_path, make_source):
    """Computed once per (rank, world size) and kept; rank r of W gets windows r, r + W, ... of the whole
    split (the same count on every rank); val_max_tokens keeps the first windows; a compact vocabulary's
    windows are GPT-2's renumbered."""
    kw = dict(
        seq_len=SEQ,
        batch_size=BATCH,
        seed=0,
        val_fraction=0.1,
        cache_dir=str(tmp_path / "cache"),
        **make_source(tmp_path),
    )
    dm = TokenStreamDataModule(**kw)
    whole = dm.val_windows(0, 1)
    assert dm.val_windows(0, 1) is whole and dm.val_windows() is whole  # no Trainer: rank 0 of 1
    n = len(whole) // 2 * 2
    assert n >= 4 and whole.shape[1] == SEQ + 1
    assert torch.equal(dm.val_windows(0, 2), whole[0:n:2]) and torch.equal(dm.val_windows(1, 2), whole[1:n:2])
    assert torch.equal(dm.val_windows(0, 1), whole)
    first = TokenStreamDataModule(**kw, val_max_tokens=2 * SEQ).val_windows(0, 1)
    assert 2 <= len(first) < len(whole) and torch.equal(first, whole[: len(first)])
    compact = TokenStreamDataModule(**kw, vocab="compact")
    table = torch.from_numpy(compact.vocabulary.table).long()
    assert torch.equal(compact.val_windows(0, 1), table[whole])


def one_document_held_out(tmp_path, last: str) -> dict:
    """A parquet corpus of 10 documents whose held-out part (val_fraction 0.1: the last one) is `last`."""
    texts = [" ".join(f"doc{i} word" for _ in range(30)) for i in range(9)] + [last]
    pq.write_table(pa.table({"text": texts}), tmp_path / "c.parquet")
    return dict(
        source="files",
        path=str(tmp_path / "c.parquet"),
        seq_len=SEQ,
        batch_size=BATCH,
        val_fraction=0.1,
        cache_dir=str(tmp_path / "cache"),
    )


def test_a_split_of_one_window_serves_one_device_and_is_refused_for_two(tmp_path):
    kw = one_document_held_out(tmp_path, " word" * 20)  # 20 tokens + end-of-text: one window of 17
    assert TokenStreamDataModule(**kw).val_windows(0, 1).shape == (1, SEQ + 1)
    with pytest.raises(DataConfigError) as err:
        TokenStreamDataModule(**kw).val_windows(0, 2)
    assert str(err.value) == (
        "The validation split holds 1 windows of seq_len + 1 = 17 tokens (the last 1 of 10 "
        "documents), fewer than the 2 device(s). Fix: raise val_fraction, lower seq_len, "
        "or add data"
    )


def test_a_split_too_short_for_one_window_is_refused(tmp_path):
    kw = one_document_held_out(tmp_path, " word" * 3)
    with pytest.raises(DataConfigError, match=r"^The validation split holds 0 windows of seq_len \+ 1 = 17 tokens"):
        TokenStreamDataModule(**kw).val_windows(0, 1)


def test_each_rank_trains_on_its_own_documents_and_the_state_carries_the_data_settings(tmp_path, monkeypatch):
    """Two ranks of the data module itself (rank and world size as a Trainer would give them) read disjoint
    training documents within an epoch, none held out; the loader's resume state records the module's
    data settings (what a resume checks)."""
    kw = dict(
        seq_len=SEQ,
        batch_size=BATCH,
        seed=0,
        val_fraction=0.1,
        shuffle_buffer=4,
        cache_dir=str(tmp_path / "cache"),
        **parquet_source(tmp_path),
    )
    read = []
    for rank in (0, 1):
        dm = TokenStreamDataModule(**kw)
        monkeypatch.setattr(dm, "_rank_world", lambda rank=rank: (rank, 2))
        read.append(doc_ids(training_windows(dm, epochs=0.4)))  # 0.4 of the corpus: within each rank's half
        state = dm.train_dataloader().state_dict()["ranks"][0]
        assert state["config"].items() >= dm._config().items()
    held = set(range(N_DOCS - 6, N_DOCS))
    assert read[0] and read[1] and not read[0] & read[1] and not (read[0] | read[1]) & held


def test_a_loader_that_lost_the_consumed_batchs_state_says_so(tmp_path):
    """The loader keeps the states of the last 2·slots + 16 = 18 batches yielded; when the last consumed batch
    is older (more prefetched than that), its state is gone and state_dict() refuses instead of guessing."""
    loader = TokenStreamDataModule(
        seq_len=SEQ, batch_size=BATCH, seed=0, val_fraction=0.1, **text_source(tmp_path)
    ).train_dataloader()
    loader.count_consumed = True
    it = iter(loader)
    for _ in range(5 + 17):  # batches 0..21: the history holds 4..21
        next(it)
    for _ in range(5):
        loader.mark_consumed()
    assert loader.state_dict()["ranks"][0]["consumed"] == 5  # batch 4's state is kept
    next(it)  # the history holds 5..22: batch 4's state is gone
    with pytest.raises(RuntimeError) as err:
        loader.state_dict()
    assert str(err.value) == "ResumableLoader lost track of consumed batches (more than its history prefetched)"


def test_a_state_from_another_device_count_or_stream_is_refused_naming_it(tmp_path):
    kw = dict(seq_len=SEQ, batch_size=BATCH, seed=0, val_fraction=0.1, **text_source(tmp_path))
    loader = TokenStreamDataModule(**kw).train_dataloader()
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    with pytest.raises(DataConfigError) as err:
        TokenStreamDataModule(**kw).train_dataloader().load_state_dict({"ranks": state["ranks"] * 2})
    assert str(err.value) == (
        "The checkpoint's data state is for 2 ranks, this run has 1. Exact data resume needs the same number of devices"
    )
    other = {"ranks": [state["ranks"][0] | {"config": state["ranks"][0]["config"] | {"seed": 1}}]}
    with pytest.raises(DataConfigError) as err:
        TokenStreamDataModule(**kw).train_dataloader().load_state_dict(other)
    assert str(err.value) == (
        "The checkpoint's data stream differs from this run's (checkpoint, now): "
        "{'seed': (1, 0)}. Exact data resume needs the same data settings, num_workers and "
        "devices"
    )
    moved = {"ranks": [state["ranks"][0] | {"config": state["ranks"][0]["config"] | {"revision": "abc123"}}]}
    with pytest.raises(DataConfigError) as err:
        TokenStreamDataModule(**kw).train_dataloader().load_state_dict(moved)
    assert str(err.value).endswith(
        "num_workers and devices; fix: read the commit it was trained on with `--data.revision abc123`"
    )


def tiny_training_split(tmp_path) -> tuple[dict, int]:
    """A parquet corpus whose training part (9 documents; the 10th held out) holds N tokens per epoch."""
    texts = [" word" * (i + 1) for i in range(9)] + [" held out" * 40]
    pq.write_table(pa.table({"text": texts}), tmp_path / "c.parquet")
    enc = gpt2_encoding()
    n = sum(len(enc.encode_ordinary(t)) + 1 for t in texts[:9])  # each document ends with end-of-text
    return dict(
        source="files", path=str(tmp_path / "c.parquet"), batch_size=1, seed=0, val_fraction=0.1, shuffle_buffer=1
    ), n


def test_a_training_split_of_one_window_trains_and_a_smaller_one_is_refused_naming_it(tmp_path, monkeypatch):
    kw, n = tiny_training_split(tmp_path)
    it = iter(TokenStreamDataModule(**kw, seq_len=n - 1).train_dataloader())  # N = seq_len + 1: one window
    assert [next(it)[0].shape for _ in range(3)] == [(1, n - 1)] * 3
    with pytest.raises(DataConfigError) as err:
        next(iter(TokenStreamDataModule(**kw, seq_len=n).train_dataloader()))
    assert str(err.value) == (
        f"the training split has {n} tokens per epoch, fewer than one window of "
        f"seq_len + 1 = {n + 1}. Fix: add data, lower seq_len"
    )
    dm = TokenStreamDataModule(**kw, seq_len=n)
    monkeypatch.setattr(dm, "_rank_world", lambda: (1, 2))
    with pytest.raises(
        DataConfigError,
        match=rf"^rank 1/2, worker 0/1: the training split has \d+ tokens per epoch, "
        rf"fewer than one window of seq_len \+ 1 = {n + 1}\. Fix: add data, "
        r"lower seq_len, or use fewer workers/devices$",
    ):
        next(iter(dm.train_dataloader()))
