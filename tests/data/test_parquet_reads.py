"""Parquet reads that fail: a damaged row group behind an intact footer fails in one line naming the file and
the row group; a transient failure (connection, rate limit) is retried with exponential backoff and jitter,
then fails in one line naming the file."""

import errno
import io
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from loopnet.data import DataConfigError
from loopnet.data import parquet
from loopnet.data.parquet import ParquetCorpus
from loopnet.data.stream import ResumableLoader, TrainStream

from .conftest import make_docs

TEXTS = make_docs(60, words=30)


def write(folder, n_files=2, rows=10, group=5):
    """`n_files` files of `rows` documents in row groups of `group`: their paths."""
    paths = []
    for k in range(n_files):
        path = folder / f"{k}.parquet"
        pq.write_table(pa.table({"text": TEXTS[k * rows : (k + 1) * rows]}), path, row_group_size=group)
        paths.append(str(path))
    return paths


def damage(path, group):
    """Zero the column chunk of row group `group` (its pages), leaving the footer as it was."""
    chunk = pq.ParquetFile(path).metadata.row_group(group).column(0)
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    data = bytearray(open(path, "rb").read())
    data[start : start + chunk.total_compressed_size] = bytes(chunk.total_compressed_size)
    open(path, "wb").write(bytes(data))


@pytest.fixture
def sleeps(monkeypatch):
    """time.sleep of the retries, recorded instead of slept."""
    slept = []
    monkeypatch.setattr(parquet.time, "sleep", slept.append)
    return slept


def test_a_damaged_row_group_fails_in_one_line_naming_the_file_and_the_group(tmp_path, sleeps):
    paths = write(tmp_path)
    damage(paths[1], 1)
    corpus = ParquetCorpus(paths, "text")  # the footer is intact: the start-up reads pass
    assert corpus.n_docs == 20
    assert [corpus.read_group(g) for g in range(3)] == [TEXTS[0:5], TEXTS[5:10], TEXTS[10:15]]
    with pytest.raises(DataConfigError) as info:
        corpus.read_group(3)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"Row group 1 of {paths[1]} (its rows 5-9) cannot be read")
    assert "fix: replace the file" in msg
    assert sleeps == []  # damaged data is not retried


def test_a_damaged_row_group_read_by_a_loader_worker_is_one_line(tmp_path):
    paths = write(tmp_path, n_files=1, rows=20)
    damage(paths[0], 2)
    corpus = ParquetCorpus(paths, "text")
    stream = TrainStream(
        corpus,
        text_column="text",
        seq_len=8,
        batch_size=2,
        seed=0,
        val=None,
        shuffle_buffer=4,
        num_slots=1,
        train_rows=20,
    )
    loader = ResumableLoader(stream, num_workers=1)
    with pytest.raises(DataConfigError) as info:
        for _ in loader:
            pass
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"Row group 2 of {paths[0]} (its rows 10-14) cannot be read"), msg


@pytest.mark.slow
def test_a_fit_on_a_damaged_row_group_ends_in_one_line(tmp_path):
    from tests.reliability.helpers import TINY, loopnet

    folder = tmp_path / "corpus"
    folder.mkdir()
    paths = []
    for k in range(2):  # 60 documents of ~100 tokens: the damaged group is read within the first epoch
        path = folder / f"{k}.parquet"
        pq.write_table(pa.table({"text": make_docs(30, words=30, tag=f"f{k}d")}), path, row_group_size=10)
        paths.append(path)
    damage(str(paths[1]), 0)
    res = loopnet(
        "fit",
        *TINY,
        "--data.source",
        "files",
        "--data.path",
        str(folder / "*.parquet"),
        "--data.shuffle_buffer",
        "1",
        "--trainer.max_steps",
        "200",
        "--trainer.val_check_interval",
        "100",
        cwd=tmp_path,
    )
    assert res.code == 2, res.err[-3000:]
    assert res.last_err_line.startswith(f"loopnet: error: Row group 0 of {paths[1]} (its rows 0-9) cannot be read")
    assert "Traceback" not in res.err


class FlakyFS:
    """An fsspec-like filesystem over local files whose reads fail `failures` times with `error`, then work."""

    def __init__(self, error):
        self.error, self.failures, self.opened = error, 0, 0

    def open(self, path, mode="rb"):
        self.opened += 1
        fs = self

        class File(io.FileIO):
            def readinto(self, buffer):
                if fs.failures > 0:
                    fs.failures -= 1
                    raise fs.error
                return super().readinto(buffer)

            def read(self, size=-1):
                if fs.failures > 0:
                    fs.failures -= 1
                    raise fs.error
                return super().read(size)

        return File(path, mode)


def http_error(status):
    """huggingface_hub's error for an HTTP `status`, on a response of the HTTP client it uses."""
    import importlib

    from huggingface_hub.errors import HfHubHTTPError

    client = importlib.import_module(HfHubHTTPError.__mro__[1].__module__.split(".")[0])
    response = client.Response(status, request=client.Request("GET", "https://huggingface.co/datasets/x"))
    return HfHubHTTPError(f"{status} Client Error", response=response)


@pytest.mark.parametrize(
    "error",
    [
        ConnectionError("reset by peer"),
        TimeoutError("read timed out"),
        OSError(errno.ECONNRESET, "Connection reset"),
        http_error(429),
        http_error(503),
    ],
)
def test_transient_failures_are_retried_with_backoff_then_read(tmp_path, sleeps, error):
    paths = write(tmp_path)
    fs = FlakyFS(error)
    corpus = ParquetCorpus(paths, "text", fs=fs, identity="test")
    opened = fs.opened
    fs.failures = 3
    assert corpus.read_group(3) == TEXTS[15:20]
    assert fs.failures == 0 and fs.opened == opened + 4  # reopened after each failure
    assert len(sleeps) == 3
    for k, slept in enumerate(sleeps):  # BACKOFF_S × 2^k, capped, times a jitter in [0.5, 1]
        full = min(parquet.BACKOFF_CAP_S, parquet.BACKOFF_S * 2**k)
        assert 0.5 * full <= slept <= full


def test_a_read_that_keeps_failing_ends_in_one_line_naming_the_file(tmp_path, sleeps):
    paths = write(tmp_path)
    fs = FlakyFS(http_error(429))
    corpus = ParquetCorpus(paths, "text", fs=fs, identity="test")
    fs.failures = 10**6
    with pytest.raises(DataConfigError) as info:
        corpus.read_group(2)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"Cannot read row group 0 of {paths[1]}: {parquet.RETRIES + 1} attempts")
    assert "HfHubHTTPError: 429 Client Error" in msg and "--ckpt_path last" in msg
    assert len(sleeps) == parquet.RETRIES
    caps = [min(parquet.BACKOFF_CAP_S, parquet.BACKOFF_S * 2**k) for k in range(parquet.RETRIES)]
    assert all(0.5 * c <= s <= c for s, c in zip(sleeps, caps))


def test_a_footer_read_that_keeps_failing_ends_in_one_line(tmp_path, sleeps):
    paths = write(tmp_path)
    fs = FlakyFS(ConnectionError("reset"))
    fs.failures = 10**6
    with pytest.raises(DataConfigError, match=rf"^Cannot read the footer of {paths[0]}: 7 attempts"):
        ParquetCorpus(paths[:1], "text", fs=fs, identity="test")
    assert len(sleeps) == parquet.RETRIES


@pytest.mark.parametrize(
    "error",
    [
        http_error(404),
        http_error(403),
        OSError("Couldn't deserialize thrift"),
        OSError(errno.ENOENT, "No such file"),
        ValueError("bad"),
    ],
)
def test_what_is_not_transient_is_not_retried(error):
    assert not parquet.transient(error)


def test_a_local_read_that_keeps_failing_names_the_disk(tmp_path, sleeps, monkeypatch):
    paths = write(tmp_path)
    corpus = ParquetCorpus(paths, "text")

    def failing(f):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(corpus, "_parquet_file", failing)
    with pytest.raises(
        DataConfigError,
        match=rf"^Cannot read row group 1 of {paths[0]}: 7 attempts .*\(OSError: "
        rf"\[Errno 5\] .*fix: check the disk or the network filesystem",
    ):
        corpus.read_group(1)
    assert len(sleeps) == parquet.RETRIES
