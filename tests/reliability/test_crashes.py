"""What crashed with a raw error now works or ends in one line that names the problem and the
fix: `loopnet predict` on a model trained on a compact vocabulary, a non-UTF-8 corpus read into a
compact vocabulary, and a DDP rank killed with SIGKILL (rank 0 ended in a multi-line gloo traceback)."""

import os
import signal

import pytest

from .helpers import RUN, SHORT, TINY, Progress, callbacks, finish, loopnet, spawn, wait_for, TWO_CPU_RANKS

pytestmark = pytest.mark.slow

COMPACT = ["--data.vocab", "compact", "--model.config.vocab_size", "19136"]  # the corpus's 19,083 ids


@pytest.mark.slow
def test_predict_with_a_compact_vocabulary(tmp_path):
    """It fed GPT-2's ids of the prompt to a 19,136-row embedding: IndexError from wte."""
    res = loopnet("fit", *SHORT, *COMPACT, cwd=tmp_path)
    assert res.code == 0, res.err[-3000:]
    res = loopnet(
        "predict",
        *SHORT,
        *COMPACT,
        "--ckpt_path",
        "last",
        "--model.generate.max_new_tokens",
        "5",
        "--model.generate.prompt",
        "ROMEO: What say you",
        cwd=tmp_path,
    )
    assert res.code == 0, res.err[-3000:]
    [text] = res.out.strip().splitlines()
    assert text.startswith("ROMEO: What say you") and len(text) > len("ROMEO: What say you")  # ids mapped both ways
    assert (
        tmp_path / "runs" / f"{RUN}_v19136" / "version_0" / "predict" / "predictions.txt"
    ).read_text().strip() == text

    # Another corpus would rebuild other ids: refused, naming what differs and what to give.
    (tmp_path / "other.txt").write_text("To be or not to be, that is the question.\n\n" * 200)
    res = loopnet(
        "predict",
        *SHORT,
        *COMPACT,
        "--data.source",
        "files",
        "--data.path",
        "other.txt",
        "--ckpt_path",
        "last",
        cwd=tmp_path,
    )
    assert res.code == 2 and "was trained on a compact vocabulary" in res.last_err_line, res.err[-3000:]
    assert "source: checkpoint 'shakespeare' vs config 'files'" in res.last_err_line
    assert "fix: give the data settings it was trained with" in res.last_err_line


def test_non_utf8_corpus_with_a_compact_vocabulary(tmp_path):
    """It ended in a bare codec error naming neither the file nor the fix."""
    (tmp_path / "latin.txt").write_bytes("Ça va très bien, Hélène. ".encode("latin-1") * 50)
    res = loopnet("fit", *SHORT, *COMPACT, "--data.source", "files", "--data.path", "latin.txt", cwd=tmp_path)
    assert res.code == 2 and "Traceback" not in res.err, res.err[-3000:]
    line = res.last_err_line
    assert line.startswith("loopnet: error: latin.txt is not valid UTF-8 (byte 0xc7 at offset 0)"), line
    assert "Fix: re-encode it as UTF-8" in line
    assert not (tmp_path / "runs").exists()


def _children(pid: int) -> list[int]:
    from pathlib import Path

    return [int(c) for t in Path(f"/proc/{pid}/task").iterdir() for c in (t / "children").read_text().split()]


@pytest.mark.slow
def test_ddp_rank_killed_ends_rank_0_in_one_line(tmp_path):
    progress = tmp_path / "progress"
    proc = spawn(
        "fit",
        *TINY,
        "--trainer.max_steps",
        "1000",
        "--data.batch_size",
        "2",
        *TWO_CPU_RANKS,
        *callbacks((Progress, {"path": str(progress), "delay": 0.2})),
        cwd=tmp_path,
        new_session=True,
        fresh=True,  # as a user's rank 0: forked, Lightning's rank watcher once printed after loopnet's last line
    )
    try:
        wait_for(lambda: progress.exists() and int(progress.read_text() or 0) >= 2, proc, "step 2")
        (rank1,) = _children(proc.pid)
        os.kill(rank1, signal.SIGKILL)
        res = finish(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert res.code == 1, res.err[-4000:]
    assert "Traceback" not in res.err, res.err[-4000:]
    line = res.last_err_line
    # Whichever sees the death first says it: rank 0's failed collective ("... ended, and rank 0 lost its
    # connection ...") or Lightning's watch over the ranks it started ("... ended at step N; every process ...").
    assert line.startswith("loopnet: error: rank 1 (killed by SIGKILL) of this DDP run ended"), res.err[-4000:]
    assert "fix:" in line and "--ckpt_path last" in line
