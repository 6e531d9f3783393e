"""Under DDP each rank validates and tests on its own batches: the fixed-point profile and the exit frontier
pool them over the ranks (`sync`), so every rank logs what one process seeing all the batches would. Two gloo
processes against one meter over both batches."""

from __future__ import annotations

import math
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from loopnet.diagnostics.fixed_point import RoundProfileMeter, jacobian_profile
from loopnet.diagnostics.frontier import FrontierMeter
from loopnet.model import LoopedTransformer
from tests.helpers import tiny_config

ROUNDS, THRESHOLDS = 4, [0.0, 1e-3, math.inf]


def model_and_batches():
    torch.manual_seed(0)
    model = LoopedTransformer(tiny_config()).eval()
    g = torch.Generator().manual_seed(1)
    batches = []
    for n in (2, 3):  # unequal batches: the pooled means are token-weighted
        idx, targets = torch.randint(0, 64, (n, 8), generator=g), torch.randint(0, 64, (n, 8), generator=g)
        targets[0, :3] = -1  # ignored targets do not count
        batches.append((idx, targets))
    return model, batches


def meters():
    return RoundProfileMeter(ROUNDS, jacobian_sequences=1, jacobian_iters=10), FrontierMeter("kl", THRESHOLDS, ROUNDS)


def _rank(rank: int, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        model, batches = model_and_batches()
        profile, frontier = meters()
        with torch.no_grad():
            profile.update(model, *batches[rank])
            frontier.update(model, *batches[rank])

        def reduce(t):
            dist.all_reduce(t)
            return t

        profile.sync(reduce)
        frontier.sync(reduce)
        torch.save({"profile": profile.compute(), "frontier": frontier.compute()}, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def synced(tmp_path_factory):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp_path_factory.mktemp("sync") / "rank")
    mp.spawn(_rank, args=(port, out), nprocs=2, join=True)
    return [torch.load(f"{out}.{r}", weights_only=True) for r in (0, 1)]


def test_every_rank_holds_the_profile_and_frontier_of_all_batches(synced):
    model, batches = model_and_batches()
    profile, frontier = meters()
    with torch.no_grad():
        for batch in batches:
            profile.update(model, *batch)
            frontier.update(model, *batch)
    expected_profile, expected_frontier = profile.compute(), frontier.compute()
    # σ_max: each rank measures its own first batch; pooled, the mean of the two
    sigmas = [jacobian_profile(model, idx[:1], ROUNDS, 10) for idx, _ in batches]
    expected_profile["sigma_max"] = [None if a is None else (a + b) / 2 for a, b in zip(*sigmas)]
    for got in synced:
        assert got["frontier"] == [pytest.approx(p, rel=1e-12) for p in expected_frontier]
        assert sorted(got["profile"]) == sorted(expected_profile)
        for q, values in expected_profile.items():
            assert [v is None for v in got["profile"][q]] == [v is None for v in values], q
            assert [v for v in got["profile"][q] if v is not None] == pytest.approx(
                [v for v in values if v is not None], rel=1e-9
            ), q


def test_a_rank_without_batches_adds_nothing():
    """A rank that saw no batch (uneven data) contributes zeros: pooled, the meters equal the other rank's."""
    import copy

    model, batches = model_and_batches()
    for which in (0, 1):  # the profile, the frontier
        seen, empty, alone = (meters()[which] for _ in range(3))
        with torch.no_grad():
            seen.update(model, *batches[0])
            alone.update(model, *batches[0])

        def vector_of(meter):
            got = []
            copy.deepcopy(meter).sync(lambda t: got.append(t.clone()) or t)
            return got[0]

        total = vector_of(seen) + vector_of(empty)
        for meter in (seen, empty):
            meter.sync(lambda t: total.clone())
            assert _close(meter.compute(), alone.compute())


def _close(got, want) -> bool:
    if isinstance(want, list):
        return len(got) == len(want) and all(_close(g, w) for g, w in zip(got, want))
    if isinstance(want, dict):
        return got.keys() == want.keys() and all(_close(got[k], want[k]) for k in want)
    if want is None or got is None:
        return got is want
    return math.isclose(got, want, rel_tol=1e-12) or (math.isnan(got) and math.isnan(want))
