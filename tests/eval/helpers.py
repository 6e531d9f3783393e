"""Reference computations straight from the model's logits, independent of the adapter."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from loopnet.data import gpt2_encoding
from loopnet.data.token_ids import N_VOCAB as GPT2_VOCAB

DATA_DIR = Path(__file__).parent / "data"
TASK = "loopnet_tiny_mc"
TASK_FILE = DATA_DIR / "tiny_mc.jsonl"


def load_docs() -> list[dict]:
    return [json.loads(line) for line in TASK_FILE.read_text().splitlines()]


@torch.no_grad()
def token_logprobs(model, inputs: list[int], rounds: int) -> torch.Tensor:
    """log P(next token | prefix) at every position of one unpadded sequence, over GPT-2's real ids."""
    logits, _ = model(torch.tensor([inputs]), rounds=rounds)
    return F.log_softmax(logits[0, :, :GPT2_VOCAB].float(), dim=-1)


def direct_loglikelihood(model, context: str, continuation: str, rounds: int) -> float:
    """Sum of log P(continuation token | everything before it), from one forward pass.

    Tokenised as the harness does for causal models: the continuation's tokens are those of
    context + continuation after the context's; the input keeps the last seq_len tokens.
    """
    enc = gpt2_encoding()
    ctx = enc.encode(context) if context else [enc.eot_token]
    whole = enc.encode(context + continuation) if context else ctx + enc.encode(continuation)
    cont = whole[len(ctx) :]
    inputs = whole[-(model.config.seq_len + 1) :][:-1]
    logprobs = token_logprobs(model, inputs, rounds)
    n = len(cont)
    picked = logprobs[len(inputs) - n :].gather(1, torch.tensor(cont).unsqueeze(1))
    return float(picked.sum())


def direct_task_scores(model, rounds: int) -> dict:
    """Per-document log-likelihoods of every choice and the acc / acc_norm they imply (argmax)."""
    lls, acc, acc_norm = [], [], []
    for doc in load_docs():
        context = f"Question: {doc['question']}\nAnswer:"
        scores = [direct_loglikelihood(model, context, " " + choice, rounds) for choice in doc["choices"]]
        normed = [s / len(choice) for s, choice in zip(scores, doc["choices"])]
        lls.append(scores)
        acc.append(float(max(range(len(scores)), key=scores.__getitem__) == doc["answer"]))
        acc_norm.append(float(max(range(len(normed)), key=normed.__getitem__) == doc["answer"]))
    return {"lls": lls, "acc": sum(acc) / len(acc), "acc_norm": sum(acc_norm) / len(acc_norm)}
