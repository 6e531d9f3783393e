"""The probe that separates the update's terms by parameter group, and norm_affine."""

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from loopnet.model import LoopConfig
from loopnet.model.scales import residual_scales
from loopnet.study import update_groups as ug
from loopnet.training.module import OptimConfig
from tests.reliability.helpers import loopnet

REPO = Path(__file__).resolve().parents[2]
TINY = LoopConfig(vocab_size=128, seq_len=16, d_model=32, n_heads=2, n_blocks=2, n_rounds=1)


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, TINY.vocab_size, (2, TINY.seq_len + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


@pytest.mark.parametrize("norm_affine", [True, False])
def test_every_parameter_element_is_in_exactly_one_group(norm_affine):
    lm = ug.fresh_model(replace(TINY, norm_affine=norm_affine, tie_embeddings=False), OptimConfig(), "deepnorm", 2, 1)
    masks = ug.group_masks(lm.model)
    for name, p in lm.model.named_parameters():
        total = sum(masks[g].get(name, torch.zeros_like(p)) for g in ug.GROUPS)
        assert torch.equal(total, torch.ones_like(p)), name
    d = TINY.d_model
    qkv = "blocks.0.attn.f.qkv_proj.weight"
    assert masks["QK"][qkv][: 2 * d].eq(1).all() and masks["VOfc"][qkv][2 * d :].eq(1).all()
    assert "lm_head.weight" in masks["embed+head"] and "blocks.1.ffn.f.fc2.weight" in masks["VOfc"]
    assert bool(masks["norm"]) == norm_affine


def test_norm_affine_false_has_no_norm_gains_and_default_is_unchanged():
    from loopnet.model import LoopedTransformer

    plain = LoopedTransformer(replace(TINY, norm_affine=False))
    assert not [n for n, _ in plain.named_parameters() if "norm" in n]
    assert plain(batch()[0])[0].isfinite().all()
    default = LoopedTransformer(TINY)
    assert "final_norm.weight" in dict(default.named_parameters())  # old checkpoints' keys still load
    assert LoopedTransformer(replace(TINY, norm="layernorm", norm_affine=False)).final_norm.weight is None
    # The norm group's update is then empty: its output change is exactly zero.
    lm = ug.fresh_model(replace(TINY, norm_affine=False), OptimConfig(lr=1e-3), "deeploop", 2, 1)
    got = ug.measure_groups(lm, batch(), "adamw", 1e-3)
    assert got["norm"] == 0.0 and got["VOfc"] > 0


def test_ratio_rows_pair_the_schemes_at_the_same_starting_point():
    row = {**{g: (1.0, 0.0, 1) for g in (*ug.GROUPS, "all")}, "n_blocks": 2}
    summary = {
        ("deepnorm-nogain@step100", 6, "sgd"): {**row, "VOfc": (48.0, 0.0, 1)},
        ("deeploop-nogain@step100", 6, "sgd"): row,
        ("deeploop", 6, "sgd"): row,
    }
    (r,) = ug.ratio_rows(summary)
    assert (r["N"], r["theory"], r["VOfc"], ug.where(r["suffix"])) == (12, 48, 48.0, "nogain step100")
    assert ug.where("") == "init" and ug.where("@step0") == "step0"


def test_checkpoints_from_before_norm_affine_still_load():
    from dataclasses import asdict

    from loopnet.checkpoints import check_model_config

    old = {k: v for k, v in asdict(LoopConfig()).items() if k != "norm_affine"}  # written before the field existed
    check_model_config(old, asdict(LoopConfig()))
    with pytest.raises(ValueError, match="norm_affine: checkpoint True vs config False"):
        check_model_config(old, asdict(LoopConfig(norm_affine=False)))


def _ratio(kind, rounds, lr):
    changes = {}
    for scheme in ("deepnorm", "deeploop"):
        lm = ug.fresh_model(TINY, OptimConfig(lr=lr), scheme, rounds, 1)
        changes[scheme] = ug.measure_groups(lm, batch(), kind, lr)
    return changes["deepnorm"]["VOfc"] / changes["deeploop"]["VOfc"], changes


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
@pytest.mark.parametrize("rounds", [1, 4])
def test_beta_scaled_ratio_at_init_follows_the_theory(kind, rounds):
    """DeepNorm/DeepLoop output change of the β-scaled matrices: 4N under SGD, 2√N under AdamW's first
    (sign-like) step. Both models share their unscaled weights (same seed) and the batch. Tolerance: the
    bound is the leading order in the branch's share of the pre-Norm stream; the first neglected term is
    that share itself, ‖f(x)‖/‖αx‖ ≈ β²/α (two β-scaled matrices per branch; the Norm divides by
    ‖αx + f(x)‖, not ‖αx‖), largest for DeepNorm, and it enters the squared sensitivity twice: relative
    tolerance 2·β²/α of DeepNorm at this N (0.35 at N = 2, 0.125 at N = 8; measured 0.09 and 0.01)."""
    n = TINY.n_blocks * rounds
    alpha, beta = residual_scales("deepnorm", n)
    ratio, _ = _ratio(kind, rounds, 1e-3)
    theory = ug.theory_ratio(kind, n)
    assert abs(ratio / theory - 1) <= 2 * beta**2 / alpha, (ratio, theory)


def test_group_changes_add_up_to_the_full_step_to_first_order():
    """SGD: the groups' state changes, as vectors, sum to the full step's up to second-order terms, so the
    residual halves with the learning rate (ratio 2 up to its own relative size, ~1%, and the fp32 floor
    ~1e-7·‖x‖/‖δ‖ ≈ 1e-5 of it)."""
    residual = {}
    for lr in (0.02, 0.01):
        lm = ug.fresh_model(TINY, OptimConfig(lr=lr), "deepnorm", 4, 1)
        got = ug.measure_groups(lm, batch(), "sgd", lr)
        residual[lr] = got["additivity"]
        assert got["all"] <= sum(got[g] for g in ug.GROUPS) * (1 + got["additivity"])
    assert residual[0.02] < 0.05
    assert residual[0.02] / residual[0.01] == pytest.approx(2.0, rel=0.1)


def test_measuring_leaves_the_weights_unchanged():
    lm = ug.fresh_model(TINY, OptimConfig(lr=1e-3), "deeploop", 2, 1)
    before = {n: p.detach().clone() for n, p in lm.model.named_parameters()}
    ug.measure_groups(lm, batch(), "adamw", 1e-3, clip=1.0)
    assert all(torch.equal(before[n], p) for n, p in lm.model.named_parameters())


@pytest.mark.slow
def test_probe_groups_from_checkpoints_of_a_real_run(tmp_path):
    """A 4-step fit (in this process) saving a checkpoint every 2 steps, then `loopnet probe --groups --checkpoints ... --with_init`:
    DeepNorm and DeepLoop at steps 0, 2 and 4, the ratio table against 4N and 2√N."""
    env_args = [
        "--config",
        "configs/deeploop_r6.yaml",
        "--config",
        "configs/cpu.yaml",
        "--model.config.d_model",
        "32",
        "--model.config.n_heads",
        "2",
        "--model.config.seq_len",
        "16",
        "--data.batch_size",
        "2",
        "--model.config.n_rounds",
        "2",
    ]
    ckpts = []
    for scheme in ("deepnorm", "deeploop"):
        res = loopnet(
            "fit",
            *env_args,
            "--model.config.residual",
            scheme,
            "--trainer.max_steps",
            "4",
            "--trainer.val_check_interval",
            "4",
            "--trainer.limit_val_batches",
            "1",
            "--checkpoint.every_n_train_steps",
            "2",
            "--checkpoint.save_top_k",
            "-1",
            "--checkpoint.monitor",
            "null",
            "--checkpoint.filename",
            "step{step:06d}",
            "--trainer.logger.init_args.save_dir",
            str(tmp_path),
            "--trainer.logger.init_args.name",
            scheme,
            "--trainer.logger.init_args.version",
            "",
            "--trainer.enable_progress_bar",
            "false",
            cwd=REPO,
        )
        assert res.code == 0, res.err[-3000:]
        found = sorted((tmp_path / scheme / "checkpoints").glob("step*.ckpt"))
        assert [p.name for p in found] == ["step000002.ckpt", "step000004.ckpt"]
        ckpts += [str(p) for p in found]
    from loopnet.study import probe

    out = tmp_path / "probe"
    probe.main([*env_args, "--groups", "--checkpoints", *ckpts, "--with_init", "--seeds", "1", "--out", str(out)])
    rows = json.loads((out / "groups.json").read_text())["rows"]
    assert {r["label"] for r in rows} == {f"{s}@step{k}" for s in ("deepnorm", "deeploop") for k in (0, 2, 4)}
    assert all(math.isfinite(r["all"]) and r["all"] > 0 for r in rows)
    md = (out / "report.md").read_text()
    for step in ("step0", "step2", "step4"):
        assert f"| sgd | {step} | 2 | 4 | 16.0 (4N) |" in md and f"| adamw | {step} | 2 | 4 | 4.0 (2√N) |" in md
    assert "that group's update is applied (every other group's update zeroed)" in md
    assert (out / "groups.png").stat().st_size > 5000


def _save(path, obj):
    torch.save(obj, path)
    return str(path)


def test_from_checkpoint_reads_a_loopnet_checkpoint(tmp_path):
    from dataclasses import asdict

    from loopnet.training.module import LoopedLM

    torch.manual_seed(0)
    lm = LoopedLM(config=replace(TINY, residual="scaled", p=0.4, n_rounds=2), optim=OptimConfig(lr=3e-4))
    path = _save(
        tmp_path / "step.ckpt",
        {
            "hyper_parameters": {"config": asdict(lm.config), "optim": asdict(lm.optim)},
            "state_dict": lm.state_dict(),
            "global_step": 7,
        },
    )
    got, state, step, name = ug.from_checkpoint(path)
    assert (state, step, name, got.config.n_rounds, got.optim.lr) == (None, 7, "p0.4", 2, 3e-4)
    assert all(torch.equal(p, dict(lm.state_dict())[n]) for n, p in got.state_dict().items())


class NotData:  # a pickled object: code the restricted loader refuses to import
    pass


@pytest.mark.parametrize(
    "bad,says",
    [
        ("missing", "does not exist"),
        ("folder", "is a folder, not a checkpoint file"),
        ("empty", "is empty (0 bytes)"),
        ("corrupt", "is not a readable checkpoint, it is corrupt or truncated"),
        ("code", "unpickling it would import or run code"),
        ("no_state", "is not a Lightning checkpoint"),
        ("not_loopnet", "is not a loopnet checkpoint (no hyper_parameters.config and .optim)"),
    ],
)
def test_probe_refuses_a_bad_checkpoint_in_one_line(tmp_path, capsys, bad, says):
    """`loopnet probe --groups --checkpoints BAD`: the one-line refusals of `loopnet.checkpoints`, before
    any data is read or anything written."""
    from loopnet.study import probe

    path = tmp_path / "bad.ckpt"
    if bad == "folder":
        path.mkdir()
    elif bad == "empty":
        path.write_bytes(b"")
    elif bad == "corrupt":
        _save(path, {"state_dict": {"w": torch.ones(64)}})
        path.write_bytes(path.read_bytes()[:100])  # truncated
    elif bad == "code":
        _save(path, {"state_dict": {}, "obj": NotData()})
    elif bad == "no_state":
        _save(path, {"weights": torch.ones(2)})
    elif bad == "not_loopnet":
        _save(path, {"state_dict": {"w": torch.ones(2)}, "hyper_parameters": {"lr": 1.0}})
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_:
        probe.main(["--groups", "--checkpoints", str(path), "--out", str(out)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and err.startswith("loopnet probe: error: "), err
    assert str(path) in err and says in err, err
    assert not out.exists()
