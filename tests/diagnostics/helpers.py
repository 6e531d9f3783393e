"""A tiny looped LM on random tokens, and a Trainer factory, for the diagnostics tests."""

from __future__ import annotations

import warnings

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from torch.utils.data import DataLoader, TensorDataset

from loopnet.training.module import LoopedLM, OptimConfig
from tests.helpers import tiny_config

VOCAB, T = tiny_config().vocab_size, tiny_config().seq_len


def random_tokens(n: int = 64, seed: int = 0) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (n, T + 1), generator=g)
    return DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=4, shuffle=False)


class ForcedLM(LoopedLM):
    """LoopedLM whose training loss is multiplied by `factor` at global step `at_step` (NaN, or a
    large number), to force a divergence."""

    def __init__(self, at_step: int = -1, factor: float = float("nan"), raise_at: int = -1, **kw):
        super().__init__(**kw)
        self.at_step, self.factor, self.raise_at = at_step, factor, raise_at

    def training_step(self, batch, batch_idx):
        if self.global_step == self.raise_at:
            raise RuntimeError("forced failure")
        loss = super().training_step(batch, batch_idx)
        return loss * self.factor if self.global_step == self.at_step else loss


def tiny_module(cls=LoopedLM, **kw) -> LoopedLM:
    torch.manual_seed(0)
    config = kw.pop("config", None) or tiny_config()
    return cls(config=config, optim=OptimConfig(lr=1e-3, warmup_steps=2), **kw)


def trainer(tmp_path, callbacks, max_steps: int, checkpoint: bool = False, **kw) -> L.Trainer:
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    warnings.filterwarnings("ignore", ".*LeafSpec.*")
    warnings.filterwarnings("ignore", ".*but have no `val_dataloader`.*")
    args = dict(
        default_root_dir=tmp_path,
        logger=TensorBoardLogger(tmp_path, name="run"),
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
        enable_checkpointing=checkpoint,
        callbacks=callbacks,
        limit_val_batches=2,
        val_check_interval=4,
        check_val_every_n_epoch=None,
    )
    return L.Trainer(**{**args, **kw})
