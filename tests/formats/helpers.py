"""Checkpoints for the export tests: a `LoopedTransformer` saved in the layout `loopnet fit` writes (the network
under `model.` in `state_dict`, its config under `hyper_parameters.config`), without a Trainer."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from loopnet.model import LoopedTransformer
from tests.helpers import tiny_config

EXPORTED_FILES = {  # what `loopnet export` writes (the weights in one file)
    "README.md",
    "config.json",
    "configuration_loopnet.py",
    "generation_config.json",
    "model.safetensors",
    "modeling_loopnet.py",
    "tokenizer.json",
    "tokenizer_config.json",
}


def tiny_model(seed: int = 0, **overrides) -> LoopedTransformer:
    torch.manual_seed(seed)
    return LoopedTransformer(tiny_config(**overrides)).eval()


def checkpoint_dict(model: LoopedTransformer, step: int = 7, vocab: str | None = "gpt2") -> dict:
    ckpt = {
        "hyper_parameters": {"config": dataclasses.asdict(model.config)},
        "global_step": step,
        "epoch": 0,
        "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
    }
    if vocab is not None:
        ckpt["datamodule_hyper_parameters"] = {"vocab": vocab, "source": "shakespeare", "seq_len": model.config.seq_len}
    return ckpt


def save_checkpoint(model: LoopedTransformer, path: Path, **kwargs) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint_dict(model, **kwargs), path)
    return path


def model_of(cfg, state, **changes) -> LoopedTransformer:
    """An imported (config, state) as a model in eval mode, with `changes` to its config."""
    model = LoopedTransformer(dataclasses.replace(cfg, **changes)).eval()
    model.load_state_dict(state)
    return model
