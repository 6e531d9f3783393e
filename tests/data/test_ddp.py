"""Two real processes (gloo): per-rank streams, a checkpoint state gathered from every rank, exact resume."""

import socket

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from loopnet.data import TokenStreamDataModule

from .conftest import make_docs
from .test_stream import draw

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(rank, world, port, kw, out):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        full, _ = draw(kw, 40)
        head, state = draw(kw, 13)  # state_dict() gathers every rank's state
        tail, _ = draw(kw, 27, state)  # each rank picks its own
        exact = all(torch.equal(a[0], b[0]) for a, b in zip(head + tail, full))
        val = TokenStreamDataModule(**kw).val_windows()  # rank from torch.distributed
        torch.save({"exact": exact, "ranks": len(state["ranks"]), "first": full[0][0], "val": val}, f"{out}/{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("kind", ["txt", "parquet"])
def test_two_ranks(tmp_path, kind):
    d = tmp_path / "corpus"
    d.mkdir()
    if kind == "txt":
        for i, text in enumerate(make_docs(16)):
            (d / f"{i:02d}.txt").write_text(text)
    else:  # 3 shards over 2 ranks: balanced row ranges; the held-out windows cached once, read by both ranks
        for k in range(3):
            pq.write_table(pa.table({"text": make_docs(11, tag=f"p{k}")}), d / f"{k:02d}.parquet", row_group_size=4)
    kw = dict(
        seq_len=16, batch_size=2, seed=1, source="files", path=str(d / f"*.{kind}"), val_fraction=0.2, shuffle_buffer=5
    )
    mp.start_processes(_run, args=(2, _free_port(), kw, str(tmp_path)), nprocs=2, start_method="fork")
    r = [torch.load(tmp_path / f"{k}.pt") for k in range(2)]
    assert r[0]["exact"] and r[1]["exact"]
    assert r[0]["ranks"] == r[1]["ranks"] == 2
    assert not torch.equal(r[0]["first"], r[1]["first"])  # ranks read different data
    single = TokenStreamDataModule(**kw).val_windows()
    assert len(r[0]["val"]) == len(r[1]["val"]) >= len(single) // 2  # the val split, sharded by rank
    assert torch.equal(torch.stack([r[0]["val"], r[1]["val"]], 1).flatten(0, 1), single[: 2 * len(r[0]["val"])])
