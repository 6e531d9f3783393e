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


def test_a_fit_that_ends_before_its_first_validation_is_warned_about(capsys):
    from loopnet.training.precheck import precheck

    base = ["fit", *TINY, "--trainer.max_steps", "3"]
    precheck([*base, "--trainer.val_check_interval", "50"])
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert line == ("loopnet: warning: --trainer.max_steps 3 < --trainer.val_check_interval 50: the run ends before "
                    "its first validation (no val/loss, no best checkpoint); fix: --trainer.val_check_interval 3 "
                    "(or fewer) to validate at the end")
    precheck([*base, "--trainer.val_check_interval", "3"])
    precheck([*base, "--trainer.val_check_interval", "50", "--trainer.limit_val_batches", "0"])
    assert "warning" not in capsys.readouterr().err
