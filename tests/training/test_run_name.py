"""Run folders of different model shapes never share a name (`cpu.yaml`'s d = 128 and
`study_cpu.yaml`'s d = 64 both logged into runs/deeploop_carry_k2_r6/, so the next `--ckpt_path last` was
refused as ambiguous)."""

import dataclasses
import sys

import pytest

from loopnet.model import RUN_SETTINGS, LoopConfig
from loopnet.training.run_folders import run_name
from tests.reliability.helpers import ROOT, SHORT, loopnet

pytestmark = pytest.mark.slow

CPU = ["--config", str(ROOT / "configs/deeploop_r6.yaml"), "--config", str(ROOT / "configs/cpu.yaml")]
STUDY = [*CPU, "--config", str(ROOT / "configs/study_cpu.yaml")]


def logger_name(tmp_path, monkeypatch, args) -> str:
    """The run folder name `loopnet fit <args>` logs into (the CLI's own resolution, nothing run)."""
    monkeypatch.setattr(sys, "argv", ["loopnet"])
    from loopnet.data import TokenStreamDataModule
    from loopnet.training.cli import LoopnetCLI, OneLineErrorParser
    from loopnet.training.defaults import TRAINER_DEFAULTS
    from loopnet.training.module import LoopedLM

    cli = LoopnetCLI(
        LoopedLM,
        TokenStreamDataModule,
        trainer_defaults=TRAINER_DEFAULTS,
        auto_configure_optimizers=False,
        parser_class=OneLineErrorParser,
        run=False,
        args=[*args, "--trainer.logger.init_args.save_dir", str(tmp_path / "runs")],
    )
    return cli.trainer.logger.name


def test_the_cpu_overlays_name_different_folders(tmp_path, monkeypatch):
    assert logger_name(tmp_path, monkeypatch, CPU) == "deeploop_carry_k2_r6_d128_h4_ctx128"
    assert logger_name(tmp_path, monkeypatch, STUDY) == "deeploop_carry_k2_r6_d64_h4_ctx64_v19136"


OTHER = {
    "d_model": 780,
    "n_heads": 4,
    "init": "normal",
    "wiring": "lt",
    "injection": "attention",
    "inject_into": "every",
    "positions": "rope",
    "norm": "layernorm",
    "loss_rounds": "all",
    "branch_scale": "wang",
    "round_sampling": "poisson_truncated",
    "backprop_rounds": 2,
    "max_rounds": 20,
    "scales_depth": "sampled",
    "round_draw": "sequence",
    "mup_base_width": 96,
    "completep_alpha": 0.5,
    "mlp": "swiglu",
    "ffn_width": 100,
    "state_init": "random",
    "norm_eps": 1e-5,
    "n_kv_heads": 2,
}
SAMPLED = {"round_sampling": "poisson_truncated"}  # the fields that act on sampled rounds need them
BASE = {
    "branch_scale": {"residual": "preln"},
    "branch_lambda": {"residual": "preln", "branch_scale": "wang"},  # Pre-LN's ε
    "max_rounds": SAMPLED,
    "round_curriculum_steps": SAMPLED,
    "scales_depth": SAMPLED,
    "round_draw": SAMPLED,
    "state_init": {"wiring": "inject", "injection": "linear"},  # the state a learned injection starts from
    "exit_kl": {"exit_gate": True, "loss_rounds": "expected"},  # Ouro's prior acts on the expected loss
}
MUP = {"parametrization": "mup", "mup_base_width": 48}
COMPLETEP = {"parametrization": "completep", "mup_base_width": 48, "completep_base_depth": 4, "residual": "preln"}
BASE |= {"mup_base_width": MUP, "completep_base_depth": COMPLETEP, "completep_alpha": COMPLETEP}
CHANGE = {"parametrization": MUP}  # μP needs its base width: the field changes with it


def _other_value(field: dataclasses.Field, base: LoopConfig):
    """A valid value of `field` other than `base`'s."""
    value = getattr(base, field.name)
    if field.name in OTHER:
        return OTHER[field.name]
    return not value if isinstance(value, bool) else value + (1 if isinstance(value, int) else 0.5)


@pytest.mark.parametrize(
    "field", [f for f in dataclasses.fields(LoopConfig) if f.name not in ("residual", "p")], ids=lambda f: f.name
)
def test_every_field_that_a_checkpoint_must_match_is_in_the_name(field):
    base = LoopConfig(**BASE.get(field.name, {}))
    change = CHANGE[field.name] if field.name in CHANGE else {field.name: _other_value(field, base)}
    changed = dataclasses.replace(base, **change)
    same = run_name(dataclasses.asdict(changed)) == run_name(dataclasses.asdict(base))
    assert same == (field.name in RUN_SETTINGS)  # a runtime field (dropout, ...) resumes in the same folder


def test_schemes_name_their_runs():
    base = dataclasses.asdict(LoopConfig())
    assert run_name(base) == "deeploop_carry_k2_r6_d768"
    assert run_name({**base, "residual": "scaled", "p": 0.4}) == "p0.4_carry_k2_r6_d768"


def test_resuming_last_after_a_run_of_another_width(tmp_path):
    """Two shapes fitted in one folder; `--ckpt_path last` of the first resumes it (it was refused as
    ambiguous: both runs were versions of one run name)."""
    wide = ["--model.config.d_model", "64", "--model.config.n_heads", "4"]
    for extra in ([], wide):
        res = loopnet("fit", *SHORT, *extra, cwd=tmp_path)
        assert res.code == 0, res.err[-3000:]
    assert len(list((tmp_path / "runs").iterdir())) == 2
    res = loopnet("fit", *SHORT, "--trainer.max_steps", "3", "--ckpt_path", "last", cwd=tmp_path)
    assert res.code == 0, res.err[-3000:]
    assert f"resuming from {tmp_path}/runs/deeploop_carry_k2_r2_d32_h2_ctx32/version_0/checkpoints/last.ckpt" in res.err
