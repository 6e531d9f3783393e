"""The training stream's resume state and the held-out split's edges, in one process (quick): a resume past the
first 64 documents `datasets` reads at a time, a resume mid-epoch on a corpus of under two windows, the parquet
parts of ranks and loader workers, the next loader worker after k batches, the state gathered over a process
group, and the held-out windows' refusals, counts and limits."""

import itertools

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from loopnet.data import DataConfigError, TokenStreamDataModule, gpt2_encoding
from loopnet.data.sources import load_documents
from loopnet.data.stream import ResumableLoader, TrainStream, pack_windows, val_windows

from .conftest import make_docs


def resumed_equals_uninterrupted(kw: dict, ks, n: int) -> None:
    """For each k: k batches consumed, the state saved, a new loader resumed from it yields batches k, k + 1, ...
    of the uninterrupted stream."""
    full = [x for x, _ in itertools.islice(iter(TokenStreamDataModule(**kw).train_dataloader()), n)]
    for k in ks:
        loader = TokenStreamDataModule(**kw).train_dataloader()
        head = [x for x, _ in itertools.islice(iter(loader), k)]
        resumed = TokenStreamDataModule(**kw).train_dataloader()
        resumed.load_state_dict(loader.state_dict())
        tail = [x for x, _ in itertools.islice(iter(resumed), n - k)]
        assert all(torch.equal(a, b) for a, b in zip(head + tail, full, strict=True)), k


def test_a_resume_past_the_first_64_documents_continues_exactly(tmp_path):
    """`datasets` reads 64 documents at a time: a position past them carries the reader's own state."""
    d = tmp_path / "txt"
    d.mkdir()
    for i, text in enumerate(make_docs(150, words=8)):
        (d / f"{i:03d}.txt").write_text(text)
    kw = dict(
        seq_len=16, batch_size=2, seed=3, source="files", path=str(d / "*.txt"), val_fraction=0.1, shuffle_buffer=3
    )
    resumed_equals_uninterrupted(kw, ks=(5, 90, 130), n=150)


@pytest.mark.parametrize(
    "lengths, seq_len",
    [
        ([5] * 9, 35),  # 9 × 6 = 54 tokens an epoch, windows every 35: window 2 starts in document 5
        ([29] + [2] * 8, 30),  # 30 + 8 × 3 = 54, windows every 30: window 2 starts at document 1
    ],
    ids=["doc5", "doc1"],
)
def test_a_resume_mid_epoch_on_a_corpus_of_under_two_windows(tmp_path, lengths, seq_len):
    """The second window spans the epoch's end: resumed from its start, the rest of that epoch holds less than
    a window, which is not the "training split too small" refusal (that counts whole epochs only)."""
    texts = [" word" * n for n in lengths] + [" held out" * 40]  # each document ends with end-of-text
    pq.write_table(pa.table({"text": texts}), tmp_path / "c.parquet")
    kw = dict(
        seq_len=seq_len,
        batch_size=1,
        seed=0,
        source="files",
        path=str(tmp_path / "c.parquet"),
        val_fraction=0.1,
        shuffle_buffer=1,
    )
    resumed_equals_uninterrupted(kw, ks=(1, 2, 3), n=6)


def test_each_pass_over_the_training_documents_is_the_next_epoch(tmp_path):
    """The stream reads epoch 0's documents, then epoch 1's (each epoch's order its own), and says so."""
    texts = [f"doc{i} " + " ".join(["word"] * 20) for i in range(10)]
    pq.write_table(pa.table({"text": texts}), tmp_path / "c.parquet")
    dm = TokenStreamDataModule(
        seq_len=16, batch_size=1, source="files", path=str(tmp_path / "c.parquet"), val_fraction=0.1
    )
    dm.setup()
    s = dm.train_stream(0, 1)
    epochs = [pos["epoch"] for pos, _ in itertools.islice(s.documents(0), 3 * 9)]
    assert epochs == [0] * 9 + [1] * 9 + [2] * 9


def test_ranks_and_loader_workers_read_disjoint_parquet_parts_covering_the_training_rows(tmp_path):
    texts = [f"doc{i} " + " ".join(["word"] * 20) for i in range(40)]
    for k in range(4):
        pq.write_table(pa.table({"text": texts[k * 10 : (k + 1) * 10]}), tmp_path / f"{k}.parquet", row_group_size=3)
    dm = TokenStreamDataModule(
        seq_len=16, batch_size=1, source="files", path=str(tmp_path / "*.parquet"), val_fraction=0.1, num_workers=2
    )  # 2 loader workers: 2 slots per rank
    dm.setup()
    train_rows = dm.docs.n_docs - dm.n_held_out
    seen = []
    for rank in range(2):
        s = dm.train_stream(rank, 2)
        for slot in range(2):
            seen.append({text.split()[0] for _, text in s.slot_texts(slot, epoch=0)})
    assert all(seen) and sum(len(s) for s in seen) == train_rows == len(set().union(*seen))


def test_the_next_loader_worker_follows_the_batches_done(tmp_path):
    """Workers serve batches round-robin: after k batches the next one comes from worker (start + k) mod slots."""
    d = tmp_path / "txt"
    d.mkdir()
    (d / "a.txt").write_text("some text")
    s = TrainStream(
        load_documents("files", str(d / "*.txt")),
        text_column="text",
        seq_len=4,
        batch_size=1,
        seed=0,
        val=None,
        shuffle_buffer=1,
        num_slots=3,
    )
    s.start = {"next_slot": 1, "slots": [None] * 3}
    loader = ResumableLoader(s)
    assert loader.state_dict()["ranks"][0]["consumed"] == 0  # nothing yielded yet
    for done, slot in ((0, 1), (1, 2), (2, 0), (4, 2), (5, 0)):
        loader._yielded = done  # batches yielded (and counted as consumed: no Trainer)
        assert loader.state_dict()["ranks"][0]["next_slot"] == slot, done


def test_the_state_is_gathered_over_the_process_group(tmp_path, monkeypatch):
    """Under torch.distributed every rank's state is gathered (all_gather_object); a group of one here, the
    stream built as rank 0 of 2, so the gather runs and returns this rank's state."""
    import torch.distributed as dist

    kw = dict(seq_len=16, batch_size=2, seed=0, source="files", val_fraction=0.1)
    d = tmp_path / "txt"
    d.mkdir()
    for i, text in enumerate(make_docs(20)):
        (d / f"{i:02d}.txt").write_text(text)
    dm = TokenStreamDataModule(**kw, path=str(d / "*.txt"))
    monkeypatch.setattr(dm, "_rank_world", lambda: (0, 2))
    loader = dm.train_dataloader()
    next(iter(loader))
    local = loader._local_state()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        assert loader.state_dict() == {"ranks": [local]}
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------------------------ held-out windows
class Chosen:
    """A hold-out rule that picks the documents whose text starts with "held" (val_windows' `val`)."""

    def __init__(self, fraction):
        self.fraction = fraction

    def __call__(self, text):
        return text.startswith("held")


def jsonl(tmp_path, texts) -> object:
    import json

    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return load_documents("files", str(path))


def test_an_empty_corpus_is_refused_naming_its_documents(tmp_path):
    docs = jsonl(tmp_path, ["", "   ", "\n\n"])
    with pytest.raises(DataConfigError) as err:
        val_windows(docs, text_column="text", seq_len=8, val=Chosen(0.5))
    assert str(err.value) == (
        "The corpus is empty: 3 document(s), none with text in column 'text'. "
        "Fix: point data.path at files that hold text (or set text_column:)"
    )


@pytest.mark.parametrize(
    "texts, fraction, reason",
    [
        # held-out documents too short for a window: their count, and the general fix
        (
            ["held a", "held b", "other " * 50, ""],
            0.1,
            "(2 held-out document(s)), fewer than the 1 device(s). Fix: raise val_fraction, lower seq_len, or add data",
        ),  # the last: empty
        # none held out, and 10 documents × 0.1 = 1: the hold-out could have picked one, so the general fix
        (
            ["other " * 20] * 10,
            0.1,
            "(0 held-out document(s)), fewer than the 1 device(s). Fix: raise val_fraction, lower seq_len, or add data",
        ),
        # none held out of 3 documents × 0.1 < 1: the hold-out is per document, so it says so
        (
            ["other " * 20] * 3,
            0.1,
            "(0 held-out document(s)), fewer than the 1 device(s); the hold-out is chosen per "
            "document and this corpus is 3 document(s) (a .txt/.md file is one), so val_fraction "
            "0.1 selects none. Fix: cut the files into documents with data.sample_by: paragraph "
            "(or line), or raise val_fraction",
        ),
    ],
)
def test_a_held_out_split_without_a_window_says_why(tmp_path, texts, fraction, reason):
    docs = jsonl(tmp_path, texts)
    with pytest.raises(DataConfigError) as err:
        val_windows(docs, text_column="text", seq_len=8, val=Chosen(fraction))
    assert str(err.value) == "The validation split holds 0 windows of seq_len + 1 = 9 tokens " + reason


def test_packing_skips_empty_documents_and_stops_once_max_tokens_are_held():
    texts = ["one " * 12, "", None, "two " * 12, "three " * 12]
    enc = gpt2_encoding()
    assert all(len(enc.encode_ordinary(t)) + 1 >= 3 * 4 for t in texts if t)
    rows = pack_windows(iter(texts), seq_len=4)
    assert len(rows) == len(pack_windows(iter([t for t in texts if t]), seq_len=4))
    first = pack_windows(iter(texts[:1]), seq_len=4)  # the windows the first document fills
    assert len(first) >= 2
    # max_tokens reached exactly by the first document's windows: packing stops there
    assert len(pack_windows(iter(texts), seq_len=4, max_tokens=len(first) * 4)) == len(first)
    assert len(pack_windows(iter(texts), seq_len=4, max_tokens=len(first) * 4 + 1)) > len(first)


def test_a_resume_at_the_start_of_a_later_read_of_64_documents_is_mid_epoch(tmp_path):
    """70 one-token documents (2 tokens each with end-of-text: 140 an epoch), windows of 129 tokens one after
    another every 128: window 2 starts at document 64, the first of `datasets`' second read, with 12 tokens left
    in the epoch. Resumed there, the stream is mid-epoch (its position carries the reader's state), not at an
    epoch's start with 12 tokens."""
    d = tmp_path / "txt"
    d.mkdir()
    for i in range(70):
        (d / f"{i:02d}.txt").write_text(" w")
    kw = dict(
        seq_len=128, batch_size=1, seed=0, source="files", path=str(d / "*.txt"), val_fraction=1e-9, shuffle_buffer=1
    )
    resumed_equals_uninterrupted(kw, ks=(1, 2), n=4)


def test_a_loader_built_without_pin_memory_yields_plain_tensors(tmp_path):
    d = tmp_path / "txt"
    d.mkdir()
    (d / "a.txt").write_text(" ".join(["word"] * 50))
    s = TrainStream(
        load_documents("files", str(d / "*.txt")),
        text_column="text",
        seq_len=4,
        batch_size=1,
        seed=0,
        val=None,
        shuffle_buffer=1,
    )
    x, y = next(iter(ResumableLoader(s)))
    assert not x.is_pinned() and not y.is_pinned() and x.shape == y.shape == (1, 4)
