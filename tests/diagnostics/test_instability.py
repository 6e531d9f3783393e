"""The instability signals of Wortsman et al. 2023 per visit (the largest attention logit
q·k/√d_h, max |logit| and mean log Z of each attention visit; the output logits' mean log Z and max
|logit|), checked against q and k recomputed by hand from each attention layer's weights and the
visit's input, and against the logits of a forward without any observer."""

import math

import pytest
import torch
import torch.nn.functional as F

from loopnet.diagnostics import VisitProbe
from loopnet.diagnostics import visit_probe as probe_module
from loopnet.model import LoopedTransformer, Visit
from loopnet.model.layers import Attention
from tests.helpers import tiny_config

# fp32 throughout: a logit is a sum of d_h = 8 products of sums of d = 32 products; the probe and the
# hand computation order them differently, so they agree to ~(d + d_h)·eps relative (≈ 5e-6), and log Z
# (a logsumexp of such logits) to the same. 1e-5 relative leaves a factor 2 on top of that.
RTOL, ATOL = 1e-5, 1e-6


class Recorder:
    """Forwards every visit to the probe and keeps each attention visit's input x."""

    def __init__(self, probe: VisitProbe):
        self.probe, self.inputs = probe, {}

    def on_visit(self, visit, trace):
        if visit.sublayer == "attn":
            self.inputs[visit] = trace.x.detach().clone()
        self.probe.on_visit(visit, trace)

    def on_logits(self, round_, logits):
        self.probe.on_logits(round_, logits)


def hand_logits(model: LoopedTransformer, visit: Visit, x: torch.Tensor) -> torch.Tensor:
    """Causal attention logits (B, H, T, T) of `visit` on its input `x`, from the layer's weights, with
    -inf above the diagonal; rotary embedding written out (rotate-half form of the RoPE paper)."""
    cfg = model.config
    sub = model.blocks[visit.block - 1].attn
    norm_in = sub.norm if cfg.pre_norm else sub.inner_norm
    h = x if norm_in is None else norm_in(x)
    d, H = cfg.d_model, cfg.n_heads
    w = sub.f.qkv_proj.weight
    q, k = h @ w[:d].T, h @ w[d : 2 * d].T  # rows [W_Q; W_K; W_V]
    B, T, _ = x.shape
    q, k = (t.view(B, T, H, d // H).transpose(1, 2) for t in (q, k))
    d_h = d // H
    if cfg.positions == "rope":
        freq = 10000.0 ** (-torch.arange(0, d_h, 2).float() / d_h)
        angle = torch.arange(T).float()[:, None] * freq[None]
        cos, sin = angle.cos(), angle.sin()

        def rope(t):
            t1, t2 = t[..., : d_h // 2], t[..., d_h // 2 :]
            return torch.cat((t1 * cos - t2 * sin, t1 * sin + t2 * cos), dim=-1)

        q, k = rope(q), rope(k)
    logits = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(d_h)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return logits.masked_fill(~causal, -math.inf)


@pytest.mark.parametrize(
    "overrides",
    [
        {},  # DeepLoop, learned positions
        {"positions": "rope", "residual": "preln"},  # the query and key of a Pre-LN visit pass its Norm
        {"positions": "rope", "sandwich": True, "residual": "deepnorm"},
    ],
)
@torch.no_grad()
def test_attention_logit_signals_match_a_hand_computation(overrides):
    torch.manual_seed(0)
    model = LoopedTransformer(tiny_config(**overrides)).eval()
    for p in model.parameters():  # logits of a few units, as after training (at init they are ~1e-3)
        if p.dim() == 2:
            p.mul_(3.0)
    for block in model.blocks:
        block.attn.f.qkv_proj.weight[: 2 * model.config.d_model].mul_(3.0)  # W_Q, W_K
    idx = torch.randint(0, model.config.vocab_size, (3, model.config.seq_len))
    probe = VisitProbe()
    recorder = Recorder(probe)
    model.attach_observer(recorder)
    logits, _ = model(idx)
    model.attach_observer(None)

    assert len(recorder.inputs) == model.config.n_blocks * model.config.n_rounds
    largest = 0.0
    for visit, x in recorder.inputs.items():
        z = hand_logits(model, visit, x)
        causal = torch.isfinite(z)
        got = probe.attention_quantities(visit)
        assert float(got["attn_logit_max"]) == pytest.approx(float(z.amax()), rel=RTOL, abs=ATOL)
        assert float(got["attn_logit_absmax"]) == pytest.approx(float(z[causal].abs().max()), rel=RTOL, abs=ATOL)
        assert float(got["attn_log_z"]) == pytest.approx(float(torch.logsumexp(z, -1).mean()), rel=RTOL, abs=ATOL)
        largest = max(largest, float(z.amax()))
    assert largest > 1.0  # the check is not a comparison of near-zeros
    assert probe.attention_quantities(Visit(1, 1, "ffn")) == {}

    plain, _ = model(idx)  # no observer: the model's own output logits
    assert torch.equal(plain, logits)
    out = probe.output_quantities()
    assert float(out["log_z"]) == pytest.approx(float(torch.logsumexp(plain.double(), -1).mean()), rel=RTOL)
    assert float(out["logit_absmax"]) == pytest.approx(float(plain.abs().max()), rel=RTOL)


@torch.no_grad()
def test_micro_batches_combine_as_one_batch():
    """Under gradient accumulation the probe sees several forwards: maxima over all of them, log Z
    averaged over every (batch, head, query) of all of them, as one forward of the concatenated batch."""
    torch.manual_seed(0)
    model = LoopedTransformer(tiny_config()).eval()
    idx = torch.randint(0, 64, (4, 16))
    whole, parts = VisitProbe(), VisitProbe()
    model.attach_observer(whole)
    model(idx)
    model.attach_observer(parts)
    model(idx[:1])
    model(idx[1:])
    model.attach_observer(None)
    for visit in whole.attn:
        for q, value in whole.attention_quantities(visit).items():
            assert float(parts.attention_quantities(visit)[q]) == pytest.approx(float(value), rel=RTOL, abs=ATOL), q
    for q, value in whole.output_quantities().items():
        assert float(parts.output_quantities()[q]) == pytest.approx(float(value), rel=RTOL, abs=ATOL), q


def test_chunked_logits_equal_the_whole():
    """The logits are formed a few batch rows at a time (memory): the chunking changes nothing."""
    torch.manual_seed(0)
    q, k = torch.randn(5, 2, 7, 4), torch.randn(5, 2, 7, 4)
    whole = probe_module.attention_logit_stats(q, k)
    chunked = probe_module.attention_logit_stats(q, k, chunk=2 * 7 * 7)  # one batch row at a time
    assert torch.allclose(whole, chunked, rtol=RTOL, atol=ATOL)
    logits = torch.randn(3, 5, 11)
    assert torch.allclose(
        probe_module.output_logit_stats(logits), probe_module.output_logit_stats(logits, chunk=11), rtol=RTOL, atol=ATOL
    )
    z = (q @ k.transpose(-1, -2) / 2.0).masked_fill(~torch.ones(7, 7, dtype=torch.bool).tril(), -math.inf)
    assert float(whole[0]) == pytest.approx(float(z.amax()), rel=RTOL)
    assert float(whole[2] / whole[3]) == pytest.approx(float(torch.logsumexp(z, -1).mean()), rel=RTOL)


def test_nothing_is_computed_without_an_observer(monkeypatch):
    """Between logging steps (no observer) the attention runs as before: no hook is set and no logit is
    formed; with a probe attached, one computation per attention visit, and the hooks are gone after."""
    calls = []
    real = probe_module.attention_logit_stats
    monkeypatch.setattr(probe_module, "attention_logit_stats", lambda q, k: calls.append(1) or real(q, k))
    seen = []
    real_sdpa = F.scaled_dot_product_attention

    def sdpa(q, k, v, **kw):
        seen.append(any(m.qk_hook is not None for m in model.modules() if isinstance(m, Attention)))
        return real_sdpa(q, k, v, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", sdpa)
    torch.manual_seed(0)
    model = LoopedTransformer(tiny_config())
    idx = torch.randint(0, 64, (2, 16))
    model(idx, idx)[1].backward()
    assert calls == [] and seen == [False] * 6
    model.attach_observer(VisitProbe())
    model(idx, idx)[1].backward()
    model.attach_observer(None)
    assert len(calls) == 6 and seen[6:] == [True] * 6
    assert all(m.qk_hook is None for m in model.modules() if isinstance(m, Attention))
