"""TokenThroughput's MFU peak on GPUs that Lightning's table misses or lists with sparsity."""

from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.trainer.states import RunningStage

from loopnet.training.callbacks import TokenThroughput, gpu_bf16_peak


@pytest.mark.parametrize(
    "name, peak",
    [
        ("NVIDIA H200", 989e12),
        ("NVIDIA H200 NVL", 835e12),
        ("NVIDIA GH200 480GB", 989e12),
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),
        ("NVIDIA H100 80GB HBM2e", 756e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("Tesla T4", None),
    ],
)
def test_dense_bf16_peak_by_device_name(name, peak):
    assert gpu_bf16_peak(name) == peak


def fake_trainer(precision_plugin):
    return SimpleNamespace(
        strategy=SimpleNamespace(root_device=torch.device("cuda", 0)),
        world_size=1,
        precision_plugin=precision_plugin,
        enable_validation=True,
        state=SimpleNamespace(stage=RunningStage.TRAINING),
    )


def test_h200_gets_its_dense_peak_for_mfu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monitor = TokenThroughput()
    monitor.setup(fake_trainer(MixedPrecision("bf16-mixed", "cuda")), None, "fit")
    assert monitor.available_flops == 989e12
    assert {t.available_flops for t in monitor._throughputs.values()} == {989e12}  # train and validation


def test_fp32_keeps_lightnings_lookup(monkeypatch):
    import lightning.pytorch.callbacks.throughput_monitor as tm

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monkeypatch.setattr(tm, "get_available_flops", lambda device, dtype: 1.25e12 if dtype == torch.float32 else None)
    monitor = TokenThroughput()
    monitor.setup(fake_trainer(Precision()), None, "fit")
    assert monitor.available_flops == 1.25e12  # Lightning's answer for fp32, not the bf16 peak


def test_flops_per_batch_follows_the_stage():
    from tests.helpers import tiny_config
    from loopnet.training.module import LoopedLM, OptimConfig

    cfg = tiny_config(n_heads=2)
    lm = LoopedLM(config=cfg, optim=OptimConfig(decay_steps=10), eval_rounds=[1])
    batch = (torch.zeros(4, 16, dtype=torch.long), torch.zeros(4, 16, dtype=torch.long))
    per_token = lm.model.flops_per_token
    lm.on_train_batch_start(batch, 0)
    assert lm.flops_per_batch == per_token(16) * 64  # forward + backward at R
    lm.on_validation_batch_start(batch, 0)
    assert lm.flops_per_batch == pytest.approx((per_token(16, 3) + per_token(16, 1)) / 3 * 64)  # forward at R and R'
    lm.on_train_batch_start(batch, 1)
    assert lm.flops_per_batch == per_token(16) * 64
