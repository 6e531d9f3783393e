"""The Huginn benches' plumbing at tiny size: the generated checkpoint is one loopnet imports, the memory bench runs
every row in its own process (the ratios at real size are in docs/benchmarks/import.md), and the speed bench refuses
a reference folder without the reference's files before any work."""

from __future__ import annotations

import pytest
import torch

from loopnet.bench import huginn_memory, huginn_speed
from loopnet.bench.huginn_checkpoint import write_checkpoint
from loopnet.formats.huginn import read_huginn

TINY = {
    "n_embd": 32,
    "n_heads": 4,
    "intermediate_size": 48,
    "vocab_size": 272,
    "block_size": 64,
    "n_layers_in_prelude": 1,
    "n_layers_in_recurrent_block": 2,
    "n_layers_in_coda": 1,
}


def test_the_generated_checkpoint_is_sharded_as_the_hub_serves_it_and_imports(tmp_path):
    made = write_checkpoint(tmp_path, TINY, shard_bytes=20_000)
    assert made["files"] > 1 and (tmp_path / "model.safetensors.index.json").is_file()
    cfg, state, meta = read_huginn(tmp_path)  # every tensor used, every weight filled, freqs_cis checked
    assert (cfg.d_model, cfg.n_prelude, cfg.n_blocks, cfg.n_coda) == (32, 1, 2, 1) and meta["dtype"] == "bfloat16"
    stored = {id(v): v for v in state.values()}  # the tied head once
    assert made["parameters"] == sum(v.numel() for v in stored.values())
    assert made["weight_bytes"] == 2 * made["parameters"] and all(v.dtype == torch.bfloat16 for v in stored.values())


@pytest.mark.slow
def test_the_memory_bench_runs_every_row_in_its_own_process(tmp_path):
    res = huginn_memory.run(1, TINY, str(tmp_path))
    assert set(res["rows"]) == set(huginn_memory.ROWS) and res["weight_bytes"] == 2 * res["parameters"]
    for row in res["rows"].values():
        assert row["seconds"] > 0 and row["peak_bytes"] >= 0 and row["base_bytes"] > 0
    table = huginn_memory.markdown(res, "loopnet bench huginn-memory")
    assert all(f"| {row} |" in table for row in huginn_memory.ROWS)
    assert not any(tmp_path.iterdir())  # the checkpoint and the imported folder are deleted


def test_the_speed_bench_refuses_a_folder_without_the_reference(tmp_path):
    with pytest.raises(SystemExit, match="holds no raven_modeling_minimal.py, raven_config_minimal.py"):
        huginn_speed.main(["--reference", str(tmp_path)])
