"""Each loop wiring against its definition written out here (the model module's docstring), from the
model's own blocks and embeddings: where each round starts, where h = Norm(x_end) enters, and which
rounds' logits make the loss.

    round 1 starts from x0 = e, or Norm(e) with input_norm
    carry:   round r+1 starts from x_end
    lt:      round r+1 starts from h = Norm(x_end)
    inject add first:   round r+1 starts from Norm(e + h)
    inject add every:   restarts from x0, x <- Norm(x + h) before every block
    inject attention:   restarts from x0, the first (or every) block's attention takes its query from h
    flt:     restarts from x0, the query of every block's attention from h
"""

import itertools

import pytest
import torch

from loopnet.model import LoopedTransformer, lm_loss
from loopnet.model.layers import unit_rms
from tests.helpers import tiny_config

WIRINGS = {
    "carry": dict(wiring="carry"),
    "lt": dict(wiring="lt"),
    "flt": dict(wiring="flt"),
    "inject add first": dict(wiring="inject", injection="add", inject_into="first"),
    "inject add every": dict(wiring="inject", injection="add", inject_into="every"),
    "inject attention first": dict(wiring="inject", injection="attention", inject_into="first"),
    "inject attention every": dict(wiring="inject", injection="attention", inject_into="every"),
}


class Watcher:
    def on_visit(self, visit, trace):
        pass


def round_ends(model: LoopedTransformer, idx: torch.Tensor, rounds: int) -> list[torch.Tensor]:
    """x_end of every round, by the definitions above."""
    cfg, T = model.config, idx.size(1)
    e = model.wte(idx)
    if cfg.positions == "learned":
        e = e + model.wpe(torch.arange(T))
    x0 = unit_rms(e) if cfg.input_norm else e
    ends, x_end = [], None
    for r in range(1, rounds + 1):
        h = None if r == 1 else unit_rms(x_end)
        if r == 1:
            x = x0
        elif cfg.wiring == "carry":
            x = x_end
        elif cfg.wiring == "lt":
            x = h
        elif cfg.wiring == "inject" and cfg.injection == "add" and cfg.inject_into == "first":
            x = unit_rms(e + h)
        else:
            x = x0
        for k, block in enumerate(model.blocks, start=1):
            query = None
            if h is not None:
                if cfg.wiring == "flt":
                    query = h
                elif cfg.wiring == "inject" and cfg.injection == "attention" and (cfg.inject_into == "every" or k == 1):
                    query = h
                elif cfg.wiring == "inject" and cfg.injection == "add" and cfg.inject_into == "every":
                    x = unit_rms(x + h)
            x = block(x, model.alpha, query, model.rotary)
        ends.append(x_end := x)
    return ends


@pytest.mark.parametrize("name,positions", list(itertools.product(WIRINGS, ["learned", "rope"])))
def test_each_wiring_is_its_definition(name, positions):
    # Pre-LN: its stream is not normalised, so Norm(x_end) differs from x_end (with a Post-LN scheme
    # such as DeepLoop the stream leaves every block normalised and lt would equal carry).
    torch.manual_seed(0)
    model = LoopedTransformer(tiny_config(residual="preln", positions=positions, **WIRINGS[name])).eval()
    idx = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        ends = round_ends(model, idx, 3)
        logits, _ = model(idx)
        want = model.lm_head(model.final_norm(ends[-1]))
        assert torch.allclose(logits, want, rtol=1e-5, atol=1e-5), name
        model.attach_observer(Watcher())  # observed, each visit reads its weights through views: same function
        assert torch.allclose(model(idx)[0], want, rtol=1e-5, atol=1e-5), name
        model.attach_observer(None)
        for r, x in model.iter_rounds(idx):
            assert torch.allclose(x, ends[r - 1], rtol=1e-5, atol=1e-5), (name, r)
        # Another round count runs the same definition (α of the training depth).
        ends5 = round_ends(model, idx, 5)
        assert torch.allclose(model(idx, rounds=5)[0], model.lm_head(model.final_norm(ends5[-1])), rtol=1e-5, atol=1e-5)
    # The wirings differ from one another by far more than the tolerance: one cannot stand in for another.
    if name != "carry":
        carry = LoopedTransformer(tiny_config(residual="preln", positions=positions))
        carry.load_state_dict(model.state_dict())
        with torch.no_grad():
            assert float((round_ends(carry, idx, 3)[-1] - ends[-1]).abs().max()) > 1e-2


@pytest.mark.parametrize("mode,rounds", [("last", [3]), ("all", [1, 2, 3]), ("last_third", [3])])
def test_the_loss_is_the_mean_over_the_loss_rounds(mode, rounds):
    torch.manual_seed(0)
    model = LoopedTransformer(tiny_config(residual="preln", wiring="lt", loss_rounds=mode))
    idx, tgt = torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        ends = round_ends(model, idx, 3)
        want = torch.stack([lm_loss(model.lm_head(model.final_norm(ends[r - 1])), tgt) for r in rounds]).mean()
        logits, loss = model(idx, tgt)
    assert float(loss) == pytest.approx(float(want), rel=1e-5)
    assert torch.allclose(logits, model.lm_head(model.final_norm(ends[-1])), atol=1e-5)  # the last round's logits


def test_last_third_of_six_rounds_is_rounds_five_and_six():
    model = LoopedTransformer(tiny_config(loss_rounds="last_third", n_rounds=6))
    assert list(model.loss_round_indices(6)) == [5, 6] and list(model.loss_round_indices(3)) == [3]
    assert list(model.loss_round_indices(9)) == [7, 8, 9] and list(model.loss_round_indices(1)) == [1]
    assert list(model.loss_round_indices(12)) == [9, 10, 11, 12]  # ⌈12/3⌉ = 4 rounds


def test_a_two_round_loss_is_the_mean_of_both_rounds():
    """Two loss rounds (last_third at R = 6: rounds 5 and 6) average both, not the first alone."""
    torch.manual_seed(0)
    model = LoopedTransformer(tiny_config(residual="preln", loss_rounds="last_third", n_rounds=6))
    idx, tgt = torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        ends = round_ends(model, idx, 6)
        per_round = [lm_loss(model.lm_head(model.final_norm(ends[r - 1])), tgt) for r in (5, 6)]
        _, loss = model(idx, tgt)
    assert abs(float(per_round[0] - per_round[1])) > 1e-4  # the two rounds differ, so the mean is seen
    assert float(loss) == pytest.approx(float((per_round[0] + per_round[1]) / 2), rel=1e-5)
