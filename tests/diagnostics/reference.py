"""An independent reference for the per-visit gradients: the looped model written out by hand.

A carry-wired LoopedTransformer with K blocks and R rounds computes the same function as one with
K·R blocks and 1 round whose block (r−1)·K + k is a copy of block k (same N = K·R, so the same α).
In the unrolled copy every visit has weights of its own, so plain autograd gives each visit's
gradient contribution g_{r,j} as the gradient of its copy: no hooks, no views, no probe.
"""

from __future__ import annotations

import dataclasses

import torch

from loopnet.model import SUBLAYERS, LoopedTransformer, Visit


def unrolled(model: LoopedTransformer) -> LoopedTransformer:
    cfg = model.config
    assert cfg.wiring == "carry" and cfg.loss_rounds == "last" and cfg.truncate_rounds == 0 and cfg.dropout == 0
    K, R = cfg.n_blocks, cfg.n_rounds
    flat = LoopedTransformer(dataclasses.replace(cfg, n_blocks=K * R, n_rounds=1))
    assert (flat.alpha, flat.beta) == (model.alpha, model.beta)  # N = K·R in both
    state = {name: t for name, t in model.state_dict().items() if not name.startswith("blocks.")}
    for r in range(R):
        for k in range(K):
            for name, t in model.blocks[k].state_dict().items():
                state[f"blocks.{r * K + k}.{name}"] = t.clone()
    flat.load_state_dict(state)
    return flat


def visit_gradients(model: LoopedTransformer, batches, scale: float = 1.0):
    """g_{r,j} per visit (r, k, sublayer) and parameter name (as `VisitTrace.params` names them) of the
    loss `scale`·Σ_batches L(batch), from the unrolled copy of `model` (whose weights are left alone);
    and the gradients of the parameters outside the blocks (embeddings, final Norm, head)."""
    K, R = model.config.n_blocks, model.config.n_rounds
    flat = unrolled(model)
    for inputs, targets in batches:
        _, loss = flat(inputs, targets)
        (loss * scale).backward()
    grads = {
        Visit(r, k, s): {
            name: p.grad.detach().clone() for name, p in getattr(flat.blocks[(r - 1) * K + k - 1], s).named_parameters()
        }
        for r in range(1, R + 1)
        for k in range(1, K + 1)
        for s in SUBLAYERS
    }
    others = [p.grad.detach().clone() for name, p in flat.named_parameters() if not name.startswith("blocks.")]
    return grads, others


def sq(tensors) -> float:
    return float(sum(t.double().square().sum() for t in tensors))


def expected_values(grads: dict[Visit, dict[str, torch.Tensor]], others=()) -> dict[str, float]:
    """What the diagnostics should log, in float64 from the reference gradients: ‖g_{r,j}‖ per visit;
    per physical sublayer j the gradient norm ‖Σ_r g_{r,j}‖ and κ̂_R(j) = ‖Σ_r g_{r,j}‖² / Σ_r ‖g_{r,j}‖²;
    the model-wide κ̂ pooled over the sublayers: Σ_j ‖Σ_r g_{r,j}‖² / Σ_j Σ_r ‖g_{r,j}‖²; the global
    gradient norm, blocks and `others` (the parameters outside the blocks) together."""
    out = {f"visits/param_grad_norm/{v.tag}": sq(g.values()) ** 0.5 for v, g in grads.items()}
    num_all = den_all = 0.0
    for j in sorted({v.physical for v in grads}):
        visits = [v for v in grads if v.physical == j]
        names = grads[visits[0]]
        num = sq(sum(grads[v][n].double() for v in visits) for n in names)
        den = sum(sq(grads[v].values()) for v in visits)
        out[f"sublayers/grad_norm/{j}"] = num**0.5
        out[f"sublayers/kappa/{j}"] = num / den
        num_all, den_all = num_all + num, den_all + den
    out["grad/kappa_model"] = num_all / den_all
    out["grad/global_norm"] = (num_all + sq(others)) ** 0.5
    return out
