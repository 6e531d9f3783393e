"""Sampled rounds across an interruption and across DDP ranks: a resumed run draws (and trains) exactly as
an uninterrupted one; the two ranks of a 2-process DDP fit run the same rounds at every step (per sequence, each
rank its own sequences' pass)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from tests.reliability.helpers import RUN, TINY, SignalAt, callbacks, finish, loopnet, scalars, spawn, TWO_CPU_RANKS

pytestmark = pytest.mark.slow

SAMPLED = [
    "--model.config.round_sampling",
    "poisson_truncated",
    "--model.config.max_rounds",
    "4",
    "--model.config.dropout",
    "0.1",
]  # dropout on: the RNG streams must continue too


class RoundsRun(Callback):
    """Per rank, to `folder/rank<r>.json`: at every step, the draw and how many rounds the loop ran (calls of
    the loop's first block)."""

    def __init__(self, folder: str):
        self.folder, self.rows, self.calls, self.hook = folder, [], 0, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.calls = 0
        block = pl_module.model.blocks[0]
        self.hook = block.register_forward_hook(lambda *a: setattr(self, "calls", self.calls + 1))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.hook.remove()
        step = trainer.global_step - 1
        draw = pl_module.draw(step, batch[0].size(0), batch_idx)
        drawn = draw.rounds.tolist() if isinstance(draw.rounds, torch.Tensor) else draw.rounds
        self.rows.append({"step": step, "drawn": drawn, "run": draw.run[0], "ran": self.calls})

    def on_train_end(self, trainer, pl_module):
        Path(self.folder).mkdir(parents=True, exist_ok=True)
        Path(self.folder, f"rank{trainer.global_rank}.json").write_text(json.dumps(self.rows))


@pytest.mark.parametrize("draw", ["batch", "sequence"])
def test_a_resumed_run_with_sampled_rounds_matches_the_uninterrupted_one(tmp_path, draw):
    """Per batch or per sequence (train/rounds: the sequences' mean R_i), the draws follow the seed and step."""
    ref, cut = tmp_path / "reference", tmp_path / "interrupted"
    ref.mkdir(), cut.mkdir()
    args = [*TINY, *SAMPLED, "--model.config.round_draw", draw]
    res = loopnet("fit", *args, cwd=ref)
    assert res.code == 0, res.err[-3000:]
    reference = scalars(ref / "runs" / RUN / "version_0")
    rounds = scalars(ref / "runs" / RUN / "version_0", "train/rounds")
    assert sorted(reference) == list(range(8)) and len(set(rounds.values())) > 1  # R varied
    res = loopnet("fit", *args, *callbacks((SignalAt, {"step": 5})), cwd=cut)
    assert res.code == 0 and "stopped at step" in res.err, res.err[-3000:]
    res = loopnet("fit", *args, "--ckpt_path", "last", cwd=cut)
    assert res.code == 0 and "resuming from" in res.err, res.err[-3000:]
    run = cut / "runs" / RUN / "version_0"
    assert scalars(run) == reference  # every step's loss, exactly
    assert scalars(run, "train/rounds") == rounds


@pytest.mark.parametrize("draw", ["batch", "sequence"])
def test_both_ddp_ranks_run_the_same_drawn_rounds(tmp_path, draw):
    """Per batch both ranks run the same R; per sequence each rank draws its own shard and runs its own pass."""
    # Huginn-like: the input re-enters every round (inject), so every parameter gets a gradient whichever
    # rounds run without; the last round only gets gradients.
    args = [
        *TINY,
        *SAMPLED,
        "--model.config.wiring",
        "inject",
        "--model.config.backprop_rounds",
        "1",
        "--trainer.max_steps",
        "6",
        "--data.batch_size",
        "2",
        *TWO_CPU_RANKS,
        "--diagnostics.every_n_steps",
        "0",
        "--model.config.round_draw",
        draw,
    ]  # its update-size forwards would call the blocks too
    proc = spawn("fit", *args, *callbacks((RoundsRun, {"folder": str(tmp_path)})), cwd=tmp_path)
    res = finish(proc)
    assert res.code == 0, res.err[-4000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert len(r0) == len(r1) == 6 and all(row["ran"] == row["run"] for row in r0 + r1)
    if draw == "batch":
        assert r0 == r1 and all(row["ran"] == row["drawn"] for row in r0)
    else:  # two sequences a rank, each its own R_i
        assert any(a["drawn"] != b["drawn"] for a, b in zip(r0, r1))
        assert all(row["run"] == max(row["drawn"]) for row in r0 + r1)
    assert len({row["ran"] for row in r0}) > 1
