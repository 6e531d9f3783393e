"""The learning-rate schedule against its formula, written out here: linear warm-up over W steps,
then a cosine from lr down to min_lr_ratio·lr over the remaining D − W steps, flat after D.

    step < W:   lr·(step + 1)/W
    step ≥ W:   lr·(m + (1 − m)·½(1 + cos(π·min(1, (step − W)/(D − W)))))
"""

import math
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import lightning as L
from loopnet.training.module import LoopedLM, OptimConfig
from tests.helpers import tiny_config

LR, W, D, M = 1e-3, 4, 20, 0.25


def expected_lr(step: int, lr=LR, warmup=W, total=D, ratio=M) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / (total - warmup))
    return lr * (ratio + (1 - ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def schedule(**optim):
    module = LoopedLM(config=tiny_config(), optim=OptimConfig(**optim))
    out = module.configure_optimizers()
    return out["optimizer"], out["lr_scheduler"]["scheduler"]


def lrs(optimizer, scheduler, steps: int) -> list[float]:
    """The learning rate of each step 0 … steps−1, as the optimiser uses it (then the scheduler steps)."""
    out = []
    for _ in range(steps):
        out.append(optimizer.param_groups[0]["lr"])
        assert all(g["lr"] == out[-1] for g in optimizer.param_groups)  # decayed and not: one schedule
        optimizer.step()
        scheduler.step()
    return out


def test_learning_rate_at_the_schedules_landmarks():
    optimizer, scheduler = schedule(lr=LR, warmup_steps=W, decay_steps=D, min_lr_ratio=M)
    got = lrs(optimizer, scheduler, D + 5)
    assert got[0] == pytest.approx(LR / W, rel=1e-12)  # step 0: not 0 (a zero first update), not lr
    assert got[W - 1] == pytest.approx(LR, rel=1e-12)  # the last warm-up step reaches the peak
    assert got[W] == pytest.approx(LR, rel=1e-12)  # the decay starts at the peak (cos 0 = 1)
    mid = W + (D - W) // 2  # progress ½: cos(π/2) = 0, half-way between lr and the floor
    assert got[mid] == pytest.approx(LR * (M + (1 - M) / 2), rel=1e-12)
    assert got[D] == pytest.approx(M * LR, rel=1e-12)  # the end: the floor, min_lr_ratio·lr
    assert got[D + 4] == pytest.approx(M * LR, rel=1e-12)  # and it stays there
    for step, value in enumerate(got):
        assert value == pytest.approx(expected_lr(step), rel=1e-12), step
    assert all(a < b for a, b in zip(got[: W - 1], got[1:W]))  # rising through the warm-up
    assert all(a > b for a, b in zip(got[W:D], got[W + 1 : D + 1]))  # falling through the decay


@pytest.mark.parametrize("ratio", [0.0, 0.1, 1.0])
def test_the_floor_is_min_lr_ratio_times_lr(ratio):
    optimizer, scheduler = schedule(lr=2e-3, warmup_steps=2, decay_steps=10, min_lr_ratio=ratio)
    got = lrs(optimizer, scheduler, 12)
    assert got[10] == pytest.approx(ratio * 2e-3, abs=1e-15)
    assert got == pytest.approx([expected_lr(s, 2e-3, 2, 10, ratio) for s in range(12)], rel=1e-12, abs=1e-15)


class RecordLR(L.Callback):
    def __init__(self):
        self.lr = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.lr.append(trainer.optimizers[0].param_groups[0]["lr"])


def test_a_fit_steps_the_schedule_once_per_step_over_max_steps(tmp_path):
    """Under a Trainer, without decay_steps: the cosine spans max_steps, and each optimiser step
    uses the rate of its global step."""
    steps, warmup = 7, 2
    torch.manual_seed(0)
    config = tiny_config()
    module = LoopedLM(config=config, optim=OptimConfig(lr=LR, warmup_steps=warmup, min_lr_ratio=M))
    tokens = torch.randint(
        0, config.vocab_size, (steps * 2, config.seq_len + 1), generator=torch.Generator().manual_seed(0)
    )
    data = DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=2)
    record = RecordLR()
    trainer = L.Trainer(
        default_root_dir=tmp_path,
        max_steps=steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[record],
    )
    trainer.fit(module, data)
    assert record.lr == pytest.approx([expected_lr(s, LR, warmup, steps, M) for s in range(steps)], rel=1e-12)


def test_adamw_takes_its_settings_from_optim_and_decays_matrices_only():
    module = LoopedLM(
        config=tiny_config(),
        optim=OptimConfig(lr=LR, weight_decay=0.3, betas=(0.8, 0.9), eps=1e-6, warmup_steps=1, decay_steps=5),
    )
    optimizer = module.configure_optimizers()["optimizer"]
    decay, no_decay = optimizer.param_groups
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.3, 0.0)
    assert all(g["betas"] == (0.8, 0.9) and g["eps"] == 1e-6 for g in optimizer.param_groups)
    matrices = {id(m.weight) for m in module.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Embedding))}
    assert {id(p) for p in decay["params"]} == matrices  # norms' gains and biases: not decayed
    assert {id(p) for p in no_decay["params"]} == {id(p) for p in module.parameters()} - matrices


def test_a_decay_of_one_step_and_no_length_at_all():
    optimizer, scheduler = schedule(lr=LR, warmup_steps=3, decay_steps=4, min_lr_ratio=M)  # D − W = 1
    assert lrs(optimizer, scheduler, 6) == pytest.approx([expected_lr(s, LR, 3, 4, M) for s in range(6)], rel=1e-12)
    assert expected_lr(4, LR, 3, 4, M) == pytest.approx(M * LR)
    optimizer, scheduler = schedule(lr=LR, warmup_steps=0, decay_steps=1, min_lr_ratio=M)  # the shortest: 1 step
    assert lrs(optimizer, scheduler, 3) == pytest.approx([LR, M * LR, M * LR], rel=1e-12)
    module = LoopedLM(config=tiny_config(), optim=OptimConfig(decay_steps=None))
    module.trainer = L.Trainer(
        max_steps=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False
    )
    with pytest.raises(
        ValueError,
        match=r"^set trainer\.max_steps \(or model\.optim\.decay_steps\) so the cosine "
        r"schedule has a length$",
    ):
        module.configure_optimizers()


def test_muon_and_its_adamw_take_their_settings_from_optim():
    """Muon on the blocks' matrices with optim's momentum, rate and decay; AdamW on the other matrices with
    optim's decay and on norms and biases with none (torch's defaults differ from each value given here)."""
    module = LoopedLM(
        config=tiny_config(),
        optim=OptimConfig(
            optimizer="muon", lr=LR, muon_lr=0.02, weight_decay=0.3, muon_momentum=0.8, warmup_steps=1, decay_steps=5
        ),
    )
    optimizer = module.configure_optimizers()["optimizer"]
    (muon,), (rest, no_decay) = optimizer.muon.param_groups, optimizer.adamw.param_groups
    assert (muon["lr"], muon["momentum"], muon["weight_decay"]) == (0.02, 0.8, 0.3)
    assert (rest["weight_decay"], no_decay["weight_decay"]) == (0.3, 0.0)
    assert {id(p) for p in muon["params"]} == {id(p) for _, p in module.muon_matrices()}


def test_muon_under_fsdp_is_refused_naming_the_fix():
    from lightning.pytorch.strategies import FSDPStrategy

    module = LoopedLM(config=tiny_config(), optim=OptimConfig(optimizer="muon", decay_steps=5))
    # A stand-in Trainer: Lightning builds an FSDP Trainer only with a GPU; the check reads its strategy only.
    module._trainer = SimpleNamespace(strategy=FSDPStrategy(), max_steps=5, precision_plugin=None)
    with pytest.raises(ValueError) as err:
        module.configure_optimizers()
    assert str(err.value) == (
        "model.optim.optimizer=muon needs whole 2-D matrices, and FSDP shards them into 1-D "
        "slices; fix: train with DDP (trainer.strategy: ddp) or optimizer: adamw"
    )
