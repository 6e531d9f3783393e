"""LoopConfig is one flat set of fields made of an Architecture and its RunSettings."""

from __future__ import annotations

import dataclasses

import pytest

from loopnet.checkpoints import check_model_config
from loopnet.model import RUN_SETTINGS, Architecture, LoopConfig, LoopedTransformer, RunSettings
from tests.helpers import tiny_config


def names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_the_fields_are_the_architecture_and_the_run_settings_each_once():
    assert names(Architecture) | names(RunSettings) == names(LoopConfig)
    assert not names(Architecture) & names(RunSettings)
    assert (
        RUN_SETTINGS
        == names(RunSettings)
        == {
            "dropout",
            "loss_rounds",
            "checkpoint_rounds",
            "truncate_rounds",
            "round_sampling",
            "round_draw",
            "backprop_rounds",
            "max_rounds",
            "round_curriculum_steps",
            "scales_depth",
            "state_init",
            "round_sigma",
            "exit_kl",
        }
    )


def test_run_settings_leave_the_weights_as_they_are():
    base = tiny_config()
    other = dataclasses.replace(base, dropout=0.1, loss_rounds="all", checkpoint_rounds=True, truncate_rounds=1)
    assert other.architecture() == base.architecture()
    shapes = lambda cfg: {k: v.shape for k, v in LoopedTransformer(cfg).state_dict().items()}  # noqa: E731
    assert shapes(other) == shapes(base)


def test_a_checkpoint_must_match_the_architecture_only():
    saved = tiny_config()
    check_model_config(saved, dataclasses.asdict(dataclasses.replace(saved, dropout=0.2, truncate_rounds=2)))
    with pytest.raises(ValueError, match="d_model: checkpoint 32 vs config 64"):
        check_model_config(saved, dataclasses.asdict(dataclasses.replace(saved, d_model=64)))
