"""Lightning's `limit_*_batches` (and `overfit_batches`) read an int as a count of batches and a float as a
fraction, so `1` (one batch) and `1.0` (all of them) differ: the real parser keeps the type the user gave."""

import contextlib
import io
from pathlib import Path

import pytest

from loopnet.training.dry_run import parse_fit
from loopnet.training.cli import main

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ["--config", str(ROOT / "configs/deeploop_r6.yaml"), "--config", str(ROOT / "configs/cpu.yaml")]
OPTIONS = ["limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches", "overfit_batches"]


@pytest.mark.parametrize("given,expected", [("1", 1), ("1.0", 1.0), ("0.25", 0.25), ("3", 3)])
def test_the_parser_keeps_an_int_a_count_and_a_float_a_fraction(given, expected):
    trainer = parse_fit([*CONFIGS, *(a for option in OPTIONS for a in (f"--trainer.{option}", given))]).trainer
    for option in OPTIONS:
        assert trainer[option] == expected and type(trainer[option]) is type(expected), (option, trainer[option])


def test_print_config_shows_the_count(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr("sys.argv", ["loopnet"])
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(
            [
                "fit",
                *CONFIGS,
                "--trainer.limit_val_batches",
                "1",
                "--trainer.limit_test_batches",
                "1.0",
                "--print_config",
            ]
        )
    assert "  limit_val_batches: 1\n" in out.getvalue() and "  limit_test_batches: 1.0\n" in out.getvalue()
