"""A model folder loopnet wrote (`loopnet export`, `import` or `retrofit`: `loopnet.formats.hf`'s layout, read by
its one reader `hf.read_exported`) opened as a `LoopedTransformer` (`load_model`), or copied into one
(`load_weights`: a fit's `model.init_weights`)."""

from __future__ import annotations

from pathlib import Path

import torch

from loopnet.model.config import LoopConfig


def read_folder(folder: str | Path) -> tuple[LoopConfig, dict[str, torch.Tensor], dict]:
    """(LoopConfig, state dict, source) of a model folder: `hf.read_exported`, with what its config.json records
    of the model it was imported from (`loopnet_export.source`: src, commit, format, ...; {} for an export)."""
    from loopnet.formats.hf import read_exported

    config, state, meta = read_exported(folder)
    return config, state, meta.get("source") or {}


def load_model(folder: str | Path, dtype: torch.dtype | None = None):
    """A `LoopedTransformer` with the folder's weights, in eval mode (`checkpoints.build_network`: built on the
    meta device and given the memory-mapped tensors, in their stored dtype or converted to `dtype`), so that
    no second copy of the weights is made (a 3.5 B model in bf16 holds its 7 GB once)."""
    from loopnet.checkpoints import build_network

    config, state, _ = read_folder(folder)
    return build_network(config, state, dtype=dtype)


def load_weights(model, folder: str | Path) -> None:
    """Copy the folder's weights into `model` (a `LoopedTransformer`), whose architecture must equal the
    folder's (else one line naming the fields that differ); run settings (rounds drawn, backprop depth...)
    may differ."""
    config, state, _ = read_folder(folder)
    theirs = config.architecture()
    diff = [
        f"{k}: folder {theirs[k]!r} vs config {v!r}" for k, v in model.config.architecture().items() if theirs[k] != v
    ]
    if diff:
        raise ValueError(
            f"model.init_weights {folder} holds another architecture ({'; '.join(diff)}); fix: set "
            f"model.config to the LoopConfig fields of {Path(folder) / 'config.json'} (an imported folder's model.yaml gives them)"
        )
    with torch.no_grad():
        model.load_state_dict(state)
