"""`loopnet eval` of an imported model's folder: its own weights and its own tokenizer (tokenizer.json)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("lm_eval", reason="the eval extra (lm-eval) is not installed")

from loopnet.eval.cli import main
from loopnet.formats.folder import load_model
from loopnet.formats.hf import write_model
from loopnet.formats.huginn import read_huginn
from loopnet.formats.tokenizer import HFTokenizer
from tests.eval.helpers import DATA_DIR, TASK, load_docs

HUGINN = Path(__file__).parents[1] / "fixtures" / "huginn"


@torch.no_grad()
def direct_acc(model, tok: HFTokenizer, rounds: int) -> float:
    """Accuracy on the task from one forward pass per choice, tokenised as the harness does for causal models
    (the continuation's tokens: those of context + continuation after the context's), with Huginn's tokenizer."""
    right = 0
    for doc in load_docs():
        context = f"Question: {doc['question']}\nAnswer:"
        scores = []
        for choice in doc["choices"]:
            ctx, whole = tok.encode(context), tok.encode(context + " " + choice)
            inputs, cont = whole[:-1], whole[len(ctx) :]
            logp = F.log_softmax(model(torch.tensor([inputs]), rounds=rounds)[0][0].float(), -1)
            scores.append(float(logp[len(inputs) - len(cont) :].gather(1, torch.tensor(cont)[:, None]).sum()))
        right += max(range(len(scores)), key=scores.__getitem__) == doc["answer"]
    return right / len(load_docs())


def test_eval_reads_an_imported_folder_with_its_tokenizer(in_data_dir, tmp_path, capsys):
    cfg, state, _ = read_huginn(HUGINN)
    folder = write_model(
        tmp_path / "huginn",
        dataclasses.replace(cfg, state_init="zero"),
        state,
        {},
        tokenizer_dir=HUGINN,
    )  # the zero state: every pass deterministic
    try:
        main(
            [
                "--ckpt_path",
                str(folder),
                "--tasks",
                TASK,
                "--rounds",
                "1,4",
                "--include_path",
                str(DATA_DIR),
                "--output_dir",
                str(tmp_path),
            ]
        )
    except SystemExit as exit_:
        assert exit_.code == 0, capsys.readouterr().err
    report = json.loads((tmp_path / "eval_huginn.json").read_text())
    model, tok = load_model(folder), HFTokenizer(folder)
    for rounds in (1, 4):
        assert report["table"][TASK]["acc"][str(rounds)]["value"] == pytest.approx(direct_acc(model, tok, rounds))
