"""Ouro's prior over exit steps: `exit_kl` adds β·KL(p ‖ U_R) to the expected-logits loss."""

import math

import pytest
import torch

from loopnet.model import LoopedTransformer
from loopnet.model.transformer import lm_loss
from tests.helpers import tiny_config


def model_and_batch(**overrides):
    torch.manual_seed(0)
    cfg = tiny_config(exit_gate=True, loss_rounds="expected", **overrides)
    model = LoopedTransformer(cfg)
    idx = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    return model, idx, torch.roll(idx, -1, dims=1)


@torch.no_grad()
def exit_distribution(model, idx) -> torch.Tensor:
    """p_r of every token, [B, T, R], in float64 from the gate's λ_r, written out: λ_r·∏_{j<r}(1 − λ_j), the
    last round the remainder ∏_{j<R}(1 − λ_j)."""
    lams = [model.exit_lambda(x).double() for _, x in model.iter_rounds(idx)]
    R, probs = len(lams), []
    for r in range(R):
        survive = torch.prod(torch.stack([1 - lam for lam in lams[:r]]), 0) if r else torch.ones_like(lams[0])
        probs.append(survive if r == R - 1 else lams[r] * survive)
    return torch.stack(probs, -1)


def test_the_loss_adds_beta_times_the_kl_to_the_uniform_prior():
    beta = 0.3
    model, idx, targets = model_and_batch(exit_kl=beta)
    logits, loss = model(idx, targets)
    p = exit_distribution(model, idx)
    R = p.size(-1)
    kl = (p * (p * R).log()).sum(-1).mean()  # KL(p ‖ U_R) = Σ p·log(p / (1/R))
    assert abs(float(p.sum(-1).mean()) - 1) < 1e-12
    # fp32 sums of R terms of size ≤ log R, against float64: a few units in fp32's last place of ~1
    assert float(model.exit_kl_term) == pytest.approx(float(kl), abs=R * 4 * 2**-24 * (1 + math.log(R)))
    assert float(loss) == pytest.approx(float(lm_loss(logits, targets)) + beta * float(model.exit_kl_term), abs=1e-6)


def test_a_constant_gate_gives_the_closed_form_kl_and_the_term_trains_the_gate():
    """With gate weight 0 and bias b every λ is σ(b): p_r = λ(1 − λ)^(r−1), p_R = (1 − λ)^(R−1)."""
    model, idx, targets = model_and_batch(exit_kl=1.0)
    R, b = model.config.n_rounds, 0.7
    with torch.no_grad():
        model.exit_gate.weight.zero_()
        model.exit_gate.bias.fill_(b)
    lam = 1 / (1 + math.exp(-b))
    p = [lam * (1 - lam) ** (r - 1) for r in range(1, R)] + [(1 - lam) ** (R - 1)]
    kl = sum(q * math.log(q * R) for q in p)
    _, loss = model(idx, targets)
    assert float(model.exit_kl_term) == pytest.approx(kl, abs=R * 4 * 2**-24 * (1 + math.log(R)))
    loss.backward()
    with_kl = model.exit_gate.bias.grad.clone()
    model.zero_grad()
    model.config.exit_kl = 0.0  # the same forward without the term: only the KL's gradient differs
    model(idx, targets)[1].backward()
    assert model.exit_kl_term is None
    dkl = sum(  # d/db of Σ_r p_r·log(p_r·R), with dλ/db = λ(1 − λ), by hand
        (math.log(q * R) + 1) * dq
        for q, dq in zip(
            p,
            [lam * (1 - lam) * ((1 - lam) ** (r - 1) - lam * (r - 1) * (1 - lam) ** (r - 2)) for r in range(1, R)]
            + [-(R - 1) * (1 - lam) ** (R - 2) * lam * (1 - lam)],
        )
    )
    assert float(with_kl - model.exit_gate.bias.grad) == pytest.approx(dkl, abs=1e-5)


def test_exit_kl_needs_the_expected_loss():
    with pytest.raises(ValueError, match="exit_kl.*loss_rounds: expected"):
        tiny_config(exit_gate=True, exit_kl=0.1)
    with pytest.raises(ValueError, match="exit_kl >= 0"):
        tiny_config(exit_gate=True, loss_rounds="expected", exit_kl=-1.0)
