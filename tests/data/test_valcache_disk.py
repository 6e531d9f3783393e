"""A validation cache that cannot be written (a full disk, a quota, an unwritable folder) costs the cache, not
the run: the held-out windows are built in memory, one warning names the folder, and nothing of the attempt
is left behind (no partial file, no key file, no lock file, no folder it created)."""

import errno
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from loopnet.data import TokenStreamDataModule, valcache
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


EXPECTED = torch.from_numpy(np.stack(pack_windows(iter(TEXTS[-6:]), 16))).long()  # ceil(0.1 × 60) = 6 held out


def files_under(folder):
    return sorted(os.path.relpath(os.path.join(root, f), folder) for root, _, files in os.walk(folder) for f in files)


@pytest.mark.parametrize("failing", [".json", ".npy"])
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_costs_the_cache_and_leaves_nothing(corpus, tmp_path, monkeypatch, capsys, failing, code):
    real = valcache.atomic_write

    def full_disk(path, write, binary=True):
        def half_then_full(f):  # some bytes reach the disk, then it is full
            f.write(b"\x93NUMPY" if binary else "{")
            raise OSError(code, os.strerror(code))

        return real(path, half_then_full if str(path).endswith(failing) else write, binary)

    monkeypatch.setattr(valcache, "atomic_write", full_disk)
    dm = TokenStreamDataModule(**corpus)
    assert torch.equal(dm.val_windows(), EXPECTED)  # the run goes on, on the same windows
    assert dm.val_cache is None and dm.summary()["val_cache"] is None
    err = capsys.readouterr().err
    assert err.count("loopnet: warning: cannot use the validation cache") == 1
    assert os.strerror(code) in err and str(tmp_path / "cache" / "val") in err
    assert not (tmp_path / "cache").exists(), files_under(tmp_path / "cache")  # nothing left, not even the folders

    monkeypatch.setattr(valcache, "atomic_write", real)  # space again: the next run keeps them
    again = TokenStreamDataModule(**corpus)
    assert torch.equal(again.val_windows(), EXPECTED) and again.val_cache is not None
    assert os.path.isfile(again.val_cache) and os.path.isfile(again.val_cache[:-4] + ".json")


def test_a_full_disk_leaves_an_existing_cache_folder_as_it_was(corpus, tmp_path, monkeypatch, capsys):
    other = tmp_path / "cache" / "val" / "val-other.npy"  # another corpus's windows, kept
    other.parent.mkdir(parents=True)
    other.write_bytes(b"x")

    def full(path, write, binary=True):
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} while writing {path}")

    monkeypatch.setattr(valcache, "atomic_write", full)
    dm = TokenStreamDataModule(**corpus)
    assert torch.equal(dm.val_windows(), EXPECTED) and dm.val_cache is None
    assert files_under(tmp_path / "cache") == ["val/val-other.npy"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_read_only_cache_folder_costs_the_cache(corpus, tmp_path, capsys):
    folder = tmp_path / "cache" / "val"
    folder.mkdir(parents=True)
    folder.chmod(0o555)
    try:
        dm = TokenStreamDataModule(**corpus)
        assert torch.equal(dm.val_windows(), EXPECTED) and dm.val_cache is None
        assert "cannot use the validation cache" in capsys.readouterr().err
        assert files_under(tmp_path / "cache") == []
    finally:
        folder.chmod(0o755)


def test_a_cache_path_that_is_a_file_costs_the_cache_and_leaves_nothing(corpus, tmp_path, capsys):
    (tmp_path / "file").write_text("")
    dm = TokenStreamDataModule(**corpus | {"cache_dir": str(tmp_path / "file" / "deeper")})
    assert torch.equal(dm.val_windows(), EXPECTED) and dm.val_cache is None
    assert "cannot use the validation cache" in capsys.readouterr().err
    assert (tmp_path / "file").read_text() == "" and sorted(os.listdir(tmp_path)) == [
        "0.parquet",
        "1.parquet",
        "2.parquet",
        "file",
    ]


def test_a_build_that_fails_leaves_no_lock_file(tmp_path):
    def broken():
        raise ValueError("the corpus is empty")

    with pytest.raises(ValueError, match="empty"):
        valcache.cached_windows({"k": 1}, broken, tmp_path / "cache")
    assert not (tmp_path / "cache").exists(), files_under(tmp_path / "cache")


def test_a_lock_that_cannot_be_created_costs_the_cache_and_leaves_nothing(corpus, tmp_path, monkeypatch, capsys):
    import filelock

    def refused(self, *args, **kwargs):  # what an unwritable folder answers (the read-only test, as root)
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), self.lock_file)

    monkeypatch.setattr(filelock.FileLock, "acquire", refused)
    dm = TokenStreamDataModule(**corpus)
    assert torch.equal(dm.val_windows(), EXPECTED) and dm.val_cache is None
    assert "cannot use the validation cache" in capsys.readouterr().err
    assert not (tmp_path / "cache").exists(), files_under(tmp_path / "cache")
