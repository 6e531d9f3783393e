"""Data pipeline throughput: tokens/s of read → tokenize → pack → batch, next to raw tokenization.

    python -m loopnet.bench.data_throughput [--tokens 8000000] [--seq-len 1024] [--batch-size 8] [--workers 0 1 2]

Both figures come from one run on the same text (the embedded Shakespeare corpus, training
split): "raw" is tiktoken's `encode_ordinary` on the documents already in memory, one thread;
"pipeline" is batches drawn from `TokenStreamDataModule.train_dataloader()` (files read
through `datasets`, hashed for the val split, tokenized, packed, shuffled, collated), timed
from the DataLoader's `iter()`, worker start-up included.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from loopnet.data import TokenStreamDataModule, gpt2_encoding  # noqa: E402
from loopnet.data.sources import SHAKESPEARE_VAL_FRACTION, ValSelector, shakespeare_files  # noqa: E402


def train_texts() -> list[str]:
    val = ValSelector(SHAKESPEARE_VAL_FRACTION)
    return [t for t in (open(f, encoding="utf-8").read() for f in shakespeare_files()) if not val(t)]


def raw_tokens_per_s(texts: list[str], min_seconds: float = 1.5) -> float:
    enc = gpt2_encoding()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < min_seconds:
        n += sum(len(enc.encode_ordinary(t)) for t in texts)
    return n / (time.perf_counter() - start)


def pipeline_tokens_per_s(num_workers: int, tokens: int, seq_len: int, batch_size: int) -> float:
    dm = TokenStreamDataModule(seq_len=seq_len, batch_size=batch_size, num_workers=num_workers, seed=0)
    dm.setup("fit")  # opening the source and loading the tokenizer are not throughput
    loader = dm.train_dataloader()
    n_batches = max(1, tokens // (seq_len * batch_size))
    start = time.perf_counter()  # worker start-up and the first shuffle block are included
    it = iter(loader)
    for _ in range(n_batches):
        x, _ = next(it)
    elapsed = time.perf_counter() - start
    del it
    return n_batches * x.numel() / elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=8_000_000, help="tokens drawn per pipeline measurement")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    args = p.parse_args()

    texts = train_texts()
    print(
        f"corpus: embedded Shakespeare, training split, {sum(map(len, texts)) / 1e6:.1f}M characters; "
        f"{os.cpu_count()} CPUs; seq_len {args.seq_len}, batch {args.batch_size}"
    )
    print("(raw is re-measured next to each pipeline run, so the ratio is immune to drifting machine load)")
    print("(vs 1 worker: pipeline tok/s over the 1-worker run, the scaling with workers)")
    results = {}
    for w in args.workers:
        raw = raw_tokens_per_s(texts)
        results[w] = (pipeline_tokens_per_s(w, args.tokens, args.seq_len, args.batch_size), raw)
    print(f"{'num_workers':>11} {'pipeline tok/s':>15} {'raw tok/s':>10} {'ratio':>6} {'vs 1 worker':>12}")
    for w, (tps, raw) in results.items():
        scale = f"{tps / results[1][0]:>11.2f}x" if 1 in results and w != 0 else f"{'-':>12}"
        print(f"{w:>11} {tps / 1e6:>14.2f}M {raw / 1e6:>9.2f}M {tps / raw:>5.2f}x {scale}")


if __name__ == "__main__":
    main()
