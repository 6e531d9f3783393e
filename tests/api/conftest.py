"""A tiny checkpoint trained in the test session, saved where `loopnet fit` would put it (a run folder)."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch

from loopnet.data.vocabulary import GPT2Vocab
from loopnet.training.module import LoopedLM
from tests.helpers import tiny_config

TEXT = """ROMEO: But, soft! what light through yonder window breaks?
It is the east, and Juliet is the sun.
JULIET: O Romeo, Romeo! wherefore art thou Romeo?
Deny thy father and refuse thy name.
"""
RUN = "runs/deeploop_carry_k2_r3_d32"  # a run folder as `loopnet fit` lays it out: <run>/version_0/checkpoints/


@pytest.fixture(scope="session")
def run_root(tmp_path_factory) -> Path:
    """A folder holding RUN/version_0/checkpoints/last.ckpt: a LoopedLM (DeepLoop, K = 2, R = 3, d = 32, GPT-2
    ids) trained for 12 steps on TEXT through the Lightning Trainer."""
    ids = torch.tensor(GPT2Vocab().encode(TEXT) * 4)
    T = 32
    n = (len(ids) - 1) // T
    inputs, targets = ids[: n * T].view(n, T), ids[1 : n * T + 1].view(n, T)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(inputs, targets), batch_size=2, shuffle=True)
    torch.manual_seed(0)
    module = LoopedLM(
        config=tiny_config(vocab_size=50304, seq_len=64, n_heads=2, residual="deeploop"),
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
    root = tmp_path_factory.mktemp("work")
    folder = root / RUN / "version_0" / "checkpoints"
    folder.mkdir(parents=True)
    trainer.save_checkpoint(folder / "last.ckpt")
    return root


@pytest.fixture(scope="session")
def ckpt(run_root) -> Path:
    return run_root / RUN / "version_0" / "checkpoints" / "last.ckpt"


@pytest.fixture(scope="session")
def saved_weights(ckpt) -> dict[str, torch.Tensor]:
    """The network's weights as the checkpoint holds them, read independently of loopnet's loader."""
    state = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
    return {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}
