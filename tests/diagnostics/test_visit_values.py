"""The values VisitDiagnostics logs in a (tiny, one-step) Lightning fit, each against an independent
computation: the per-visit gradient norms, κ̂_R per sublayer and model-wide, the sublayer gradient
norms and the global norm from the model unrolled by hand (`reference`), the update ratio from the
weights before and after the step. Quick: one or two steps in-process."""

import copy

import pytest
import torch
from lightning.pytorch.loggers import Logger

from loopnet.diagnostics import VisitDiagnostics
from loopnet.model import Visit

from tests.helpers import tiny_config

from .helpers import random_tokens, tiny_module, trainer
from .reference import expected_values, visit_gradients

# The logged values are fp32 sums of up to a few thousand squares, the reference float64: they agree to
# ~n·2⁻²⁴ ≈ 1e-4 relative at worst; a visit read from a neighbouring one differs by far more.
REL = 1e-4


class Recorder(Logger):
    """Keeps every `log_metrics` call (the callback hands non-TensorBoard loggers all its scalars at once)."""

    def __init__(self):
        super().__init__()
        self.rows: list[tuple[int, dict]] = []

    name, version = "recorder", 0

    def log_hyperparams(self, *args, **kwargs):
        pass

    def log_metrics(self, metrics, step=None):
        self.rows.append((step, dict(metrics)))

    def logged(self, step: int) -> dict:
        out = {}
        for s, metrics in self.rows:
            if s == step:
                out |= metrics
        return out


def fit_one_step(tmp_path, accumulate: int = 1, clip: float | None = None, residual: str = "deeploop"):
    module = tiny_module(config=tiny_config(residual=residual))
    before = copy.deepcopy(module.model)
    data = random_tokens(4 * accumulate)
    diagnostics = VisitDiagnostics(every_n_steps=1, histograms=False, update_size=False, profile=False)
    recorder = Recorder()
    t = trainer(
        tmp_path,
        [diagnostics],
        max_steps=1,
        logger=recorder,
        limit_val_batches=0,
        accumulate_grad_batches=accumulate,
        gradient_clip_val=clip,
    )
    t.fit(module, data)
    return before, module.model, list(data), recorder.logged(0), diagnostics


@pytest.mark.parametrize("accumulate,residual", [(1, "deeploop"), (2, "preln")])
def test_every_logged_gradient_value_matches_the_unrolled_model(tmp_path, accumulate, residual):
    """One step (two micro-batches with accumulation, each loss scaled by ½ as Lightning does); the
    gradients clipped hard, so that the logged global norm must be the one before clipping."""
    before, _, batches, logged, diagnostics = fit_one_step(tmp_path, accumulate, clip=1e-4, residual=residual)
    grads, others = visit_gradients(before, batches[:accumulate], scale=1 / accumulate)
    expected = expected_values(grads, others)
    K, R = before.config.n_blocks, before.config.n_rounds
    assert len([t for t in expected if t.startswith("visits/")]) == 2 * K * R
    for tag, value in expected.items():
        assert logged[tag] == pytest.approx(value, rel=REL), tag
    # Visits differ from the same sublayer's visit in the round before by far more than the tolerance
    # (DeepLoop evens them out, so not all do): a value read from the previous round cannot pass.
    norm = lambda r, k, s: expected[f"visits/param_grad_norm/{Visit(r, k, s).tag}"]  # noqa: E731
    assert (
        max(
            abs(norm(v.round, v.block, v.sublayer) / norm(v.round - 1, v.block, v.sublayer) - 1)
            for v in grads
            if v.round > 1
        )
        > 10 * REL
    )
    assert expected["grad/global_norm"] > 100 * 1e-4  # the clip was active
    stats = diagnostics.last_stats
    assert stats["step"] == 0
    for v in grads:
        assert stats["visits"][v.tag]["param_grad_norm"] == pytest.approx(
            expected[f"visits/param_grad_norm/{v.tag}"], rel=REL
        )
    assert stats["kappa"] == pytest.approx(
        {j.removeprefix("sublayers/kappa/"): value for j, value in expected.items() if j.startswith("sublayers/kappa/")}
        | {"model": expected["grad/kappa_model"]},
        rel=REL,
    )
    assert stats["global_grad_norm"] == pytest.approx(expected["grad/global_norm"], rel=REL)


def test_update_ratio_is_the_relative_change_of_each_sublayers_weights(tmp_path):
    before, after, _, logged, diagnostics = fit_one_step(tmp_path)
    for k in (1, 2):
        for s in ("attn", "ffn"):
            w0 = {n: p.detach() for n, p in getattr(before.blocks[k - 1], s).named_parameters()}
            w1 = {n: p.detach() for n, p in getattr(after.blocks[k - 1], s).named_parameters()}
            delta = sum((w1[n].double() - w0[n].double()).square().sum() for n in w0) ** 0.5
            norm = sum(w0[n].double().square().sum() for n in w0) ** 0.5
            j = Visit(1, k, s).physical
            assert float(delta) > 0 and float(norm) > 0
            assert logged[f"sublayers/update_ratio/{j}"] == pytest.approx(float(delta / norm), rel=1e-3)
            assert diagnostics.last_stats["update_ratio"][j] == pytest.approx(float(delta / norm), rel=1e-3)


def test_the_unrolled_reference_computes_the_looped_models_loss():
    """The reference is the same function: same loss from the same batch, to fp32 rounding."""
    module = tiny_module()
    inputs, targets = next(iter(random_tokens(4)))
    from .reference import unrolled

    with torch.no_grad():
        assert float(unrolled(module.model)(inputs, targets)[1]) == pytest.approx(
            float(module.model(inputs, targets)[1]), rel=1e-6
        )
