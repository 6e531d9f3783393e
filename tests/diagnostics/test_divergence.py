"""DivergenceGuard: forced NaN / runaway loss stop the run, the last good checkpoint stays
byte-for-byte intact, and summary.json records the outcome."""

import hashlib
import math
import os
import warnings

import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from loopnet.diagnostics import DivergenceGuard, VisitDiagnostics, read_summary

from .helpers import ForcedLM, random_tokens, tiny_module, trainer


class CheckpointSnapshots(Callback):
    """Hash of every checkpoint file at the start of each step (i.e. as the previous step left them)."""

    def __init__(self, folder):
        self.folder, self.at_step = folder, {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.at_step[trainer.global_step] = _hashes(self.folder)


def _hashes(folder):
    if not os.path.isdir(folder):
        return {}
    return {
        name: hashlib.sha256(open(os.path.join(folder, name), "rb").read()).hexdigest()
        for name in sorted(os.listdir(folder))
    }


def fit_forced(tmp_path, at_step, factor, guard=None, max_steps=16):
    folder = str(tmp_path / "ckpt")
    # As the CLI configures it: best by val/loss, plus last.ckpt; and a save at every step.
    ckpt = ModelCheckpoint(
        dirpath=folder,
        monitor="val/loss",
        mode="min",
        save_last=True,
        save_top_k=1,
        every_n_train_steps=1,
        filename="best-{step}",
    )
    snaps = CheckpointSnapshots(folder)
    guard = guard or DivergenceGuard()
    module = tiny_module(ForcedLM, at_step=at_step, factor=factor)
    t = trainer(
        tmp_path,
        [ckpt, snaps, guard],
        max_steps=max_steps,
        checkpoint=True,
        val_check_interval=2,
        gradient_clip_val=1.0,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t.fit(module, random_tokens(), random_tokens(8, seed=1))
    told = [str(w.message) for w in caught if "the run diverged at step" in str(w.message)]
    assert len(told) == guard.diverged  # the user is told once, with the step
    return t, module, guard, snaps, folder


def test_forced_nan_stops_with_diverged_and_keeps_last_good_checkpoint(tmp_path):
    S = 5
    t, module, guard, snaps, folder = fit_forced(tmp_path, at_step=S, factor=float("nan"))
    summary = read_summary(t.log_dir)
    assert summary["status"] == "diverged" and summary["diverged_at_step"] == S
    assert "non-finite gradient" in summary["reason"]
    assert t.global_step == S + 1 < 16  # stopped right after the bad step
    # Every checkpoint file is byte-identical to what was on disk before step S.
    assert snaps.at_step[S] and _hashes(folder) == snaps.at_step[S]
    last = torch.load(os.path.join(folder, "last.ckpt"), weights_only=False)
    assert last["global_step"] == S
    assert all(torch.isfinite(v).all() for v in last["state_dict"].values() if v.is_floating_point())
    assert summary["last_checkpoint"] == os.path.join(folder, "last.ckpt")
    # The NaN update was skipped: the weights in memory stay finite.
    assert all(torch.isfinite(p).all() for p in module.parameters())
    assert summary["config"]["n_rounds"] == 3 and summary["hparams"]["optim"]["lr"] == 1e-3


def test_loss_above_bound_after_warmup_diverges(tmp_path):
    S = 6
    guard = DivergenceGuard(max_loss=20.0, after_step=3)
    t, _, _, snaps, folder = fit_forced(tmp_path, at_step=S, factor=1e3, guard=guard)
    summary = read_summary(t.log_dir)
    assert summary["status"] == "diverged" and summary["diverged_at_step"] == S
    assert "max_loss" in summary["reason"] and summary["final_train_loss"] > 20
    assert _hashes(folder) == snaps.at_step[S]


def test_loss_above_bound_during_warmup_is_allowed(tmp_path):
    guard = DivergenceGuard(max_loss=20.0, after_step=3)
    t, *_ = fit_forced(tmp_path, at_step=1, factor=1e3, guard=guard, max_steps=6)
    summary = read_summary(t.log_dir)
    assert summary["status"] == "completed" and summary["diverged_at_step"] is None and t.global_step == 6


def test_completed_run_summary(tmp_path):
    module = tiny_module()
    guard = DivergenceGuard()
    t = trainer(tmp_path, [VisitDiagnostics(every_n_steps=3), guard], max_steps=8)
    t.fit(module, random_tokens(), random_tokens(8, seed=1))
    summary = read_summary(os.path.join(t.log_dir, "summary.json"))
    assert guard.summary_path == os.path.join(t.log_dir, "summary.json")
    assert summary["status"] == "completed" and summary["global_step"] == 8 and summary["schema"] == 1
    assert [step for step, _ in summary["val_history"]] == [4, 8]
    assert summary["final_val_loss"] == pytest.approx(float(t.callback_metrics["val/loss"]))
    assert summary["best_val_loss"] == min(v for _, v in summary["val_history"])
    assert math.isfinite(summary["final_train_loss"])
    assert summary["diagnostics_step"] == 7 and len(summary["last_visit_stats"]) == 12  # the last step is measured
    assert set(summary["last_visit_stats"]["r03_k1_attn"]) == {
        "resid_norm",
        "state_norm_dev",
        "branch_ratio",
        "act_grad_norm",
        "param_grad_norm",
        "attn_logit_max",
        "attn_logit_absmax",
        "attn_log_z",
    }
    assert set(summary["last_output_stats"]) == {"log_z", "logit_absmax"}
    assert set(summary["kappa"]) == {"k1_attn", "k1_ffn", "k2_attn", "k2_ffn", "model"}
    assert not [f for f in os.listdir(t.log_dir) if f.endswith(".tmp")]  # written atomically


def test_exception_writes_interrupted(tmp_path):
    module = tiny_module(ForcedLM, raise_at=2)
    t = trainer(tmp_path, [DivergenceGuard()], max_steps=8)
    with pytest.raises(RuntimeError, match="forced failure"):
        t.fit(module, random_tokens(), random_tokens(8, seed=1))
    summary = read_summary(t.log_dir)
    assert summary["status"] == "interrupted" and "forced failure" in summary["error"]
    assert summary["global_step"] == 2


def test_read_summary_rejects_other_json(tmp_path):
    (tmp_path / "summary.json").write_text('{"status": "ok"}')
    with pytest.raises(ValueError, match="not a loopnet run summary"):
        read_summary(tmp_path)
