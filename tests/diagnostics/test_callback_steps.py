"""VisitDiagnostics' per-step set-up and helpers called directly (quick; test_callback.py runs real fits): which
probe a logging step builds, the physical sublayers it measures, the norm it takes."""

from types import SimpleNamespace

import pytest
import torch

from loopnet.diagnostics import VisitDiagnostics
from loopnet.diagnostics.callback import physical_sublayers, step_draw, total_norm
from loopnet.diagnostics.update_size import round_outputs
from loopnet.model import LoopedTransformer
from tests.helpers import tiny_config

from .helpers import random_tokens, tiny_module


@pytest.mark.parametrize("accumulate, world, keep", [(1, 1, False), (2, 1, True), (1, 2, True)])
@pytest.mark.parametrize("histograms", [True, False])
def test_a_logging_steps_probe_keeps_gradient_tensors_only_where_the_sums_need_them(
    accumulate, world, keep, histograms
):
    """keep_grads (R copies of the block gradients in memory) only under accumulation or several processes;
    histogram samples only with histograms on; the update size reads the step's inputs at its own rounds."""
    lm = tiny_module()
    cb = VisitDiagnostics(every_n_steps=1, histograms=histograms, hist_samples=64)
    cb.on_fit_start(SimpleNamespace(strategy=None, is_global_zero=False, loggers=[]), lm)
    trainer_ = SimpleNamespace(global_step=3, max_steps=10, accumulate_grad_batches=accumulate, world_size=world)
    batch = next(iter(random_tokens(4, seed=1)))
    cb.on_train_batch_start(trainer_, lm, batch, 0)
    assert cb._probe.keep_grads is keep and cb._probe.hist_samples == (64 if histograms else 0)
    assert lm.model.observer is cb._probe and cb._inputs is batch[0]
    lm.model.attach_observer(None)
    with torch.no_grad():
        expected = round_outputs(lm.model, batch[0])
    assert all(torch.equal(a, b) for a, b in zip(cb._outputs_before, expected))


def test_total_norm_is_the_l2_norm_of_all_tensors_together():
    empty = total_norm([])
    assert empty.shape == () and float(empty) == 0.0
    a, b = torch.tensor([3.0, 0.0]), torch.tensor([[4.0], [12.0]])
    assert float(total_norm([a, b])) == 13.0


def test_physical_sublayers_are_what_the_visits_name_with_the_parameters_they_read():
    """Loop, prelude and coda: one entry per physical sublayer the model's visits name (`Visit.physical`),
    holding the very parameters those visits read through their views."""

    class Keep:
        def __init__(self):
            self.params = {}

        def on_visit(self, visit, trace):
            self.params.setdefault(visit.physical, trace.params)

    torch.manual_seed(0)
    model = LoopedTransformer(tiny_config(wiring="inject", n_prelude=1, n_coda=2))
    keep = Keep()
    model.attach_observer(keep)
    model(torch.zeros(1, 4, dtype=torch.long))
    model.attach_observer(None)
    physical = physical_sublayers(model)
    assert set(physical) == set(keep.params) and len(physical) == 2 * (2 + 1 + 2)
    for j, params in physical.items():
        assert set(params) == set(keep.params[j])
        assert all(params[n].data_ptr() == keep.params[j][n].data_ptr() for n in params), j


def test_with_sampled_rounds_the_update_size_reads_the_steps_own_draw():
    """A model that samples R per step: the step's outputs before its update are taken at that step's drawn
    rounds and α (LoopedLM.draw), not at the mean R."""
    config = tiny_config(
        wiring="inject", round_sampling="poisson_truncated", backprop_rounds=2, max_rounds=6, scales_depth="sampled"
    )
    lm = tiny_module(config=config)
    # a step whose draw is neither the mean R nor step 0's (the module's own step outside a Trainer)
    step = next(s for s in range(1, 100) if lm.draw(s).rounds not in (config.n_rounds, lm.draw(0).rounds))
    draw = lm.draw(step)
    cb = VisitDiagnostics(every_n_steps=1)
    cb.on_fit_start(SimpleNamespace(strategy=None, is_global_zero=False, loggers=[]), lm)
    trainer_ = SimpleNamespace(global_step=step, max_steps=1000, accumulate_grad_batches=1, world_size=1)
    batch = next(iter(random_tokens(4, seed=2)))
    cb.on_train_batch_start(trainer_, lm, batch, 0)
    lm.model.attach_observer(None)
    assert cb._draw == (draw.rounds, draw.alpha) and draw.alpha != lm.model.alpha
    with torch.no_grad():
        expected = round_outputs(lm.model, batch[0], draw.rounds, draw.alpha)
    assert len(cb._outputs_before) == draw.rounds + 1
    assert all(torch.equal(a, b) for a, b in zip(cb._outputs_before, expected))


def test_a_module_that_draws_nothing_runs_the_models_own_rounds():
    assert step_draw(torch.nn.Module(), 3) == (None, None)
