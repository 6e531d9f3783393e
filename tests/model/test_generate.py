"""`LoopedTransformer.generate` against a plain recompute loop: one sequence at a time, the whole
(cropped) sequence through the model for every new token."""

from __future__ import annotations

import pytest
import torch

from loopnet.generate import sample_next
from loopnet.model import LoopedTransformer
from tests.helpers import tiny_config


@pytest.fixture(scope="module")
def model() -> LoopedTransformer:
    torch.manual_seed(0)
    return LoopedTransformer(tiny_config(vocab_size=97, seq_len=12, n_rounds=3)).eval()


def recompute(model, prompt, max_new, rounds, window, n_vocab, temperature=0.0, top_k=None, stop=None):
    seq, new = list(prompt), []
    for _ in range(max_new):
        logits, _ = model(torch.tensor([seq[-window:]]), rounds=rounds)
        token = int(sample_next(logits[:, -1, :n_vocab].float(), temperature, top_k))
        seq.append(token)
        new.append(token)
        if stop is not None and stop(new):
            break
    return new


@pytest.mark.parametrize("rounds", [None, 1, 5])
def test_greedy_batch_of_ragged_prompts_matches_one_at_a_time(model, rounds):
    prompts = [[5, 17, 3], [40], [9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9]]  # the last outgrows the window at once
    got = model.generate(prompts, 7, rounds=rounds, n_vocab=90, window=10).tokens
    assert got == [recompute(model, p, 7, rounds, 10, 90) for p in prompts]
    assert all(t < 90 for row in got for t in row)


def test_a_stopped_prompt_leaves_the_batch_and_the_others_go_on(model):
    prompts = [[1, 2, 3], [4, 5], [6]]
    calls = []

    def stop(i, new):
        calls.append((i, len(new)))
        return i == 1 and len(new) == 3

    got = model.generate(prompts, 6, stop=stop).tokens
    full = [recompute(model, p, 6, None, 12, 97) for p in prompts]
    assert got == [full[0], full[1][:3], full[2]]
    assert [n for i, n in calls if i == 1] == [1, 2, 3]  # not asked again once it stopped
    assert [n for i, n in calls if i == 0] == [1, 2, 3, 4, 5, 6]


def test_sampling_draws_the_same_tokens_as_the_plain_loop(model):
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    torch.manual_seed(7)
    got = model.generate(prompt, 10, temperature=0.8, top_k=20).tokens
    torch.manual_seed(7)
    expected = recompute(model, prompt[0].tolist(), 10, None, 12, 97, temperature=0.8, top_k=20)
    assert got == [expected]


def test_bad_window_and_empty_prompt_are_refused(model):
    with pytest.raises(ValueError, match="window must be in"):
        model.generate([[1]], 1, window=13)
    with pytest.raises(ValueError, match="at least one token"):
        model.generate([[1], []], 1)


def test_predict_step_continues_the_prompt_as_the_plain_loop(tmp_path):
    from loopnet.data import gpt2_encoding
    from loopnet.training.module import LoopedLM

    torch.manual_seed(0)
    lm = LoopedLM(
        config=tiny_config(vocab_size=50304, seq_len=8, n_heads=2, n_blocks=1, n_rounds=2),
        generate={"prompt": "ROMEO: to be", "max_new_tokens": 12, "temperature": 0.9, "top_k": 30, "rounds": 3},
    )
    lm.eval()
    (batch,) = list(lm.predict_dataloader())
    torch.manual_seed(3)
    text = lm.predict_step(batch)
    torch.manual_seed(3)
    prompt = batch[0].tolist()
    new = recompute(lm.model, prompt, 12, 3, 8, 50257, temperature=0.9, top_k=30)
    assert text == gpt2_encoding().decode(prompt + new)


@pytest.mark.parametrize(
    "kwargs", [{}, {"cache": False}, {"exit": "entropy", "exit_threshold": 0.0}], ids=["cache", "recompute", "exit"]
)
def test_an_interrupted_generation_returns_the_tokens_before_the_stop(model, kwargs):
    prompts = [[1, 2, 3], [4, 5]]
    full = model.generate(prompts, 6, **kwargs)
    lengths = []
    for stop_at in range(1, 60):  # the n-th time it is asked (before a token, or between two rounds)
        asked = []

        def interrupted():
            asked.append(1)
            return len(asked) >= stop_at

        got = model.generate(prompts, 6, interrupted=interrupted, **kwargs)
        n = len(got.tokens[0])
        assert got.tokens == [row[:n] for row in full.tokens] and got.rounds == [row[:n] for row in full.rounds]
        if n < 6:
            assert len(asked) == stop_at  # not asked again once it said stop
        lengths.append(n)
    # Every token's rounds are asked about: the generation ends at every token count, in order.
    assert lengths == sorted(lengths) and set(lengths) == set(range(7))
