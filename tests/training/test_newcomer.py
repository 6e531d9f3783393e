"""A newcomer's first hour: what a first run prints and warns about."""

from __future__ import annotations

import signal

from tests.reliability.helpers import TINY, SignalAt, callbacks, loopnet


def test_the_resume_hint_starts_its_own_line_after_the_progress_bar(tmp_path):
    """On a terminal the live bar (stdout) leaves its line open when the run stops; the hint (stderr, the
    same terminal) ends that line first, or it is glued onto the bar."""
    res = loopnet("fit", *TINY, "--trainer.enable_progress_bar", "true",
                  *callbacks((SignalAt, {"step": 2, "signum": int(signal.SIGTERM)})), cwd=tmp_path)
    assert res.code == 0, res.err[-3000:]
    assert "\nloopnet: stopped at step 2, saved " in res.err, res.err[-2000:]
