"""VisitProbe and the κ̂_R estimator, on the real LoopedTransformer and on toy visits."""

import copy

import pytest
import torch
from torch import nn

from loopnet.diagnostics import VisitProbe, alignment
from loopnet.diagnostics.callback import physical_sublayers
from loopnet.model import LoopedTransformer, Visit, VisitTrace, visit_order

from .helpers import VOCAB, T, tiny_config
from .reference import expected_values, visit_gradients


def step(model, probe, seed=0, backward=True):
    g = torch.Generator().manual_seed(seed)
    idx, tgt = torch.randint(0, VOCAB, (2, T), generator=g), torch.randint(0, VOCAB, (2, T), generator=g)
    model.attach_observer(probe)
    _, loss = model(idx, tgt)
    model.attach_observer(None)
    if backward:
        loss.backward()
    return loss


def test_per_visit_contributions_sum_to_weight_grad():
    torch.manual_seed(0)
    model = LoopedTransformer(tiny_config(residual="deeploop"))
    probe = VisitProbe(keep_grads=True)
    step(model, probe)
    assert probe.visits == visit_order(2, 3)
    for j, params in physical_sublayers(model).items():
        visits = [v for v in probe.visits if v.physical == j]
        assert len(visits) == 3
        for name, weight in params.items():
            total = sum(probe.grads[v][name] for v in visits)
            err = torch.linalg.vector_norm(total - weight.grad) / torch.linalg.vector_norm(weight.grad)
            assert err <= 1e-6, (j, name, err)


@pytest.mark.parametrize("residual", ["postln", "preln", "deeploop"])
def test_kappa_from_norms_equals_kappa_from_kept_gradients(residual):
    """κ̂_R per sublayer and model-wide, and every ‖g_{r,j}‖², with and without kept gradients, against
    the model unrolled by hand (each visit its own copy of the weights: plain autograd, no probe)."""
    torch.manual_seed(0)
    base = LoopedTransformer(tiny_config(residual=residual))
    g = torch.Generator().manual_seed(0)
    batch = torch.randint(0, VOCAB, (2, T), generator=g), torch.randint(0, VOCAB, (2, T), generator=g)
    expected = expected_values(visit_gradients(base, [batch])[0])
    for keep in (False, True):
        model = copy.deepcopy(base)
        probe = VisitProbe(keep_grads=keep)
        step(model, probe)
        kappa = probe.kappa(physical_sublayers(model))
        assert kappa.keys() == {"k1_attn", "k1_ffn", "k2_attn", "k2_ffn", "model"}
        for j, value in kappa.items():
            want = expected["grad/kappa_model" if j == "model" else f"sublayers/kappa/{j}"]
            assert float(value) == pytest.approx(want, rel=1e-4), (keep, j)  # fp32 sums vs float64
        for v in probe.visits:
            assert float(probe.visit_grad_sq(v)) == pytest.approx(
                expected[f"visits/param_grad_norm/{v.tag}"] ** 2, rel=1e-4
            ), (keep, v)
    if residual == "preln":  # here the pooled ratio is not the mean of the sublayers' κ̂: either would not pass
        mean = sum(expected[f"sublayers/kappa/{j}"] for j in ("k1_attn", "k1_ffn", "k2_attn", "k2_ffn")) / 4
        assert abs(expected["grad/kappa_model"] - mean) > 1e-3 * mean


def test_gradient_accumulation_sums_micro_batches():
    torch.manual_seed(0)
    model = LoopedTransformer(tiny_config(residual="deepnorm"))
    probe = VisitProbe(keep_grads=True)
    step(model, probe, seed=0)
    step(model, probe, seed=1)  # .grad now holds two micro-batches
    num, _ = probe.alignment_terms(physical_sublayers(model))
    for j, params in physical_sublayers(model).items():
        direct = sum(p.grad.square().sum() for p in params.values())
        assert torch.allclose(num[j], direct, rtol=1e-5)
    v = Visit(2, 1, "attn")
    assert probe.n_fwd[v] == 2 and probe.n_act[v] == 2


def test_identical_visits_give_kappa_R():
    """Pre-LN with zero output projections (o_proj, fc2): every branch adds 0, so every visit reads
    the same stream x0 and receives the same ∂L/∂x; each visit's gradient is the same g, κ̂ = R."""
    torch.manual_seed(0)
    R = 3
    model = LoopedTransformer(tiny_config(residual="preln", n_rounds=R))
    with torch.no_grad():
        for block in model.blocks:
            block.attn.f.o_proj.weight.zero_()
            block.ffn.f.fc2.weight.zero_()
    probe = VisitProbe()
    step(model, probe)
    kappa = probe.kappa(physical_sublayers(model))
    for j, value in kappa.items():
        assert abs(float(value) - R) < 1e-4, (j, float(value))


class ToyLoop(nn.Module):
    """One shared weight W read by R visits through its own view; visit r sees input xs[r]."""

    def __init__(self, rounds: int):
        super().__init__()
        self.w = nn.Parameter(torch.randn(5, rounds))
        self.observer = None

    def forward(self, xs, c):
        loss = 0.0
        for r, x in enumerate(xs, start=1):
            view = self.w.view_as(self.w)
            y = view @ x
            self.observer.on_visit(Visit(r, 1, "ffn"), VisitTrace(x, 1.0, y, y, y, {"weight": view}))
            loss = loss + (y * c).sum()
        return loss


@pytest.mark.parametrize("case,expected", [("orthogonal", 1.0), ("identical", 4.0)])
def test_toy_visits_kappa(case, expected):
    R = 4
    torch.manual_seed(0)
    toy, c = ToyLoop(R), torch.randn(5)
    eye = torch.eye(R)
    xs = [eye[r] for r in range(R)] if case == "orthogonal" else [eye[0] * 2.0 for _ in range(R)]
    for keep in (False, True):
        toy.zero_grad()
        toy.observer = probe = VisitProbe(keep_grads=keep)
        toy(xs, c).backward()
        kappa = probe.kappa({"k1_ffn": {"weight": toy.w}})
        assert abs(float(kappa["k1_ffn"]) - expected) < 1e-5
        assert abs(float(kappa["model"]) - expected) < 1e-5


class TwoSublayerToy(nn.Module):
    """Two shared weights, each read by R visits through views: sublayer k1_attn (W1) sees orthogonal
    inputs e_r, sublayer k1_ffn (W2) the same input 2·e_1 at every visit; loss Σ_r c1·(W1 x_r) + c2·(W2 x'_r)."""

    def __init__(self, rounds: int):
        super().__init__()
        self.w1, self.w2 = nn.Parameter(torch.randn(5, rounds)), nn.Parameter(torch.randn(3, rounds))
        self.observer = None

    def forward(self, c1, c2):
        R, loss = self.w1.size(1), 0.0
        eye = torch.eye(R)
        for r in range(1, R + 1):
            for sublayer, w, x, c in (("attn", self.w1, eye[r - 1], c1), ("ffn", self.w2, 2.0 * eye[0], c2)):
                view = w.view_as(w)
                y = view @ x
                self.observer.on_visit(Visit(r, 1, sublayer), VisitTrace(x, 1.0, y, y, y, {"weight": view}))
                loss = loss + (y * c).sum()
        return loss


def test_model_kappa_is_the_pooled_ratio_not_the_mean_of_the_sublayers():
    """g_{r} = c ⊗ x_r. Orthogonal visits: ‖Σ_r g_r‖² = R‖c1‖², Σ_r ‖g_r‖² = R‖c1‖² (κ̂ = 1). Identical
    visits 2·e_1: ‖Σ_r g_r‖² = 4R²‖c2‖², Σ_r ‖g_r‖² = 4R‖c2‖² (κ̂ = R). Model-wide, pooled:
    κ̂ = (R‖c1‖² + 4R²‖c2‖²) / (R‖c1‖² + 4R‖c2‖²), which is not (1 + R)/2."""
    R = 4
    torch.manual_seed(0)
    toy = TwoSublayerToy(R)
    c1, c2 = torch.tensor([1.0, -2.0, 0.5, 3.0, 1.0]), torch.tensor([4.0, 2.0, -2.0])
    a, b = float(c1.square().sum()), float(c2.square().sum())
    pooled = (R * a + 4 * R**2 * b) / (R * a + 4 * R * b)
    assert abs(pooled - (1 + R) / 2) > 0.5  # the two readings are far apart here
    for keep in (False, True):
        toy.zero_grad()
        toy.observer = probe = VisitProbe(keep_grads=keep)
        toy(c1, c2).backward()
        kappa = probe.kappa({"k1_attn": {"weight": toy.w1}, "k1_ffn": {"weight": toy.w2}})
        assert float(kappa["k1_attn"]) == pytest.approx(1.0, rel=1e-6)
        assert float(kappa["k1_ffn"]) == pytest.approx(R, rel=1e-6)
        assert float(kappa["model"]) == pytest.approx(pooled, rel=1e-6)


def test_alignment_edge_cases():
    assert float(alignment(0.0, 0.0)) == 0.0  # no gradient flowed (e.g. truncated rounds)
    assert float(alignment(9.0, 3.0)) == 3.0


def test_forward_statistics_match_their_definitions():
    class Keep(VisitProbe):
        def on_visit(self, visit, trace):
            super().on_visit(visit, trace)
            self.traces = {**getattr(self, "traces", {}), visit: trace}

    torch.manual_seed(0)
    model = LoopedTransformer(tiny_config(residual="deeploop"))
    probe = Keep(hist_samples=100)
    step(model, probe, backward=False)
    for v in probe.visits:
        t = probe.traces[v]
        resid, state, ratio = probe.forward_stats(v).tolist()
        assert resid == pytest.approx(t.stream.square().mean().sqrt().item(), rel=1e-5)
        assert state == pytest.approx(t.state.square().mean().sqrt().item() - 1, abs=1e-5)  # state_norm_dev
        assert ratio == pytest.approx((t.branch.norm() / (t.alpha * t.x.norm())).item(), rel=1e-5)
    assert sorted(probe.hist) == [1, 2, 3]
    assert probe.hist[3]["state"].numel() >= 100 and probe.hist[3]["token_rms"].numel() == 2 * T
    # The histogram of round 3 samples the round's last visit (k2 ffn).
    last = probe.traces[Visit(3, 2, "ffn")].state.flatten()
    assert torch.equal(probe.hist[3]["state"], last[:: last.numel() // 100])


@pytest.mark.parametrize("keep_grads", [False, True])
def test_preln_state_is_the_stream_and_truncated_rounds_have_no_gradient(keep_grads):
    torch.manual_seed(0)
    model = LoopedTransformer(tiny_config(residual="preln", truncate_rounds=1))
    probe = VisitProbe(keep_grads=keep_grads)
    step(model, probe)
    for v in probe.visits:
        resid, state_dev, _ = probe.forward_stats(v).tolist()
        assert state_dev == pytest.approx(resid - 1, abs=1e-6)  # fp32 rounding of the subtraction
        if v.round == 1:  # run without grad: no hooks, no contribution
            assert float(probe.visit_grad_sq(v)) == 0.0 and probe.act_grad_norm(v).isnan()
        else:
            assert float(probe.visit_grad_sq(v)) > 0 and probe.act_grad_norm(v) > 0


def test_micro_batches_average_the_forward_values_and_the_output_is_read_off_the_logits():
    """Two micro-batches A and B of one size, same weights: every per-visit forward value and activation
    gradient norm is the mean of A's and B's alone, the attention maxima their maximum; the output's
    mean log Z and max |logit| are those of the logits themselves."""
    torch.manual_seed(0)
    model = LoopedTransformer(tiny_config(residual="deeploop"))
    g = torch.Generator().manual_seed(3)
    batches = [
        (torch.randint(0, VOCAB, (2, T), generator=g), torch.randint(0, VOCAB, (2, T), generator=g)) for _ in "AB"
    ]
    alone = []
    for idx, tgt in batches:
        probe = VisitProbe()
        model.attach_observer(probe)
        logits, loss = model(idx, tgt)
        model.attach_observer(None)
        loss.backward()
        alone.append(probe)
        out = probe.output_quantities()
        assert float(out["log_z"]) == pytest.approx(float(torch.logsumexp(logits.float(), -1).mean()), rel=1e-5)
        assert float(out["logit_absmax"]) == pytest.approx(float(logits.abs().max()), rel=1e-6)
    both = VisitProbe(keep_grads=True)
    for idx, tgt in batches:
        model.attach_observer(both)
        _, loss = model(idx, tgt)
        model.attach_observer(None)
        loss.backward()
    a, b = alone
    for v in both.visits:
        assert torch.allclose(both.forward_stats(v), (a.forward_stats(v) + b.forward_stats(v)) / 2, rtol=1e-5), v
        assert float(both.act_grad_norm(v)) == pytest.approx(
            float(a.act_grad_norm(v) + b.act_grad_norm(v)) / 2, rel=1e-5
        )
        qa, qb, q = a.attention_quantities(v), b.attention_quantities(v), both.attention_quantities(v)
        if v.sublayer == "attn":
            assert float(q["attn_logit_max"]) == max(float(qa["attn_logit_max"]), float(qb["attn_logit_max"]))
            assert float(q["attn_log_z"]) == pytest.approx(float(qa["attn_log_z"] + qb["attn_log_z"]) / 2, rel=1e-5)
        else:
            assert q == {}
    out, oa, ob = both.output_quantities(), a.output_quantities(), b.output_quantities()
    assert float(out["log_z"]) == pytest.approx(float(oa["log_z"] + ob["log_z"]) / 2, rel=1e-5)
    assert float(out["logit_absmax"]) == max(float(oa["logit_absmax"]), float(ob["logit_absmax"]))
    assert VisitProbe().output_quantities() == {} and torch.isnan(VisitProbe().act_grad_norm(both.visits[0]))


def test_branch_ratio_of_a_small_or_zero_skip_path():
    """branch_ratio = ‖f‖ / (α‖x‖) also below ‖x‖ = 1 (a stream near 0 early in a Post-LN model), and finite
    (‖f‖ / 1e-30) when the skip path is exactly 0."""
    probe = VisitProbe()
    x, branch = torch.full((1, 2, 4), 1e-3), torch.full((1, 2, 4), 2e-3)  # ‖x‖ = √8·1e-3, ‖f‖ = √8·2e-3
    trace = VisitTrace(x=x, alpha=0.5, branch=branch, stream=0.5 * x + branch, state=0.5 * x + branch, params={})
    probe.on_visit(Visit(1, 1, "attn"), trace)
    assert probe.forward_quantities(Visit(1, 1, "attn"))["branch_ratio"].item() == pytest.approx(4.0, rel=1e-6)
    zero = VisitTrace(x=torch.zeros(1, 2, 4), alpha=1.0, branch=branch, stream=branch, state=branch, params={})
    probe.on_visit(Visit(1, 1, "ffn"), zero)
    ratio = probe.forward_quantities(Visit(1, 1, "ffn"))["branch_ratio"].item()
    assert ratio == pytest.approx(8**0.5 * 2e-3 / 1e-30, rel=1e-6)


def test_by_default_the_probe_keeps_no_gradient_tensors_and_no_histogram_samples():
    torch.manual_seed(0)
    probe = VisitProbe()
    step(LoopedTransformer(tiny_config()), probe)
    assert probe.grads == {} and probe.hist == {} and len(probe.param_sq) == len(probe.visits)


def test_a_rounds_histogram_samples_its_last_visit_whatever_order_the_visits_arrive_in():
    """The last visit of a round (highest block, FFN after attention) is the round's output; an earlier visit
    seen after it (a block re-run in the backward) does not replace it, the same visit seen again (the next
    micro-batch) does."""
    probe = VisitProbe(hist_samples=4)

    def trace(value):
        x = torch.full((1, 2, 4), value)
        return VisitTrace(x=x, alpha=1.0, branch=x, stream=x, state=x, params={})

    probe.on_visit(Visit(1, 2, "ffn"), trace(3.0))
    probe.on_visit(Visit(1, 2, "attn"), trace(2.0))
    probe.on_visit(Visit(1, 1, "ffn"), trace(1.0))
    assert torch.equal(probe.hist[1]["state"], torch.full((4,), 3.0))
    probe.on_visit(Visit(1, 2, "ffn"), trace(5.0))
    assert torch.equal(probe.hist[1]["state"], torch.full((4,), 5.0))
    probe.on_visit(Visit(2, 1, "attn"), trace(7.0))
    assert torch.equal(probe.hist[2]["state"], torch.full((4,), 7.0)) and probe.hist[1]["state"][0] == 5.0


@pytest.mark.parametrize("keep_grads", [False, True])
def test_before_a_backward_every_alignment_term_is_zero_and_kappa_is_zero(keep_grads):
    """No gradient yet (a fresh probe, then a forward without backward): both terms are exact zeros, as
    0-d tensors, and κ̂ = 0 for every sublayer and the model."""
    torch.manual_seed(0)
    model = LoopedTransformer(tiny_config())
    probe = VisitProbe(keep_grads=keep_grads)
    params = physical_sublayers(model)
    for _ in range(2):
        num, den = probe.alignment_terms(params)
        assert set(num) == set(den) == set(params)
        for j in params:
            assert num[j].shape == den[j].shape == () and float(num[j]) == 0.0 and float(den[j]) == 0.0
        assert all(float(k) == 0.0 for k in probe.kappa(params).values())
        step(model, probe, backward=False)
