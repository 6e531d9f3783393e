"""`loopnet test`'s exit frontier and the per-round profile, through a Lightning Trainer."""

from __future__ import annotations

import json
import math

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger

from loopnet.diagnostics.fixed_point import jacobian_profile, round_profile
from loopnet.diagnostics.frontier import FrontierMeter, read_frontier
from loopnet.training.module import LoopedLM
from loopnet.training.options import FrontierConfig
from tests.helpers import tiny_config


def batches(n=2, B=2, T=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    data = [(torch.randint(0, 64, (B, T), generator=g), torch.randint(0, 64, (B, T), generator=g)) for _ in range(n)]
    return torch.utils.data.DataLoader(data, batch_size=None)


@pytest.fixture(scope="module")
def tested(tmp_path_factory):
    folder = tmp_path_factory.mktemp("run")
    torch.manual_seed(0)
    lm = LoopedLM(
        config=tiny_config(),
        eval_rounds=[1, 4],
        extrapolate_rounds=6,
        frontier={"exit": "kl", "thresholds": [0.0, 1e-3, math.inf], "max_rounds": 4},
    )
    trainer = L.Trainer(
        accelerator="cpu",
        logger=TensorBoardLogger(str(folder), name="t"),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    (metrics,) = trainer.test(lm, dataloaders=batches())
    return lm, trainer, metrics


def test_threshold_zero_is_the_full_depth_and_infinity_is_one_round(tested):
    _, _, m = tested
    assert m["test/frontier/mean_rounds/t0"] == 4.0
    assert m["test/frontier/loss/t0"] == pytest.approx(m["test/loss_r4"], rel=1e-5)
    assert m["test/frontier/mean_rounds/t2"] == 1.0
    assert m["test/frontier/loss/t2"] == pytest.approx(m["test/loss_r1"], rel=1e-5)
    assert 1.0 <= m["test/frontier/mean_rounds/t1"] <= 4.0
    assert m["test/frontier/ppl/t0"] == pytest.approx(math.exp(m["test/frontier/loss/t0"]), rel=1e-5)


def test_the_profile_loss_per_round_is_the_loss_at_that_round_count(tested):
    _, _, m = tested
    assert m["test_fixed_point/loss/r01"] == pytest.approx(m["test/loss_r1"], rel=1e-5)
    assert m["test_fixed_point/loss/r03"] == pytest.approx(m["test/loss"], rel=1e-5)
    assert m["test_fixed_point/loss/r04"] == pytest.approx(m["test/loss_r4"], rel=1e-5)
    for q in ("latent_change", "kl", "sigma_max"):
        assert "test_fixed_point/%s/r01" % q not in m
    # every round of the others, computed apart: token-weighted over the batches, σ_max on the first batch
    lm, _, _ = tested
    model, data = lm.model.eval(), list(batches())
    profiles = [round_profile(model, idx, targets, 6) for idx, targets in data]
    expected = {q: [(a + b) / 2 for a, b in zip(*(p[q][1:] for p in profiles))] for q in ("latent_change", "kl")}
    expected["sigma_max"] = jacobian_profile(model, data[0][0][:2], 6)[1:]
    for q, values in expected.items():
        assert [m[f"test_fixed_point/{q}/r{r:02d}"] for r in range(2, 7)] == pytest.approx(values, rel=1e-5), q


def test_files_and_the_tensorboard_image_are_written(tested):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, trainer, m = tested
    folder = trainer.log_dir
    frontier = read_frontier(folder)
    assert [p["threshold"] for p in frontier["points"]] == [0.0, 1e-3, math.inf]
    assert frontier["points"][0]["loss"] == pytest.approx(m["test/frontier/loss/t0"])
    assert set(frontier["fixed"]) == {"1", "3", "4"}
    with open(f"{folder}/frontier.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    profile = json.load(open(f"{folder}/fixed_point.json"))
    assert len(profile["loss"]) == 6 and profile["kl"][0] is None
    acc = EventAccumulator(folder)
    acc.Reload()
    assert "frontier/loss_vs_rounds" in acc.Tags()["images"]
    # the per-round profile: one labelled image per quantity (not a chart of one unlabelled line per round)
    assert {f"test_fixed_point/{q}" for q in ("loss", "latent_change", "kl", "sigma_max")} <= set(acc.Tags()["images"])


def test_a_round_image_draws_each_value_at_its_round_with_the_training_R_marked(tested):
    from loopnet.diagnostics.profile import ROUND_VIEWS, round_figure

    _, trainer, _ = tested
    profile = json.load(open(f"{trainer.log_dir}/fixed_point.json"))
    for q in ("loss", "latent_change", "kl", "sigma_max"):
        fig = round_figure(q, profile[q], train_rounds=3)
        (ax,) = fig.axes
        data, *marks = ax.lines
        expected = [
            (r, v) for r, v in enumerate(profile[q], start=1) if v is not None and (v > 0 or not ROUND_VIEWS[q][1])
        ]
        assert list(data.get_xdata()) == [r for r, _ in expected]
        assert list(data.get_ydata()) == pytest.approx([v for _, v in expected])
        assert [tuple(m.get_xdata()) for m in marks if m.get_linestyle() == "--"] == [(3, 3)]
        assert ax.get_xlabel() == "round r" and ax.get_yscale() == ("log" if ROUND_VIEWS[q][1] else "linear")


@pytest.mark.parametrize("at_validation", [False, True])
def test_validation_profile_reaches_the_summary_record(at_validation):
    """σ_max (minutes at a real width) only when asked for at validation: then that of the first batch's first
    two sequences, as `jacobian_profile` computes it."""
    torch.manual_seed(0)
    lm = LoopedLM(config=tiny_config(), extrapolate_rounds=4, jacobian_at_validation=at_validation)
    trainer = L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    (m,) = trainer.validate(lm, dataloaders=batches(n=1))
    profile = lm.depth_eval.last_profile
    assert profile["loss"][2] == pytest.approx(m["val/loss"], rel=1e-5)
    if not at_validation:
        assert "sigma_max" not in profile and not any(k.startswith("fixed_point/sigma_max") for k in m)
        return
    ((idx, _),) = list(batches(n=1))
    expected = jacobian_profile(lm.model.eval(), idx[:2], 4)
    assert profile["sigma_max"][0] is None and profile["sigma_max"][1:] == pytest.approx(expected[1:], rel=1e-6)
    assert m["fixed_point/sigma_max/r04"] == pytest.approx(expected[3], rel=1e-6)


def test_the_meter_counts_only_target_tokens():
    torch.manual_seed(0)
    model = LoopedLM(config=tiny_config()).model.eval()
    meter = FrontierMeter("latent", [0.0], 3)
    idx, targets = torch.randint(0, 64, (1, 6)), torch.randint(0, 64, (1, 6))
    targets[0, :3] = -1
    meter.update(model, idx, targets)
    (point,) = meter.compute()
    with torch.no_grad():
        logits, _ = model(idx, rounds=3)
    expected = torch.nn.functional.cross_entropy(logits[0, 3:], targets[0, 3:])
    assert point["loss"] == pytest.approx(float(expected), rel=1e-5) and point["mean_rounds"] == 3.0


def test_bad_frontier_settings_are_refused():
    with pytest.raises(ValueError, match="needs thresholds"):
        FrontierConfig(exit="kl")
    with pytest.raises(ValueError, match="is not a criterion"):
        FrontierConfig(exit="cos", thresholds=[1])
    with pytest.raises(ValueError, match="extrapolate_rounds=1 must be >= 2"):
        LoopedLM(config=tiny_config(), extrapolate_rounds=1)


def test_compare_overlays_two_runs_frontiers(tested, tmp_path, capsys):
    import shutil

    from loopnet.diagnostics.compare import main

    _, trainer, _ = tested
    other = tmp_path / "other"
    shutil.copytree(trainer.log_dir, other)
    out = tmp_path / "frontiers.png"
    main([trainer.log_dir, str(other), "--frontier", "--labels", "a", "b", "--out", str(out)])
    text = capsys.readouterr().out
    assert out.read_bytes()[:4] == b"\x89PNG" and text.count("exit kl") == 2 and "wrote" in text
    with pytest.raises(SystemExit):
        main([str(tmp_path / "nothing"), str(other), "--frontier", "--out", str(out)])
