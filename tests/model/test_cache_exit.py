"""Adaptive exit per token in `generate`, and the criteria against their formulas."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from loopnet.model import LoopedTransformer
from loopnet.model.exit import ExitCriterion
from tests.helpers import tiny_config

PROMPTS = [[5, 17, 3, 8], [40], [9, 2, 9, 2, 9, 2]]


@pytest.fixture(scope="module", params=["carry", "flt"])
def model(request) -> LoopedTransformer:
    torch.manual_seed(0)
    return LoopedTransformer(tiny_config(vocab_size=97, seq_len=16, wiring=request.param, positions="rope")).eval()


@pytest.mark.parametrize("cache", [True, False])
@pytest.mark.parametrize("exit,never", [("kl", 0.0), ("latent", 0.0), ("entropy", 0.0), ("argmax", 4)])
def test_a_threshold_that_never_holds_runs_every_round_and_equals_no_exit(model, cache, exit, never):
    """kl/latent/entropy compare strictly (< 0 never holds); argmax needs 4 stable rounds of 4."""
    plain = model.generate(PROMPTS, 6, rounds=4, cache=cache)
    got = model.generate(PROMPTS, 6, cache=cache, exit=exit, exit_threshold=never, max_rounds=4)
    assert got.tokens == plain.tokens
    assert got.rounds == [[4] * 6] * 3


@pytest.mark.parametrize("cache", [True, False])
@pytest.mark.parametrize("exit,always", [("kl", math.inf), ("latent", math.inf), ("entropy", math.inf), ("argmax", 0)])
def test_a_threshold_that_always_holds_runs_one_round(model, cache, exit, always):
    """Every token stops after round 1: what it reads of the others is their round 1, which does not
    depend on later rounds, so the tokens are those of a generation at R' = 1."""
    got = model.generate(PROMPTS, 6, cache=cache, exit=exit, exit_threshold=always, max_rounds=4)
    assert got.rounds == [[1] * 6] * 3
    assert got.tokens == model.generate(PROMPTS, 6, rounds=1, cache=cache).tokens
    assert got.mean_rounds() == 1.0


def test_rounds_per_token_vary_between_bounds_and_match_a_stopped_batch(model):
    got = model.generate(PROMPTS, 8, exit="argmax", exit_threshold=1, max_rounds=6)
    assert [len(r) for r in got.rounds] == [8, 8, 8]
    assert all(2 <= r <= 6 for row in got.rounds for r in row)  # argmax must repeat once: round 2 at the earliest
    # a row's tokens do not depend on the other rows of its batch
    assert [
        model.generate([p], 8, exit="argmax", exit_threshold=1, max_rounds=6).tokens[0] for p in PROMPTS
    ] == got.tokens


def test_bad_exit_settings_are_refused(model):
    with pytest.raises(ValueError, match="model.generate.exit='cosine' is not a criterion"):
        model.generate([[1]], 1, exit="cosine")
    with pytest.raises(ValueError, match="exit_threshold=-1 must be >= 0"):
        model.generate([[1]], 1, exit="kl", exit_threshold=-1)
    for kwargs in ({"exit": "kl"}, {"cache": False}):  # a compiled step needs fixed work per token
        with pytest.raises(ValueError, match="compile needs the cache and no exit criterion"):
            model.generate([[1]], 1, compile=True, **kwargs)
    from loopnet.training.options import GenerateConfig  # the config says so before Lightning's import

    with pytest.raises(ValueError, match="compile needs the cache and no exit criterion"):
        GenerateConfig(compile=True, exit="argmax")


def test_criteria_follow_their_formulas():
    """Every round against its formula: round r compares with round r − 1 (each criterion's previous state
    moves on), round 1 with the reference."""
    torch.manual_seed(0)
    xs = list(torch.randn(6, 4, 8).unbind(0))  # x_0 (the round-1 input), x_1, ..., x_5
    ls = [None, *torch.randn(5, 4, 11).unbind(0)]  # the logits of rounds 1..5
    ps = [torch.full((4, 11), 1 / 11), *(F.softmax(l, -1) for l in ls[1:])]  # p_0: uniform
    H = lambda p: -(p * p.log()).sum(-1)  # noqa: E731
    expected = {
        "kl": lambda r: (ps[r - 1] * (ps[r - 1] / ps[r]).log()).sum(-1),
        "latent": lambda r: (xs[r] - xs[r - 1]).norm(dim=-1) / xs[r].norm(dim=-1),
        "entropy": lambda r: (H(ps[r]) - H(ps[r - 1])).abs(),
    }  # H(p_0) = log V
    for kind, formula in expected.items():
        criterion = ExitCriterion(kind, 0.5)
        criterion.start(xs[0])
        for r in range(1, 6):
            exits, value = criterion.step(xs[r], ls[r])
            torch.testing.assert_close(value, formula(r), msg=f"{kind}, round {r}")
            assert torch.equal(exits, value < 0.5)

    argmax = ExitCriterion("argmax", 2)
    argmax.start(xs[0][:2, :2])
    same = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    counts = [argmax.step(xs[0][:2, :2], logits)[1].tolist() for logits in (same, same, same, same.flip(-1))]
    assert counts == [[0, 0], [1, 1], [2, 2], [0, 0]]
    assert ExitCriterion("argmax").threshold == 5 and ExitCriterion("kl").threshold == 1e-3  # Huginn's defaults


@pytest.mark.parametrize("exit,threshold", [("kl", 0.0), ("argmax", 1), ("latent", 0.05)])
def test_with_prelude_and_coda_exit_keeps_the_batch_independent_and_the_extremes_exact(exit, threshold):
    """The coda runs on the state each token leaves with; a row's tokens do not depend on its batch."""
    torch.manual_seed(0)
    model = LoopedTransformer(tiny_config(vocab_size=97, seq_len=16, n_prelude=1, n_coda=1, wiring="lt")).eval()
    got = model.generate(PROMPTS, 6, exit=exit, exit_threshold=threshold, max_rounds=5)
    assert [
        model.generate([p], 6, exit=exit, exit_threshold=threshold, max_rounds=5).tokens[0] for p in PROMPTS
    ] == got.tokens
    if threshold == 0.0:
        assert got.tokens == model.generate(PROMPTS, 6, rounds=5, cache=False).tokens
    one = model.generate(PROMPTS, 6, exit="entropy", exit_threshold=math.inf, max_rounds=5)
    assert one.tokens == model.generate(PROMPTS, 6, rounds=1).tokens and one.mean_rounds() == 1.0


def test_predict_logs_the_rounds_per_token(caplog):
    import logging

    from loopnet.training.module import LoopedLM
    from loopnet.training.options import EXITS as OPTION_EXITS
    from loopnet.model.exit import EXITS

    assert OPTION_EXITS == EXITS  # the torch-free copy of the criteria's names
    torch.manual_seed(0)
    lm = LoopedLM(
        config=tiny_config(vocab_size=50304, seq_len=16, n_heads=2, n_blocks=1, n_rounds=2),
        generate={
            "prompt": "to be",
            "max_new_tokens": 5,
            "temperature": 0.0,
            "exit": "argmax",
            "exit_threshold": 0,
            "max_rounds": 3,
        },
    ).eval()
    (batch,) = list(lm.predict_dataloader())
    with caplog.at_level(logging.INFO):
        lm.predict_step(batch)
    assert lm.generated_rounds == [1] * 5
    assert "5 tokens generated, 1.00 rounds per token (exit: argmax; rounds per token [1, 1, 1, 1, 1])" in caplog.text
