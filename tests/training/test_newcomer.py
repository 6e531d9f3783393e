"""A newcomer's first hour: what a first run prints and warns about."""

from __future__ import annotations

import signal

from tests.reliability.helpers import TINY, SignalAt, callbacks, loopnet


def test_the_resume_hint_starts_its_own_line_after_the_progress_bar(tmp_path):
    res = loopnet("fit", *TINY, "--trainer.enable_progress_bar", "true",
                  *callbacks((SignalAt, {"step": 2, "signum": int(signal.SIGTERM)})), cwd=tmp_path)
    assert res.code == 0, res.err[-3000:]
    hint = [line for line in res.err.splitlines() if "resume with the same command and --ckpt_path last" in line]
    assert len(hint) == 1 and hint[0].startswith("loopnet: stopped at step 2"), res.err[-2000:]
