import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from loopnet.model import LoopConfig, LoopedTransformer, Visit, residual_scales, visit_order
from tests.helpers import tiny_config
from loopnet.model.layers import QKVLinear

SCHEMES = ["preln", "postln", "deepnorm", "deeploop", "scaled"]
WIRINGS = [
    dict(wiring="carry"),
    dict(wiring="flt"),
    dict(wiring="lt"),
    dict(wiring="inject", injection="add", inject_into="first"),
    dict(wiring="inject", injection="add", inject_into="every"),
    dict(wiring="inject", injection="attention", inject_into="first"),
]


def tiny(**kw) -> LoopConfig:
    return tiny_config(**{"vocab_size": 97, **kw})


class Recorder:
    def __init__(self):
        self.traces = {}

    def on_visit(self, visit, trace):
        self.traces[visit] = trace


@pytest.mark.parametrize(
    "scheme,K,R",
    [
        ("deepnorm", 2, 6),
        ("deeploop", 2, 6),
        ("deeploop", 12, 1),
        ("deepnorm", 4, 3),
        ("preln", 2, 6),
        ("postln", 3, 4),
    ],
)
def test_scales_match_formulas(scheme, K, R):
    N = K * R
    p = {"deepnorm": 0.25, "deeploop": 0.5}.get(scheme)
    alpha, beta = residual_scales(scheme, N)
    if p is None:
        assert (alpha, beta) == (1.0, 1.0)
    else:
        assert alpha == pytest.approx((2 * N) ** p) and beta == pytest.approx((8 * N) ** -p)


def test_deeploop_k2_r6_published_example():
    alpha, beta = residual_scales("deeploop", 2 * 6)
    assert alpha == pytest.approx(math.sqrt(24)) and beta == pytest.approx(96**-0.5)
    assert residual_scales("scaled", 12, p=0.35) == pytest.approx((24**0.35, 96**-0.35))
    cfg = LoopConfig(n_blocks=2, n_rounds=6)
    assert cfg.n_unrolled == 12 and cfg.n_visits == 24 and cfg.scales == pytest.approx((24**0.5, 96**-0.5))


def test_parameter_count_independent_of_rounds():
    counts = {R: LoopedTransformer(tiny(n_rounds=R)).num_params() for R in (1, 3, 6, 12)}
    assert len(set(counts.values())) == 1


def test_beta_scales_exactly_value_output_and_ffn_init():
    kw = dict(vocab_size=64, seq_len=8, d_model=256, n_heads=4, n_blocks=1, n_rounds=6)
    torch.manual_seed(0)
    ref = LoopedTransformer(LoopConfig(residual="postln", **kw))  # β = 1, same α-free init
    torch.manual_seed(0)
    deep = LoopedTransformer(LoopConfig(residual="deeploop", **kw))
    beta = deep.beta
    assert beta == pytest.approx(48**-0.5)
    ref_weights = dict(matrices(ref))
    for name, w in matrices(deep):
        ratio = w.std().item() / ref_weights[name].std().item()
        scaled = any(f".{m}" in name for m in ("v_proj", "o_proj", "fc1", "fc2"))
        assert ratio == pytest.approx(beta if scaled else 1.0, rel=0.03), name
    assert deep.wte.weight.std().item() == pytest.approx(0.02, rel=0.03)


def matrices(model):
    """(name, weight) of every block matrix, the fused QKV projection as its three parts by their names."""
    for name, module in model.blocks.named_modules():
        if isinstance(module, QKVLinear):
            yield from ((f"{name}.{part}", w) for part, w in module.parts().items())
        elif isinstance(module, torch.nn.Linear):
            yield name, module.weight


@pytest.mark.parametrize("scheme,wiring", list(itertools.product(SCHEMES, range(len(WIRINGS)))))
def test_causality(scheme, wiring):
    torch.manual_seed(0)
    model = LoopedTransformer(
        tiny(residual=scheme, positions="rope" if wiring % 2 else "learned", **WIRINGS[wiring])
    ).eval()
    idx = torch.randint(0, 97, (1, 12))
    t = 7
    changed = idx.clone()
    changed[0, t] = (idx[0, t] + 1) % 97
    with torch.no_grad():
        a, _ = model(idx)
        b, _ = model(changed)
    assert torch.allclose(a[:, :t], b[:, :t], atol=1e-5)
    assert not torch.allclose(a[:, t:], b[:, t:], atol=1e-5)


@pytest.mark.parametrize("scheme", ["postln", "deepnorm", "deeploop"])
def test_postln_family_visits_have_unit_rms_at_init(scheme):
    torch.manual_seed(0)
    model = LoopedTransformer(tiny(residual=scheme, d_model=64))
    rec = Recorder()
    model.attach_observer(rec)
    model(torch.randint(0, 97, (2, 16)))
    assert list(rec.traces) == visit_order(2, 3)
    for trace in rec.traces.values():
        rms = trace.state.pow(2).mean(-1).sqrt()
        assert torch.allclose(rms, torch.ones_like(rms), atol=1e-3)


def test_flt_first_round_is_plain_self_attention():
    torch.manual_seed(0)
    flt = LoopedTransformer(tiny(wiring="flt"))
    lt = LoopedTransformer(tiny(wiring="lt"))
    lt.load_state_dict(flt.state_dict())
    idx = torch.randint(0, 97, (2, 16))
    recs = Recorder(), Recorder()
    for model, rec in zip((flt, lt), recs):
        model.attach_observer(rec)
        model(idx)
    last_of_round1 = Visit(1, 2, "ffn")
    assert torch.equal(recs[0].traces[last_of_round1].state, recs[1].traces[last_of_round1].state)
    assert not torch.allclose(recs[0].traces[Visit(2, 1, "attn")].state, recs[1].traces[Visit(2, 1, "attn")].state)
    # rounds=1 FLT equals LT at R = 1
    with torch.no_grad():
        assert torch.equal(flt(idx, rounds=1)[0], lt(idx, rounds=1)[0])


def test_rounds_override_runs_any_round_count():
    model = LoopedTransformer(tiny())
    idx = torch.randint(0, 97, (2, 16))
    with torch.no_grad():
        outs = [model(idx, idx, rounds=r) for r in (1, 2, 5, 8)]
    assert all(o[0].shape == (2, 16, 97) for o in outs)
    assert len({round(o[1].item(), 6) for o in outs}) == 4
    assert model.alpha == pytest.approx(math.sqrt(12))  # α of the training N = 6
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        model(idx, rounds=0)


@pytest.mark.parametrize("wiring", ["lt", "flt"])
def test_activation_checkpointing_same_loss_and_grads(wiring):
    idx = torch.randint(0, 97, (2, 16))
    results = []
    for ckpt in (False, True):
        torch.manual_seed(0)
        model = LoopedTransformer(tiny(wiring=wiring, checkpoint_rounds=ckpt))
        _, loss = model(idx, idx)
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    assert torch.allclose(results[0][0], results[1][0])
    for name, g in results[0][1].items():
        assert torch.allclose(g, results[1][1][name], atol=1e-6), name


def test_truncated_rounds_contribute_no_gradient():
    torch.manual_seed(0)
    model = LoopedTransformer(tiny(n_rounds=4, truncate_rounds=2, residual="deeploop"))
    rec, grads = Recorder(), {}
    model.attach_observer(rec)
    idx = torch.randint(0, 97, (2, 16))
    _, loss = model(idx, idx)
    for visit, trace in rec.traces.items():
        assert trace.state.requires_grad == (visit.round > 2), visit
        w = trace.params["f.fc1.weight" if visit.sublayer == "ffn" else "f.qkv_proj.weight"]
        if w.requires_grad:
            w.register_hook(lambda g, v=visit: grads.__setitem__(v, g))
    loss.backward()
    assert {v.round for v in grads} == {3, 4}
    for k, block in enumerate(model.blocks, 1):  # the weight's grad is rounds 3 + 4 alone
        total = grads[Visit(3, k, "ffn")] + grads[Visit(4, k, "ffn")]
        assert torch.allclose(total, block.ffn.f.fc1.weight.grad, rtol=1e-6, atol=1e-9)


def test_loss_round_modes():
    idx = torch.randint(0, 97, (2, 16))
    torch.manual_seed(0)
    model = LoopedTransformer(tiny(n_rounds=6, loss_rounds="all", init_std=0.5))  # logits large enough to differ
    assert list(model.loss_round_indices(6)) == [1, 2, 3, 4, 5, 6]
    model.config.loss_rounds = "last_third"
    assert list(model.loss_round_indices(6)) == [5, 6]
    model.config.loss_rounds = "last"
    assert list(model.loss_round_indices(6)) == [6]
    with torch.no_grad():
        _, last = model(idx, idx)
        per_round = [model(idx, idx, rounds=r)[1] for r in range(1, 7)]  # each round's own loss
        model.config.loss_rounds = "all"
        _, mean_all = model(idx, idx)
    model.config.loss_rounds = "last"
    assert len({round(v.item(), 4) for v in per_round}) == 6  # the rounds' losses differ, so the mean is a test
    assert torch.allclose(mean_all, torch.stack(per_round).mean(), atol=1e-6)
    assert torch.allclose(last, per_round[-1])


def test_per_visit_views_sum_to_weight_grad():
    torch.manual_seed(0)
    model = LoopedTransformer(tiny(residual="deeploop"))
    rec, grads = Recorder(), {}
    model.attach_observer(rec)
    _, loss = model(*(2 * [torch.randint(0, 97, (2, 16))]))
    for visit, trace in rec.traces.items():
        trace.params["f.fc1.weight" if visit.sublayer == "ffn" else "f.qkv_proj.weight"].register_hook(
            lambda g, v=visit: grads.__setitem__(v, g)
        )
    loss.backward()
    for k, block in enumerate(model.blocks, 1):
        for s, weight in (("attn", block.attn.f.qkv_proj.weight), ("ffn", block.ffn.f.fc1.weight)):
            total = sum(grads[Visit(r, k, s)] for r in (1, 2, 3))
            assert torch.allclose(total, weight.grad, rtol=1e-6, atol=1e-9)


def test_visit_tags_round_trip():
    v = Visit(3, 1, "attn")
    assert v.tag == "r03_k1_attn" and Visit.parse(v.tag) == v and v.physical == "k1_attn"
    with pytest.raises(ValueError):
        Visit.parse("round3")


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(residual="deepnet"), "residual='deepnet' is not allowed; choose one of preln, postln"),
        (dict(wiring="loop"), "wiring='loop' is not allowed; choose one of carry, lt, inject, flt"),
        (dict(d_model=30, n_heads=4), "d_model=30 is not divisible by n_heads=4"),
        (dict(n_rounds=0), "n_rounds must be >= 1"),
        (dict(residual="scaled", p=0.0), "needs p > 0"),
        (dict(residual="scaled", p=-1), "needs p > 0"),
        (dict(p=0.3), "only used with residual='scaled'"),
        (dict(truncate_rounds=3), "truncate_rounds=3 must be in"),
    ],
)
def test_bad_configs_raise_clear_errors(kw, match):
    base = dict(vocab_size=97, seq_len=16, d_model=32, n_heads=4, n_blocks=2, n_rounds=3)
    base.update(kw)
    with pytest.raises(ValueError, match=match.replace("(", r"\(").replace("[", r"\[")):
        LoopConfig(**base)


def test_sequence_longer_than_position_table():
    model = LoopedTransformer(tiny())
    with pytest.raises(ValueError, match="exceeds the position table"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_compiles_without_graph_breaks():
    model = LoopedTransformer(tiny(wiring="flt", positions="rope"))
    idx = torch.randint(0, 97, (2, 16))
    explanation = torch._dynamo.explain(model)(idx, idx)
    assert explanation.graph_break_count == 0, explanation.break_reasons


# ------------------------------------------------------------------ init, wirings, FLOPs
def test_xavier_init_is_deepnets_recipe_and_the_post_ln_default():
    kw = dict(vocab_size=64, seq_len=8, d_model=128, n_heads=4, n_blocks=1, n_rounds=6)
    assert LoopConfig(residual="preln", **kw).init_scheme == "normal"
    assert LoopConfig(residual="deeploop", **kw).init_scheme == "xavier"
    torch.manual_seed(0)
    model = LoopedTransformer(LoopConfig(residual="deeploop", **kw))
    beta, d, d_ff = model.beta, 128, 512
    attn, ffn = model.blocks[0].attn.f, model.blocks[0].ffn.f
    square = math.sqrt(2 / (2 * d))  # xavier_normal std of a d x d matrix
    q, k, v = attn.qkv_proj.parts().values()  # each part of the fused projection a d x d matrix of its own
    assert q.std().item() == pytest.approx(square, rel=0.03)  # gain 1 on Q, K
    assert k.std().item() == pytest.approx(square, rel=0.03)
    assert v.std().item() == pytest.approx(beta * square, rel=0.03)  # gain β on V, O, fc1, fc2
    assert attn.o_proj.weight.std().item() == pytest.approx(beta * square, rel=0.03)
    assert ffn.fc1.weight.std().item() == pytest.approx(beta * math.sqrt(2 / (d + d_ff)), rel=0.03)
    assert model.wte.weight.std().item() == pytest.approx(0.02, rel=0.03)  # embeddings stay N(0, init_std²)
    normal = LoopedTransformer(LoopConfig(residual="deeploop", init="normal", init_std=0.05, **kw))
    assert normal.blocks[0].attn.f.qkv_proj.parts()["q_proj"].std().item() == pytest.approx(0.05, rel=0.03)
    assert normal.blocks[0].ffn.f.fc2.weight.std().item() == pytest.approx(0.05 * beta, rel=0.03)


def _round_inputs(model, idx):
    rec = Recorder()
    model.attach_observer(rec)
    with torch.no_grad():
        model(idx)
    model.attach_observer(None)
    return rec.traces


@pytest.mark.parametrize("input_norm", [False, True])
def test_wirings_start_each_round_where_their_papers_do(input_norm):
    from loopnet.model.layers import unit_rms

    idx = torch.randint(0, 97, (2, 16))
    torch.manual_seed(0)
    ref = LoopedTransformer(tiny(residual="preln", input_norm=input_norm))
    e = ref.wte(idx) + ref.wpe(torch.arange(16))
    x0 = unit_rms(e) if input_norm else e
    for wiring, start in [
        ("carry", lambda end, h: end),
        ("lt", lambda end, h: h),
        ("inject", lambda end, h: unit_rms(e + h)),
    ]:  # LT_i: Norm(e + h), as the FLT code
        model = LoopedTransformer(tiny(residual="preln", input_norm=input_norm, wiring=wiring))
        model.load_state_dict(ref.state_dict())
        traces = _round_inputs(model, idx)
        assert torch.allclose(traces[Visit(1, 1, "attn")].x, x0)
        end = traces[Visit(1, 2, "ffn")].state
        assert torch.allclose(traces[Visit(2, 1, "attn")].x, start(end, unit_rms(end)), atol=1e-6), wiring
    flt = LoopedTransformer(tiny(residual="preln", input_norm=input_norm, wiring="flt"))
    flt.load_state_dict(ref.state_dict())
    assert torch.allclose(_round_inputs(flt, idx)[Visit(3, 1, "attn")].x, x0)  # every round restarts


def test_flops_count_every_loss_head_and_no_backward_for_truncated_rounds():
    def count(**kw):
        model = LoopedTransformer(tiny(n_rounds=6, **kw))
        return model, model.flops_per_token(seq_len=16)

    model, base = count()
    K, d, T = 2, 32, 16
    block = sum(p.numel() for p in model.blocks[0].parameters())
    head = model.lm_head.weight.numel()
    fwd_round = K * (2 * block + 4 * d * T)
    assert base == 3 * 6 * fwd_round + 6 * head  # 6(R·K·block + head) + 12·N·d·T, nanoGPT's formula
    assert count(loss_rounds="all")[1] == 3 * 6 * fwd_round + 6 * head * 6
    assert count(loss_rounds="last_third")[1] == 3 * 6 * fwd_round + 6 * head * 2
    assert count(truncate_rounds=2)[1] == 3 * 4 * fwd_round + 2 * fwd_round + 6 * head
    assert model.flops_per_token(seq_len=16, rounds=3, training=False) == 3 * fwd_round + 2 * head


# ------------------------------------------------------------------ fused QKV, hand-written RMSNorm
def separate_attention(attn, x, q_src=None):
    """The attention of separate W_Q, W_K, W_V matmuls (the layout before the fused projection)."""
    B, T, C = x.shape
    w_q, w_k, w_v = attn.qkv_proj.parts().values()
    split = lambda t: t.view(B, T, attn.n_heads, C // attn.n_heads).transpose(1, 2)  # noqa: E731
    q, k, v = split((x if q_src is None else q_src) @ w_q.T), split(x @ w_k.T), split(x @ w_v.T)
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    return attn.o_proj(y.transpose(1, 2).reshape(B, T, C))


@pytest.mark.parametrize("inject", [False, True])
def test_fused_qkv_computes_the_separate_projections(inject):
    torch.manual_seed(0)
    attn = LoopedTransformer(tiny(residual="deeploop")).blocks[0].attn.f
    x = torch.randn(2, 16, 32, requires_grad=True)
    q_src = torch.randn(2, 16, 32, requires_grad=True) if inject else None
    fused, separate = attn(x, q_src=q_src), separate_attention(attn, x, q_src)
    torch.testing.assert_close(fused, separate, rtol=1e-5, atol=1e-6)
    inputs = (x, attn.qkv_proj.weight) + ((q_src,) if inject else ())
    g = torch.randn_like(fused)
    for a, b in zip(torch.autograd.grad(fused, inputs, g), torch.autograd.grad(separate, inputs, g)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    if inject:  # the queries come from q_src: moving it moves the output, x fixed
        assert not torch.allclose(attn(x, q_src=q_src + 1), fused)


@pytest.mark.parametrize("init", ["xavier", "normal"])
def test_beta_lands_on_the_value_rows_of_the_fused_projection_only(init):
    """Same seed, β = 1 against β < 1: W_Q and W_K identical, W_V exactly β times its β = 1 self; each
    part drawn as a d x d matrix (xavier std √(2/(2d)), not the 3d x d fan's)."""
    kw = dict(vocab_size=64, seq_len=8, d_model=128, n_heads=4, n_blocks=2, n_rounds=3, init=init)
    torch.manual_seed(0)
    ref = LoopedTransformer(LoopConfig(residual="postln", **kw))
    torch.manual_seed(0)
    deep = LoopedTransformer(LoopConfig(residual="deeploop", **kw))
    for a, b in zip(ref.blocks, deep.blocks):
        q, k, v = a.attn.f.qkv_proj.parts().values()
        q_, k_, v_ = b.attn.f.qkv_proj.parts().values()
        assert torch.equal(q, q_) and torch.equal(k, k_)
        torch.testing.assert_close(v_, deep.beta * v, rtol=1e-6, atol=0)
        if init == "xavier":
            assert q.std().item() == pytest.approx(math.sqrt(1 / 128), rel=0.05)


@pytest.mark.parametrize("weighted", [True, False])
def test_rms_norm_matches_torch_forward_and_backward(weighted):
    from loopnet.model.kernels import rms_norm

    torch.manual_seed(0)
    x = (3 * torch.randn(4, 8, 32)).requires_grad_()
    w = (1 + torch.randn(32)).requires_grad_() if weighted else None
    ours, ref = rms_norm(x, w, 1e-6), torch.nn.functional.rms_norm(x, (32,), w, 1e-6)
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6)
    inputs = (x, w) if weighted else (x,)
    g = torch.randn_like(ours)
    for a, b in zip(torch.autograd.grad(ours, inputs, g), torch.autograd.grad(ref, inputs, g)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_training_head_loss_and_gradients_equal_cross_entropy_on_the_logits():
    """The fp32 training head (gradients formed in the forward) against F.cross_entropy on materialised
    logits, ignored targets (-1) included; the tied weight also gets the embedding's gradient."""
    from loopnet.model import lm_loss

    torch.manual_seed(0)
    model = LoopedTransformer(tiny(residual="preln", n_rounds=1, init_std=0.3))
    idx, targets = torch.randint(0, 97, (2, 16)), torch.randint(0, 97, (2, 16))
    targets[0, :5] = -1
    grads = []
    for fused in (True, False):
        model.zero_grad()
        if fused:
            logits, loss = model(idx, targets)
            assert not logits.requires_grad
        else:
            x = next(x for _, x in model.iter_rounds(idx))
            logits = model.lm_head(model.final_norm(x))
            loss = lm_loss(logits, targets)
        loss.backward()
        grads.append((loss.detach(), logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (l1, z1, g1), (l2, z2, g2) = grads
    torch.testing.assert_close(l1, l2, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(z1, z2, rtol=1e-6, atol=1e-6)
    # Both paths sum the same B·T = 32 per-position contributions into each gradient entry, in other
    # orders (the fused head accumulates in the forward, autograd in one matmul); reordering an fp32 sum
    # of n terms moves it by up to n·u·Σ|terms| (u = 2^-24), and here the terms are of the gradient's own
    # size (|p - y| <= 1, normalised h of order 1). A wrong gradient is off by the order of |g| itself.
    n, u = idx.numel(), 2.0**-24
    for name in g1:
        atol = n * u * g2[name].abs().max().item()
        torch.testing.assert_close(g1[name], g2[name], rtol=0, atol=atol, msg=name)
    with torch.no_grad():  # evaluation keeps the plain path: logits and the same loss
        torch.testing.assert_close(model(idx, targets)[1], l2, rtol=1e-6, atol=1e-6)


def test_training_head_loss_is_exact_where_the_softmax_underflows():
    """A target whose probability is below fp32's range (loss ≈ 150 and 400 nats) still gets
    F.cross_entropy's loss, and its row's gradient is still softmax − one-hot."""
    from loopnet.model.kernels import LinearCrossEntropy

    torch.manual_seed(0)
    x, w = torch.randn(6, 8), torch.randn(11, 8)
    x[0], w[3] = 0.0, 0.0
    x[0, 0], w[3, 0], w[4, 0] = 10.0, -15.0, 0.0  # row 0: logit of class 3 is 150 below class 4's
    x[1, 1], w[5, 1] = 20.0, 20.0  # row 1: class 5's logit 400 above the rest
    targets = torch.tensor([3, 0, 1, -1, 2, 7])
    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    loss, _ = LinearCrossEntropy.apply(xs, ws, targets)
    loss.backward()
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    ref = F.cross_entropy(xr @ wr.t(), targets, ignore_index=-1)
    ref.backward()
    assert ref.item() > 50
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(xs.grad, xr.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ws.grad, wr.grad, rtol=1e-5, atol=1e-6)
    # The sync-free route (CUDA's) gives the same per-row losses, ignored row and far rows included.
    from loopnet.model.kernels import target_nll

    logits = x @ w.t()
    p, index = torch.softmax(logits, -1), targets.clamp(min=0)[:, None]
    exact = F.cross_entropy(logits, targets.clamp(min=0), reduction="none")
    for host_check in (True, False):
        torch.testing.assert_close(target_nll(logits, p, index, host_check), exact, rtol=1e-6, atol=1e-5)
