"""FSDP that runs: Lightning's FSDPStrategy as configs/fsdp.yaml configures it (one FSDP unit and one
activation checkpoint per Block), on 2 gloo processes started by torchrun (`tests.reliability.fsdp_cpu`,
which says how Lightning's strategy is driven on CPU), against the unsharded model in this process.

Tolerances: the sharded and unsharded runs do the same fp32 arithmetic on the same weights except for the
order of some sums (FSDP averages two half-batch gradients in its reduce-scatter where the reference
differentiates the mean of the two half-batch losses; the clipping norm sums the ranks' shards). Such
reorderings move a result by a few ulps of the largest term: the gradients here are below 0.5 in
magnitude (asserted), an ulp there is 2^-24 ≈ 6e-8, and 1e-6 absolute allows ~17 ulps; the measured
differences are ~1e-8. Losses are compared relatively at 1e-6 (~8 ulps at a loss of ~4.2)."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch

from loopnet import checkpoints
from loopnet.diagnostics import VisitProbe
from loopnet.diagnostics.callback import physical_sublayers
from loopnet.model import LoopConfig, LoopedTransformer
from loopnet.training.module import LoopedLM
from tests.helpers import run_command

from .fsdp_cpu import CLIP, MODEL
from .helpers import ROOT, env

pytestmark = pytest.mark.slow

MODES = ("grads", "gathers", "resume", "guard")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict[str, list[dict]]:
    """One torchrun of every mode (one start-up of 2 processes, ~40 s on 2 busy cores): mode -> [rank 0's
    record, rank 1's]."""
    out = tmp_path_factory.mktemp("fsdp")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "tests.reliability.fsdp_cpu",
        str(out),
        ",".join(MODES),
    ]
    res = run_command(cmd, cwd=ROOT, env=env() | {"OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, (res.stdout + res.stderr)[-6000:]
    records = {m: [torch.load(out / f"{m}_rank{r}.pt", weights_only=False) for r in (0, 1)] for m in MODES}
    records["init"] = torch.load(out / "init.pt")
    records["out"] = out
    return records


def unsharded(ranks) -> LoopedTransformer:
    model = LoopedTransformer(LoopConfig(**MODEL))
    model.load_state_dict(ranks["init"])
    return model


def test_loss_and_gradients_equal_the_unsharded_model_before_and_after_clipping(ranks):
    steps = [r["steps"][0] for r in ranks["grads"]]
    model = unsharded(ranks)
    losses = [model(*step["batch"])[1] for step in steps]  # each rank's half of the global batch
    for loss, step in zip(losses, steps):
        assert step["loss"] == pytest.approx(loss.item(), rel=1e-6)
    (sum(losses) / 2).backward()  # the global batch's loss: the ranks' windows hold equal token counts
    grads = {f"model.{n}": p.grad.clone() for n, p in model.named_parameters()}
    assert max(g.abs().max().item() for g in grads.values()) < 0.5  # the tolerance's premise (docstring)
    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    clipped = {f"model.{n}": p.grad for n, p in model.named_parameters()}
    assert sum(g.square().sum() for g in grads.values()).sqrt() > 2 * CLIP  # clipping was active
    for step in steps:  # every rank gathered the whole gradient
        assert step["grads"].keys() == grads.keys()
        for name, g in grads.items():
            torch.testing.assert_close(step["grads"][name], g, rtol=0, atol=1e-6, msg=name)
            torch.testing.assert_close(step["clipped"][name], clipped[name], rtol=0, atol=1e-6, msg=name)


def test_weight_decay_groups_and_model_flops_are_those_of_the_unsharded_model(ranks):
    """The optimiser is built on FSDP's flat 1-D shards: the matrices must still be the decayed group, and
    the model FLOPs behind the logged MFU must count whole blocks, not this rank's shard."""
    lm = LoopedLM(config=LoopConfig(**MODEL))
    groups = [len(g) for g in lm._param_groups()]
    assert groups[0] > 0 and groups[1] > 0
    batch = ranks["grads"][0]["steps"][0]["batch"][0]
    for rank in ranks["grads"]:
        assert rank["steps"][0]["decayed"] == groups
        assert rank["steps"][0]["flops_per_batch"] == lm.model.flops_per_token(seq_len=batch.size(1)) * batch.numel()


def test_per_visit_diagnostics_under_fsdp(ranks):
    """Per-visit norms and κ̂ are each rank's own (as under DDP): rank 0's equal the unsharded model's on
    rank 0's batch. Norms over the weights and gradients (global gradient norm, update ratio) sum the
    ranks' shards: the ranks agree, and the gradient norm is the whole model's."""
    step, stats = ranks["grads"][0]["steps"][0], ranks["grads"][0]["diagnostics"]
    model = unsharded(ranks)
    probe = VisitProbe(keep_grads=True)
    model.attach_observer(probe)
    model(*step["batch"])[1].backward()
    model.attach_observer(None)
    kappa = probe.kappa(physical_sublayers(model))
    assert len(stats["visits"]) == len(probe.visits) == 2 * MODEL["n_blocks"] * MODEL["n_rounds"]
    for v in probe.visits:
        assert stats["visits"][v.tag]["param_grad_norm"] == pytest.approx(
            probe.visit_grad_sq(v).sqrt().item(), rel=1e-5
        )
        assert stats["visits"][v.tag]["resid_norm"] == pytest.approx(probe.forward_stats(v)[0].item(), rel=1e-5)
    for j, value in kappa.items():
        assert stats["kappa"][j] == pytest.approx(value.item(), rel=1e-5)
    whole = torch.cat([g.flatten() for g in step["grads"].values()]).norm().item()
    other = ranks["grads"][1]["diagnostics"]
    assert stats["global_grad_norm"] == pytest.approx(whole, rel=1e-5) == other["global_grad_norm"]
    assert stats["update_ratio"] == pytest.approx(other["update_ratio"], rel=1e-6)
    assert all(v > 0 for v in stats["update_ratio"].values())


def test_each_block_is_gathered_once_per_step_with_the_documented_sharding(ranks):
    """configs/fsdp.yaml's SHARD_GRAD_OP: one all-gather per Block per step for R = 3 rounds; FULL_SHARD
    re-gathers at every round and once more in the backward (R + 1). The root unit (embeddings, head,
    final norm) is gathered once either way."""
    blocks, rounds = MODEL["n_blocks"], MODEL["n_rounds"]
    for rank in ranks["gathers"]:
        assert rank["SHARD_GRAD_OP"] == [{"LoopedLM": 1, "Block": blocks}] * 2
        assert rank["FULL_SHARD"] == [{"LoopedLM": 1, "Block": blocks * (rounds + 1)}] * 2


def test_resume_from_a_sharded_checkpoint_continues_exactly(ranks):
    for rank in ranks["resume"]:
        assert {".metadata", "meta.pt"} <= set(rank["checkpoint"])  # a folder of shards (state_dict_type: sharded)
        assert rank["first"] == rank["straight"][:2]
        assert rank["resumed"] == rank["straight"][2:]  # exact: max per-step loss difference 0.0


def test_loopnet_checks_a_sharded_checkpoint_folder(ranks):
    """`--ckpt_path` (given, or found by 'last') passes loopnet's checks as a folder of shards: read from its
    meta.pt with the restricted unpickler, the model config compared; `loopnet eval` asks for one file."""
    folder = ranks["out"] / "ckpt" / "last.ckpt"
    assert checkpoints.is_sharded_checkpoint(folder)
    assert checkpoints.newest_last_checkpoint(folder.parent) == folder
    config = dataclasses.asdict(LoopConfig(**MODEL))
    assert checkpoints.check_checkpoint(str(folder), config)["global_step"] == 2
    with pytest.raises(ValueError, match="another model config"):
        checkpoints.check_checkpoint(str(folder), config | {"d_model": 64})
    with pytest.raises(ValueError, match="consolidate_checkpoint"):
        checkpoints.model_weights(checkpoints.load_checkpoint_meta(str(folder)), folder)


def test_divergence_guard_decides_the_same_on_every_rank(ranks):
    """A nan in one element of rank 1's gradient shard, which rank 0 never holds: both ranks see the
    non-finite global norm at the same step, skip that update and stop together."""
    r0, r1 = ranks["guard"]
    assert r0 == r1
    assert r0["diverged_at_step"] == 1 and "non-finite gradient norm" in r0["reason"]
    assert r0["steps"] == 2


def test_loopnet_export_reads_the_sharded_checkpoint_fsdp_wrote(ranks, tmp_path):
    """`loopnet export` of the folder of shards holds the weights Lightning's own consolidation reads from it, bit
    for bit (no process group: torch.distributed.checkpoint reads every shard)."""
    from lightning.fabric.utilities.load import _load_distributed_checkpoint

    from loopnet.formats import hf

    folder = ranks["out"] / "ckpt" / "last.ckpt"
    out = hf.export(folder, tmp_path / "exported")
    config, state, meta = hf.read_exported(out)
    consolidated = _load_distributed_checkpoint(folder)["model"]
    expected = {k.removeprefix("model."): v for k, v in consolidated.items() if k.startswith("model.")}
    assert config == LoopConfig(**MODEL) and meta["global_step"] == 2
    assert state.keys() == expected.keys() | {"lm_head.weight"}  # the tied head: the embedding, stored once
    for key, tensor in expected.items():
        assert torch.equal(state[key], tensor), key
    assert not torch.equal(state["wte.weight"], ranks["init"]["wte.weight"])  # trained: not the initial weights
