"""z-loss (in the fused head kernel and the plain path, and logged) and Muon on the blocks' matrices with
AdamW on the rest."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from loopnet.model import LoopedTransformer
from loopnet.model.kernels import LinearCrossEntropy
from loopnet.training.module import LoopedLM, OptimConfig
from loopnet.training.optimizers import MuonWithAdamW
from tests.helpers import tiny_config
from tests.training.test_recipe_rounds import fit


# ------------------------------------------------------------------------------ z-loss
def reference_loss(x, w, targets, c):
    """F.cross_entropy + c·mean((log Z)²) over the rows with a target, differentiated by autograd."""
    logits = x @ w.t()
    valid = targets != -1
    log_z = torch.logsumexp(logits, -1)
    return F.cross_entropy(logits, targets, ignore_index=-1) + c * (log_z[valid] ** 2).mean(), (
        log_z[valid] ** 2
    ).mean()


@pytest.mark.parametrize("c", [1e-4, 0.3])
def test_fused_head_z_loss_value_and_gradients_match_autograd(c):
    torch.manual_seed(0)
    x, w = torch.randn(24, 16) * 2, torch.randn(40, 16)
    targets = torch.randint(0, 40, (24,))
    targets[[3, 7]] = -1
    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    loss, logits, z = LinearCrossEntropy.apply(xs, ws, targets, c)
    (2.5 * loss).backward()  # an upstream gradient other than 1
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    ref, ref_z = reference_loss(xr, wr, targets, c)
    (2.5 * ref).backward()
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(z, ref_z, rtol=1e-6, atol=1e-6)
    # Both sum the same N = 24 per-row terms G_ri·x_rj into a gradient entry, in other orders, from a logit
    # gradient G = ∂L/∂z computed with a few fp32 roundings each (softmax, the (1 + 2c·log Z) scale, the
    # one-hot): each entry may move by up to ~8·N·u·Σ_r |G_ri|·|x_rj| (u = 2^-24); a wrong gradient is off
    # by the order of the gradient itself.
    logits = (x @ w.t()).requires_grad_()
    valid = targets != -1
    (G,) = torch.autograd.grad(
        2.5
        * (F.cross_entropy(logits, targets, ignore_index=-1) + c * (torch.logsumexp(logits, -1)[valid] ** 2).mean()),
        logits,
    )
    n, u = x.size(0), 2.0**-24
    torch.testing.assert_close(xs.grad, xr.grad, rtol=0, atol=8 * n * u * (G.abs() @ w.abs()).max().item())
    torch.testing.assert_close(ws.grad, wr.grad, rtol=0, atol=8 * n * u * (G.abs().t() @ x.abs()).max().item())
    assert LinearCrossEntropy.apply(xs, ws, targets)[0].item() == pytest.approx(ref.item() - c * ref_z.item(), rel=1e-6)


def test_the_model_adds_the_z_term_on_the_fused_and_the_plain_path():
    torch.manual_seed(0)
    model = LoopedTransformer(tiny_config())
    model.z_loss = 0.01
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    logits, loss = model(idx, idx)  # fused (fp32, grad)
    z = model.z_term
    with torch.no_grad():
        plain_logits, plain_loss = model(idx, idx)  # the plain path
    expected = (torch.logsumexp(plain_logits, -1) ** 2).mean()
    torch.testing.assert_close(z, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model.z_term, expected, rtol=1e-5, atol=1e-6)
    ce = F.cross_entropy(plain_logits.flatten(0, 1), idx.flatten())
    torch.testing.assert_close(plain_loss, ce + 0.01 * expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(loss, plain_loss, rtol=1e-5, atol=1e-6)


def test_z_loss_is_logged_as_the_term_added(tmp_path):
    lm, rows = fit(tmp_path, steps=2, optim=OptimConfig(lr=1e-2, warmup_steps=1, decay_steps=10, z_loss=0.05))
    for _, _, _, metrics, _ in rows:
        assert metrics["train/z_loss"] > 0
    # The last forward was the last step's: its logged term is c times its mean (log Z)².
    assert rows[-1][3]["train/z_loss"] == pytest.approx(0.05 * lm.model.z_term.item(), rel=1e-6)
    assert "train/rounds" not in rows[0][3]  # fixed R: no draw logged


# ------------------------------------------------------------------------------ Muon
def test_muon_takes_the_blocks_matrices_and_adamw_the_rest():
    torch.manual_seed(0)
    lm = LoopedLM(
        config=tiny_config(n_prelude=1, n_coda=1, wiring="inject", injection="diagonal"),
        optim=OptimConfig(optimizer="muon", lr=1e-3, muon_lr=0.02, weight_decay=0.1, decay_steps=10),
    )
    opt = lm.configure_optimizers()["optimizer"]
    assert isinstance(opt, MuonWithAdamW)
    (muon_group,) = opt.muon.param_groups
    names = {id(p): n for n, p in lm.named_parameters()}
    muon = sorted(names[id(p)] for p in muon_group["params"])
    expected = sorted(
        f"model.{part}.{i}.{s}.{w}"
        for part, n in (("prelude", 1), ("blocks", 2), ("coda", 1))
        for i in range(n)
        for s, ws in (("attn", ("f.qkv_proj.weight", "f.o_proj.weight")), ("ffn", ("f.fc1.weight", "f.fc2.weight")))
        for w in ws
    )
    assert muon == expected and all(p.ndim == 2 for p in muon_group["params"])
    assert muon_group["initial_lr"] == 0.02 and muon_group["momentum"] == 0.95  # peak rates; lr: warm-up's first
    adamw = {names[id(p)] for g in opt.adamw.param_groups for p in g["params"]}
    assert adamw == set(names.values()) - set(muon)  # everything else: embeddings, norms, injection
    assert {"model.wte.weight", "model.injection.B", "model.final_norm.weight"} <= adamw
    assert [g["initial_lr"] for g in opt.adamw.param_groups] == [1e-3, 1e-3]
    assert opt.param_groups == opt.muon.param_groups + opt.adamw.param_groups


def test_a_muon_step_is_torch_muon_plus_adamw_and_its_state_round_trips():
    torch.manual_seed(0)
    a, b, c = (
        torch.nn.Parameter(torch.randn(8, 6)),
        torch.nn.Parameter(torch.randn(6)),
        torch.nn.Parameter(torch.randn(5, 4)),
    )
    ref = [p.detach().clone().requires_grad_() for p in (a, b, c)]
    opt = MuonWithAdamW([{"params": [a, c]}], [{"params": [b]}], muon=dict(lr=0.02), adamw=dict(lr=1e-3))
    ref_muon, ref_adamw = torch.optim.Muon([ref[0], ref[2]], lr=0.02), torch.optim.AdamW([ref[1]], lr=1e-3)
    for step in range(3):
        for p, r in zip((a, b, c), ref):
            g = torch.randn_like(p)
            p.grad, r.grad = g.clone(), g.clone()
        opt.step()
        ref_muon.step(), ref_adamw.step()
        for p, r in zip((a, b, c), ref):
            assert torch.equal(p.detach(), r.detach())
    state = opt.state_dict()
    fresh = MuonWithAdamW([{"params": [a, c]}], [{"params": [b]}], muon=dict(lr=0.02), adamw=dict(lr=1e-3))
    fresh.load_state_dict(state)
    assert torch.equal(fresh.muon.state[a]["momentum_buffer"], opt.muon.state[a]["momentum_buffer"])
    assert fresh.param_groups[0] is fresh.muon.param_groups[0]


def test_a_fit_with_muon_schedules_both_rates_and_lowers_the_loss(tmp_path):
    lm, rows = fit(
        tmp_path,
        steps=6,
        optim=OptimConfig(optimizer="muon", lr=3e-3, muon_lr=0.02, warmup_steps=2, decay_steps=6, weight_decay=0.0),
    )
    opt = lm.optimizers().optimizer
    # After 6 steps the cosine schedule (min_lr_ratio 0.1) sits at its floor for both.
    assert opt.muon.param_groups[0]["lr"] == pytest.approx(0.002)
    assert opt.adamw.param_groups[0]["lr"] == pytest.approx(3e-4)
    losses = [m["train/loss"] for *_, m, _ in rows]
    assert losses[-1] < losses[0]


# ------------------------------------------------------------------------------ loopnet probe --groups with Muon
@pytest.mark.parametrize("rounds", [1, 4])
def test_muon_beta_scaled_ratio_at_init_follows_the_sign_step_theory(rounds):
    """Muon's step is an orthogonalised matrix whose size does not follow the gradient's, like AdamW's sign-like
    first step, so the DeepNorm/DeepLoop ratio of the β-scaled matrices' output change is (β/α)'s, 2√N, within
    the tolerance `tests/study/test_update_groups.py` derives for AdamW (2·β²/α of DeepNorm at this N)."""
    from loopnet.model.scales import residual_scales
    from loopnet.study import update_groups as ug
    from tests.study.test_update_groups import TINY, _ratio

    n = TINY.n_blocks * rounds
    alpha, beta = residual_scales("deepnorm", n)
    ratio, changes = _ratio("muon", rounds, 1e-3)
    assert ug.theory_ratio("muon", n) == 2 * math.sqrt(n)
    assert abs(ratio / (2 * math.sqrt(n)) - 1) <= 2 * beta**2 / alpha, ratio
    assert all(changes[s]["VOfc"] > 0 for s in changes)


@pytest.mark.slow
def test_probe_groups_prints_muons_ratio_beside_adamws_and_sgds(tmp_path, capsys):
    from loopnet.study import probe
    from tests.study.test_update_groups import REPO

    args = [
        "--config",
        str(REPO / "configs/deeploop_r6.yaml"),
        "--config",
        str(REPO / "configs/cpu.yaml"),
        "--model.config.d_model",
        "32",
        "--model.config.n_heads",
        "2",
        "--model.config.seq_len",
        "16",
        "--data.batch_size",
        "2",
    ]
    out = tmp_path / "probe"
    probe.main(
        [
            *args,
            "--groups",
            "--optimizers",
            "adamw",
            "sgd",
            "muon",
            "--rounds",
            "2",
            "--schemes",
            "deepnorm",
            "deeploop",
            "--seeds",
            "1",
            "--out",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    for kind in ("adamw", "sgd", "muon"):
        assert f"DeepNorm/DeepLoop {kind:>5}" in printed
    md = (out / "report.md").read_text()
    assert "## Muon (+ AdamW on the rest): output change per group" in md
    assert "| muon | init | 2 | 4 | 4.0 (2√N) |" in md
