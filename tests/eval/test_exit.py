"""`loopnet eval` with adaptive exit: the table at the extreme thresholds and the mean rounds per task."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("lm_eval", reason="the eval extra (lm-eval) is not installed")

from loopnet.eval.adapter import LoopnetLM
from tests.eval.helpers import DATA_DIR, TASK
from tests.eval.test_cli import run_cli


@pytest.mark.parametrize("threshold,rounds_used", [("0", 2.0), ("inf", 1.0)])
def test_exit_thresholds_score_as_full_depth_or_one_round(
    tiny_ckpt, reference_scores, in_data_dir, tmp_path, capsys, threshold, rounds_used
):
    """KL below 0 never holds: every scored token runs R' = 2 rounds, as without exit; below ∞ always
    holds: one round, the scores of R' = 1."""
    code, out, err = run_cli(
        capsys,
        "--ckpt_path",
        tiny_ckpt,
        "--tasks",
        TASK,
        "--rounds",
        "2",
        "--exit",
        "kl",
        "--exit_threshold",
        threshold,
        "--include_path",
        str(DATA_DIR),
        "--output_dir",
        str(tmp_path),
    )
    assert code == 0, err
    report = json.loads(next(Path(tmp_path).glob("eval_*.json")).read_text())
    expected = reference_scores(int(rounds_used))
    assert report["table"][TASK]["acc"]["2"]["value"] == pytest.approx(expected["acc"])
    assert report["mean_rounds"] == {"2": {TASK: rounds_used}}
    assert report["exit"] == "kl"
    assert f"| {TASK} | mean rounds per token | {rounds_used:.3f} |" in out


def test_generation_records_rounds_per_task(tiny_model):
    from lm_eval.api.instance import Instance

    lm = LoopnetLM(model=tiny_model, rounds=3, exit="argmax", exit_threshold=0, batch_size=2)
    requests = [
        Instance(
            request_type="generate_until",
            doc={},
            arguments=(text, {"until": ["\n\n"], "max_gen_toks": 5}),
            idx=0,
            metadata=("gen_task", i, 1),
        )
        for i, text in enumerate(["Question: a", "Question: bb"])
    ]
    texts = lm.generate_until(requests, disable_tqdm=True)
    assert len(texts) == 2
    assert lm.mean_rounds_by_task() == {"gen_task": 1.0}  # argmax with n = 0 stops every token after round 1
    with pytest.raises(ValueError, match="is not a criterion"):
        LoopnetLM(model=tiny_model, exit="cosine")
