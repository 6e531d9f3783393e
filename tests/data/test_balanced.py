"""Balanced reading of parquet corpora: every rank and worker reads a near-equal share, every training
document exactly once per epoch, only the row groups that hold its rows; held-out documents never."""

import collections

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from loopnet.data import DataConfigError
from loopnet.data.parquet import ParquetCorpus
from loopnet.data.stream import TrainStream

from .conftest import make_docs
from .test_stream import draw


def uneven_corpus(folder, shards, seed=0):
    """`shards` parquet files of uneven row counts (7..40) and row-group sizes (3..9): (files, texts)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    files, texts = [], []
    for k in range(shards):
        n = int(rng.integers(7, 41))
        docs = make_docs(n, words=12, tag=f"s{k}d")
        path = folder / f"{k:04d}.parquet"
        pq.write_table(pa.table({"text": docs}), path, row_group_size=int(rng.integers(3, 10)))
        files.append(str(path))
        texts += docs
    return files, texts


def part_stream(corpus, n_train, rank, world, slots):
    return TrainStream(
        corpus,
        text_column="text",
        seq_len=8,
        batch_size=1,
        seed=3,
        val=None,
        shuffle_buffer=1,
        rank=rank,
        world_size=world,
        num_slots=slots,
        train_rows=n_train,
    )


@pytest.mark.parametrize("shards,world,slots", [(3, 2, 1), (8, 3, 2), (2, 2, 2), (5, 2, 3), (1, 3, 2)])
def test_every_document_read_once_per_epoch_in_near_equal_parts(tmp_path, shards, world, slots):
    files, texts = uneven_corpus(tmp_path, shards)
    corpus = ParquetCorpus(files, "text")
    n_val = corpus.n_held_out(0.05)
    n_train = corpus.n_docs - n_val
    held_out = set(texts[n_train:])
    decoded = collections.Counter()  # rows parquet decoded, per part
    read_group = corpus.read_group
    for epoch in (0, 1):
        reads, sizes = collections.Counter(), []
        for rank in range(world):
            for slot in range(slots):
                part = (rank, slot)

                def counting(group, part=part):
                    decoded[part] += int(corpus.group_rows[group])
                    return read_group(group)

                corpus.read_group = counting
                got = [t for _, t in part_stream(corpus, n_train, rank, world, slots).slot_texts(slot, epoch)]
                sizes.append(len(got))
                reads.update(got)
        assert set(reads) == set(texts[:n_train]) and set(reads.values()) == {1}  # once each, all of them
        assert not held_out & set(reads)  # the training stream never yields a held-out document
        assert max(sizes) - min(sizes) <= 1  # within one document
    biggest_group = int(corpus.group_rows.max())
    for part, rows in decoded.items():  # only its own row groups: at most one cut group at each end, per epoch
        assert rows <= 2 * (n_train // (world * slots) + 1 + 2 * biggest_group), part


def test_epochs_are_reshuffled_and_parts_differ(tmp_path):
    files, _ = uneven_corpus(tmp_path, 4)
    corpus = ParquetCorpus(files, "text")
    s = part_stream(corpus, corpus.n_docs, 0, 1, 1)
    e0, e1 = ([t for _, t in s.slot_texts(0, e)] for e in (0, 1))
    assert sorted(e0) == sorted(e1) and e0 != e1


@pytest.mark.parametrize("num_workers", [0, 2])
def test_exact_resume_on_a_parquet_corpus(tmp_path, num_workers):
    files, _ = uneven_corpus(tmp_path, 3)
    kw = dict(
        seq_len=16,
        batch_size=2,
        seed=5,
        num_workers=num_workers,
        source="files",
        path=str(tmp_path / "*.parquet"),
        val_fraction=0.1,
        shuffle_buffer=7,
    )
    full, _ = draw(kw, 120)  # several epochs
    for k in (1, 37, 95):
        head, state = draw(kw, k)
        tail, _ = draw(kw, 120 - k, state)
        assert all(torch.equal(x, fx) and torch.equal(y, fy) for (x, y), (fx, fy) in zip(head + tail, full))


def test_resume_refuses_another_split_rule(tmp_path):
    uneven_corpus(tmp_path, 3)
    kw = dict(seq_len=16, batch_size=2, seed=5, source="files", path=str(tmp_path / "*.parquet"), val_fraction=0.1)
    _, state = draw(kw, 3)
    pq.write_table(pa.table({"text": make_docs(9, tag="new")}), tmp_path / "9999.parquet")  # the corpus grew
    with pytest.raises(DataConfigError, match="differs.*val_rule"):
        draw(kw, 1, state)
