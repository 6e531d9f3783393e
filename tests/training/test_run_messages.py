"""What a first run prints and warns about: the resume hint after the progress bar, a fit that ends before its
first validation, the per-round losses' order."""

from __future__ import annotations

import signal

from tests.reliability.helpers import TINY, SignalAt, callbacks, loopnet


def test_the_resume_hint_starts_its_own_line_after_the_progress_bar(tmp_path):
    """On a terminal the live bar (stdout) leaves its line open when the run stops; the hint (stderr, the
    same terminal) ends that line first, or it is glued onto the bar."""
    res = loopnet(
        "fit",
        *TINY,
        "--trainer.enable_progress_bar",
        "true",
        *callbacks((SignalAt, {"step": 2, "signum": int(signal.SIGTERM)})),
        cwd=tmp_path,
    )
    assert res.code == 0, res.err[-3000:]
    assert "\nloopnet: stopped at step 2, saved " in res.err, res.err[-2000:]


def test_a_fit_that_ends_before_its_first_validation_is_warned_about(capsys):
    from loopnet.training.precheck import precheck

    base = ["fit", *TINY, "--trainer.max_steps", "3"]
    precheck([*base, "--trainer.val_check_interval", "50"])
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert line == (
        "loopnet: warning: --trainer.max_steps 3 < --trainer.val_check_interval 50: the run ends before "
        "its first validation (no val/loss, no best checkpoint); fix: --trainer.val_check_interval 3 "
        "(or fewer) to validate at the end"
    )
    precheck([*base, "--trainer.val_check_interval", "3"])
    precheck([*base, "--trainer.val_check_interval", "50", "--trainer.limit_val_batches", "0"])
    assert "warning" not in capsys.readouterr().err


def _eval_tags(n_rounds: int, eval_rounds) -> list[str]:
    import torch

    from loopnet.training.module import LoopedLM
    from tests.helpers import tiny_config

    lm = LoopedLM(config=tiny_config(n_rounds=n_rounds), eval_rounds=eval_rounds)
    for metric in lm.eval_loss.values():
        metric.update(torch.tensor(2.0))
    tags = []
    lm.log = lambda name, value, **kwargs: tags.append(name)
    lm._log_eval("test")
    return tags


def test_the_per_round_losses_sort_by_round_and_include_the_training_r():
    tags = [t for t in _eval_tags(3, [1, 2, 12]) if "/loss" in t]
    assert tags == ["test/loss", "test/loss_r03", "test/loss_r01", "test/loss_r02", "test/loss_r12"]
    assert sorted(t for t in tags if "_r" in t) == ["test/loss_r01", "test/loss_r02", "test/loss_r03", "test/loss_r12"]
    assert _eval_tags(3, None) == ["test/loss", "test/ppl"]  # without eval_rounds: the one loss, as before
