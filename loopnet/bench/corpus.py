"""A generated corpus of OpenWebText's shape, laid out as the hub serves it (for tests and the first-step bench).

OpenWebText on the hub: one `text` column, 8,013,769 documents of ~4.9 kB mean (long-tailed: most are
a few kB), in parquet files named as the hub's parquet conversion names them
(``plain_text/train/0000.parquet``, or ``plain_text/partial-train/`` for a partial conversion) or as the
repository's own (``plain_text/train-00000-of-00080.parquet``). The text here is pseudo-English
(Zipf-distributed words of random syllables, sentences, paragraphs): what matters for the data path
is its size, shape and the tokenizer's work per byte, not its meaning. Generated, never committed.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np

LAYOUTS = {
    "conversion": "plain_text/train/{i:04d}.parquet",
    "partial": "plain_text/partial-train/{i:04d}.parquet",
    "own": "plain_text/train-{i:05d}-of-{n:05d}.parquet",
    "flat": "{i:04d}.parquet",
}


@functools.cache
def _vocabulary(n: int = 20000) -> np.ndarray:
    rng = np.random.default_rng(12345)
    syllables = [
        a + b
        for a in ("", "b", "c", "d", "f", "g", "h", "l", "m", "n", "p", "r", "s", "t", "st", "th", "w")
        for b in ("a", "e", "i", "o", "u", "ou", "ea", "er", "in", "on", "an", "al")
    ]
    lengths = rng.choice([1, 1, 2, 2, 2, 3, 3, 4], size=n)
    picks = rng.integers(0, len(syllables), size=(n, 4))
    return np.array(["".join(syllables[j] for j in picks[i, :k]) for i, k in enumerate(lengths)])


def documents(n: int, seed: int = 0, mean_chars: int = 4900) -> list[str]:
    """n pseudo-English documents with a log-normal length around `mean_chars` characters."""
    rng = np.random.default_rng(seed)
    vocab = _vocabulary()
    p = 1.0 / np.arange(1, len(vocab) + 1) ** 1.1
    p /= p.sum()
    sigma = 0.9
    words_per_doc = np.maximum(8, rng.lognormal(np.log(mean_chars / 7.7) - sigma**2 / 2, sigma, size=n)).astype(int)
    words = vocab[rng.choice(len(vocab), size=int(words_per_doc.sum()), p=p)]
    out, k = [], 0
    for count in words_per_doc:
        doc = words[k : k + count]
        k += count
        cuts = np.cumsum(rng.integers(6, 25, size=count // 6 + 1))
        sentences = [" ".join(doc[a:b]) for a, b in zip(np.r_[0, cuts[:-1]], cuts) if a < count]
        out.append(". ".join(s.capitalize() for s in sentences) + ".")
    return out


def write_corpus(
    folder: str | os.PathLike,
    n_docs: int,
    shards: int = 8,
    layout: str = "conversion",
    row_group_docs: int = 1000,
    seed: int = 0,
    mean_chars: int = 4900,
    batch: int = 20000,
) -> list[Path]:
    """Write `n_docs` documents in `shards` parquet files (near-equal row counts) under `folder`, named as
    `layout` (see LAYOUTS); row groups of `row_group_docs` rows. Returns the files, in order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder, files = Path(folder), []
    bounds = [i * n_docs // shards for i in range(shards + 1)]
    for i in range(shards):
        path = folder / LAYOUTS[layout].format(i=i, n=shards)
        path.parent.mkdir(parents=True, exist_ok=True)
        with pq.ParquetWriter(path, pa.schema([("text", pa.string())])) as writer:
            for a in range(bounds[i], bounds[i + 1], batch):
                b = min(a + batch, bounds[i + 1])
                texts = documents(b - a, seed=seed * 1_000_003 + a, mean_chars=mean_chars)
                writer.write_table(pa.table({"text": texts}), row_group_size=row_group_docs)
        files.append(path)
    return files
