"""Memory of one forward + backward: bytes saved for backward and the peak above the step's start."""

from __future__ import annotations

from typing import Optional

import torch

from loopnet.bench.settings import Settings, sync
from loopnet.model import LoopConfig, LoopedTransformer


def step_memory(s: Settings, config: LoopConfig, batch) -> dict:
    """Saved-for-backward bytes and peak bytes of one forward + backward (see the module docstring)."""
    torch.manual_seed(0)
    model = LoopedTransformer(config).to(s.device)
    x, y = (t.to(s.device) for t in batch)
    autocast = s.autocast()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params and ptr != 0:
            saved[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
        _, loss = model(x, y)
    loss.backward()
    model.zero_grad(set_to_none=True)
    out = {"saved": sum(saved.values()), "peak": None}
    del loss
    if s.cuda:
        sync(s.device)
        torch.cuda.reset_peak_memory_stats(s.device)
        base = torch.cuda.memory_allocated(s.device)
        with autocast:
            _, loss = model(x, y)
        loss.backward()
        sync(s.device)
        out["peak"] = torch.cuda.max_memory_allocated(s.device) - base
    else:
        try:
            from torch.distributed._tools.mem_tracker import MemTracker
        except ImportError:  # torch built without distributed
            return out
        tracker = MemTracker()
        tracker.track_external(model)
        with tracker:
            with autocast:
                _, loss = model(x, y)
            loss.backward()
        snap = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
        out["peak"] = sum(v for k, v in snap.items() if str(k).rsplit(".", 1)[-1] in ("GRAD", "ACT", "TEMP", "OTH"))
    model.zero_grad(set_to_none=True)
    return out


def fmt_bytes(n: Optional[float]) -> str:
    if n is None:
        return "—"
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 or n == 0 else f"{n / 2**10:.0f} KiB"
