"""Fused AdamW with Lightning's gradient clipping (the GPU default: bf16-mixed + fused), on CPU,
where fused AdamW also exists. Lightning alone refuses to clip a fused optimizer under mixed
precision; LoopedLM.configure_gradient_clipping clips it."""

import math
import warnings
from pathlib import Path

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from loopnet.training.module import LoopedLM, OptimConfig
from tests.helpers import tiny_config

V, T = 64, 16


class LearningRates(L.Callback):
    """The learning rate of each optimiser step, as AdamW applies it."""

    def __init__(self):
        self.lrs = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.lrs.append(optimizer.param_groups[0]["lr"])


def fit(
    tmp_path, fused: bool, clip, precision="bf16-mixed", algorithm=None, lrs: list | None = None
) -> dict[str, torch.Tensor]:
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    torch.manual_seed(0)
    cfg = tiny_config(vocab_size=V, seq_len=T, n_heads=2, n_rounds=2)
    lm = LoopedLM(config=cfg, optim=OptimConfig(lr=1e-2, warmup_steps=1, decay_steps=10, fused=fused))
    tokens = torch.randint(0, V, (16, T + 1), generator=torch.Generator().manual_seed(0))
    data = DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=4)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        precision=precision,
        max_steps=3,
        gradient_clip_val=clip,
        gradient_clip_algorithm=algorithm,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[recorder := LearningRates()],
    )
    trainer.fit(lm, data)
    assert lm.optimizers().optimizer.defaults["fused"] is fused
    if lrs is not None:
        lrs.extend(recorder.lrs)
    return {k: v.detach().clone() for k, v in lm.model.state_dict().items()}


def bf16_step_tolerance(lrs: list[float], betas: tuple[float, float]) -> float:
    """How far fused and for-each AdamW may end apart after `len(lrs)` steps under bf16-mixed: derived
    from the arithmetic, not measured on one machine (AMD EPYC and Intel Xeon round differently).

    Step 1 sees the same gradients in both (same weights, same batch): the two kernels differ only in
    the order of their fp32 operations, a few fp32 ulps (~1e-7 for |w| <= 0.5, negligible here). From
    step 2 a weight that sits within those ulps of a bf16 rounding boundary is cast to the neighbouring
    bf16 value in the forward, and the gradients (themselves rounded to bf16 in the matmuls) may differ
    by one bf16 rounding, relative eps = 2^-8 (bf16 keeps 8 significant bits). AdamW's update
    u = lr·m̂/√v̂ with m̂ = m/(1-β1^t), v̂ = v/(1-β2^t); perturbing g_t by eps·g_t changes it, to first
    order, by lr·eps·[(1-β1)/(1-β1^t)·|g_t|/√v̂ + |m̂/√v̂|·(1-β2)/(1-β2^t)·g_t²/v̂], where
    g_t²/v̂ <= (1-β2^t)/(1-β2) (v holds (1-β2)·g_t²) and |m̂/√v̂| <= 1 for these betas (Cauchy-Schwarz;
    1.0003 at t = 2, 1.0009 at t = 3). So step t moves the two runs apart by at most
    lr_t·eps·[(1-β1)/(1-β1^t)·√((1-β2^t)/(1-β2)) + 1.001], and the steps add up (weight decay shrinks
    the gap by (1 - lr·wd) per step: ignored, it only helps). For the test's lr 1e-2, betas
    (0.9, 0.95), 3 steps: 1.3e-4; the clipping itself moves weights by 1e-2 or more."""
    b1, b2, eps = *betas, 2.0**-8
    bound = 0.0
    for t, lr in enumerate(lrs, start=1):
        if t == 1:
            continue  # the same gradients in both runs
        bound += lr * eps * ((1 - b1) / (1 - b1**t) * math.sqrt((1 - b2**t) / (1 - b2)) + 1.001)
    return bound


@pytest.mark.parametrize("algorithm", ["norm", "value"])
def test_fused_adamw_is_clipped_under_bf16_mixed(tmp_path, algorithm):
    lrs = []
    fused = fit(tmp_path, True, 1e-3, algorithm=algorithm, lrs=lrs)  # Lightning's own clipping raises here
    foreach = fit(tmp_path, False, 1e-3, algorithm=algorithm)
    unclipped = fit(tmp_path, True, None)
    atol = bf16_step_tolerance(lrs, OptimConfig().betas)
    assert len(lrs) == 3 and 1e-4 < atol < 2e-4, (lrs, atol)
    for k in fused:  # the same clipped update, up to bf16 rounding
        torch.testing.assert_close(fused[k], foreach[k], rtol=0, atol=atol, msg=lambda m: f"{k}: {m}")
    # and clipping changed it, by far more than that rounding
    assert max((fused[k] - unclipped[k]).abs().max().item() for k in fused) > 10 * atol


def test_default_fused_on_cpu_and_cuda_without_a_grad_scaler(tmp_path):
    torch.manual_seed(0)
    cfg = tiny_config(vocab_size=V, seq_len=T, n_heads=2, n_blocks=1, n_rounds=1)
    lm = LoopedLM(config=cfg, optim=OptimConfig(decay_steps=10))
    assert lm.configure_optimizers()["optimizer"].defaults["fused"] is True  # CPU: one kernel per tensor
    lm = LoopedLM(config=cfg, optim=OptimConfig(decay_steps=10, fused=False))
    assert lm.configure_optimizers()["optimizer"].defaults["fused"] is False


def test_fp32_and_negative_clip_values(tmp_path):
    clipped = fit(tmp_path, False, 1e-3, precision="32-true")
    assert any(not torch.allclose(clipped[k], v) for k, v in fit(tmp_path, False, None, precision="32-true").items())
    # Lightning treats a clip value <= 0 as no clipping (clip_grad_norm_ would flip the gradients).
    negative, unclipped = (
        fit(tmp_path, False, -1.0, precision="32-true"),
        fit(tmp_path, False, None, precision="32-true"),
    )
    for k in negative:
        torch.testing.assert_close(negative[k], unclipped[k])


# A Lightning checkpoint written by loopnet at commit 8d46145, before the fused QKV projection: separate
# q_proj/k_proj/v_proj (with biases), FLT wiring, 3 steps of AdamW (tests/training/data/README.md).
OLD_CKPT = Path(__file__).parent / "data" / "separate_qkv_8d46145.ckpt"


# The test resumes on a plain DataLoader (the model, not the data position, is what it checks); Lightning warns.
@pytest.mark.filterwarnings("ignore:You're resuming from a checkpoint that ended before the epoch ended")
def test_checkpoint_with_separate_qkv_loads_weights_and_optimizer_state(tmp_path):
    raw = torch.load(OLD_CKPT, weights_only=True)
    old_sd = raw["state_dict"]
    # The old optimizer order, read from the checkpoint itself: its parameters in state-dict order (the
    # tied head once), ≥ 2-D ones first.
    names = [k for k in old_sd if k != "model.lm_head.weight"]
    old_order = [n for n in names if old_sd[n].dim() >= 2] + [n for n in names if old_sd[n].dim() < 2]
    old_state = {old_order[i]: s for i, s in raw["optimizer_states"][0]["state"].items()}

    lm = LoopedLM.load_from_checkpoint(OLD_CKPT, map_location="cpu")  # the weights convert on load
    for k in range(2):
        old = [f"model.blocks.{k}.attn.f.{p}_proj" for p in "qkv"]
        fused = lm.model.blocks[k].attn.f.qkv_proj
        assert torch.equal(fused.weight, torch.cat([old_sd[f"{o}.weight"] for o in old]))
        assert torch.equal(fused.bias, torch.cat([old_sd[f"{o}.bias"] for o in old]))

    ckpt = torch.load(OLD_CKPT, weights_only=True)  # the optimizer state converts in on_load_checkpoint
    lm.on_load_checkpoint(ckpt)
    opt = lm.configure_optimizers()["optimizer"]
    opt.load_state_dict(ckpt["optimizer_states"][0])
    params = dict(lm.named_parameters())
    for k in range(2):
        for kind in ("weight", "bias"):
            state = opt.state[params[f"model.blocks.{k}.attn.f.qkv_proj.{kind}"]]
            for moment in ("exp_avg", "exp_avg_sq"):
                expected = torch.cat([old_state[f"model.blocks.{k}.attn.f.{p}_proj.{kind}"][moment] for p in "qkv"])
                assert torch.equal(state[moment], expected)
            assert state["step"].item() == 3
    o_proj = opt.state[params["model.blocks.1.attn.f.o_proj.weight"]]["exp_avg"]  # the others keep theirs
    assert torch.equal(o_proj, old_state["model.blocks.1.attn.f.o_proj.weight"]["exp_avg"])

    # And a run resumes from it: one more step through the Trainer.
    tokens = torch.randint(0, 64, (8, 9), generator=torch.Generator().manual_seed(0))
    data = DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=2)
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    resumed = LoopedLM(**{k: raw["hyper_parameters"][k] for k in ("config", "optim")})
    trainer.fit(resumed, data, ckpt_path=OLD_CKPT)
    assert trainer.global_step == 4 and torch.isfinite(resumed.model.blocks[0].attn.f.qkv_proj.weight).all()


def test_mismatched_old_optimizer_state_is_refused_clearly():
    ckpt = torch.load(OLD_CKPT, weights_only=True)
    ckpt["optimizer_states"][0]["param_groups"][0]["params"].pop()
    lm = LoopedLM(**{k: ckpt["hyper_parameters"][k] for k in ("config", "optim")})
    with pytest.raises(ValueError, match="layout before the fused QKV projection"):
        lm.on_load_checkpoint(ckpt)
