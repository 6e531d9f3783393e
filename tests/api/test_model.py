"""`loopnet.Model`'s text-level measures: generation is `LoopedTransformer.generate`'s, the per-visit table has
one row per visit in execution order with the values of an independent computation, and the fixed-point
profile is `loopnet.diagnostics.fixed_point`'s."""

from __future__ import annotations

import math

import pytest
import torch

import loopnet
from loopnet.data.vocabulary import BytesVocab
from loopnet.diagnostics.depth_eval import JACOBIAN_ITERS
from loopnet.diagnostics.fixed_point import jacobian_profile, round_profile
from loopnet.model import LoopedTransformer, visit_order
from loopnet.model.layers import Sublayer
from tests.api.conftest import TEXT
from tests.helpers import tiny_config

PROMPT = "ROMEO: But, soft!"


@pytest.fixture(scope="module")
def model(ckpt) -> loopnet.Model:
    return loopnet.load(ckpt)


def test_generate_is_the_networks_generate_on_the_tokenizers_ids(model):
    ids = model.tokenizer.encode(PROMPT)
    for kwargs in (dict(rounds=2), dict(rounds=12, exit="kl", exit_threshold=1e-3), dict(rounds=5, cache=False)):
        got = model.generate(PROMPT, 6, **kwargs)
        want = model.network.generate([ids], 6, n_vocab=model.tokenizer.size, **kwargs)
        assert got.tokens == want.tokens[0] and got.rounds == want.rounds[0]
        assert got.text == model.tokenizer.decode(want.tokens[0]) and got.prompt == PROMPT
        assert got.mean_rounds == want.mean_rounds()
    assert model.generate(PROMPT, 4, rounds=12, exit="kl", exit_threshold=math.inf).rounds == [1] * 4
    batch = model.generate([PROMPT, "JULIET:"], 3, rounds=2)
    assert [c.tokens for c in batch] == [model.generate(p, 3, rounds=2).tokens for p in (PROMPT, "JULIET:")]
    with pytest.raises(ValueError, match="^every prompt needs at least one token; fix: give a non-empty prompt text$"):
        model.generate("", 3)


def sublayer_values(network, idx, rounds):
    """(resid_norm, state_norm_dev, branch_ratio) of every sublayer call of a forward without an observer, in
    call order, in float64 from the sublayers' own inputs and outputs (forward hooks): RMS of the pre-Norm
    stream, RMS of the output − 1, ‖branch‖ / (α‖x‖)."""
    values = []

    def hook(module, args, output):
        x, alpha = args[0].double(), args[1]
        new, stream, branch = (t.double() for t in output)
        rms = lambda t: float(t.square().mean().sqrt())
        values.append((rms(stream), rms(new) - 1, float(branch.norm() / (alpha * x.norm()))))

    handles = [m.register_forward_hook(hook) for m in network.modules() if isinstance(m, Sublayer)]
    try:
        with torch.no_grad():
            network(idx, rounds=rounds)
    finally:
        for h in handles:
            h.remove()
    return values


@pytest.mark.parametrize("rounds", [None, 5])
def test_the_visit_table_has_one_row_per_visit_with_the_hooks_values(rounds):
    """A model with a prelude and a coda block, at R and at R' = 5 ≠ R. The probe sums in fp32 over the n = B·T·d
    elements of a visit; the error of such a sum of squares is at most n·u of it (u = 2⁻²⁴), halved by the root,
    so each RMS agrees with the float64 one within n·u (relative); state_norm_dev = RMS − 1 within n·u·RMS."""
    torch.manual_seed(0)
    network = LoopedTransformer(tiny_config(vocab_size=257, n_prelude=1, n_coda=1, residual="deeploop")).eval()
    model = loopnet.Model(network, BytesVocab())
    text = "To be, or not"
    table = model.visits(text, rounds=rounds)
    cfg = network.config
    order = visit_order(cfg.n_blocks, rounds or cfg.n_rounds, cfg.n_prelude, cfg.n_coda)
    assert len(table) == len(order) == 2 * (1 + 2 * (rounds or 3) + 1)
    assert [row["visit"] for row in table] == [v.tag for v in order]
    assert [(row["part"], row["round"], row["block"], row["sublayer"]) for row in table] == [
        (v.part, v.round, v.block, v.sublayer) for v in order
    ]
    reference = sublayer_values(network, model.encode(text), rounds)
    n = len(model.tokenizer.encode(text)) * cfg.d_model
    tol = n * 2.0**-24
    for row, (resid, dev, ratio) in zip(table, reference, strict=True):
        assert row["resid_norm"] == pytest.approx(resid, rel=tol, abs=0)
        assert row["state_norm_dev"] == pytest.approx(dev, rel=0, abs=tol * (1 + dev))
        assert row["branch_ratio"] == pytest.approx(ratio, rel=3 * tol, abs=0)  # two norms and their quotient
        attention = [row[q] for q in ("attn_logit_max", "attn_logit_absmax", "attn_log_z")]
        assert all(math.isfinite(v) for v in attention) if row["sublayer"] == "attn" else attention == [None] * 3
    csv = table.to_csv().splitlines()
    assert csv[0] == ",".join(table.columns) and len(csv) == len(order) + 1
    assert str(table).splitlines()[1].split()[0] == "p1_attn"


def test_the_visit_table_of_a_batch_of_ids(model):
    ids = torch.stack([model.encode(PROMPT)[0], model.encode(PROMPT)[0]])
    one, two = model.visits(PROMPT), model.visits(ids)
    assert one.column("resid_norm") == pytest.approx(two.column("resid_norm"), rel=1e-6)


def test_the_fixed_point_profile_is_the_diagnostics_direct_call(model):
    """Against `round_profile` and `jacobian_profile` called directly on the same ids. The profile goes
    through validation's meter, which weighs each batch by its n target tokens: v·n/n, two float64
    roundings (relative 2⁻⁵³ each) from the direct value; σ_max runs the same seeded iteration: equal."""
    ids = model.encode(TEXT)[:, : model.config.seq_len + 1]
    inputs, targets = ids[:, :-1], ids[:, 1:]
    table = model.fixed_point(ids, rounds=7)
    assert table.columns == ["round", "loss", "latent_change", "kl", "sigma_max"]
    assert table.column("round") == list(range(1, 8))
    direct = round_profile(model.network, inputs, targets, 7)
    direct["sigma_max"] = jacobian_profile(model.network, inputs, 7, JACOBIAN_ITERS)
    for quantity in ("loss", "latent_change", "kl"):
        got, want = table.column(quantity), direct[quantity]
        if quantity != "loss":  # undefined at round 1
            assert got[0] is None and want[0] is None
            got, want = got[1:], want[1:]
        assert got == pytest.approx(want, rel=2**-52, abs=0)
    assert table.column("sigma_max") == direct["sigma_max"]
    text = model.fixed_point(TEXT[:60])  # a text: its own tokens as targets; default 2R rounds
    assert len(text) == 2 * model.config.n_rounds
    assert model.fixed_point(TEXT[:60], rounds=3, jacobian=False).columns == ["round", "loss", "latent_change", "kl"]


def test_texts_that_do_not_fit_are_refused_in_one_line(model):
    long = model.tokenizer.decode(list(range(1000, 1000 + model.config.seq_len + 2)))
    with pytest.raises(ValueError, match=r"^the text is \d+ tokens; this takes 1 to 64 \(seq_len 64\); fix: "):
        model.visits(long)
    with pytest.raises(ValueError, match=r"^the text is 1 token; this takes 2 to 65 .*fix: give a text"):
        model.fixed_point("the")
    with pytest.raises(ValueError, match="^rounds must be >= 1"):
        model.fixed_point(PROMPT, rounds=0)
