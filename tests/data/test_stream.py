import itertools

import numpy as np
import pytest
import torch

from loopnet.data import EOT_ID, DataConfigError, TokenStreamDataModule, gpt2_encoding
from loopnet.data.sources import ValSelector, load_documents
from loopnet.data.stream import TrainStream, iter_texts, val_windows


def stream(
    docs, *, rank=0, world=1, slots=1, seq_len=16, batch_size=2, shuffle_buffer=5, seed=0, column="text", val=0.2
):
    return TrainStream(
        docs,
        text_column=column,
        seq_len=seq_len,
        batch_size=batch_size,
        seed=seed,
        val=ValSelector(val),
        shuffle_buffer=shuffle_buffer,
        rank=rank,
        world_size=world,
        num_slots=slots,
    )


def epoch_texts(s: TrainStream, slot: int, epoch: int) -> list[str]:
    return [t for _, t in iter_texts(s.slot_docs(slot, epoch), s.text_column)]


@pytest.mark.parametrize("world,slots", [(1, 1), (1, 2), (2, 1), (2, 2), (3, 2)])
def test_ranks_and_workers_see_disjoint_data_covering_the_stream(jsonl_corpus, world, slots):
    path, texts = jsonl_corpus  # 4 shards: (3, 2) = 6 parts falls back to splitting by example
    docs = load_documents("files", path)
    for epoch in (0, 1):
        parts = [
            epoch_texts(stream(docs, rank=r, world=world, slots=slots, column="body"), s, epoch)
            for r in range(world)
            for s in range(slots)
        ]
        seen = list(itertools.chain(*parts))
        assert sorted(seen) == sorted(texts)  # union is everything, and nothing is seen twice
        assert all(parts)


def test_val_split_is_the_same_whatever_the_world_size(jsonl_corpus):
    path, texts = jsonl_corpus
    docs, sel = load_documents("files", path), ValSelector(0.25)
    expected = sorted(t for t in texts if sel(t))
    assert 3 < len(expected) < 20
    for world, slots in ((1, 1), (2, 1), (3, 2)):
        for epoch in (0, 3):
            got = [
                t
                for r in range(world)
                for s in range(slots)
                for t in epoch_texts(stream(docs, rank=r, world=world, slots=slots, column="body"), s, epoch)
                if sel(t)
            ]
            assert sorted(got) == expected


def test_training_windows_are_the_training_documents_in_order(txt_corpus):
    path, texts = txt_corpus
    s = stream(load_documents("files", path), shuffle_buffer=1, seq_len=16, batch_size=1)
    enc = gpt2_encoding()
    order = [t for t in epoch_texts(s, 0, 0) if not s.val(t)]
    assert 0 < len(order) < len(texts)  # some documents are held out
    tokens = np.concatenate([enc.encode_ordinary(t) + [EOT_ID] for t in order])
    n = (len(tokens) - 1) // 16  # windows that fit in epoch 0
    windows = [w for w, _ in itertools.islice(s.batches(0), n)]
    rebuilt = np.concatenate([windows[0][0]] + [w[0][1:] for w in windows[1:]])
    assert np.array_equal(rebuilt, tokens[: len(rebuilt)])
    assert len(tokens) - len(rebuilt) < 16  # nothing lost but the tail that continues into epoch 1


def test_epochs_are_reshuffled_from_the_seed(txt_corpus):
    docs = load_documents("files", txt_corpus[0])
    e0, e1 = epoch_texts(stream(docs), 0, 0), epoch_texts(stream(docs), 0, 1)
    assert sorted(e0) == sorted(e1) and e0 != e1
    assert epoch_texts(stream(docs, seed=1), 0, 0) != e0
    assert epoch_texts(stream(docs), 0, 0) == e0


def draw(dm_kwargs, n, state=None):
    loader = TokenStreamDataModule(**dm_kwargs).train_dataloader()
    if state is not None:
        loader.load_state_dict(state)
    it = iter(loader)
    batches = [next(it) for _ in range(n)]
    return batches, loader.state_dict()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_exact_resume_across_epochs(txt_corpus, num_workers):
    kw = dict(
        seq_len=16,
        batch_size=2,
        seed=5,
        num_workers=num_workers,
        source="files",
        path=txt_corpus[0],
        val_fraction=0.2,
        shuffle_buffer=7,
    )
    full, _ = draw(kw, 160)  # ~2.5 epochs of this corpus
    for k in (1, 37, 95):
        head, state = draw(kw, k)
        tail, _ = draw(kw, 160 - k, state)
        for (x, y), (fx, fy) in zip(head + tail, full):
            assert torch.equal(x, fx) and torch.equal(y, fy)
    # resuming twice in a row is exact too
    a, s1 = draw(kw, 20)
    b, s2 = draw(kw, 30, s1)
    c, _ = draw(kw, 10, s2)
    assert all(torch.equal(x[0], f[0]) for x, f in zip(a + b + c, full))


def test_resume_refuses_a_different_stream(txt_corpus):
    kw = dict(seq_len=16, batch_size=2, seed=5, source="files", path=txt_corpus[0], val_fraction=0.2)
    _, state = draw(kw, 3)
    with pytest.raises(DataConfigError, match="differs.*seq_len"):
        draw(kw | {"seq_len": 8}, 1, state)
    with pytest.raises(DataConfigError, match="num_slots"):
        draw(kw | {"num_workers": 2}, 1, state)


def test_batches_are_deterministic_and_shifted():
    kw = dict(seq_len=32, batch_size=4, seed=0)
    a, _ = draw(kw, 3)
    b, _ = draw(kw, 3)
    for (x, y), (x2, y2) in zip(a, b):
        assert x.dtype == y.dtype == torch.long and x.shape == y.shape == (4, 32)
        assert torch.equal(x, x2) and torch.equal(y, y2)
        assert torch.equal(x[:, 1:], y[:, :-1])
    c, _ = draw(kw | {"seed": 1}, 3)
    assert not torch.equal(a[0][0], c[0][0])


def test_corpus_smaller_than_a_window(tmp_path):
    (tmp_path / "a.txt").write_text("a short document")
    dm = TokenStreamDataModule(
        seq_len=64, batch_size=2, seed=0, source="files", path=str(tmp_path / "a.txt"), val_fraction=1e-9
    )
    with pytest.raises(DataConfigError, match="fewer than one window of seq_len \\+ 1 = 65"):
        next(iter(dm.train_dataloader()))


def test_more_workers_than_documents(tmp_path):
    for i in range(2):
        (tmp_path / f"{i}.txt").write_text(" ".join(["word"] * 100) + str(i))
    s = stream(load_documents("files", str(tmp_path / "*.txt")), slots=3, val=1e-9)
    with pytest.raises(DataConfigError, match="worker 2/3.*0 tokens per epoch.*fewer workers"):
        next(s.batches(2))


@pytest.mark.parametrize(
    "bad",
    [
        dict(seq_len=0),
        dict(seq_len=-3),
        dict(batch_size=0),
        dict(num_workers=-1),
        dict(shuffle_buffer=0),
        dict(val_fraction=0.0),
        dict(val_max_tokens=0),
        dict(source="nope"),
        dict(source="files"),
    ],
)
def test_bad_arguments_fail_at_construction(bad):
    with pytest.raises(DataConfigError):
        TokenStreamDataModule(**(dict(seq_len=16, batch_size=2, seed=0) | bad))


def test_val_windows_fixed_order_and_max_tokens(jsonl_corpus):
    path, _ = jsonl_corpus
    docs, sel = load_documents("files", path), ValSelector(0.5)
    a = val_windows(docs, text_column="body", seq_len=8, val=sel)
    assert torch.equal(a, val_windows(docs, text_column="body", seq_len=8, val=sel))
    b = val_windows(docs, text_column="body", seq_len=8, val=sel, max_tokens=40)
    assert len(b) * 8 >= 40 and torch.equal(b, a[: len(b)]) and len(b) < len(a)
    for world in (2, 3):
        parts = [
            val_windows(docs, text_column="body", seq_len=8, val=sel, rank=r, world_size=world) for r in range(world)
        ]
        assert len({len(p) for p in parts}) == 1  # same number of windows on every rank
        n = len(parts[0]) * world
        assert n > len(a) - world
        assert torch.equal(torch.stack(parts, 1).reshape(n, -1), a[:n])  # rank r holds windows r, r + world, ...


def test_loader_is_freed_without_the_cyclic_gc(txt_corpus):
    # A DataLoader whose workers are shut down by the cyclic GC stalls 5 s per worker.
    import gc
    import weakref

    gc.disable()
    try:
        dm = TokenStreamDataModule(seq_len=16, batch_size=2, seed=0, source="files", path=txt_corpus[0])
        loader = dm.train_dataloader()
        it = iter(loader)
        next(it)
        refs = weakref.ref(dm), weakref.ref(loader)
        del dm, loader, it
        assert all(r() is None for r in refs)
    finally:
        gc.enable()
