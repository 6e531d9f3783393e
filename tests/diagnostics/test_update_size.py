"""The update-size diagnostic: the relative change of each round's state and of the logits that one
optimiser step causes, measured on the step's own batch."""

import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from loopnet.diagnostics import VisitDiagnostics
from loopnet.diagnostics.update_size import relative_changes, round_outputs
from loopnet.model import LoopedTransformer, Visit

from .helpers import random_tokens, tiny_config, tiny_module, trainer


class LastStates:
    """An observer keeping the output of the last visit of every round (an independent route to
    the end-of-round states)."""

    def __init__(self, n_blocks):
        self.n_blocks, self.states = n_blocks, {}

    def on_visit(self, visit, trace):
        if visit == Visit(visit.round, self.n_blocks, "ffn"):
            self.states[visit.round] = trace.state.detach().clone()


def test_round_outputs_and_relative_changes_match_a_direct_computation():
    torch.manual_seed(0)
    model = LoopedTransformer(tiny_config(dropout=0.1))
    idx = torch.randint(0, 64, (4, 16))
    rng = torch.get_rng_state()
    before = round_outputs(model, idx)
    assert torch.equal(torch.get_rng_state(), rng) and model.training  # no RNG drawn, mode restored
    assert all(v.norm() == 0 for v in relative_changes(before, before).values())

    def direct():
        rec = LastStates(2)
        model.eval()
        model.attach_observer(rec)
        with torch.no_grad():
            logits, _ = model(idx)
        model.attach_observer(None)
        model.train()
        return [rec.states[r] for r in (1, 2, 3)] + [logits]

    ref_before = direct()
    for a, b in zip(before, ref_before):
        assert torch.allclose(a, b, atol=1e-6)
    with torch.no_grad():
        for p in model.blocks[0].ffn.parameters():
            p.add_(0.01 * torch.randn_like(p))
    changes = relative_changes(before, round_outputs(model, idx))
    ref_after = direct()
    for r in (1, 2, 3):
        want = (ref_after[r - 1] - ref_before[r - 1]).norm() / ref_before[r - 1].norm()
        assert torch.allclose(changes[f"update/output_change/r{r:02d}"], want, rtol=1e-4)
    assert torch.allclose(changes["update/output_change"], changes["update/output_change/r03"])
    want = (ref_after[-1] - ref_before[-1]).norm() / ref_before[-1].norm()
    assert torch.allclose(changes["update/logit_change"], want, rtol=1e-4)
    assert changes["update/output_change"] > 0


def _fit(tmp_path, update_size):
    module = tiny_module()
    diag = VisitDiagnostics(every_n_steps=2, histograms=False, update_size=update_size)
    tr = trainer(tmp_path / str(update_size), [diag], max_steps=5)
    tr.fit(module, random_tokens(), random_tokens(16, seed=1))
    return module, diag, tr


def test_callback_logs_the_update_size_and_leaves_training_unchanged(tmp_path):
    on, diag, tr = _fit(tmp_path, True)
    off, _, _ = _fit(tmp_path, False)
    for a, b in zip(on.parameters(), off.parameters()):  # two extra no-grad forwards change nothing
        assert torch.equal(a, b)
    acc = EventAccumulator(tr.logger.log_dir, size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"update/output_change", "update/logit_change"} | {
        f"update/output_change/r{r:02d}" for r in (1, 2, 3)
    } <= tags
    values = [e.value for e in acc.Scalars("update/output_change")]
    assert [e.step for e in acc.Scalars("update/output_change")] == [0, 2, 4]
    assert all(0 < v < 10 for v in values)
    assert diag.last_stats["update"]["output_change"] == values[-1]
