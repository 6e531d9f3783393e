"""The quantity DeepLoop's theory bounds: how much one optimiser update changes the model's output.

DeepNet's argument, extended to tied weights by DeepLoop, bounds the first-order change of the
output after one shared update by O(M·κ_R·(β/α)²) (M = 2N visits, κ_R the visit alignment):
growing ~R for DeepNorm when the visits are aligned (κ_R ~ R), flat for DeepLoop. Measured
directly: run the same batch before and after the optimiser step, without grad and in eval mode
(no dropout, no RNG drawn, so training is unchanged), and compare

    output_change       ‖x_R' − x_R‖ / ‖x_R‖, the final state (end of the last round, before the
                        final Norm and the head)
    output_change/r<rr> the same for the state at the end of round r
    logit_change        ‖z' − z‖ / ‖z‖ for the logits z

(Frobenius norms over the batch). `VisitDiagnostics` logs them as ``update/...`` on its logging
steps; `loopnet probe` measures them over R and schemes at initialisation.
"""

from __future__ import annotations

import torch

from .tags import update_tag


@torch.no_grad()
def round_outputs(
    model, idx: torch.Tensor, rounds: int | None = None, alpha: float | None = None
) -> list[torch.Tensor]:
    """[x_end of round 1, ..., x_end of round R, logits] of `model` (a `LoopedTransformer`) on
    token ids `idx` at R = `rounds` (default the training R) and skip scale `alpha` (default the model's):
    a step with sampled rounds passes its draw. Without grad and in eval mode; the logits come after the
    coda. Detach any visit observer first."""
    was_training = model.training
    model.eval()
    try:
        states = [x for _, x in model.iter_rounds(idx, rounds, alpha=alpha)]
        logits, _ = model.head(states[-1], alpha=alpha)
    finally:
        model.train(was_training)
    return states + [logits]


def relative_changes(before: list[torch.Tensor], after: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """{tag: 0-d tensor} of the relative changes between two `round_outputs` of the same batch."""
    rel = [
        torch.linalg.vector_norm((a - b).float()) / torch.linalg.vector_norm(b.float()).clamp_min(1e-30)
        for b, a in zip(before, after)
    ]
    *rounds, logits = rel
    out = {update_tag("output_change"): rounds[-1], update_tag("logit_change"): logits}
    out.update({update_tag("output_change", r): value for r, value in enumerate(rounds, start=1)})
    return out
