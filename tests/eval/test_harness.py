"""The harness runs offline through the adapter on a tiny task defined on local JSON lines."""

from __future__ import annotations

import pytest

pytest.importorskip("lm_eval", reason="the eval extra (lm-eval) is not installed")

import lm_eval

from loopnet.eval.adapter import LoopnetLM
from tests.eval.helpers import TASK


@pytest.mark.parametrize("rounds", [1, 2])
def test_accuracy_equals_argmax_of_direct_loglikelihoods(
    tiny_ckpt, reference_scores, in_data_dir, task_manager, rounds
):
    lm = LoopnetLM(ckpt_path=tiny_ckpt, rounds=rounds, batch_size=16)
    out = lm_eval.simple_evaluate(model=lm, tasks=[TASK], task_manager=task_manager, log_samples=True)
    reference = reference_scores(rounds)

    samples = sorted(out["samples"][TASK], key=lambda s: s["doc_id"])
    harness_lls = [[ll for ll, _ in s["filtered_resps"]] for s in samples]
    for got, expected in zip(harness_lls, reference["lls"], strict=True):
        assert got == pytest.approx(expected, abs=1e-4)

    result = out["results"][TASK]
    assert result["acc,none"] == pytest.approx(reference["acc"])
    assert result["acc_norm,none"] == pytest.approx(reference["acc_norm"])
    assert out["config"]["rounds"] == rounds
