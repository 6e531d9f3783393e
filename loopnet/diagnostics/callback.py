"""VisitDiagnostics: the Lightning callback that logs per-visit stability diagnostics.

On a logging step (``global_step % every_n_steps == 0``, and the last of ``max_steps``) it attaches a `VisitProbe` to the
`LoopedTransformer` before the forward, and

    forward + backward      the probe records per-visit norms and gradient contributions g_{r,j}
    on_before_optimizer_step    detach the probe; global gradient norm (Lightning calls this hook
                            *before* gradient clipping: precision plugin `_after_closure`), the
                            κ̂_R terms from ``.grad``, and a copy of each sublayer's weights
    on_train_batch_end      ‖ΔW‖/‖W‖ of the step just taken; one device→host copy of every
                            number; write the scalars and histograms, keep `last_stats` and
                            hand them to the run summary (`RunSummary`)

With `update_size` the batch is also run once before the forward and once after the optimiser
step, without grad (`loopnet.diagnostics.update_size`): the relative change of every round's final
state and of the logits that the step caused, the quantity DeepLoop's theory bounds.

Between logging steps no observer is attached, so the model computes nothing extra and nothing
is synchronised: the callback costs one modulo per step. Tag names: `loopnet.diagnostics.tags`.
While the probe is attached the model bypasses activation checkpointing (`checkpoint_rounds`),
so a logging step needs the memory of an uncheckpointed step.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_warn
from tensorboard.compat.proto.summary_pb2 import Summary

from loopnet.model import SUBLAYERS, Visit

from .visit_probe import VisitProbe, kappas
from .summary import RunSummary
from .tags import (
    HIST_QUANTITIES,
    OUTPUT_QUANTITIES,
    custom_scalars_layout,
    hist_tag,
    output_tag,
    sublayer_tag,
    visit_quantities,
    visit_tag,
)
from .update_size import relative_changes, round_outputs


def find_looped_model(pl_module: torch.nn.Module):
    """The module that emits visits (a `LoopedTransformer`): ``pl_module.model`` or the first
    submodule with ``attach_observer``."""
    model = getattr(pl_module, "model", None)
    if model is not None and hasattr(model, "attach_observer"):
        return model
    for module in pl_module.modules():
        if hasattr(module, "attach_observer") and hasattr(module, "blocks"):
            return module
    raise TypeError(f"{type(pl_module).__name__} holds no LoopedTransformer (no submodule with attach_observer)")


def physical_sublayers(model) -> dict[str, dict[str, torch.nn.Parameter]]:
    """Physical sublayer j (named by ``Visit.physical``) -> its parameters, by the names the
    model's visits use in ``VisitTrace.params``: the loop's tied sublayers, then the prelude's and the
    coda's untied ones (visited once each, so their κ̂ is 1 by definition)."""
    parts = [
        ("loop", 1, model.blocks),
        ("prelude", 0, getattr(model, "prelude_blocks", [])),
        ("coda", 0, getattr(model, "coda_blocks", [])),
    ]
    return {
        Visit(r, k, s, part).physical: dict(getattr(block, s).named_parameters())
        for part, r, blocks in parts
        for k, block in enumerate(blocks, start=1)
        for s in SUBLAYERS
    }


def step_draw(pl_module, step: int, batch_size: int | None = None, batch_idx: int = 0):
    """(rounds, alpha) that training step `step` runs on micro-batch `batch_idx` of `batch_size` sequences
    (`LoopedLM.draw`; rounds per sequence with `round_draw` "sequence"); (None, None), the model's own, for a
    module that draws nothing."""
    draw = getattr(pl_module, "draw", None)
    if draw is None:
        return None, None
    d = draw(step, batch_size=batch_size, batch_idx=batch_idx)
    return d.rounds, d.alpha


def total_norm(tensors: list[torch.Tensor]) -> torch.Tensor:
    """L2 norm of all `tensors` together, as a 0-d tensor (no host sync)."""
    if not tensors:
        return torch.tensor(0.0)
    return torch.nn.utils.get_total_norm(tensors, 2.0).float()  # foreach kernels (torch >= 2.6, the floor)


def sharded(trainer) -> bool:
    """Whether each rank holds only a shard of the parameters and gradients (FSDP on several ranks):
    a norm over them is then the root of the ranks' summed squares."""
    from lightning.pytorch.strategies import FSDPStrategy

    return trainer.world_size > 1 and isinstance(trainer.strategy, FSDPStrategy)


def sum_over_shards(trainer, squares: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`squares` (sums of squares over this rank's shards) summed over the ranks under FSDP, in one
    all-reduce; as they are otherwise."""
    if not sharded(trainer):
        return squares
    return trainer.strategy.reduce(squares.to(device=device, dtype=torch.float32), reduce_op="sum")


def global_norm(trainer, tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """L2 norm of `tensors` over every rank's shard (the whole model's under FSDP), 0-d."""
    return sum_over_shards(trainer, total_norm(tensors).square(), device).sqrt()


def write_scalars(writer, scalars: dict[str, float], step: int) -> None:
    """All `scalars` as one TensorBoard event (one Summary with many values) rather than one event
    each: a logging step then queues one record, not a hundred, on the writer's small queue."""
    file_writer = getattr(writer, "file_writer", None)
    if file_writer is None:  # not torch's SummaryWriter: one call per scalar
        for tag, value in scalars.items():
            writer.add_scalar(tag, value, step)
        return
    file_writer.add_summary(Summary(value=[Summary.Value(tag=t, simple_value=v) for t, v in scalars.items()]), step)


def write_histogram(writer, tag: str, values: torch.Tensor, step: int, bins: int = 64) -> None:
    """A histogram from statistics computed by torch (``add_histogram_raw``); SummaryWriter's own
    ``add_histogram`` goes through NumPy, whose BLAS threads cost milliseconds on a busy CPU."""
    v = values.detach().float().flatten().cpu()
    v = v[torch.isfinite(v)]
    if v.numel() == 0:
        return
    lo, hi = v.min().item(), v.max().item()
    if hi > lo:
        counts = torch.histc(v, bins=bins, min=lo, max=hi).tolist()
        limits = torch.linspace(lo, hi, bins + 1)[1:].tolist()  # right edges, as TensorBoard expects
    else:
        counts, limits = [float(v.numel())], [hi]
    v64 = v.double()
    writer.add_histogram_raw(
        tag,
        min=lo,
        max=hi,
        num=v.numel(),
        sum=v64.sum().item(),
        sum_squares=v64.square().sum().item(),
        bucket_limits=limits,
        bucket_counts=counts,
        global_step=step,
    )


class VisitDiagnostics(Callback):
    """Per-visit stability diagnostics in TensorBoard: residual and state norms, branch-to-skip
    ratio, activation- and parameter-gradient norms of every sublayer visit (round r, block k,
    attn|ffn); the measured visit alignment κ̂_R and the update-to-weight ratio of every physical
    sublayer; the global gradient norm before clipping; per-round histograms. κ̂_R(j) treats all
    of sublayer j's parameters as one vector g_{r,j} (see `loopnet.diagnostics.visit_probe`); the
    model-wide κ̂ (``grad/kappa_model``) concatenates every sublayer. Tags: `loopnet.diagnostics.tags`.

    Args:
        every_n_steps: Measure and log on steps whose global step is a multiple of this (step 0
            included), and on the last step (`max_steps`). Steps in between attach nothing and cost
            nothing. 0 turns it off.
        histograms: Also log per-round histograms of the round's final state (``hist/state/r03``)
            and of the per-token RMS of its pre-Norm stream (``hist/token_rms/r03``).
        hist_samples: About how many values each histogram samples (a fixed stride over the batch).
        update_size: Also measure how much the step changed the output: the batch run again after
            the optimiser step (``update/output_change``, per round ``update/output_change/r03``,
            ``update/logit_change``); two extra forwards without grad on logging steps.
        profile: Also draw the depth profile (``depth/gradients``, ``depth/norms``, ... in IMAGES): the
            per-visit values against the visit index in forward order (`loopnet.diagnostics.profile`;
            matplotlib).
    """

    def __init__(
        self,
        every_n_steps: int = 50,
        histograms: bool = True,
        hist_samples: int = 16384,
        update_size: bool = True,
        profile: bool = True,
    ):
        if every_n_steps < 0:
            raise ValueError(f"diagnostics.every_n_steps must be >= 0 (0 turns it off), got {every_n_steps}")
        if hist_samples < 1:
            raise ValueError(f"diagnostics.hist_samples must be >= 1, got {hist_samples}")
        self.every_n_steps = every_n_steps
        self.histograms = histograms
        self.hist_samples = hist_samples
        self.update_size = update_size
        self.profile = profile
        # The last measured step: {"step", "visits": {tag: {q: v}}, "kappa": {j: v}, ...}.
        self.last_stats: dict[str, Any] | None = None
        self._model = None  # the LoopedTransformer, found once per fit (on_fit_start)
        # The depth profile's y range per view, the union over the steps drawn (kept in checkpoints: a
        # resumed run's images keep the axes of its first part).
        self._profile_ylims: dict[str, tuple[float, float]] = {}
        self._reset()

    def state_dict(self) -> dict[str, Any]:
        # plain floats: matplotlib's are numpy scalars, which the restricted checkpoint loader refuses
        return {"profile_ylims": {view: [float(v) for v in lim] for view, lim in self._profile_ylims.items()}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._profile_ylims = {view: tuple(lim) for view, lim in state_dict.get("profile_ylims", {}).items()}

    def _reset(self) -> None:
        self._probe: VisitProbe | None = None
        self._step = -1
        self._grad_side: dict[str, Any] | None = None  # tensors from on_before_optimizer_step
        self._weights_before: dict[str, list[torch.Tensor]] = {}
        self._inputs: torch.Tensor | None = None  # the step's first micro-batch, for update_size
        self._outputs_before: list[torch.Tensor] | None = None
        self._draw: tuple = (None, None)

    def _looped(self, pl_module):
        if self._model is None:
            self._model = find_looped_model(pl_module)
        return self._model

    def _detach(self, pl_module) -> None:
        if self._probe is None:
            return
        model = self._looped(pl_module)
        if model.observer is self._probe:
            model.attach_observer(None)

    # ------------------------------------------------------------------------------ hooks
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._model = find_looped_model(pl_module)  # fails early, with a clear message, on a module without visits
        from lightning.pytorch.strategies import FSDPStrategy

        if self.update_size and isinstance(trainer.strategy, FSDPStrategy):
            # Its extra forwards call the inner model, outside the root FSDP module that gathers the shards.
            rank_zero_warn("VisitDiagnostics: update_size is off under FSDP (it would read sharded weights)")
            self.update_size = False
        if not self.every_n_steps or not trainer.is_global_zero:
            return
        cfg = self._model.config  # a category per round up to the most a step runs (max_rounds with sampling)
        layout = custom_scalars_layout(cfg.round_cap, untied=bool(cfg.n_prelude or cfg.n_coda))
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_custom_scalars(layout)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if not self._due(trainer):
            return  # the common case: nothing attached, nothing computed
        if self._probe is None or self._step != trainer.global_step:
            self._reset()
            # Exact per-visit sums over micro-batches (accumulation) and a per-process κ̂ under DDP
            # need the g_{r,j} tensors themselves; otherwise their squared norms suffice.
            keep = trainer.accumulate_grad_batches > 1 or trainer.world_size > 1
            self._probe = VisitProbe(keep_grads=keep, hist_samples=self.hist_samples if self.histograms else 0)
            self._step = trainer.global_step
            if self.update_size:  # before the forward: the weights the step starts from
                self._inputs = batch[0]
                self._draw = step_draw(pl_module, trainer.global_step, batch[0].size(0), batch_idx)  # this step's
                self._outputs_before = round_outputs(self._looped(pl_module), self._inputs, *self._draw)
        self._looped(pl_module).attach_observer(self._probe)

    def _due(self, trainer) -> bool:
        """A logging step: every n-th global step, and the fit's last step (max_steps), so that the
        end-of-training statistics (summary.json's last_visit_stats) are the final model's."""
        step = trainer.global_step
        return bool(self.every_n_steps) and (step % self.every_n_steps == 0 or step == trainer.max_steps - 1)

    @torch.no_grad()
    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if self._probe is None or self._grad_side is not None:
            return
        self._detach(pl_module)
        # Lightning clips after this hook, so these are the unclipped gradients.
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        physical = physical_sublayers(self._looped(pl_module))
        num, den = self._probe.alignment_terms(physical)
        self._grad_side = {"global_norm": global_norm(trainer, grads, pl_module.device), "num": num, "den": den}
        self._weights_before = {j: [p.detach().clone() for p in ps.values()] for j, ps in physical.items()}

    @torch.no_grad()
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._probe is None:
            return
        self._detach(pl_module)  # reattached by on_train_batch_start for the next micro-batch
        if self._grad_side is None:
            return  # more micro-batches of this step to come
        probe, side, step = self._probe, self._grad_side, self._step
        physical = physical_sublayers(self._looped(pl_module))
        device = next(iter(pl_module.parameters())).device

        # Every number as a 0-d tensor under its tag, then one device->host copy.
        named: dict[str, torch.Tensor] = {}
        for v in probe.visits:
            for q, value in probe.forward_quantities(v).items():
                named[visit_tag(q, v)] = value
            named[visit_tag("act_grad_norm", v)] = probe.act_grad_norm(v)
            named[visit_tag("param_grad_norm", v)] = probe.visit_grad_sq(v).sqrt()
            for q, value in probe.attention_quantities(v).items():
                named[visit_tag(q, v)] = value
        for q, value in probe.output_quantities().items():
            named[output_tag(q)] = value
        num, kappa = side["num"], kappas(side["num"], side["den"])
        # ‖ΔW‖² and ‖W‖² per sublayer; under FSDP each rank holds a shard of W: summed over the ranks.
        squares = sum_over_shards(
            trainer,
            torch.stack(
                [
                    total_norm(t).square().to(device)
                    for j, params in physical.items()
                    for t in (
                        [p.detach() - b for p, b in zip(params.values(), self._weights_before[j])],
                        self._weights_before[j],
                    )
                ]
            ),
            device,
        ).view(-1, 2)
        for j, (delta_sq, weight_sq) in zip(physical, squares):
            named[sublayer_tag("kappa", j)] = kappa[j]
            named[sublayer_tag("grad_norm", j)] = num[j].sqrt()
            named[sublayer_tag("update_ratio", j)] = delta_sq.sqrt() / weight_sq.sqrt().clamp_min(1e-30)
        named["grad/global_norm"] = side["global_norm"]
        named["grad/kappa_model"] = kappa["model"]
        if self._outputs_before is not None:
            after = round_outputs(self._looped(pl_module), self._inputs, *self._draw)
            named.update(relative_changes(self._outputs_before, after))
        values = torch.stack([t.to(device=device, dtype=torch.float32) for t in named.values()]).tolist()
        scalars = dict(zip(named, values))

        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                if trainer.is_global_zero:
                    write_scalars(logger.experiment, scalars, step)
                    for r, samples in sorted(probe.hist.items()):
                        for q in HIST_QUANTITIES:
                            write_histogram(logger.experiment, hist_tag(q, r), samples[q], step)
                    if self.profile:
                        self._write_profile(logger, scalars, probe.visits, step)
            else:
                logger.log_metrics(scalars, step=step)

        self.last_stats = {
            "step": step,
            "visits": {
                v.tag: {q: scalars[visit_tag(q, v)] for q in visit_quantities(v) if visit_tag(q, v) in scalars}
                for v in probe.visits
            },
            "output": {q: scalars[output_tag(q)] for q in OUTPUT_QUANTITIES if output_tag(q) in scalars},
            "kappa": {**{j: scalars[sublayer_tag("kappa", j)] for j in physical}, "model": scalars["grad/kappa_model"]},
            "update_ratio": {j: scalars[sublayer_tag("update_ratio", j)] for j in physical},
            "global_grad_norm": scalars["grad/global_norm"],
            "update": {t.removeprefix("update/"): v for t, v in scalars.items() if t.startswith("update/")},
        }
        RunSummary.of(trainer).record_diagnostics(
            step, self.last_stats["visits"], self.last_stats["kappa"], self.last_stats["output"]
        )
        self._reset()

    def _write_profile(self, logger, scalars: dict[str, float], visits: list[Visit], step: int) -> None:
        import threading

        from .profile import profile_pngs, round_pngs, write_png

        per_round = sorted(
            (int(t.rsplit("/r", 1)[1]), v) for t, v in scalars.items() if t.startswith("update/output_change/")
        )

        # Drawn on a short-lived thread, which allocates from its own malloc arena: on the main thread
        # matplotlib's long-lived objects landed between a CPU step's large blocks, which HostMemory keeps
        # for reuse, and fragmented that heap (peak RSS of a 60-step `make fit` run +0.4-0.9 GB, 1.7 GB here).
        out: dict[str, Any] = {}

        def draw() -> None:
            try:
                out["pngs"] = profile_pngs(scalars, visits, self._profile_ylims)
                if per_round:  # update/output_change/rNN as one image against r (`profile.ROUND_VIEWS`)
                    out["pngs"] |= round_pngs(
                        {"output_change": [v for _, v in per_round]}, "update/per_round", ylims=self._profile_ylims
                    )
            except BaseException as err:  # noqa: BLE001  raised again on the calling thread
                out["error"] = err

        thread = threading.Thread(target=draw, name="loopnet-depth-profile")
        thread.start()
        thread.join()
        error = out.get("error")
        if isinstance(error, ImportError):  # matplotlib missing: the scalars are logged all the same
            rank_zero_warn(
                f"VisitDiagnostics: no depth profile ({error}); install matplotlib, or set --diagnostics.profile false"
            )
            self.profile = False
            return
        if error is not None:
            raise error
        for tag, png in out["pngs"].items():
            write_png(logger.experiment, tag, png, step)

    def on_train_end(self, trainer, pl_module) -> None:
        self._detach(pl_module)
        self._reset()
        self._model = None

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self._detach(pl_module)
        self._reset()
        self._model = None
