"""Does loopnet's Pre-LN learn as well as a standard GPT? Side by side with an independent nanoGPT-style
GPT (`loopnet.bench.nanogpt`), in one run, on the same batches, with the same training loop.

    python -m loopnet.bench.parity                      # defaults below, ~3 min on 2 cores
    python -m loopnet.bench.parity --steps 100 --seeds 1  # quick look

Both models: K = L blocks of width d, R = 1, learned positions, tied head, no dropout; loopnet's
Pre-LN with its defaults (RMSNorm, e fed in as it is, N(0, 0.02²) init) and, as a control, with
`input_norm: true` (Norm(e) as the input: with a tied head it costs Pre-LN ~0.3 nat at small scale, docs/model.md). Same
AdamW (β = 0.9, 0.95, weight decay 0.1 on ≥ 2-D tensors), linear warm-up then cosine to lr/10,
gradient clipping 1.0, the embedded corpus with the compact vocabulary, the same training batches
and the same held-out windows. Prints validation loss per model and seed, mean ± std, and the
paired difference loopnet − nanoGPT.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from loopnet.bench.nanogpt import GPT, GPTConfig
from loopnet.model import LoopConfig, LoopedTransformer, lm_loss


def lr_at(step: int, lr: float, warmup: int, total: int) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def adamw(model: torch.nn.Module, lr: float) -> torch.optim.AdamW:
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(
        [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=lr,
        betas=(0.9, 0.95),
    )


def loss_of(model, inputs, targets):
    if isinstance(model, LoopedTransformer):
        return model(inputs, targets)[1]
    return lm_loss(model(inputs)[0], targets)


def train(model, batches, val, lr: float, warmup: int) -> float:
    """Train on `batches`, return the mean loss on the validation windows `val` [n, T + 1]."""
    opt = adamw(model, lr)
    model.train()
    for step, (inputs, targets) in enumerate(batches):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, lr, warmup, len(batches))
        loss = loss_of(model, inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    model.eval()
    with torch.no_grad():
        losses = [loss_of(model, w[:, :-1], w[:, 1:]).item() for w in val.split(8)]
    return statistics.fmean(losses)


def models(args, vocab: int) -> dict:
    loop = dict(
        vocab_size=vocab,
        seq_len=args.seq_len,
        d_model=args.d_model,
        n_heads=args.n_heads,
        n_blocks=args.n_layers,
        n_rounds=1,
        residual="preln",
    )
    return {
        "nanoGPT (independent)": lambda: GPT(
            GPTConfig(
                vocab_size=vocab,
                block_size=args.seq_len,
                n_layer=args.n_layers,
                n_head=args.n_heads,
                n_embd=args.d_model,
            )
        ),
        "loopnet preln": lambda: LoopedTransformer(LoopConfig(**loop)),
        "loopnet preln, input_norm: true": lambda: LoopedTransformer(LoopConfig(**loop, input_norm=True)),
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(
        prog="python -m loopnet.bench.parity", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=40)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--n-layers", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--val-batches", type=int, default=8)
    args = p.parse_args(argv)

    from loopnet.data import TokenStreamDataModule

    data = TokenStreamDataModule(seq_len=args.seq_len, batch_size=args.batch_size, vocab="compact")
    data.setup("fit")
    loader = iter(data.train_dataloader())
    batches = [tuple(t.long() for t in next(loader)) for _ in range(args.steps)]
    val = data.val_windows()[: args.val_batches * args.batch_size]
    vocab = -(-data.vocab_size // 64) * 64
    results: dict[str, list[float]] = {}
    start = time.perf_counter()
    for seed in args.seeds:
        for name, build in models(args, vocab).items():
            torch.manual_seed(seed)
            results.setdefault(name, []).append(train(build(), batches, val, args.lr, args.warmup))
            print(f"seed {seed}  {name:<34} val loss {results[name][-1]:.4f}", flush=True)
    ref = results["nanoGPT (independent)"]
    print(
        f"\n{args.steps} steps, d={args.d_model}, L=K={args.n_layers}, T={args.seq_len}, batch {args.batch_size}, "
        f"lr {args.lr:g}, compact vocabulary {data.vocab_size} (padded {vocab}), {len(args.seeds)} seed(s), "
        f"{time.perf_counter() - start:.0f} s"
    )
    print("| model | val loss (mean ± std) | minus nanoGPT, paired (mean ± std) |\n|---|---:|---:|")
    for name, vals in results.items():
        diff = [a - b for a, b in zip(vals, ref)]
        sd = lambda xs: statistics.stdev(xs) if len(xs) > 1 else 0.0  # noqa: E731
        print(
            f"| {name} | {statistics.fmean(vals):.4f} ± {sd(vals):.4f} | "
            f"{statistics.fmean(diff):+.4f} ± {sd(diff):.4f} |"
        )
    return results


if __name__ == "__main__":
    main()
