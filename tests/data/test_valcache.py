"""The held-out windows of a parquet corpus: a fixed document range, read and tokenized once, kept on disk
keyed by what they depend on, built by one process while the others wait, shared by the ranks."""

import multiprocessing as mp

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import loopnet.data.datamodule as datamodule
from loopnet.data import TokenStreamDataModule
from loopnet.data.stream import pack_windows

from .conftest import make_docs

TEXTS = make_docs(60, words=30)


@pytest.fixture
def corpus(tmp_path):
    for k in range(3):
        pq.write_table(pa.table({"text": TEXTS[k * 20 : (k + 1) * 20]}), tmp_path / f"{k}.parquet", row_group_size=6)
    return dict(
        seq_len=16,
        batch_size=2,
        seed=0,
        source="files",
        path=str(tmp_path / "*.parquet"),
        val_fraction=0.1,
        cache_dir=str(tmp_path / "cache"),
    )


@pytest.fixture
def builds(monkeypatch):
    calls = []

    def counting(*args, **kw):
        calls.append(1)
        return pack_windows(*args, **kw)

    monkeypatch.setattr(datamodule, "pack_windows", counting)
    return calls


def test_the_split_is_the_last_documents_built_once_and_cached(corpus, builds):
    a = TokenStreamDataModule(**corpus).val_windows()
    expected = torch.from_numpy(np.stack(pack_windows(iter(TEXTS[-6:]), 16))).long()  # ceil(0.1 × 60) = 6
    assert torch.equal(a, expected) and builds == [1]
    dm = TokenStreamDataModule(**corpus)
    assert torch.equal(dm.val_windows(), a) and builds == [1]  # read from disk, not rebuilt
    assert dm.val_cache and dm.val_cache.endswith(".npy") and dm.summary()["val_cache"] == dm.val_cache
    for change in ({"seq_len": 8}, {"val_fraction": 0.2}, {"val_max_tokens": 20}):
        TokenStreamDataModule(**corpus | change).val_windows()  # another key: built anew
    assert len(builds) == 4


def test_ranks_share_the_windows_in_equal_parts(corpus):
    whole = TokenStreamDataModule(**corpus).val_windows()
    parts = [TokenStreamDataModule(**corpus).val_windows(r, 2) for r in range(2)]
    assert len(parts[0]) == len(parts[1]) == len(whole) // 2
    assert torch.equal(torch.stack(parts, 1).flatten(0, 1), whole[: 2 * len(parts[0])])


def _build(kw, out, q):
    import loopnet.data.datamodule as dm_module

    inner = dm_module.pack_windows

    def marking(*args, **k):
        with open(out, "a") as f:
            f.write("built\n")
        return inner(*args, **k)

    dm_module.pack_windows = marking
    q.put(TokenStreamDataModule(**kw).val_windows().numpy())


def test_concurrent_ranks_build_it_once(corpus, tmp_path):
    ctx, out = mp.get_context("fork"), tmp_path / "builds.txt"
    q = ctx.Queue()
    procs = [ctx.Process(target=_build, args=(corpus, str(out), q)) for _ in range(3)]
    for p in procs:
        p.start()
    got = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert out.read_text() == "built\n"  # one process built it; the others waited on the lock and read it
    assert all(np.array_equal(g, got[0]) for g in got) and len(got[0]) > 0


def test_unwritable_cache_costs_the_cache_not_the_run(corpus, tmp_path, capsys):
    (tmp_path / "file").write_text("")
    dm = TokenStreamDataModule(**corpus | {"cache_dir": str(tmp_path / "file")})
    assert len(dm.val_windows()) > 0 and dm.val_cache is None
    assert "cannot use the validation cache" in capsys.readouterr().err
