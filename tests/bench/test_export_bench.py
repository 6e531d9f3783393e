"""`loopnet bench export` runs every row end to end (on a tiny model here; the GPT-2-small figures are in
docs/benchmarks/export.md)."""

from __future__ import annotations

import pytest

from loopnet.bench import export as bench


@pytest.mark.slow
def test_every_row_runs_in_its_own_process_and_the_table_names_them():
    res = bench.run(1, {"d_model": 32, "n_heads": 2, "n_blocks": 1, "seq_len": 16, "vocab_size": 64})
    assert set(res["rows"]) == set(bench.ROWS)
    assert res["weight_bytes"] == res["parameters"] * 4  # fp32, the tied head counted once
    for row in res["rows"].values():
        assert row["seconds"] > 0 and row["peak_ratio"] >= 0
    table = bench.markdown(res, "loopnet bench export")
    assert all(f"| {row} |" in table for row in bench.ROWS)
