"""configs/huginn_style.yaml and configs/parcae_style.yaml, each fitted with configs/cpu.yaml (a few steps of a
narrow model): the run completes, draws its rounds, logs its recipe's terms, and diagnoses every visit."""

from __future__ import annotations

import json
import math

import pytest

from tests.reliability.helpers import ROOT, loopnet, scalars

pytestmark = pytest.mark.slow

SMALL = [
    "--config",
    str(ROOT / "configs/cpu.yaml"),
    "--model.config.d_model",
    "32",
    "--model.config.seq_len",
    "32",
    "--data.batch_size",
    "2",
    "--trainer.max_steps",
    "3",
    "--trainer.val_check_interval",
    "3",
    "--trainer.limit_val_batches",
    "1",
    "--trainer.log_every_n_steps",
    "1",
    "--trainer.enable_progress_bar",
    "false",
    "--trainer.enable_model_summary",
    "false",
    "--diagnostics.every_n_steps",
    "1",
]


@pytest.mark.parametrize(
    "recipe, expect",
    [
        (
            "huginn_style",
            dict(
                n_prelude=2,
                n_blocks=4,
                n_coda=2,
                injection="linear",
                round_sampling="poisson_lognormal",
                round_draw="batch",
                qk_norm=False,
                optimizer="adamw",
            ),
        ),
        (
            "parcae_style",
            dict(
                n_prelude=2,
                n_blocks=2,
                n_coda=2,
                injection="diagonal",
                round_sampling="poisson_truncated",
                round_draw="sequence",
                qk_norm=True,
                optimizer="muon",
            ),
        ),
    ],
)
def test_recipe_config_fits_on_cpu(tmp_path, recipe, expect):
    res = loopnet("fit", "--config", str(ROOT / f"configs/{recipe}.yaml"), *SMALL, cwd=tmp_path)
    assert res.code == 0, res.err[-3000:]
    (run,) = (tmp_path / "runs").glob("*/version_0")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed"
    import yaml

    cfg = yaml.safe_load((run / "config.yaml").read_text())["model"]
    for key, value in expect.items():
        got = cfg["optim"][key] if key == "optimizer" else cfg["config"][key]
        assert got == value, key
    rounds = scalars(run, "train/rounds")
    assert sorted(rounds) == [0, 1, 2] and all(1 <= r <= cfg["config"]["max_rounds"] for r in rounds.values())
    assert len(scalars(run, "val/loss")) == 1  # at the mean R (cpu.yaml sets eval_rounds: null)
    visits = summary["last_visit_stats"]  # the last step: prelude, the rounds that ran, coda
    assert list(visits)[:4] == ["p1_attn", "p1_ffn", "p2_attn", "p2_ffn"]
    assert list(visits)[-4:] == ["c1_attn", "c1_ffn", "c2_attn", "c2_ffn"]
    ran, rest = divmod(len(visits) - 8, 2 * cfg["config"]["n_blocks"])  # the loop's rounds
    if cfg["config"]["round_draw"] == "sequence":  # train/rounds: the sequences' mean R_i; the pass runs their most
        assert rest == 0 and math.ceil(rounds[2]) <= ran <= cfg["config"]["max_rounds"]
    else:
        assert rest == 0 and ran == rounds[2]
    if recipe == "parcae_style":
        decay = scalars(run, "injection/spectral_norm")
        assert sorted(decay) == [0, 1, 2] and all(0 < a < 1 for a in decay.values())
        # the mean decay is at most the largest (up to fp32's rounding of the mean: at init every decay is √(1/5))
        assert all(0 < a <= decay[s] * (1 + 1e-6) for s, a in scalars(run, "injection/contraction").items())
