"""The loopnet model adapter: scores equal those computed directly from the model's logits."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("lm_eval", reason="the eval extra (lm-eval) is not installed")

from lm_eval.api.instance import Instance

from loopnet.data import gpt2_encoding
from loopnet.eval.adapter import LoopnetLM
from tests.eval.helpers import direct_loglikelihood, token_logprobs


def requests(kind: str, args: list[tuple]) -> list[Instance]:
    return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(args)]


PAIRS = [
    ("Question: Which animal says moo?\nAnswer:", " cow"),
    ("Question: Which animal says moo?\nAnswer:", " cat"),  # shares context + cont[:-1]: one forward pass
    ("Question: Which animal says moo?\nAnswer:", " a small brown duck"),
    ("Where do fish live?", " In water."),
    ("", "Hello world"),  # empty context: conditioned on <|endoftext|>
]


def test_registered_with_the_harness(tiny_ckpt):
    from lm_eval.api.registry import get_model, model_registry

    assert get_model("loopnet") is LoopnetLM
    assert "hf" in model_registry  # registering ours did not hide the harness's own models
    lm = LoopnetLM.create_from_arg_string(f"ckpt_path={tiny_ckpt},rounds=1", {"batch_size": "3", "device": "cpu"})
    assert (lm.rounds, lm.batch_size, lm.max_length) == (1, 3, 64)


@pytest.mark.parametrize("rounds", [1, 2, 3])
def test_loglikelihood_equals_direct_sum_of_token_logprobs(tiny_ckpt, tiny_model, rounds):
    lm = LoopnetLM(ckpt_path=tiny_ckpt, rounds=rounds, batch_size=2)
    got = lm.loglikelihood(requests("loglikelihood", PAIRS), disable_tqdm=True)
    for (context, continuation), (logprob, _) in zip(PAIRS, got):
        assert logprob == pytest.approx(direct_loglikelihood(tiny_model, context, continuation, rounds), abs=1e-4)


def test_is_greedy_flag(tiny_ckpt, tiny_model):
    """The flag says whether greedy decoding would produce the continuation."""
    enc = gpt2_encoding()
    context = "Question: What do bees make?\nAnswer:"
    ids = enc.encode(context)
    greedy = []
    for _ in range(2):
        greedy.append(int(token_logprobs(tiny_model, ids + greedy, 2)[-1].argmax()))
    other = greedy[:1] + [(greedy[1] + 1) % 50257]
    lm = LoopnetLM(ckpt_path=tiny_ckpt)
    # Token ids directly: decoding then re-encoding greedy tokens need not give them back.
    (_, is_greedy), (_, not_greedy) = lm._loglikelihood_tokens([(None, ids, greedy), (None, ids, other)])
    assert is_greedy and not not_greedy


def test_long_context_is_left_truncated(tiny_ckpt, tiny_model):
    """A context longer than the window keeps its last tokens, as the harness expects."""
    context = " ".join(f"word{i}" for i in range(80))  # > 64 tokens
    lm = LoopnetLM(ckpt_path=tiny_ckpt, rounds=2)
    [(logprob, _)] = lm.loglikelihood(requests("loglikelihood", [(context, " end")]), disable_tqdm=True)
    assert len(gpt2_encoding().encode(context)) > 64
    assert logprob == pytest.approx(direct_loglikelihood(tiny_model, context, " end", 2), abs=1e-4)


def test_rounds_change_the_scores(tiny_ckpt):
    scores = {}
    for rounds in (1, 2, 4):
        lm = LoopnetLM(ckpt_path=tiny_ckpt, rounds=rounds)
        scores[rounds] = [ll for ll, _ in lm.loglikelihood(requests("loglikelihood", PAIRS), disable_tqdm=True)]
    assert scores[1] != pytest.approx(scores[2], abs=1e-3)
    assert scores[4] != pytest.approx(scores[2], abs=1e-3)
    assert LoopnetLM(ckpt_path=tiny_ckpt).rounds == 2  # default R' = the training R


def test_loglikelihood_rolling_windows(tiny_ckpt, tiny_model):
    """Every token is scored once, each window with as much preceding context as fits."""
    enc = gpt2_encoding()
    short = "Bees make honey."
    long = " ".join(f"token{i}" for i in range(80))  # > 2 windows of 64
    lm = LoopnetLM(ckpt_path=tiny_ckpt, rounds=2, batch_size=2)
    got = lm.loglikelihood_rolling(requests("loglikelihood_rolling", [(short,), (long,)]), disable_tqdm=True)

    W = 64
    for text, value in zip((short, long), got):
        seq = [enc.eot_token] + enc.encode(text)  # seq[j + 1] is predicted from seq[: j + 1]
        expected, start = 0.0, 0
        while start < len(seq) - 1:
            end = min(start + W, len(seq) - 1)  # predict seq[start + 1 : end + 1]
            first = max(0, end - W)
            logprobs = token_logprobs(tiny_model, seq[first:end], 2)
            targets = torch.tensor(seq[start + 1 : end + 1])
            expected += float(logprobs[start - first :].gather(1, targets.unsqueeze(1)).sum())
            start = end
        assert value == pytest.approx(expected, abs=1e-3)
    assert len(enc.encode(long)) > 2 * W


def test_generate_until_is_greedy_and_stops(tiny_ckpt, tiny_model):
    enc = gpt2_encoding()
    prompts = ["Question: Which animal says moo?\nAnswer:", "Question: Where do fish live?\nAnswer: in"]
    gen_kwargs = {"until": ["\n"], "max_gen_toks": 6, "do_sample": False}
    lm = LoopnetLM(ckpt_path=tiny_ckpt, rounds=2, batch_size=2)
    got = lm.generate_until(requests("generate_until", [(p, gen_kwargs) for p in prompts]), disable_tqdm=True)

    for prompt, text in zip(prompts, got):
        ids = enc.encode(prompt)
        out: list[int] = []
        for _ in range(6):
            out.append(int(token_logprobs(tiny_model, ids + out, 2)[-1].argmax()))
        expected = enc.decode(out).split("\n")[0].split("<|endoftext|>")[0]
        assert text == expected
        assert "\n" not in text


def test_a_compact_vocabulary_checkpoint_is_refused(tmp_path):
    import torch

    from loopnet.eval.adapter import load_checkpoint
    from tests.helpers import tiny_config

    cfg = tiny_config(seq_len=8, d_model=16, n_heads=2, n_blocks=1, n_rounds=1)
    path = tmp_path / "compact.ckpt"
    from dataclasses import asdict

    torch.save(
        {
            "hyper_parameters": {"config": asdict(cfg)},
            "state_dict": {},
            "datamodule_hyper_parameters": {"vocab": "compact"},
        },
        path,
    )
    with pytest.raises(ValueError, match="data.vocab: compact.*fix: evaluate a model trained with data.vocab: gpt2"):
        load_checkpoint(path)
