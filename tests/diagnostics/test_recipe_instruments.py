"""Every instrument on every model of the recipe (prelude and coda, learned injection, qk-norm, sampled
rounds, z-loss, Muon): per-visit norms and gradient contributions, κ̂, the update size, the depth profile and
`loopnet compare`, each against the independent computation the suite already has for the seed papers'
models (tests/diagnostics/test_visit_probe.py, test_update_size.py, test_compare.py)."""

from __future__ import annotations

import math

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from loopnet.diagnostics import VisitDiagnostics, VisitProbe
from loopnet.diagnostics.callback import physical_sublayers
from loopnet.diagnostics.compare import compare_figure, read_visits
from loopnet.diagnostics.profile import PROFILE_QUANTITIES, profile_pngs
from loopnet.diagnostics.tags import custom_scalars_layout, visit_quantities, visit_tag
from loopnet.diagnostics.update_size import relative_changes, round_outputs
from loopnet.model import LoopedTransformer, Visit, visit_order
from loopnet.model.rounds import draw_rounds
from loopnet.training.module import OptimConfig

from .helpers import VOCAB, T, random_tokens, tiny_config, tiny_module, trainer

MODELS = {
    "prelude_coda_linear": dict(n_prelude=1, n_coda=1, wiring="inject", injection="linear"),
    "diagonal": dict(n_prelude=1, wiring="inject", injection="diagonal"),
    "qk_norm": dict(qk_norm=True, residual="preln"),
    "sampled": dict(
        n_coda=1,
        wiring="inject",
        round_sampling="poisson_truncated",
        backprop_rounds=2,
        max_rounds=5,
        scales_depth="sampled",
    ),
}


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (2, T), generator=g), torch.randint(0, VOCAB, (2, T), generator=g)


# ------------------------------------------------------------------------------ per-visit gradients and κ̂
@pytest.mark.parametrize("case", list(MODELS))
def test_per_visit_contributions_sum_to_every_weights_gradient_and_kappa_agrees(case):
    """As test_visit_probe.py: the visits' g_{r,j} add up to each parameter's .grad (prelude and coda sublayers
    included), κ̂ from squared norms equals κ̂ from the kept tensors, and an untied sublayer's κ̂ is 1."""
    cfg = tiny_config(**MODELS[case])
    d = draw_rounds(cfg, 3, seed=0)
    kappas = []
    for keep in (True, False):
        torch.manual_seed(0)
        model = LoopedTransformer(cfg)
        probe = VisitProbe(keep_grads=keep)
        model.attach_observer(probe)
        idx, tgt = batch()
        _, loss = model(idx, tgt, rounds=d.rounds, grad_rounds=d.grad_rounds, alpha=d.alpha)
        model.attach_observer(None)
        loss.backward()
        physical = physical_sublayers(model)
        assert probe.visits == visit_order(cfg.n_blocks, d.rounds, cfg.n_prelude, cfg.n_coda)
        assert set(physical) == {v.physical for v in probe.visits}
        if keep:
            for j, params in physical.items():
                visits = [v for v in probe.visits if v.physical == j]
                for name, weight in params.items():
                    total = sum(probe.grads[v][name] for v in visits if name in probe.grads[v])
                    err = torch.linalg.vector_norm(total - weight.grad) / torch.linalg.vector_norm(weight.grad)
                    assert err <= 1e-6, (j, name, err)
        kappas.append(probe.kappa(physical))
    for j in kappas[0]:
        assert torch.allclose(kappas[0][j], kappas[1][j], rtol=1e-5), j
        if not j.startswith("k") and j != "model":  # p1_attn, c1_ffn: one visit each
            assert kappas[0][j].item() == pytest.approx(1.0, abs=1e-5)
        elif j != "model":
            assert 0 <= kappas[0][j] <= d.grad_rounds + 1e-5  # at most the visits that got gradients


# ------------------------------------------------------------------------------ the update size
class LastStates:
    """As test_update_size.py: the output of the last loop visit of every round (an independent route to the
    end-of-round states)."""

    def __init__(self, n_blocks):
        self.n_blocks, self.states = n_blocks, {}

    def on_visit(self, visit, trace):
        if visit == Visit(visit.round, self.n_blocks, "ffn"):
            self.states[visit.round] = trace.state.detach().clone()


@pytest.mark.parametrize("case", list(MODELS))
def test_update_size_at_the_drawn_rounds_matches_a_direct_computation(case):
    cfg = tiny_config(**MODELS[case])
    d = draw_rounds(cfg, 5, seed=0)
    torch.manual_seed(0)
    model = LoopedTransformer(cfg)
    idx, _ = batch()

    def direct():
        rec = LastStates(cfg.n_blocks)
        model.eval()
        model.attach_observer(rec)
        with torch.no_grad():
            logits, _ = model(idx, rounds=d.rounds, alpha=d.alpha)
        model.attach_observer(None)
        model.train()
        return [rec.states[r] for r in range(1, d.rounds + 1)] + [logits]

    before, ref_before = round_outputs(model, idx, d.rounds, d.alpha), direct()
    for a, b in zip(before, ref_before, strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    changes = relative_changes(before, round_outputs(model, idx, d.rounds, d.alpha))
    ref_after = direct()
    for r in range(1, d.rounds + 1):
        want = (ref_after[r - 1] - ref_before[r - 1]).norm() / ref_before[r - 1].norm()
        assert torch.allclose(changes[f"update/output_change/r{r:02d}"], want, rtol=1e-4)
    want = (ref_after[-1] - ref_before[-1]).norm() / ref_before[-1].norm()
    assert torch.allclose(changes["update/logit_change"], want, rtol=1e-4)


def test_the_layout_has_a_category_per_round_up_to_max_rounds_and_one_for_prelude_and_coda():
    cfg = tiny_config(**MODELS["sampled"])
    layout = custom_scalars_layout(cfg.round_cap, untied=True)
    assert [c for c in layout if c.startswith("round")] == [f"round {r:02d}" for r in range(1, 6)]
    charts = layout["prelude and coda"]
    assert charts["resid_norm"] == ["Multiline", [r"^visits/resid_norm/[pc]\d+_"]]


# ------------------------------------------------------------------------------ end to end: callback, profile, compare
FITS = {
    **{k: (v, {}) for k, v in MODELS.items()},
    "z_loss": ({"n_prelude": 1, "wiring": "inject"}, {"z_loss": 0.01}),
    "muon": ({"n_coda": 1}, {"optimizer": "muon", "muon_lr": 0.02}),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(FITS))
def test_diagnostics_profile_and_compare_on_each_recipe_model(tmp_path, case):
    overrides, optim = FITS[case]
    cfg = tiny_config(**overrides)
    lm = tiny_module(config=cfg)
    lm.optim = OptimConfig(lr=1e-3, warmup_steps=2, **optim)
    lm.model.z_loss = lm.optim.z_loss
    diag = VisitDiagnostics(every_n_steps=1, histograms=False)
    trainer(tmp_path, [diag], max_steps=3).fit(lm, random_tokens())
    stats = diag.last_stats
    d = lm.draw(2)
    visits = visit_order(cfg.n_blocks, d.rounds, cfg.n_prelude, cfg.n_coda)
    assert list(stats["visits"]) == [v.tag for v in visits]
    for v in visits:  # every quantity of every visit, finite (gradients only where rounds got them)
        values = stats["visits"][v.tag]
        assert set(values) == set(visit_quantities(v))
        assert math.isfinite(values["resid_norm"]) and values["resid_norm"] > 0
        got_grad = not v.looped or v.round > d.rounds - d.grad_rounds
        assert (values["param_grad_norm"] > 0) == got_grad, v
    for j, kappa in stats["kappa"].items():
        if j != "model" and not j.startswith("k"):
            assert kappa == pytest.approx(1.0, abs=1e-5)
    assert all(r > 0 for r in stats["update_ratio"].values())
    assert set(stats["update_ratio"]) == {v.physical for v in visits}
    assert {f"output_change/r{r:02d}" for r in range(1, d.rounds + 1)} <= set(stats["update"])

    # The depth profile: one image per view; its values are the logged scalars, in forward order.
    run = next(tmp_path.glob("run/version_*"))
    acc = EventAccumulator(str(run), size_guidance={"scalars": 0, "images": 0}).Reload()
    assert {"depth/gradients", "depth/norms", "depth/skip_ratio"} <= set(acc.Tags()["images"])
    logged = {t: acc.Scalars(t)[-1].value for t in acc.Tags()["scalars"] if t.startswith("visits/")}
    assert profile_pngs(logged, visits)

    # `loopnet compare`: the visits in forward order over every logged step's rounds, and each line the
    # logged values of its step (nan, left out, where that step ran fewer rounds).
    order, by_step = read_visits(run)
    most = max(lm.draw(s).rounds for s in range(3))
    assert order == visit_order(cfg.n_blocks, most, cfg.n_prelude, cfg.n_coda)
    fig = compare_figure([("A", order, by_step)], steps=[2])
    for ax, q in zip(fig.axes, PROFILE_QUANTITIES):
        (line,) = [ln for ln in ax.lines if ln.get_label().startswith("A")]
        want = [
            (i, by_step[2][visit_tag(q, v)])
            for i, v in enumerate(order, start=1)
            if visit_tag(q, v) in by_step[2]
            and math.isfinite(by_step[2][visit_tag(q, v)])
            and (by_step[2][visit_tag(q, v)] > 0 or q in ("attn_logit_max", "attn_log_z"))
        ]
        assert list(line.get_xdata()) == [i for i, _ in want], q
        assert list(line.get_ydata()) == pytest.approx([y for _, y in want]), q
