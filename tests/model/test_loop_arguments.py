"""What a caller hands the loop reaches every visit: an α other than the training N's (a sampled depth's), the
rounds that get gradients, the round-1 input (`start`), the learned injection's FLOPs and bias, and
`checkpoint_rounds` (which rounds are recomputed in the backward, and when it is bypassed)."""

import copy

import pytest
import torch

import loopnet.model.transformer as transformer
from loopnet.model import LoopedTransformer
from loopnet.model.layers import unit_rms
from tests.helpers import tiny_config

IDX = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
TGT = torch.roll(IDX, -1, 1)
# Prelude and coda blocks too (α reaches them through embed and finish); inject, so that the prelude still
# gets gradients when early rounds run without.
UNTIED = dict(residual="deeploop", wiring="inject", n_prelude=1, n_coda=1)


def test_an_alpha_given_to_forward_is_the_alpha_of_every_visit():
    torch.manual_seed(0)
    model = LoopedTransformer(tiny_config(**UNTIED)).eval()
    other = copy.deepcopy(model)
    other.alpha = 0.5 * model.alpha  # the model whose own α is the one handed over
    with torch.no_grad():
        logits, loss = model(IDX, TGT, alpha=other.alpha)
        ref_logits, ref_loss = other(IDX, TGT)
        own_logits, _ = model(IDX, TGT)
    assert torch.equal(logits, ref_logits) and torch.equal(loss, ref_loss)
    assert not torch.allclose(logits, own_logits)  # the α handed over made a difference


def test_grad_rounds_given_to_forward_are_the_rounds_with_gradient():
    """forward(grad_rounds=1) on a model that backpropagates through every round equals the model whose
    config stops the gradient after the last round (backprop_rounds=1): the same loss and gradients."""
    torch.manual_seed(0)
    full = LoopedTransformer(tiny_config(**UNTIED))
    truncated = LoopedTransformer(tiny_config(**UNTIED, backprop_rounds=1))
    truncated.load_state_dict(full.state_dict())
    _, loss = full(IDX, TGT, rounds=4, grad_rounds=1)
    _, ref = truncated(IDX, TGT, rounds=4)
    loss.backward()
    ref.backward()
    assert torch.equal(loss, ref)
    for (name, p), q in zip(full.named_parameters(), truncated.parameters()):
        assert torch.equal(p.grad, q.grad), name


@pytest.mark.parametrize("input_norm", [False, True])
def test_start_yields_the_round_one_input_first(input_norm):
    torch.manual_seed(0)
    model = LoopedTransformer(tiny_config(**UNTIED, input_norm=input_norm)).eval()
    with torch.no_grad():
        rounds = list(model.iter_rounds(IDX, 3, start=True))
        e = model.embed(IDX)
        plain = list(model.iter_rounds(IDX, 3))
    assert [r for r, _ in rounds] == [0, 1, 2, 3]
    assert torch.equal(rounds[0][1], unit_rms(e) if input_norm else e)
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(rounds[1:], plain))


@pytest.mark.parametrize(
    "injection, matrix_params", [("linear", lambda d: 2 * d * d), ("diagonal", lambda d: d * d), ("add", lambda d: 0)]
)
def test_flops_count_the_learned_injection_once_per_round(injection, matrix_params):
    """2·(matrix parameters) per round for the injection's map: Linear(2d → d) or the diagonal SSM's B (d × d)."""
    base = LoopedTransformer(tiny_config(wiring="inject", injection="add"))
    model = LoopedTransformer(tiny_config(wiring="inject", injection=injection))
    d, R = model.config.d_model, 5
    assert model.flops_per_token(rounds=R, training=False) - base.flops_per_token(
        rounds=R, training=False
    ) == R * 2 * matrix_params(d)


def test_the_linear_injection_has_a_bias_when_the_model_has_biases():
    for bias in (False, True):
        adapter = LoopedTransformer(tiny_config(wiring="inject", injection="linear", bias=bias)).injection.adapter
        assert (adapter.bias is not None) == bias


def test_checkpoint_rounds_recomputes_exactly_the_rounds_with_gradient(monkeypatch):
    """With `checkpoint_rounds` each round that gets gradients runs under torch's non-reentrant checkpoint,
    once, with its own round number; rounds without gradient, an observed forward, a forward without grad
    and a forward without the option do not. The values are the plain forward's."""
    calls = []

    def spy(fn, *args, **kwargs):
        calls.append((args[0], kwargs))
        return torch.utils.checkpoint.checkpoint(fn, *args, **kwargs)

    monkeypatch.setattr(transformer, "checkpoint", spy)
    torch.manual_seed(0)
    model = LoopedTransformer(tiny_config(**UNTIED, checkpoint_rounds=True, backprop_rounds=2))
    plain = LoopedTransformer(tiny_config(**UNTIED, backprop_rounds=2))
    plain.load_state_dict(model.state_dict())
    _, loss = model(IDX, TGT, rounds=4)
    assert calls == [(3, {"use_reentrant": False}), (4, {"use_reentrant": False})]
    _, ref = plain(IDX, TGT, rounds=4)
    assert torch.equal(loss, ref) and len(calls) == 2  # without the option: no checkpoint
    loss.backward()
    ref.backward()
    for (name, p), q in zip(model.named_parameters(), plain.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0, msg=name)
    calls.clear()
    with torch.no_grad():
        model(IDX, TGT, rounds=4)
    model.attach_observer(type("Watch", (), {"on_visit": lambda self, v, t: None})())
    model(IDX, TGT, rounds=4)
    model.attach_observer(None)
    assert calls == []
