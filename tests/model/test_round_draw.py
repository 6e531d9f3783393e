"""Rounds drawn per sequence (`round_draw: sequence`, Parcae's per-sequence depths): the masked loop against the
batch loop and against each sequence run alone, where the gradients go, the draw's seeding and distribution,
the configurations it refuses, and a short fit."""

from __future__ import annotations

import math
from types import SimpleNamespace

import lightning as L
import numpy as np
import pytest
import torch

from loopnet.diagnostics.callback import VisitDiagnostics
from loopnet.model import LoopedTransformer
from loopnet.model.rounds import draw_rounds, mean_rounds, sequence_layout
from tests.diagnostics.helpers import random_tokens, tiny_module, trainer
from tests.helpers import tiny_config
from tests.training.test_recipe_rounds import reference_pmf

IDX = torch.randint(0, 64, (5, 16), generator=torch.Generator().manual_seed(0))
TGT = torch.roll(IDX, -1, 1)
# With backprop_rounds 2: k_i = min(2, R_i) = 1, 2, 2, 2, 2 and n_i = R_i − k_i = 0, 0, 3, 1, 5, so the pass runs
# 5 rounds without grad and 2 with; sequences 0 and 1 start at round 6, sequence 0 finishes there.
ROUNDS = torch.tensor([1, 2, 5, 3, 7])
GRAD = torch.tensor([1, 2, 2, 2, 2])
SEQUENCE = dict(round_sampling="poisson_truncated", backprop_rounds=2, round_draw="sequence", max_rounds=8)
# The wirings whose rounds differ only in where they start (carry with truncated rounds has no prelude: it
# would get no gradient).
WIRINGS = {
    "carry": dict(wiring="carry", n_coda=1),
    "carry_input_norm": dict(wiring="carry", input_norm=True),
    "lt": dict(wiring="lt", n_coda=1),
    "lt_round_norm": dict(wiring="lt", round_norm=True),
    "inject_add": dict(wiring="inject", injection="add", n_prelude=1, n_coda=1),
    "linear": dict(wiring="inject", injection="linear", n_prelude=1),
    "parcae": dict(
        wiring="inject",
        injection="diagonal",
        residual="preln",
        n_prelude=1,
        n_coda=1,
        prelude_norm=True,
        loop_proj=True,
        qk_norm=True,
        positions="rope",
    ),
}


def model_for(seed: int = 0, **overrides) -> LoopedTransformer:
    torch.manual_seed(seed)
    return LoopedTransformer(tiny_config(**SEQUENCE, **overrides))


def fp32_bound(cfg, rounds: int, scale: float, length: int | None = None) -> float:
    """Tolerance on two fp32 computations of one function in different orders (a batch of one sequence against
    a batch of five: the matmuls may block their sums differently). Each of the 2·N sublayer visits (N = P + K·R
    + C), the R injections and the head sum dot products of length at most n = max(d, d_ff, `length`), whose
    worst-case rounding is n·2⁻²⁴ relative; the Norms keep the errors adding rather than compounding; both
    sides round: 2·(2N + R + 2)·n·2⁻²⁴·`scale`."""
    n = max(cfg.d_model, cfg.d_ff, length or 0)
    return 2 * (2 * cfg.depth(rounds) + rounds + 2) * n * 2.0**-24 * scale


def loss_and_grads(model, idx, tgt, rounds, grad_rounds):
    model.zero_grad()
    logits, loss = model(idx, tgt, rounds=rounds, grad_rounds=grad_rounds)
    loss.backward()
    return (
        logits.detach(),
        loss.detach(),
        {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
    )


# ------------------------------------------------------------------------------ the masked loop
@pytest.mark.parametrize("wiring", ["carry", "inject_add", "parcae"])
def test_equal_sequences_run_as_the_batch_draw_does(wiring):
    """Every sequence at R = 4 with k = 2: no round is masked and no sequence starts late, so the per-sequence
    pass runs the batch pass's operations in its order: the same logits, loss and gradients, bit for bit."""
    model = model_for(**WIRINGS[wiring])
    per_sequence = loss_and_grads(model, IDX, TGT, torch.full((5,), 4), torch.full((5,), 2))
    batch = loss_and_grads(model, IDX, TGT, 4, 2)
    assert torch.equal(per_sequence[0], batch[0]) and torch.equal(per_sequence[1], batch[1])
    assert per_sequence[2].keys() == batch[2].keys() and len(batch[2]) > 0
    for name, grad in batch[2].items():
        assert torch.equal(per_sequence[2][name], grad), name


@pytest.mark.parametrize("wiring", list(WIRINGS))
def test_each_sequence_under_the_mask_is_that_sequence_run_alone(wiring):
    """Sequence i in the batch at its own (R_i, k_i) gives the logits of it alone at R_i rounds, the last k_i with
    gradients; and as the batch's loss is the mean of the sequences' (16 tokens each), its gradients are the mean
    of theirs. Sequences 0 and 1 start after the 5 rounds without grad, as at round 1."""
    model = model_for(**WIRINGS[wiring])
    cfg = model.config
    logits, loss, grads = loss_and_grads(model, IDX, TGT, ROUNDS, None)  # k_i by default: LoopConfig.grad_rounds
    alone = [
        loss_and_grads(model, IDX[i : i + 1], TGT[i : i + 1], int(r), int(k))
        for i, (r, k) in enumerate(zip(ROUNDS, GRAD))
    ]
    for i, (ref_logits, _, _) in enumerate(alone):
        error = (logits[i] - ref_logits[0]).abs().max().item()
        assert error <= fp32_bound(cfg, int(ROUNDS[i]), ref_logits.abs().max().item()), (i, error)
    mean_loss = torch.stack([a[1] for a in alone]).mean()
    assert abs(loss - mean_loss).item() <= fp32_bound(cfg, 7, mean_loss.item())
    # a parameter that only round 1 reads (carry's wpe) has gradients from the sequences whose round 1 has grad
    assert grads.keys() == set().union(*(a[2].keys() for a in alone))
    for name, grad in grads.items():
        parts = [a[2][name] for a in alone if name in a[2]]
        expected = torch.stack(parts).sum(0) / len(alone)
        scale = torch.stack(parts).abs().sum(0).max().item() / len(alone)
        error = (grad - expected).abs().max().item()
        # the weight gradients also sum over the B·T tokens
        assert error <= fp32_bound(cfg, 7, scale, IDX.numel()), (name, error, scale)
    # the bound tells rounds apart: sequence 4 alone at R = 1 is over twice the bound from its R = 7
    other, _, _ = loss_and_grads(model, IDX[4:5], TGT[4:5], 1, 1)
    assert (logits[4] - other[0]).abs().max() > 2 * fp32_bound(cfg, 7, other.abs().max().item())


def test_the_layout_masks_the_last_rounds_of_each_part():
    """Parcae's layout: sequence i advances in the first n_i of the rounds without grad and the first k_i of
    those with; the rounds after them hold its state."""
    n, active = sequence_layout(ROUNDS, GRAD)
    assert n == 5 and active.shape == (7, 5)
    expected = [
        [r < n_i if r < 5 else r - 5 < k_i for n_i, k_i in zip((0, 0, 3, 1, 5), GRAD.tolist())] for r in range(7)
    ]
    assert active.tolist() == expected


def test_gradients_reach_only_the_rounds_with_grad_of_the_sequences_that_advance():
    """Rounds 1..5 run without grad; in rounds 6 and 7 the gradient of every visit's output is zero exactly on the
    sequences held there (sequence 0 in round 7) and non-zero on the others."""
    model = model_for(**WIRINGS["parcae"])
    states = {}

    class Keep:
        def on_visit(self, visit, trace):
            if visit.looped:
                states[visit] = trace.state
                if trace.state.requires_grad:
                    trace.state.retain_grad()

    model.attach_observer(Keep())
    _, loss = model(IDX, TGT, rounds=ROUNDS)
    loss.backward()
    _, active = sequence_layout(ROUNDS, GRAD)
    assert {v.round for v in states} == set(range(1, 8))
    for visit, state in states.items():
        if visit.round <= 5:
            assert not state.requires_grad, visit
            continue
        per_sequence = state.grad.flatten(1).abs().amax(1)
        assert torch.equal(per_sequence == 0, ~active[visit.round - 1]), (visit, per_sequence)


# ------------------------------------------------------------------------------ the draw
def test_the_draw_is_a_function_of_seed_step_and_shard_and_leaves_the_global_rng_alone():
    cfg = tiny_config(n_rounds=6, round_sampling="poisson_truncated", backprop_rounds=2, round_draw="sequence")
    state = torch.get_rng_state()
    a = draw_rounds(cfg, 5, seed=7, batch_size=64, shard=0)
    assert torch.equal(torch.get_rng_state(), state)
    torch.manual_seed(123)
    b = draw_rounds(cfg, 5, seed=7, batch_size=64, shard=0)
    assert torch.equal(a.rounds, b.rounds) and torch.equal(a.grad_rounds, b.grad_rounds) and a.alpha is None
    for other in (dict(seed=8, shard=0), dict(seed=7, shard=1)):
        assert not torch.equal(draw_rounds(cfg, 5, batch_size=64, **other).rounds, a.rounds), other
    assert not torch.equal(draw_rounds(cfg, 6, seed=7, batch_size=64).rounds, a.rounds)
    assert a.rounds.shape == (64,) and 1 <= a.rounds.min() and a.rounds.max() <= cfg.round_cap
    assert torch.equal(a.grad_rounds, a.rounds.clamp(max=2))
    assert a.run == (int(a.rounds.max()), 2) and a.mean == pytest.approx(a.rounds.double().mean().item())


def test_the_module_draws_its_micro_batch_and_ranks_shard():
    """LoopedLM.draw: shard = (batch_idx mod accumulate_grad_batches) · world size + rank; a batch draw ignores it."""
    lm = tiny_module(config=tiny_config(n_rounds=4, **{**SEQUENCE, "max_rounds": 8}))
    assert torch.equal(lm.draw(3, batch_size=8).rounds, draw_rounds(lm.config, 3, batch_size=8, shard=0).rounds)
    lm._trainer = SimpleNamespace(global_rank=1, world_size=2, accumulate_grad_batches=3)
    try:
        got = lm.draw(3, batch_size=8, batch_idx=7)  # micro-batch 7 mod 3 = 1: shard 1·2 + 1
        assert torch.equal(got.rounds, draw_rounds(lm.config, 3, batch_size=8, shard=3).rounds)
    finally:
        lm._trainer = None
    batch = tiny_module(config=tiny_config(n_rounds=4, round_sampling="poisson_truncated", backprop_rounds=2))
    assert batch.draw(3, batch_size=8, batch_idx=5) == draw_rounds(batch.config, 3)


@pytest.mark.parametrize(
    "rule, m, s, cap",
    [("poisson_truncated", 8, 4, 400), ("poisson_truncated", 2, 1, 3), ("poisson_lognormal", 6, 2, 10)],
)
def test_per_sequence_draws_have_the_reference_distribution_and_are_independent(rule, m, s, cap):
    """20,000 R_i (40 steps × 500 sequences): the mean and variance of the reference's rule (the batch draw's,
    `reference_pmf`) within 3 standard errors, k_i = min(s, R_i), and no correlation between the sequences of a
    batch, the shards of a step, or successive steps beyond 4/√n (the standard error of a correlation of n
    independent pairs is 1/√n)."""
    cfg = tiny_config(n_rounds=m, round_sampling=rule, backprop_rounds=s, max_rounds=cap, round_draw="sequence")
    draws = [draw_rounds(cfg, step, seed=1234, batch_size=500) for step in range(40)]
    R = torch.stack([d.rounds for d in draws]).double().numpy()  # [step, sequence]
    assert all(torch.equal(d.grad_rounds, d.rounds.clamp(max=s)) for d in draws)
    pmf = reference_pmf(rule, m, cap, top=max(cap, 400))
    j = np.arange(pmf.size)
    mean = (j * pmf).sum()
    var = ((j - mean) ** 2 * pmf).sum()
    mu4 = ((j - mean) ** 4 * pmf).sum()
    n = R.size
    se_var = math.sqrt((mu4 - (n - 3) / (n - 1) * var**2) / n)  # Var(s²) = (μ4 − (n−3)/(n−1)·σ⁴)/n
    assert abs(R.mean() - mean) < 3 * math.sqrt(var / n), (R.mean(), mean)
    assert abs(R.var(ddof=1) - var) < 3 * se_var, (R.var(ddof=1), var)
    assert R.min() >= 1 and R.max() <= cap
    shard1 = torch.stack([draw_rounds(cfg, t, seed=1234, batch_size=500, shard=1).rounds for t in range(40)])
    for a, b in (
        (R[:, :-1], R[:, 1:]),  # neighbouring sequences of a batch
        (R, shard1.double().numpy()),  # the same position in two shards of a step
        (R[:-1], R[1:]),  # the same position at successive steps
    ):
        corr = np.corrcoef(a.ravel(), b.ravel())[0, 1]
        assert abs(corr) < 4 / math.sqrt(a.size), corr


def test_the_curriculum_sets_every_sequences_mean():
    """At step 0 of a 100-step curriculum (m = 10, s = 2) every sequence draws at m_0 = 2: mean 2 + e⁻² for
    max(Poisson(2), 1), within 3 standard errors over 20,000 sequences."""
    cfg = tiny_config(n_rounds=10, round_curriculum_steps=100, **(SEQUENCE | {"max_rounds": 400}))
    assert mean_rounds(cfg, 0) == 2
    R = draw_rounds(cfg, 0, seed=3, batch_size=20_000).rounds.double()
    pmf = reference_pmf("poisson_truncated", 2, 400)
    var = (np.arange(pmf.size) ** 2 * pmf).sum() - (2 + math.exp(-2)) ** 2
    assert abs(R.mean().item() - (2 + math.exp(-2))) < 3 * math.sqrt(var / R.numel())


# ------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize(
    "overrides, named",
    [
        (dict(round_draw="sequence"), "round_sampling='fixed' draws none"),
        (dict(round_draw="token"), "LoopConfig.round_draw='token' is not allowed"),
        (dict(SEQUENCE, scales_depth="sampled"), "every sequence has its own; fix: set model.config.scales_depth"),
        (dict(SEQUENCE, loss_rounds="all"), "fix: set model.config.loss_rounds: last"),
        (dict(SEQUENCE, wiring="flt"), "wiring=flt hands the previous round's state to the blocks"),
        (dict(SEQUENCE, wiring="inject", injection="attention"), "injection='attention'"),
        (dict(SEQUENCE, wiring="inject", inject_into="every"), "'every'"),
    ],
)
def test_a_config_that_cannot_draw_per_sequence_is_refused(overrides, named):
    with pytest.raises(ValueError, match=named) as err:
        tiny_config(**overrides)
    assert "fix:" in str(err.value)


@pytest.mark.parametrize(
    "rounds, grad_rounds, named",
    [
        (torch.tensor([3, 3]), None, "one entry per sequence \\(5\\)"),
        (torch.full((5,), 3.0), None, "1-D integer tensor"),
        (torch.tensor([3, 0, 3, 3, 3]), None, "must all be >= 1"),
        (ROUNDS, torch.full((5,), 2), "grad_rounds must be in \\[1, rounds\\]"),
        (ROUNDS, 2, "take per-sequence grad_rounds"),
    ],
)
def test_bad_per_sequence_rounds_are_refused(rounds, grad_rounds, named):
    model = model_for()
    with pytest.raises(ValueError, match=named):
        model(IDX, TGT, rounds=rounds, grad_rounds=grad_rounds)


def test_rounds_per_sequence_need_a_model_that_can_run_them():
    model = LoopedTransformer(tiny_config(loss_rounds="all"))
    with pytest.raises(ValueError, match="rounds per sequence: loss_rounds='all'"):
        model(IDX, TGT, rounds=ROUNDS)
    with pytest.raises(ValueError, match="a cached generation runs one round count"):
        next(model_for().iter_rounds(IDX, ROUNDS, kv=object()))  # any cache: refused before it is read
    with pytest.raises(ValueError, match="draws one R per sequence; got batch_size=None"):
        draw_rounds(tiny_config(**SEQUENCE), 0)


# ------------------------------------------------------------------------------ a fit
class StepRecord(L.Callback):
    """Per micro-batch: the module's draw, the loop's block-1 calls (rounds run), train/rounds, flops_per_batch."""

    def __init__(self):
        self.rows = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.calls, self.step = 0, trainer.global_step
        self.hook = pl_module.model.blocks[0].register_forward_hook(self.count)

    def count(self, module, *args):
        self.calls += module.training  # not the update size's passes, which run in eval mode

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.hook.remove()
        draw = pl_module.draw(self.step, batch[0].size(0), batch_idx)
        self.rows.append((draw, self.calls, float(trainer.callback_metrics["train/rounds"]), pl_module.flops_per_batch))


def test_a_fit_draws_per_sequence_and_the_visit_instruments_see_the_pass(tmp_path):
    """Three steps of two micro-batches each: every micro-batch runs its own pass (the most rounds its sequences
    need), logs their mean R and counts the FLOPs of the pass; the per-visit diagnostics log every round of it."""
    config = tiny_config(n_rounds=3, **WIRINGS["parcae"], **SEQUENCE)
    lm = tiny_module(config=config)
    record, diagnostics = StepRecord(), VisitDiagnostics(every_n_steps=1, histograms=False)
    t = trainer(tmp_path, [record, diagnostics], max_steps=3, accumulate_grad_batches=2, limit_val_batches=0)
    t.fit(lm, random_tokens(24))
    assert len(record.rows) == 6
    runs = []
    for draw, calls, logged, flops in record.rows:
        rounds, grad_rounds = draw.run
        assert calls == rounds and logged == pytest.approx(draw.mean)
        assert flops == lm.model.flops_per_token(seq_len=16, rounds=rounds, grad_rounds=grad_rounds) * 4 * 16
        runs.append(rounds)
    assert len({tuple(d.rounds.tolist()) for d, *_ in record.rows}) == 6  # micro-batches draw their own
    loop = [tag for tag in diagnostics.last_stats["visits"] if tag.startswith("r")]
    assert len(loop) == 2 * 2 * max(runs[-2:])  # the step's micro-batches: every round either ran
    visits = diagnostics.last_stats["visits"]
    assert all(math.isfinite(v["resid_norm"]) for v in visits.values())
    last = f"r{max(runs[-2:]):02d}_k2_ffn"  # a round with grad: its gradient values are there
    assert visits[last]["act_grad_norm"] > 0 and visits[last]["param_grad_norm"] > 0
