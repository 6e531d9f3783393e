"""A run interrupted around a validation and resumed keeps the same record as the
uninterrupted run: every TensorBoard point at its step, the same val_history and best checkpoint."""

import pytest

from .helpers import TINY, SignalAt, SignalInValidation, callbacks, loopnet, record

pytestmark = pytest.mark.slow

ARGS = [*TINY, "--trainer.max_steps", "6", "--trainer.val_check_interval", "3"]  # validations at steps 3 and 6


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("reference")
    res = loopnet("fit", *ARGS, cwd=cwd)
    assert res.code == 0, res.err[-3000:]
    rec = record(cwd)
    assert len(rec["val/loss"]) == 2 and sorted(rec["train/loss"]) == list(range(6))
    return rec


WHEN = {
    "step_before_validation": (SignalAt, {"step": 3}),
    "first_validation_batch": (SignalInValidation, {"step": 3, "batch_idx": 0}),
    "last_validation_batch": (SignalInValidation, {"step": 3, "batch_idx": 1}),
    "sanity_check": (SignalInValidation, {"sanity": True, "batch_idx": 0}),
}


@pytest.mark.parametrize("when", list(WHEN))
def test_resumed_record_equals_the_uninterrupted_one(reference, tmp_path, when):
    res = loopnet("fit", *ARGS, *callbacks(WHEN[when]), cwd=tmp_path)
    assert res.code == 0 and "loopnet: stopped at step" in res.err, res.err[-3000:]
    res = loopnet("fit", *ARGS, "--ckpt_path", "last", cwd=tmp_path)
    assert res.code == 0, res.err[-3000:]
    rec = record(tmp_path)
    assert rec["val/loss"] == reference["val/loss"]
    assert rec["train/loss"] == reference["train/loss"]
    assert rec == reference
