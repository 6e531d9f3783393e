"""Fused AdamW with Lightning's gradient clipping (the GPU default: bf16-mixed + fused), on CPU,
where fused AdamW also exists. Lightning alone refuses to clip a fused optimizer under mixed
precision; LoopedLM.configure_gradient_clipping clips it."""

import warnings

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from loopnet.model import LoopConfig
from loopnet.training.module import LoopedLM, OptimConfig

V, T = 64, 16


def fit(tmp_path, fused: bool, clip, precision="bf16-mixed", algorithm=None) -> dict[str, torch.Tensor]:
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    torch.manual_seed(0)
    cfg = LoopConfig(vocab_size=V, seq_len=T, d_model=32, n_heads=2, n_blocks=2, n_rounds=2)
    lm = LoopedLM(config=cfg, optim=OptimConfig(lr=1e-2, warmup_steps=1, decay_steps=10, fused=fused))
    tokens = torch.randint(0, V, (16, T + 1), generator=torch.Generator().manual_seed(0))
    data = DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=4)
    trainer = L.Trainer(accelerator="cpu", devices=1, precision=precision, max_steps=3, gradient_clip_val=clip,
                        gradient_clip_algorithm=algorithm, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(lm, data)
    assert lm.optimizers().optimizer.defaults["fused"] is fused
    return {k: v.detach().clone() for k, v in lm.model.state_dict().items()}


@pytest.mark.parametrize("algorithm", ["norm", "value"])
def test_fused_adamw_is_clipped_under_bf16_mixed(tmp_path, algorithm):
    fused = fit(tmp_path, True, 1e-3, algorithm=algorithm)  # Lightning's own clipping raises here
    foreach = fit(tmp_path, False, 1e-3, algorithm=algorithm)
    unclipped = fit(tmp_path, True, None)
    for k in fused:
        torch.testing.assert_close(fused[k], foreach[k], rtol=1e-4, atol=1e-5)  # the same clipped update
    assert any(not torch.allclose(fused[k], unclipped[k]) for k in fused)  # and clipping changed it


def test_default_fused_only_on_cuda_without_a_grad_scaler(tmp_path):
    torch.manual_seed(0)
    lm = LoopedLM(config=LoopConfig(vocab_size=V, seq_len=T, d_model=32, n_heads=2, n_blocks=1, n_rounds=1),
                  optim=OptimConfig(decay_steps=10))
    assert lm.configure_optimizers()["optimizer"].defaults["fused"] is False  # CPU


def test_fp32_and_negative_clip_values(tmp_path):
    clipped = fit(tmp_path, False, 1e-3, precision="32-true")
    assert any(not torch.allclose(clipped[k], v) for k, v in fit(tmp_path, False, None, precision="32-true").items())
    # Lightning treats a clip value <= 0 as no clipping (clip_grad_norm_ would flip the gradients).
    negative, unclipped = fit(tmp_path, False, -1.0, precision="32-true"), fit(tmp_path, False, None, precision="32-true")
    for k in negative:
        torch.testing.assert_close(negative[k], unclipped[k])
