"""VisitProbe: the visit observer that measures one training step, and the κ̂_R estimator.

Attached to a `LoopedTransformer` (``model.attach_observer(probe)``) it sees every sublayer visit
i = (r, j) of the forward pass through `VisitTrace` and

- in the forward, keeps three 0-d tensors per visit (no host sync): RMS of the pre-Norm stream
  α·x + f(x), RMS of the state after the Norm minus 1, and ‖f(x)‖ / ‖α·x‖;
- at an attention visit, from its queries and keys (`VisitTrace.qk`), the instability signals of
  Wortsman et al. 2023 (arXiv 2309.14322): the largest logit q·k/√d_h and the largest |logit| over
  heads and causal positions, and the heads' mean log-partition log Z = log Σ_{j≤i} exp(q_i·k_j/√d_h)
  (`attention_logit_stats`); at the model's output, the mean log Z of the LM head's softmax and its
  largest |logit| (`output_logit_stats`), the output-logit divergence they report;
- hooks the visit's output to get ‖∂L/∂x‖ in the backward;
- hooks the visit's own parameter views to get the per-visit gradient contribution g_{r,j}
  (Σ_r g_{r,j} is the shared parameter's ``.grad``) and keeps ‖g_{r,j}‖² per parameter, or the
  tensors themselves when `keep_grads` (needed to sum micro-batches exactly under gradient
  accumulation, and by the tests).

With several micro-batches per step (gradient accumulation) forward statistics are averaged over
micro-batches and per-visit gradients summed, like ``.grad`` itself.

The visit-alignment estimator (reference §2, "Measuring κ_R") for a physical sublayer j is

    κ̂_R(j) = ‖Σ_r g_{r,j}‖² / Σ_r ‖g_{r,j}‖²

with g_{r,j} the concatenation of the visit's contributions to *all* the sublayer's parameters
(weight matrices, norm gains, biases): numerator and denominator are sums over parameters. κ̂ = 1
when the visits' gradients are orthogonal, κ̂ = R when they are identical. The model-wide κ̂
concatenates every sublayer the same way.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from loopnet.model import Visit, VisitTrace

from .tags import ATTN_QUANTITIES, FORWARD_QUANTITIES, OUTPUT_QUANTITIES


def _sq(t: torch.Tensor) -> torch.Tensor:
    return t.detach().float().square().sum()


def alignment(total_sq: torch.Tensor | float, per_visit_sq: torch.Tensor | float) -> torch.Tensor:
    """κ̂ = ‖Σ_r g_r‖² / Σ_r ‖g_r‖², given both squared norms (0 when no gradient flowed)."""
    total_sq, per_visit_sq = torch.as_tensor(total_sq), torch.as_tensor(per_visit_sq)
    return torch.where(per_visit_sq > 0, total_sq / per_visit_sq.clamp_min(1e-38), torch.zeros_like(total_sq))


def kappas(num: dict[str, torch.Tensor], den: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """κ̂_R per physical sublayer j from `VisitProbe.alignment_terms`, and for the whole model (every
    sublayer's gradients concatenated) under the key ``"model"``; 0-d tensors, no host sync."""
    out = {j: alignment(num[j], den[j]) for j in num}
    if num:
        out["model"] = alignment(sum(num.values()), sum(den.values()))
    return out


@torch.no_grad()
def attention_logit_stats(q: torch.Tensor, k: torch.Tensor, chunk: int = 1 << 22) -> torch.Tensor:
    """[max logit, max |logit|, Σ log Z, n] of causal attention with queries `q` and keys `k` (B, H, T,
    d_h), logits q·kᵀ/√d_h (what scaled_dot_product_attention computes and does not return), over the
    causal positions j ≤ i only; log Z of each (batch, head, query) is logsumexp over its keys, summed
    here (n of them) so that micro-batches combine. Computed in fp32, a few batch rows at a time so the
    B·H·T² logits are never all held at once (≤ `chunk` elements)."""
    B, H, T, d_h = q.shape
    allowed = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    rows = max(1, chunk // (H * T * T))
    top, top_abs, log_z = [], [], []
    for b in range(0, B, rows):
        logits = q[b : b + rows].float() @ k[b : b + rows].float().transpose(-1, -2) / d_h**0.5
        logits = logits.masked_fill(~allowed, -torch.inf)
        top.append(logits.amax())
        top_abs.append(logits.abs().masked_fill(~allowed, 0).amax())  # masked: |−inf| would win
        log_z.append(torch.logsumexp(logits, dim=-1).sum())
    return torch.stack(
        [
            torch.stack(top).amax(),
            torch.stack(top_abs).amax(),
            torch.stack(log_z).sum(),
            torch.tensor(float(B * H * T), device=q.device),
        ]
    )


@torch.no_grad()
def output_logit_stats(logits: torch.Tensor, chunk: int = 1 << 24) -> torch.Tensor:
    """[Σ log Z, max |logit|, n] of the LM head's logits (..., V): log Z = logsumexp over the vocabulary
    for each of the n positions (summed, so that micro-batches combine). In fp32, a few rows at a time
    (≤ `chunk` elements), so that no second N×V tensor is formed."""
    z = logits.detach().flatten(0, -2)
    rows = max(1, chunk // z.size(-1))
    log_z, top_abs = [], []
    for i in range(0, z.size(0), rows):
        part = z[i : i + rows].float()
        log_z.append(torch.logsumexp(part, dim=-1).sum())
        top_abs.append(part.abs().amax())
    return torch.stack(
        [torch.stack(log_z).sum(), torch.stack(top_abs).amax(), torch.tensor(float(z.size(0)), device=z.device)]
    )


def _combine(before: torch.Tensor | None, new: torch.Tensor, maxima: tuple[int, ...]) -> torch.Tensor:
    """Statistics of two micro-batches in one: the `maxima` entries by max, the others (sums) added."""
    if before is None:
        return new
    out = before + new
    for i in maxima:
        out[i] = torch.maximum(before[i], new[i])
    return out


class VisitProbe:
    """Records the per-visit statistics of one training step (see the module docstring).

    Args:
        keep_grads: Keep the per-visit gradient tensors g_{r,j} (summed over micro-batches) in
            `grads` instead of only their squared norms. Costs R times the block parameters in memory.
        hist_samples: Keep about this many values of each round's final state and its per-token
            RMS for histograms (0: none).
    """

    def __init__(self, keep_grads: bool = False, hist_samples: int = 0):
        self.keep_grads = keep_grads
        self.hist_samples = hist_samples
        self.visits: list[Visit] = []  # in execution order, each once
        self.fwd: dict[Visit, torch.Tensor] = {}  # FORWARD_QUANTITIES, summed over micro-batches
        self.n_fwd: dict[Visit, int] = defaultdict(int)
        self.act_grad: dict[Visit, torch.Tensor] = {}  # ‖∂L/∂x‖ summed over micro-batches
        self.n_act: dict[Visit, int] = defaultdict(int)
        self.param_sq: dict[Visit, dict[str, torch.Tensor]] = defaultdict(dict)  # ‖g_{r,j,p}‖², no keep_grads
        self.grads: dict[Visit, dict[str, torch.Tensor]] = defaultdict(dict)  # g_{r,j,p} (keep_grads=True)
        self.hist: dict[int, dict[str, torch.Tensor]] = {}  # round -> {"state": values, "token_rms": values}
        self.attn: dict[Visit, torch.Tensor] = {}  # attention visits: `attention_logit_stats`, over micro-batches
        self.output: tuple[int, torch.Tensor] | None = None  # (round, `output_logit_stats`) of the last head
        self._last_visit_of_round: dict[int, Visit] = {}

    # ------------------------------------------------------------------------ forward / backward
    def on_visit(self, visit: Visit, trace: VisitTrace) -> None:
        if visit not in self.fwd:
            self.visits.append(visit)
        with torch.no_grad():
            stream, state = trace.stream.detach().float(), trace.state.detach().float()
            skip = trace.alpha * torch.linalg.vector_norm(trace.x.detach().float())
            stats = torch.stack(
                [  # in the order of FORWARD_QUANTITIES
                    stream.square().mean().sqrt(),  # resid_norm
                    state.square().mean().sqrt() - 1,  # state_norm_dev: ≈ 0 after a Norm, so its deviation
                    torch.linalg.vector_norm(trace.branch.detach().float()) / skip.clamp_min(1e-30),  # branch_ratio
                ]
            )
            self.fwd[visit] = self.fwd[visit] + stats if visit in self.fwd else stats
            self.n_fwd[visit] += 1
            if self.hist_samples and visit.looped:  # histograms are per round of the loop
                self._sample_for_histograms(visit, stream, state)
            if trace.qk is not None:
                self.attn[visit] = _combine(self.attn.get(visit), attention_logit_stats(*trace.qk), maxima=(0, 1))
        if trace.state.requires_grad:
            trace.state.register_hook(lambda g, v=visit: self._on_act_grad(v, g))
        for name, view in trace.params.items():
            if view.requires_grad:
                view.register_hook(lambda g, v=visit, n=name: self._on_param_grad(v, n, g))

    def on_logits(self, round_: int, logits: torch.Tensor) -> None:
        """The head's logits at a loss round; the last round's (the model's output) are kept."""
        if self.output is not None and self.output[0] > round_:
            return
        same = self.output is not None and self.output[0] == round_  # another micro-batch
        stats = output_logit_stats(logits)
        self.output = (round_, _combine(self.output[1] if same else None, stats, maxima=(1,)))

    def _sample_for_histograms(self, visit: Visit, stream: torch.Tensor, state: torch.Tensor) -> None:
        # The last visit seen in a round is the round's output; later visits overwrite earlier ones.
        last = self._last_visit_of_round.get(visit.round)
        if last is not None and (last.block, last.sublayer) > (visit.block, visit.sublayer):
            return
        self._last_visit_of_round[visit.round] = visit
        flat = state.flatten()
        token_rms = stream.square().mean(-1).sqrt().flatten()
        stride = lambda t: t[:: max(1, t.numel() // self.hist_samples)]  # noqa: E731 (deterministic sample)
        self.hist[visit.round] = {"state": stride(flat).clone(), "token_rms": stride(token_rms).clone()}

    def _on_act_grad(self, visit: Visit, grad: torch.Tensor) -> None:
        norm = torch.linalg.vector_norm(grad.detach().float())
        self.act_grad[visit] = self.act_grad[visit] + norm if visit in self.act_grad else norm
        self.n_act[visit] += 1

    def _on_param_grad(self, visit: Visit, name: str, grad: torch.Tensor) -> None:
        if self.keep_grads:
            store = self.grads[visit]
            # Our own copy: autograd may accumulate into the tensor it hands to the hook.
            store[name] = store[name].add_(grad) if name in store else grad.detach().clone()
        else:
            self.param_sq[visit][name] = _sq(grad)

    # ------------------------------------------------------------------------ results
    def forward_stats(self, visit: Visit) -> torch.Tensor:
        """The FORWARD_QUANTITIES (resid_norm, state_norm_dev, branch_ratio) averaged over micro-batches."""
        return self.fwd[visit] / self.n_fwd[visit]

    def forward_quantities(self, visit: Visit) -> dict[str, torch.Tensor]:
        """`forward_stats` by name."""
        return dict(zip(FORWARD_QUANTITIES, self.forward_stats(visit)))

    def attention_quantities(self, visit: Visit) -> dict[str, torch.Tensor]:
        """ATTN_QUANTITIES of an attention visit (max logit, max |logit|, mean log Z); {} for an FFN visit."""
        if visit not in self.attn:
            return {}
        top, top_abs, log_z, n = self.attn[visit]
        return dict(zip(ATTN_QUANTITIES, (top, top_abs, log_z / n)))

    def output_quantities(self) -> dict[str, torch.Tensor]:
        """OUTPUT_QUANTITIES of the model's output logits (mean log Z, max |logit|); {} if none was seen."""
        if self.output is None:
            return {}
        log_z, top_abs, n = self.output[1]
        return dict(zip(OUTPUT_QUANTITIES, (log_z / n, top_abs)))

    def act_grad_norm(self, visit: Visit) -> torch.Tensor:
        if visit not in self.act_grad:
            return torch.tensor(float("nan"))
        return self.act_grad[visit] / self.n_act[visit]

    def visit_grad_sq(self, visit: Visit) -> torch.Tensor:
        """‖g_{r,j}‖² over all parameters of the visited sublayer (0 when no gradient flowed)."""
        if self.keep_grads:
            terms = [_sq(g) for g in self.grads.get(visit, {}).values()]
        else:
            terms = list(self.param_sq.get(visit, {}).values())
        return torch.stack(terms).sum() if terms else torch.tensor(0.0)

    def alignment_terms(self, physical_params: dict[str, dict[str, torch.Tensor]]):
        """(‖Σ_r g_{r,j}‖², Σ_r ‖g_{r,j}‖²) per physical sublayer j, as 0-d tensors.

        `physical_params` maps a physical sublayer name (``Visit.physical``) to its parameters by
        the names of `VisitTrace.params`. Without `keep_grads` the first term comes from the
        parameters' ``.grad`` (= Σ_r g_{r,j} in one process), so call this before anything
        (clipping, the optimiser) touches the gradients; with `keep_grads` it comes from the kept
        per-visit sums (this process's gradient, also under DDP).
        """
        num, den = {}, {}
        for j, params in physical_params.items():
            if self.keep_grads:  # Σ_r g_{r,j} from our own sums: this process's gradient, before any all-reduce
                visits = [v for v in self.visits if v.physical == j]
                grads = [sum(self.grads[v][n] for v in visits if n in self.grads[v]) for n in params]
                grads = [g for g in grads if isinstance(g, torch.Tensor)]
            else:
                grads = [p.grad for p in params.values() if p.grad is not None]
            num[j] = torch.stack([_sq(g) for g in grads]).sum() if grads else torch.tensor(0.0)
            den[j] = sum(
                (self.visit_grad_sq(v).to(num[j].device) for v in self.visits if v.physical == j),
                torch.zeros((), device=num[j].device),
            )
        return num, den

    def kappa(self, physical_params: dict[str, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """κ̂_R per physical sublayer, and for the whole model under the key ``"model"``."""
        return kappas(*self.alignment_terms(physical_params))
