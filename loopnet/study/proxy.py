"""Where a study model's parameters and training step go: the blocks against the embeddings and head.

    python -m loopnet.study.proxy --config configs/deeploop_r6.yaml --config configs/cpu.yaml \\
        --config configs/study_map.yaml [--model.config.n_rounds 6] [--steps 20]

A stability study on CPU uses a small proxy of the model it speaks for; the proxy should spend its
parameters and its step in the blocks, which the residual schemes act on, not in the embeddings and the
head (at d = 64 with a 19,136-way tied head the blocks held ~7% of the parameters and ~40% of a
step). For the config given (the `loopnet fit` options, parsed by the CLI's own parser) it measures, on
one thread and on the config's real training batches:

- parameters: the blocks (every Block), the embeddings + head (token and position tables, an untied
  head), the final Norm;
- the step (forward, backward, AdamW step, as `loopnet fit` runs it) under torch.profiler: each op's
  time goes to where its forward ran (the blocks' sublayers, the embeddings, the head: final Norm, LM
  head and loss), a backward op to its forward op's place (autograd's sequence numbers), the optimiser
  step to its own share;
- the step's speed in model GFLOP/s (`LoopedTransformer.flops_per_token` x tokens / time), against a
  512³ fp32 matmul timed on the same thread, interleaved with the steps (on a shared machine the ratio
  is what holds, not either speed).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from contextlib import ExitStack


def param_split(model) -> dict[str, int]:
    blocks = sum(p.numel() for p in model.blocks.parameters())
    norm = sum(p.numel() for p in model.final_norm.parameters())
    total = sum(p.numel() for p in model.parameters())
    return {"blocks": blocks, "embed+head": total - blocks - norm, "final norm": norm, "total": total}


def matmul_gflops(n: int = 512, repeats: int = 10) -> float:
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    t = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * n**3 * repeats / (time.perf_counter() - t) / 1e9


def scoped_step(lm, optimizer, batch):
    """One training step with the model's parts in `record_function` scopes: hooks on every sublayer
    ("blocks") and embedding table ("embed"), the head wrapped ("head"), the AdamW step ("optimizer")."""
    import torch
    from torch.autograd.profiler import record_function

    model = lm.model
    stacks = []

    def enter(name):
        def hook(*_):
            stack = ExitStack()
            stack.enter_context(record_function(name))
            stacks.append(stack)

        return hook

    def leave(*_):
        stacks.pop().close()

    handles = []
    for block in model.blocks:
        for sub in (block.attn, block.ffn):
            handles += [sub.register_forward_pre_hook(enter("blocks")), sub.register_forward_hook(leave)]
    for table in (model.wte, model.wpe):
        if table is not None:
            handles += [table.register_forward_pre_hook(enter("embed")), table.register_forward_hook(leave)]
    head = model.head

    def scoped_head(*args, **kwargs):
        with record_function("head"):
            return head(*args, **kwargs)

    model.head = scoped_head
    try:
        inputs, targets = batch
        _, loss = model(inputs, targets)
        loss.backward()
        with record_function("optimizer"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    finally:
        del model.head
        for h in handles:
            h.remove()
    return loss


def attribute(events) -> dict[str, float]:
    """Self CPU time (µs) per place: an op inside a scope counts for the scope; a backward op for its
    forward op's scope (same sequence number); the rest is "other"."""
    scopes = ("blocks", "embed", "head", "optimizer")

    def scope_of(ev):
        while ev is not None:
            if ev.name in scopes:
                return ev.name
            ev = ev.cpu_parent
        return None

    forward_scope = {}
    for ev in events:
        if ev.sequence_nr >= 0 and not ev.name.startswith("autograd::engine"):
            s = scope_of(ev)
            if s is not None:
                forward_scope.setdefault(ev.sequence_nr, s)
    out = dict.fromkeys((*scopes, "other"), 0.0)
    for ev in events:
        s = scope_of(ev)
        if s is None:  # in the backward: find the evaluate_function ancestor and its forward's scope
            anc = ev
            while anc is not None and not anc.name.startswith("autograd::engine::evaluate_function"):
                anc = anc.cpu_parent
            if anc is not None:
                s = forward_scope.get(anc.sequence_nr)
        out[s or "other"] += ev.self_cpu_time_total
    return out


def measure(config_args: list[str], steps: int = 20, warmup: int = 3) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from loopnet.training.module import LoopedLM

    from .probe import resolve

    torch.set_num_threads(1)
    base, optim, data, _ = resolve(config_args)
    data.setup("fit")
    loader = iter(data.train_dataloader())
    torch.manual_seed(0)
    lm = LoopedLM(config=base, optim=optim)
    optimizer = torch.optim.AdamW(lm.parameters(), lr=optim.lr, fused=True)
    batches = [next(loader) for _ in range(warmup + steps)]
    for b in batches[:warmup]:
        scoped_step(lm, optimizer, b)
    step_s, mm = [], []
    for b in batches[warmup:]:  # the matmul interleaved with the steps: both see the same load
        mm.append(matmul_gflops())
        t = time.perf_counter()
        scoped_step(lm, optimizer, b)
        step_s.append(time.perf_counter() - t)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for b in batches[warmup : warmup + 5]:
            scoped_step(lm, optimizer, b)
    places = attribute(prof.events())
    tokens = batches[0][0].numel()
    flops = lm.model.flops_per_token(seq_len=batches[0][0].shape[1]) * tokens
    step = statistics.median(step_s)
    return {
        "config": {
            "d_model": base.d_model,
            "n_blocks": base.n_blocks,
            "n_rounds": base.n_rounds,
            "vocab_size": base.vocab_size,
            "seq_len": batches[0][0].shape[1],
            "batch": batches[0][0].shape[0],
        },
        "params": param_split(lm.model),
        "time": places,
        "step_s": step,
        "step_s_all": step_s,
        "gflops": flops / step / 1e9,
        "matmul_gflops": statistics.median(mm),
        "flops_per_step": flops,
    }


def markdown(m: dict) -> str:
    c, p, t = m["config"], m["params"], m["time"]
    total_t = sum(t.values())
    share = {k: v / total_t for k, v in t.items()}
    return "\n".join(
        [
            f"d = {c['d_model']}, K = {c['n_blocks']}, R = {c['n_rounds']}, V = {c['vocab_size']}, "
            f"batch {c['batch']} x {c['seq_len']}:",
            f"- parameters: blocks {p['blocks']:,} ({p['blocks'] / p['total']:.0%}), embeddings + head "
            f"{p['embed+head']:,} ({p['embed+head'] / p['total']:.0%}), of {p['total']:,}",
            f"- step (profiled, one thread): blocks {share['blocks']:.0%}, head {share['head']:.0%}, embeddings "
            f"{share['embed']:.0%}, optimiser {share['optimizer']:.0%}, other {share['other']:.0%}",
            f"- step {m['step_s'] * 1e3:.0f} ms (median), {m['flops_per_step'] / 1e9:.2f} GFLOP: {m['gflops']:.1f} GFLOP/s "
            f"against {m['matmul_gflops']:.1f} GFLOP/s for a 512³ matmul on the same thread "
            f"(ratio {m['gflops'] / m['matmul_gflops']:.2f})",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(
        prog="python -m loopnet.study.proxy", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=20, help="timed steps (the profile takes 5 of them)")
    args, config_args = p.parse_known_args(argv)
    m = measure(config_args, steps=args.steps)
    print(markdown(m))


if __name__ == "__main__":
    main()
