"""A full disk (or quota) under TensorBoard's event file: the fit ends in one line naming the file and the fix
(not the writer thread's traceback and a bare `[Errno 28]`), and its summary.json says "failed" and why."""

import errno
import json
import os

import pytest

from loopnet.diagnostics import summary as run_summary
from loopnet.diagnostics.summary import read_summary

from .helpers import RUN, TINY, loopnet


@pytest.fixture
def full_after(monkeypatch):
    """full_after(n): TensorBoard's record writer (its writer thread) fails with ENOSPC from its n+1-th record."""
    from tensorboard.summary.writer import record_writer

    real = record_writer.RecordWriter.write

    def arm(n, code=errno.ENOSPC):
        count = [0]

        def write(self, data):
            count[0] += 1
            if count[0] > n:
                raise OSError(code, os.strerror(code))
            return real(self, data)

        monkeypatch.setattr(record_writer.RecordWriter, "write", write)

    return arm


@pytest.mark.slow
@pytest.mark.parametrize("records,code", [(0, errno.ENOSPC), (30, errno.ENOSPC), (30, errno.EDQUOT)])
def test_a_full_disk_under_the_event_file_ends_in_one_line_with_a_failed_summary(tmp_path, full_after, records, code):
    full_after(records, code)  # 0: the file's first record, at start; 30: some steps in
    res = loopnet("fit", *TINY, cwd=tmp_path)
    assert res.code == 1, res.err[-3000:]
    assert "Traceback" not in res.err and "Exception in thread" not in res.err
    folder = tmp_path / "runs" / RUN / "version_0"
    line = f"loopnet: error: [Errno {code}] {os.strerror(code)} while writing {folder}/events.out.tfevents."
    assert res.last_err_line.startswith(line) and "; fix: free space there" in res.last_err_line, res.err[-3000:]
    if records == 0:  # a failed start: its run folder is removed, as for any fit that fails before its first step
        assert not folder.exists() and "removed the run folder it had created" in res.err
        return
    event_file = res.last_err_line[res.last_err_line.index(str(folder)) :].split(";")[0]
    assert os.path.isfile(event_file)
    summary = read_summary(folder)
    assert summary["status"] == "failed" and summary["reason"] == res.last_err_line[len("loopnet: error: ") :]
    assert summary["error"].startswith(f"OSError({code}, ")


def test_a_disk_full_error_with_its_file_keeps_its_line():
    named = OSError(errno.ENOSPC, "No space left on device while writing /r/last.ckpt (nothing was replaced); fix: x")
    record = run_summary.RunSummary()
    assert record.record_failure(named) == "failed" and record.reason == str(named)
    assert str(named) == "[Errno 28] No space left on device while writing /r/last.ckpt (nothing was replaced); fix: x"
    opened = OSError(errno.EDQUOT, os.strerror(errno.EDQUOT), "/r/file")
    assert (
        run_summary.name_disk_full(opened)
        and str(opened) == f"[Errno {errno.EDQUOT}] {os.strerror(errno.EDQUOT)}: '/r/file'"
    )


def test_other_errors_stay_interrupted():
    record = run_summary.RunSummary()
    assert record.record_failure(RuntimeError("CUDA out of memory")) == "interrupted" and record.reason is None
    assert record.record_failure(OSError(errno.EIO, "I/O error")) == "interrupted" and record.reason is None
    assert record.record_failure(KeyboardInterrupt()) == "interrupted"


def test_a_failed_summary_reads_back(tmp_path):
    from loopnet.diagnostics.summary import write_summary

    write_summary(tmp_path / "summary.json", {"status": "failed", "reason": "disk full"})
    assert read_summary(tmp_path)["status"] == "failed"
    assert json.loads((tmp_path / "summary.json").read_text())["schema"] == 1


def test_a_disk_full_error_without_a_file_is_named_by_the_file_being_written(tmp_path):
    path = tmp_path / "hparams.yaml"
    try:
        with open(path, "w") as f:
            f.write("a: 1\n")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # what a failed flush or close raises
    except OSError as err:
        error = err
    record = run_summary.RunSummary()
    assert record.record_failure(error) == "failed"
    assert str(error).startswith(f"[Errno {errno.ENOSPC}] {os.strerror(errno.ENOSPC)} while writing {path}; fix: ")
    assert record.reason == str(error) and "\n" not in record.reason
