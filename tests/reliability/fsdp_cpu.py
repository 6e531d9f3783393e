"""Lightning's FSDPStrategy on CPU: 2 gloo processes started by torchrun, the strategy as configs/fsdp.yaml
configures it. Run as ``torchrun --standalone --nproc_per_node 2 -m tests.reliability.fsdp_cpu OUT grads,gathers,resume,guard``;
each rank writes what it saw to OUT/<mode>_rank<r>.pt for tests/reliability/test_fsdp.py to compare with the
unsharded model.

Lightning refuses the class FSDPStrategy itself on a CPU accelerator (its accelerator connector tests
``type(strategy) is FSDPStrategy``), not a subclass; torch's FSDP (FSDP1) runs on CPU with gloo. So
`CPUFSDPStrategy` is Lightning's strategy under another name that names the CPU as FSDP's device:
the wrapping, activation checkpointing, clipping, sharded checkpoints and resume are Lightning's own
code paths.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Union

import torch
import yaml
from lightning.pytorch.strategies import FSDPStrategy, Strategy

ROOT = Path(__file__).resolve().parents[2]
FSDP_YAML = ROOT / "configs" / "fsdp.yaml"
MODEL = dict(vocab_size=64, seq_len=16, d_model=32, n_heads=4, n_blocks=2, n_rounds=3, dropout=0.0)
BATCH, WINDOWS = 2, 8  # per rank; 8 windows: an epoch is 2 steps of 2 ranks x 2 (a resume at step 2 starts epoch 2)
CLIP = 0.05  # small enough that clipping is active at step 1 (the gradient norm is ~1 at init)


class CPUFSDPStrategy(FSDPStrategy):
    """Lightning's FSDPStrategy (see the module docstring), with one difference: it hands FSDP the CPU
    as its device. Lightning passes ``device_id=root_device.index``, None for the CPU, and without a
    device FSDP looks for an accelerator and finds none."""

    def _setup_model(self, model):
        from unittest import mock

        from torch.distributed.fsdp import FullyShardedDataParallel

        class OnCPU(FullyShardedDataParallel):
            def __init__(self, *args, device_id=None, **kwargs):
                super().__init__(*args, device_id=device_id or torch.device("cpu"), **kwargs)

        with mock.patch("torch.distributed.fsdp.FullyShardedDataParallel", OnCPU):
            return super()._setup_model(model)


def strategy_from_yaml(**overrides) -> FSDPStrategy:
    """configs/fsdp.yaml's strategy, built as the CLI builds it (jsonargparse), with the class swapped
    for `CPUFSDPStrategy` and `overrides` added to its init_args."""
    from jsonargparse import ArgumentParser

    spec = yaml.safe_load(FSDP_YAML.read_text())["trainer"]["strategy"]
    spec = {"class_path": f"{__name__}.CPUFSDPStrategy", "init_args": spec["init_args"] | overrides}
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--strategy", type=Union[str, Strategy])
    return parser.instantiate(parser.parse_object({"strategy": spec})).strategy


def windows(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, MODEL["vocab_size"], (WINDOWS, MODEL["seq_len"] + 1), generator=g)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def gathers() -> Counter:
    """Counts FSDP all-gathers of parameters by the class of the module a unit wraps (FSDP1 gathers a
    unit's flat parameter in `FlatParamHandle._all_gather_flat_param`)."""
    from torch.distributed.fsdp._flat_param import FlatParamHandle

    counts: Counter = Counter()
    original = FlatParamHandle._all_gather_flat_param

    def counted(self, *args, **kwargs):
        module = self._fully_sharded_module
        inner = getattr(module, "_checkpoint_wrapped_module", module)
        counts[type(inner).__name__] += 1
        return original(self, *args, **kwargs)

    FlatParamHandle._all_gather_flat_param = counted
    return counts


def clean(name: str) -> str:
    for wrapper in ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module."):
        name = name.replace(wrapper, "")
    return name


def full_grads(trainer) -> dict[str, torch.Tensor]:
    """Every parameter's whole gradient (collective: every rank calls it)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    with FSDP.summon_full_params(trainer.strategy.model, with_grads=True, writeback=False):
        return {
            clean(n): p.grad.detach().clone()
            for n, p in trainer.strategy.model.named_parameters()
            if p.grad is not None
        }


def main(out: Path, modes: list[str]) -> None:
    import lightning as L
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint

    from loopnet.diagnostics import DivergenceGuard, VisitDiagnostics
    from loopnet.model import LoopConfig
    from loopnet.training.module import LoopedLM, OptimConfig

    counts = gathers()
    inputs, targets = windows()
    loader = lambda: torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(inputs, targets),  # noqa: E731
        batch_size=BATCH,
        shuffle=False,
    )

    class Recorder(Callback):
        """Per step: the rank's batch, loss, gathers, and (mode grads) the whole gradients before and
        after clipping."""

        def __init__(self, grads: bool = False):
            self.steps: list[dict] = []
            self.grads = grads

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            counts.clear()
            self.steps.append({"batch": [t.clone() for t in batch]})

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            if self.grads:
                self.steps[-1]["grads"] = full_grads(trainer)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            step = self.steps[-1]
            step["loss"] = float(outputs["loss"].detach())
            step["gathers"] = dict(counts)
            step["decayed"] = [len(g["params"]) for g in trainer.optimizers[0].param_groups]
            step["flops_per_batch"] = pl_module.flops_per_batch
            if self.grads:
                step["clipped"] = full_grads(trainer)

    class NaNOnRank1(Callback):
        """Step 1 (global_step 1): one gradient element of rank 1's shard becomes nan, after FSDP's
        reduce-scatter: only rank 1 can see it."""

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            if trainer.global_step == 1 and trainer.global_rank == 1:
                p = next(p for p in pl_module.parameters() if p.grad is not None and p.grad.numel())
                p.grad.view(-1)[0] = float("nan")

    def fit(max_steps: int, callbacks: list, ckpt_path=None, **strategy_args) -> L.Trainer:
        """A fit of the tiny model on `loader()` (the same initial weights every time)."""
        torch.manual_seed(0)
        # decay_steps: the schedule of a 4-step run also in its first 2 steps (the run a resume continues)
        model = LoopedLM(config=LoopConfig(**MODEL), optim=OptimConfig(lr=1e-2, warmup_steps=1, decay_steps=4))
        trainer = L.Trainer(
            accelerator="cpu",
            devices=2,
            strategy=strategy_from_yaml(**strategy_args),
            max_steps=max_steps,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            gradient_clip_val=CLIP,
            limit_val_batches=0,
            default_root_dir=out / "root",
            callbacks=callbacks,
            enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
        )
        if trainer.global_rank == 0 and ckpt_path is None:
            torch.save({k: v.clone() for k, v in model.model.state_dict().items()}, out / "init.pt")
        trainer.fit(model, train_dataloaders=loader(), ckpt_path=ckpt_path)
        return trainer

    def grads() -> dict:  # one step: gradients before and after clipping; per-visit diagnostics
        diag = VisitDiagnostics(every_n_steps=1, histograms=False, update_size=False, profile=False)
        rec = Recorder(grads=True)
        fit(1, [rec, diag])
        return {"steps": rec.steps, "diagnostics": diag.last_stats}

    def gathers_per_step() -> dict:  # all-gathers per step, SHARD_GRAD_OP (the YAML's) and FULL_SHARD
        record = {}
        for sharding in ("SHARD_GRAD_OP", "FULL_SHARD"):
            rec = Recorder()
            fit(2, [rec], sharding_strategy=sharding)
            record[sharding] = [s["gathers"] for s in rec.steps]
        return record

    def resume() -> dict:  # 4 steps straight; 2 steps, a sharded checkpoint, then steps 3-4 resumed from it
        straight, first, resumed = Recorder(), Recorder(), Recorder()
        fit(4, [straight])
        fit(2, [first, ModelCheckpoint(dirpath=out / "ckpt", save_last=True, save_top_k=0, every_n_train_steps=2)])
        last = out / "ckpt" / "last.ckpt"
        fit(4, [resumed, ModelCheckpoint(dirpath=out / "ckpt2", save_top_k=0)], ckpt_path=str(last))
        return {
            "straight": [s["loss"] for s in straight.steps],
            "first": [s["loss"] for s in first.steps],
            "resumed": [s["loss"] for s in resumed.steps],
            "checkpoint": sorted(p.name for p in last.iterdir()) if last.is_dir() else "not a folder",
        }

    def guard() -> dict:  # a nan in rank 1's shard only: both ranks stop at the same step
        guard, rec = DivergenceGuard(after_step=100), Recorder()
        trainer = fit(4, [NaNOnRank1(), guard, rec])
        return {
            "diverged_at_step": guard.diverged_at_step,
            "reason": guard.record.reason,
            "global_step": trainer.global_step,
            "steps": len(rec.steps),
        }

    run = {"grads": grads, "gathers": gathers_per_step, "resume": resume, "guard": guard}
    for mode in modes:
        torch.save(run[mode](), out / f"{mode}_rank{torch.distributed.get_rank()}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2].split(","))
