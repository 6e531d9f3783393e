"""Fixtures for the loopnet.eval tests: a tiny trained checkpoint and the local multiple-choice task."""

from __future__ import annotations

import json

import lightning as L
import pytest
import torch

from loopnet.data import gpt2_encoding
from tests.helpers import tiny_config
from loopnet.training.module import LoopedLM
from tests.eval.helpers import DATA_DIR, TASK_FILE, direct_task_scores


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory) -> str:
    """A LoopedLM checkpoint (K=1, R=2, d=32) trained for a few steps through the Lightning Trainer.

    It sees the correct answers of the first half of the test items only, so it is far from
    random (R' matters) yet not perfect on the task.
    """
    docs = [json.loads(line) for line in TASK_FILE.read_text().splitlines()]
    text = "".join(f"Question: {d['question']}\nAnswer: {d['choices'][d['answer']]}\n\n" for d in docs[:4])
    ids = torch.tensor(gpt2_encoding().encode_ordinary(text) * 4)
    T = 32  # shorter than seq_len: cheaper steps, same model
    n = (len(ids) - 1) // T
    inputs, targets = ids[: n * T].view(n, T), ids[1 : n * T + 1].view(n, T)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(inputs, targets), batch_size=2, shuffle=True)

    torch.manual_seed(0)
    module = LoopedLM(
        config=tiny_config(vocab_size=50304, seq_len=64, n_heads=2, n_blocks=1, n_rounds=2),
        optim={"lr": 1e-2, "warmup_steps": 1},
    )
    trainer = L.Trainer(
        max_steps=12,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
    )
    trainer.fit(module, loader)
    path = tmp_path_factory.mktemp("ckpt") / "tiny.ckpt"
    trainer.save_checkpoint(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_model(tiny_ckpt):
    """The checkpoint's network, loaded through Lightning (independently of the adapter's loader)."""
    module = LoopedLM.load_from_checkpoint(tiny_ckpt, map_location="cpu", weights_only=True)
    return module.model.eval()


@pytest.fixture(scope="session")
def reference_scores(tiny_model):
    """direct_task_scores(tiny_model, R'), computed once per R'."""
    cache: dict[int, dict] = {}

    def scores(rounds: int) -> dict:
        if rounds not in cache:
            cache[rounds] = direct_task_scores(tiny_model, rounds)
        return cache[rounds]

    return scores


@pytest.fixture
def in_data_dir(monkeypatch):
    """Run from tests/eval/data, where the task YAML's relative data_files points."""
    monkeypatch.chdir(DATA_DIR)
    return DATA_DIR


@pytest.fixture(scope="session")
def task_manager():
    """A TaskManager over the local test task only (indexing the built-in tasks takes seconds)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(DATA_DIR), include_defaults=False)
