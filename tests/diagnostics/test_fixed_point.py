"""Fixed-point diagnostics: the round map is the model's round, the power iteration finds the dense
Jacobian's largest singular value within the bound of its iteration count and eigengap, and the
per-round profile matches the model evaluated at each R'."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from loopnet.diagnostics.fixed_point import (
    RoundProfileMeter,
    jacobian_profile,
    round_jacobian_norm,
    round_map,
    round_profile,
)
from loopnet.model import LoopedTransformer
from tests.helpers import tiny_config

WIRINGS = [
    dict(wiring="carry"),
    dict(wiring="lt"),
    dict(wiring="inject", injection="add", inject_into="every"),
    dict(wiring="inject", injection="attention", inject_into="first"),
    dict(wiring="flt"),
]


def tiny(**overrides) -> LoopedTransformer:
    torch.manual_seed(0)
    return LoopedTransformer(tiny_config(**({"d_model": 8, "n_heads": 2, "seq_len": 8} | overrides))).double().eval()


@pytest.mark.parametrize("wiring", WIRINGS, ids=lambda w: "_".join(w.values()))
def test_the_round_map_is_the_models_round(wiring):
    model = tiny(**wiring)
    idx = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        states = [x for _, x in model.iter_rounds(idx, 4)]
        for r in (2, 3, 4):
            torch.testing.assert_close(round_map(model, idx, r)(states[r - 2]), states[r - 1], rtol=0, atol=1e-12)


@pytest.mark.parametrize("iters", [3, 30])
@pytest.mark.parametrize("wiring", WIRINGS, ids=lambda w: "_".join(w.values()))
def test_power_iteration_finds_the_dense_jacobians_largest_singular_value(wiring, iters):
    """Against torch.autograd.functional.jacobian + svdvals (float64). With A = JᵀJ (eigenvalues
    λ_i = σ_i²) and θ0 the angle between the start vector and A's top eigenvector, k power steps leave
    0 ≤ λ_1 − ρ ≤ (λ_1 − λ_n)·tan²θ0·(λ_2/λ_1)^(2k) for the Rayleigh quotient ρ = σ̂² (Golub & Van Loan,
    Thm 8.2.1 applied to the symmetric A), so 0 ≤ σ_1 − σ̂ ≤ that / σ_1; plus float64 rounding."""
    model = tiny(**wiring)
    idx = torch.randint(0, 64, (1, 3), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        x1 = next(iter(model.iter_rounds(idx, 2)))[1]
    step = round_map(model, idx, 2)
    n = x1.numel()
    J = torch.autograd.functional.jacobian(step, x1).reshape(n, n)
    U, S, Vh = torch.linalg.svd(J)
    torch.testing.assert_close(S, torch.linalg.svdvals(J))
    v0 = torch.randn(x1.shape, generator=torch.Generator().manual_seed(5), dtype=x1.dtype).flatten()
    cos = abs(float(v0 @ Vh[0])) / float(v0.norm())
    tan2 = (1 - cos**2) / cos**2
    lam = S**2
    bound = float((lam[0] - lam[-1]) * tan2 * (lam[1] / lam[0]) ** (2 * iters)) / float(S[0])
    sigma = round_jacobian_norm(model, idx, x1, 2, iters, torch.Generator().manual_seed(5))
    assert -1e-10 <= float(S[0]) - sigma <= bound + 1e-10
    if iters == 30 and bound < 1e-6:
        assert sigma == pytest.approx(float(S[0]), rel=1e-6)


@pytest.mark.parametrize("wiring", WIRINGS[:2], ids=lambda w: "_".join(w.values()))
def test_jacobian_profile_is_each_rounds_dense_jacobian_at_the_previous_state(wiring):
    """Round r's σ_max is that of ∂x_r/∂x_{r−1} at the trajectory's x_{r−1}: the dense Jacobian's largest
    singular value (torch.autograd.functional.jacobian + svdvals, float64) at every round, within the power
    iteration's bound (as above) for the start vector each round draws. The blocks' matrices are scaled up so
    that the rounds' maps differ (σ_max 2.8-6.3) and their spectra have a gap (σ_2/σ_1 ≤ 0.56): a Jacobian
    taken at x_r instead of x_{r−1} is told apart, and 30 steps leave a bound below 1e-20."""
    model = tiny(**wiring)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("blocks") and p.dim() == 2:
                p.mul_(6.0)
    idx = torch.randint(0, 64, (2, 3), generator=torch.Generator().manual_seed(7))
    iters, rounds = 30, 5
    got = jacobian_profile(model, idx, rounds, iters=iters, seed=3)
    with torch.no_grad():
        states = [x for _, x in model.iter_rounds(idx, rounds)]
    generator, n = torch.Generator().manual_seed(3), states[0].numel()  # the start vectors, drawn in round order
    assert got[0] is None and len(got) == rounds
    for r in range(2, rounds + 1):
        J = torch.autograd.functional.jacobian(round_map(model, idx, r), states[r - 2]).reshape(n, n)
        _, S, Vh = torch.linalg.svd(J)
        v0 = torch.randn(states[0].shape, generator=generator, dtype=torch.float64).flatten()
        cos = abs(float(v0 @ Vh[0])) / float(v0.norm())
        lam = S**2
        bound = float((lam[0] - lam[-1]) * (1 - cos**2) / cos**2 * (lam[1] / lam[0]) ** (2 * iters)) / float(S[0])
        assert -1e-10 <= float(S[0]) - got[r - 1] <= bound + 1e-10, (r, float(S[0]), got[r - 1], bound)


@torch.no_grad()
def test_round_profile_matches_the_model_at_each_round_count():
    model = tiny(wiring="lt")
    idx = torch.randint(0, 64, (3, 6), generator=torch.Generator().manual_seed(3))
    targets = torch.randint(0, 64, (3, 6), generator=torch.Generator().manual_seed(4))
    targets[0, :2] = -1
    profile = round_profile(model, idx, targets, 5)
    for r in range(1, 6):
        logits = model(idx, rounds=r)[0]  # float64 (lm_loss would round it to float32)
        expected = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1)
        assert profile["loss"][r - 1] == pytest.approx(float(expected), rel=1e-10)
    states = [x for _, x in model.iter_rounds(idx, 5)]
    logp = [F.log_softmax(model(idx, rounds=r)[0], -1) for r in range(1, 6)]
    assert profile["latent_change"][0] is None and profile["kl"][0] is None
    for r in range(2, 6):
        a, b = states[r - 2], states[r - 1]
        expected = sum(float((b[i, t] - a[i, t]).norm() / b[i, t].norm()) for i in range(3) for t in range(6)) / 18
        assert profile["latent_change"][r - 1] == pytest.approx(expected, rel=1e-9)
        kl = float((logp[r - 2].exp() * (logp[r - 2] - logp[r - 1])).sum(-1).mean())
        assert profile["kl"][r - 1] == pytest.approx(kl, rel=1e-9, abs=1e-15)


def test_the_meter_weights_batches_by_their_tokens():
    model = tiny()
    meter = RoundProfileMeter(3, jacobian_sequences=1, jacobian_iters=2)
    g = torch.Generator().manual_seed(6)
    batches = [(torch.randint(0, 64, (2, 4), generator=g), torch.randint(0, 64, (2, 4), generator=g)) for _ in range(2)]
    batches[1][1][:, :2] = -1  # the second batch has half the target tokens
    for idx, targets in batches:
        meter.update(model, idx, targets)
    out = meter.compute()
    losses = [round_profile(model, idx, t, 3)["loss"] for idx, t in batches]
    assert out["loss"] == pytest.approx([(8 * a + 4 * b) / 12 for a, b in zip(*losses)], rel=1e-10)
    # σ_max: the first batch's first sequence (jacobian_sequences), with the meter's iteration count
    assert out["sigma_max"] == jacobian_profile(model, batches[0][0][:1], 3, iters=2)


def test_the_report_table_shows_rounds_2_R_and_the_last():
    from loopnet.diagnostics.fixed_point import fixed_point_table

    profile = {
        "loss": [5.0, 4.0, 3.5, 3.4, 3.45, 3.5],
        "latent_change": [None, 0.5, 0.2, 0.1, 0.05, 0.02],
        "kl": [None, 0.3, 0.1, 0.01, 0.001, 0.0001],
        "sigma_max": [None, 1.5, 1.1, 0.9, 0.8, 0.7],
    }
    table = fixed_point_table([("a", {"config": {"n_rounds": 3}, "fixed_point": profile}), ("b", {"config": {}})])
    lines = table.splitlines()
    assert len(lines) == 3  # run b has no profile
    assert lines[2] == "| a | 2, 3, 6 | 4 / 3.5 / 3.5 | 0.5 / 0.2 / 0.02 | 0.3 / 0.1 / 0.0001 | 1.5 / 1.1 / 0.7 |"
    assert fixed_point_table([("b", None)]) is None


def test_the_jacobian_measurement_reports_its_progress(capsys):
    """One line per round at most (here every round: no minimum interval), the round reached, then done; none on
    a rank other than 0."""
    from loopnet.diagnostics.depth_eval import JacobianProgress

    model, idx = tiny(), torch.randint(0, 64, (1, 4), generator=torch.Generator().manual_seed(8))
    jacobian_profile(model, idx, 4, iters=1, progress=JacobianProgress("val", True, every=0))
    lines = capsys.readouterr().err.splitlines()
    assert [line.split("model.extrapolate_rounds): ")[1].rsplit(",", 1)[0] for line in lines] == [
        "round 2 of 4",
        "round 3 of 4",
        "done",
    ]
    assert all(line.startswith("loopnet: val: σ_max of the round Jacobians") for line in lines)
    jacobian_profile(model, idx, 4, iters=1, progress=JacobianProgress("val", False, every=0))
    assert capsys.readouterr().err == ""
