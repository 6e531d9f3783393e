"""What atomic writes leave behind when the disk fills up or the process is killed."""

import errno
import io

import pytest
import torch

from loopnet import files
from loopnet.checkpoints import AtomicCheckpointIO

from .helpers import TINY, loopnet


class FullDisk(io.RawIOBase):
    """A file on a disk that fills up after `room` bytes."""

    def __init__(self, f, room: int = 3000):
        self.f, self.room = f, room

    def writable(self):
        return True

    def write(self, data):
        if self.room < len(data):
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return self.f.write(data)

    def fileno(self):
        return self.f.fileno()


def test_disk_full_names_enospc_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"step": 1}, path)
    before = path.read_bytes()
    real = files.os.fdopen
    monkeypatch.setattr(files.os, "fdopen", lambda fd, mode: FullDisk(real(fd, mode)))
    with pytest.raises(OSError) as err:  # was torch's RuntimeError "unexpected pos 704 vs 598"
        AtomicCheckpointIO().save_checkpoint({"weights": torch.zeros(10_000)}, path)
    monkeypatch.undo()
    assert err.value.errno == errno.ENOSPC
    assert f"No space left on device while writing {path}" in str(err.value) and "fix: free space" in str(err.value)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_disk_full_during_a_fit_is_one_line(tmp_path, monkeypatch):
    def full(self, checkpoint, path, storage_options=None):
        raise OSError(errno.ENOSPC, f"No space left on device while writing {path}")

    monkeypatch.setattr(AtomicCheckpointIO, "save_checkpoint", full)
    res = loopnet("fit", *TINY, "--trainer.max_steps", "2", "--trainer.val_check_interval", "2", cwd=tmp_path)
    assert res.code == 1 and "Traceback" not in res.err, res.err[-3000:]
    assert res.last_err_line.startswith("loopnet: error: [Errno 28] No space left on device while writing "), res.err


def test_fit_removes_temporaries_left_by_a_kill(tmp_path):
    """`kill -9` during a checkpoint write leaves `.last.ckpt.<random>.tmp`; the next fit there removes it."""
    folder = tmp_path / "ckpts"
    folder.mkdir()
    stale = [folder / ".last.ckpt.a1b2_c3d.tmp", folder / ".best-step000002.ckpt.zz9y8x7w.tmp"]
    for p in stale:
        p.write_bytes(b"half a checkpoint")
    (folder / ".keep.tmp").write_text("not ours")
    with pytest.warns(UserWarning, match="Checkpoint directory .* exists and is not empty"):  # .keep.tmp stays there
        res = loopnet("fit", *TINY, "--trainer.max_steps", "1", "--checkpoint.dirpath", str(folder), cwd=tmp_path)
    assert res.code == 0, res.err[-3000:]
    assert not any(p.exists() for p in stale) and (folder / ".keep.tmp").exists()
