"""The KV cache across rounds against the full recompute: the logits at every position and the greedy
tokens, for every wiring, with learned and rotary positions, at R' = R and R' ≠ R."""

from __future__ import annotations

import pytest
import torch

from loopnet.generate import sample_next
from loopnet.model import LoopedTransformer
from loopnet.model.cache import KVCache
from tests.helpers import tiny_config

WIRINGS = {  # name: LoopConfig fields
    "carry": dict(wiring="carry"),
    "lt": dict(wiring="lt"),
    "inject_add_first": dict(wiring="inject", injection="add", inject_into="first"),
    "inject_add_every": dict(wiring="inject", injection="add", inject_into="every"),
    "inject_attention_first": dict(wiring="inject", injection="attention", inject_into="first"),
    "inject_attention_every": dict(wiring="inject", injection="attention", inject_into="every"),
    "flt": dict(wiring="flt"),
    # the recipe's pieces: untied prelude and coda blocks, learned injections, qk-norm
    "prelude_coda_carry": dict(wiring="carry", n_prelude=1, n_coda=2),
    "prelude_coda_flt": dict(wiring="flt", n_prelude=2, n_coda=1, qk_norm=True),
    "inject_linear": dict(wiring="inject", injection="linear", n_prelude=1, n_coda=1),
    "inject_diagonal": dict(wiring="inject", injection="diagonal", qk_norm=True),
    # grouped-query attention and a gated MLP (Llama's), Huginn's qk_bias and RoPE base
    "gqa_swiglu": dict(wiring="carry", n_kv_heads=2, mlp="swiglu"),
    "qk_bias_rope_base": dict(wiring="carry", qk_bias=True, rope_base=500.0),
    # μP's query scale and logit multiplier, CompleteP's branch ε, away from their base width and depth
    "mup": dict(wiring="carry", parametrization="mup", mup_base_width=16),
    "completep": dict(
        wiring="carry", residual="preln", parametrization="completep", mup_base_width=16, completep_base_depth=2
    ),
}


def make(wiring: str, positions: str, **overrides) -> LoopedTransformer:
    torch.manual_seed(0)
    config = tiny_config(vocab_size=97, seq_len=16, positions=positions, **(WIRINGS[wiring] | overrides))
    model = LoopedTransformer(config).eval()
    with torch.no_grad():  # sharper attention than at init (logits ×16), so that where the queries come from
        d = model.config.d_model  # (the stream or, injecting, h) shows in the logits: ~3e-4, not ~2e-5
        for block in [*model.prelude_blocks, *model.blocks, *model.coda_blocks]:
            block.attn.f.qkv_proj.weight[: 2 * d].mul_(4.0)
    return model


def recompute(model, prompt, max_new, rounds, window):
    """The plain loop: the whole (cropped) sequence through `forward` for every new token."""
    seq, new = list(prompt), []
    for _ in range(max_new):
        logits, _ = model(torch.tensor([seq[-window:]]), rounds=rounds)
        token = int(sample_next(logits[:, -1].float(), 0.0))
        seq.append(token)
        new.append(token)
    return new


@pytest.mark.parametrize("static", [False, True], ids=["sliced", "static"])
@pytest.mark.parametrize("positions", ["learned", "rope"])
@pytest.mark.parametrize("wiring", list(WIRINGS))
@pytest.mark.parametrize("rounds", [None, 5])  # R' = R = 3 and R' = 5
@torch.no_grad()
def test_cached_logits_equal_the_full_forward_at_every_position(wiring, positions, rounds, static):
    """Prefill 5 tokens, then feed the others one at a time through the cache: each position's logits
    equal those of one forward over the whole sequence. Both sum the same fp32 products, in another
    order: the difference is rounding (~1e-7 at d = 32 and logits of order 1), far below 1e-5. The static cache
    (a compiled step's) attends over all 16 positions under a mask: the masked ones add exact zeros."""
    model = make(wiring, positions)
    idx = torch.randint(0, 97, (2, 14), generator=torch.Generator().manual_seed(1))
    R = rounds or model.config.n_rounds
    full, _ = model(idx, rounds=rounds)
    kv = KVCache(2, 16, "cpu", static=static)
    P = 5
    positions_ = torch.arange(P).expand(2, P)
    kv.begin(positions_)
    *_, (_, x) = model.iter_rounds(idx[:, :P], R, positions=positions_, kv=kv)
    got = [model.head(x, kv=kv)[0]]
    kv.end(torch.full((2,), P - 1))
    for t in range(P, idx.size(1)):
        pos = torch.full((2, 1), t)
        kv.begin(pos)
        *_, (_, x) = model.iter_rounds(idx[:, t : t + 1], R, positions=pos, kv=kv)
        got.append(model.head(x, kv=kv)[0])
        kv.end(pos[:, 0])
    torch.testing.assert_close(torch.cat(got, 1), full, rtol=0, atol=1e-5)
    cfg = model.config
    assert sorted(kv.store) == sorted(
        [("core", r, k) for r in range(1, R + 1) for k in (1, 2)]
        + [("prelude", p) for p in range(1, cfg.n_prelude + 1)]
        + [("coda", c) for c in range(1, cfg.n_coda + 1)]
    )
    # grouped-query attention caches each shared K/V head once: [B, n_kv_heads, capacity, d_h]
    assert {K.shape for K, _ in kv.store.values()} == {(2, cfg.kv_heads, 16, cfg.head_dim)}


@pytest.mark.parametrize("positions", ["learned", "rope"])
@pytest.mark.parametrize("wiring", list(WIRINGS))
@pytest.mark.parametrize("rounds", [None, 1, 5])
def test_greedy_tokens_with_the_cache_equal_the_recompute(wiring, positions, rounds):
    model = make(wiring, positions)
    prompts = [[5, 17, 3, 8], [40], [9, 2, 9, 2, 9, 2]]
    cached = model.generate(prompts, 8, rounds=rounds)
    assert cached.tokens == model.generate(prompts, 8, rounds=rounds, cache=False).tokens
    assert cached.tokens == [recompute(model, p, 8, rounds, 16) for p in prompts]
    R = rounds or model.config.n_rounds
    assert cached.rounds == [[R] * 8] * 3


@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_past_the_window_the_context_is_cropped_and_the_cache_rebuilt(positions):
    """A sequence that outgrows the window reads its last `window` tokens, as the recompute does: the
    tokens past the window equal the recompute's on the cropped context."""
    model = make("flt", positions)
    prompts = [[3, 1, 4, 1, 5, 9, 2], [6, 5]]
    window = 8
    got = model.generate(prompts, 9, window=window).tokens  # the first prompt passes the window at its 2nd token
    assert got == [recompute(model, p, 9, None, window) for p in prompts]
    with pytest.raises(ValueError, match="window must be in"):
        model.generate(prompts, 1, window=17)


def test_a_compiled_step_gives_the_tokens_of_the_eager_cache_and_the_recompute():
    """`compile=True`: ragged prompts (one of one token, whose first step runs eagerly and fills the cache's
    slots), a window that one prompt outgrows (the cache rebuilt), untied prelude and coda, qk-norm, RoPE:
    the greedy tokens of the eager cache and the recompute. One compile (batch 2, R' = R), no recompile. One
    prelude block and R = 2: the compile's cost grows with the blocks the step runs."""
    model = make("prelude_coda_flt", "rope", n_prelude=1, n_rounds=2)
    prompts, window = [[3, 1, 4, 1, 5, 9, 2], [6]], 8
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        got = model.generate(prompts, 9, window=window, compile=True)
    assert got.tokens == model.generate(prompts, 9, window=window).tokens
    assert got.tokens == [recompute(model, p, 9, None, window) for p in prompts]
    assert got.rounds == [[model.config.n_rounds] * 9] * 2


def test_fill_later_rounds_copies_the_exit_rounds_keys_and_values():
    """The exit rule on a cache of known contents: row 0 exits after round 1 at position 2, row 1 runs
    all 3 rounds at position 1; only row 0's position 2 of rounds 2 and 3 change, to round 1's values."""
    kv = KVCache(2, 4, "cpu")
    for r in (1, 2, 3):
        for k in (1, 2):
            kv.store[("core", r, k)] = (torch.full((2, 1, 4, 2), 10.0 * r + k), torch.full((2, 1, 4, 2), -10.0 * r - k))
    before = {key: (K.clone(), V.clone()) for key, (K, V) in kv.store.items()}
    kv.fill_later_rounds(torch.tensor([1, 3]), 3, 2, torch.tensor([2, 1]))
    for (stage, r, k), (K, V) in kv.store.items():
        expected_k, expected_v = before[(stage, r, k)][0].clone(), before[(stage, r, k)][1].clone()
        if r > 1:
            expected_k[0, :, 2], expected_v[0, :, 2] = 10.0 + k, -10.0 - k
        assert torch.equal(K, expected_k) and torch.equal(V, expected_v)


def test_a_cache_call_past_its_capacity_is_refused():
    kv = KVCache(1, 4, "cpu")
    with pytest.raises(ValueError, match="past the cache's capacity 4"):
        kv.begin(torch.tensor([[4]]))
