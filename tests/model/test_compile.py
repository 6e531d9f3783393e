"""torch.compile of the network in training: its gradients equal eager's with graphs reused across R', and a
compiled fit logs the per-visit diagnostics of the eager one. Both compile the same model (tests.helpers.tiny_config,
batch 4): run one after the other in this module, the second finds most of its kernels in inductor's cache."""

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from loopnet.diagnostics import VisitDiagnostics, expected_scalar_tags
from loopnet.model import LoopedTransformer
from tests.diagnostics.helpers import random_tokens, tiny_module, trainer
from tests.helpers import tiny_config

pytestmark = pytest.mark.slow

CONFIG = tiny_config()  # tests.diagnostics.helpers.tiny_module's model too


def test_compiled_model_matches_eager_and_reuses_graphs_across_rounds():
    from torch._dynamo.utils import counters

    cfg = CONFIG
    torch.manual_seed(0)
    eager = LoopedTransformer(cfg)
    torch.manual_seed(0)
    compiled = LoopedTransformer(cfg)
    compiled.compile()
    x = torch.randint(0, 64, (4, 16))
    before = counters["stats"]["unique_graphs"]
    for model in (eager, compiled):
        model(x, x)[1].backward()
    first = counters["stats"]["unique_graphs"] - before
    assert 1 <= first <= 3  # attention, FFN and head graphs, not one per visit (graphs may already be cached)
    for p, q in zip(eager.parameters(), compiled.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    before = counters["stats"]["unique_graphs"]
    compiled(x, x, rounds=5)[1].backward()  # another R': the same graphs
    assert counters["stats"]["unique_graphs"] == before


def test_compiled_model_logs_the_same_visits_as_eager(tmp_path):
    """`compile: true` with diagnostics: logging steps (observer attached) run the eager visit path
    beside the compiled graphs, and every per-visit value matches the uncompiled run."""
    from torch._dynamo.utils import counters

    values = {}
    graphs_before = counters["stats"]["unique_graphs"]
    for compiled in (False, True):
        module = tiny_module(compile=compiled)
        t = trainer(tmp_path / str(compiled), [VisitDiagnostics(every_n_steps=2)], max_steps=3)
        t.fit(module, random_tokens())
        acc = EventAccumulator(t.log_dir, size_guidance={"scalars": 0})
        acc.Reload()
        values[compiled] = {
            tag: [e.value for e in acc.Scalars(tag)] for tag in expected_scalar_tags(CONFIG.n_blocks, CONFIG.n_rounds)
        }
    assert counters["stats"]["unique_graphs"] > graphs_before  # the compiled run did run compiled graphs
    assert values[True].keys() == values[False].keys()
    for tag, eager in values[False].items():
        assert len(eager) == 2 and values[True][tag] == pytest.approx(eager, rel=1e-3, abs=1e-5), tag
