"""lm-eval's own `hf` model on an exported folder scores the task as `loopnet eval` scores the checkpoint.

Both run the harness's loglikelihood requests through the same model code (the exported file is loopnet's model
inlined) on the same fp32 weights, tokenised by the same BPE (the exported tokenizer.json is GPT-2's, as
tiktoken's), normalised over the same 50257 real ids (the exported model's logits stop there, as the adapter's),
batched and right-padded alike (both use the harness's Collator at the same batch size). So each log-likelihood
is the same sum of the same fp32 terms: equal up to the order the two sides sum a continuation's few token
log-probabilities, a few ulps of a sum of magnitude < 100, far below 1e-4 (~800 ulps at 100)."""

from __future__ import annotations

import pytest

pytest.importorskip("lm_eval", reason="the eval extra (lm-eval) is not installed")

import lm_eval

from loopnet.eval.adapter import LoopnetLM
from loopnet.formats import hf
from tests.eval.helpers import TASK


def test_the_hf_model_on_the_export_gives_loopnet_evals_numbers(tiny_ckpt, tmp_path, in_data_dir, task_manager):
    out = hf.export(tiny_ckpt, tmp_path / "exported")
    ours = lm_eval.simple_evaluate(
        model=LoopnetLM(ckpt_path=tiny_ckpt, batch_size=16), tasks=[TASK], task_manager=task_manager, log_samples=True
    )
    theirs = lm_eval.simple_evaluate(
        model="hf",
        model_args={"pretrained": str(out), "trust_remote_code": True, "device": "cpu", "dtype": "float32"},
        batch_size=16,
        tasks=[TASK],
        task_manager=task_manager,
        log_samples=True,
    )

    def lls(run):
        return [[ll for ll, _ in s["filtered_resps"]] for s in sorted(run["samples"][TASK], key=lambda s: s["doc_id"])]

    for got, expected in zip(lls(theirs), lls(ours), strict=True):
        assert got == pytest.approx(expected, rel=0, abs=1e-4)
    for metric in ("acc,none", "acc_norm,none"):
        assert theirs["results"][TASK][metric] == ours["results"][TASK][metric]
    assert ours["results"][TASK]["acc,none"] > 0  # a trained model, not a vacuous comparison
