"""The unigram plateau: the loss of a model that has learned token frequencies and nothing else.

Early in training a language model's loss drops fast to what the unigram distribution of its
training tokens scores, and can sit there; a run that never gets below it has learned no context.
The DeepLoop appendix counts a seed as having *escaped* when its loss left this plateau (≈ 7.67
nats for GPT-2 BPE on OpenWebText, where training and validation text are alike).

On a small local corpus the held-out text differs from the training text (the embedded corpus
holds out one whole play), so the plateau of the *validation* loss is not the training entropy:
it is the cross-entropy of the validation tokens under the training unigram distribution. loopnet
computes exactly that, on the very batches a run validates on (its data module's held-out windows,
the first `limit_val_batches` batches), with add-one smoothing so that a token unseen in training
costs a finite amount. For a hub dataset (too large to scan) it uses the OpenWebText value.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from loopnet.data.token_ids import N_VOCAB

OPENWEBTEXT_PLATEAU = 7.67  # nats, GPT-2 BPE on OpenWebText (DeepLoop appendix)


def entropy(counts: np.ndarray) -> float:
    """Entropy in nats of the distribution proportional to `counts`."""
    counts = counts[counts > 0].astype(np.float64)
    p = counts / counts.sum()
    return float(-(p * np.log(p)).sum())


def unigram_counts(token_arrays: Iterable[np.ndarray], vocab_size: int = N_VOCAB) -> np.ndarray:
    counts = np.zeros(vocab_size, dtype=np.int64)
    for ids in token_arrays:
        counts += np.bincount(ids, minlength=vocab_size)[:vocab_size]
    return counts


def cross_entropy(targets: np.ndarray, counts: np.ndarray) -> float:
    """Mean loss in nats of predicting every target with the add-one smoothed unigram distribution
    of `counts`."""
    logp = np.log((counts + 1.0) / (counts.sum() + len(counts)))
    return float(-logp[targets].mean())


def val_limit(limit, n_batches: int) -> int:
    """How many validation batches Lightning runs for `trainer.limit_val_batches` (a count, or a
    fraction when ≤ 1.0; None means all)."""
    if limit is None:
        return n_batches
    if isinstance(limit, float) and limit <= 1.0:
        return int(n_batches * limit)
    return min(int(limit), n_batches)


def run_plateau(config: dict) -> tuple[float, str]:
    """The unigram plateau of a run's validation loss, from its resolved config (config.yaml):
    (nats, how it was got)."""
    data = dict(config.get("data") or {})
    source = data.get("source", "shakespeare")
    if source == "hub":
        return OPENWEBTEXT_PLATEAU, "the OpenWebText value of the DeepLoop appendix (hub datasets are not scanned)"
    from loopnet.data import TokenStreamDataModule
    from loopnet.data.stream import encode

    seq_len = config["model"]["config"]["seq_len"]
    batch = data.pop("batch_size", 1)
    keys = ("source", "path", "name", "split", "text_column", "sample_by", "val_fraction", "vocab")
    dm = TokenStreamDataModule(seq_len=seq_len, batch_size=batch, **{k: data[k] for k in keys if k in data})
    dm.setup("fit")
    table = dm._table  # the run's own ids: GPT-2's, compact (the same plateau, renumbered) or bytes
    train = (
        encode(d[dm.text_column], table) for d in dm.docs if d.get(dm.text_column) and not dm.val(d[dm.text_column])
    )
    counts = unigram_counts(train, dm.vocab_size)
    windows = dm.val_windows()
    n = val_limit((config.get("trainer") or {}).get("limit_val_batches"), -(-len(windows) // batch)) * batch
    targets = windows[:n, 1:].numpy()
    value = cross_entropy(targets, counts)
    how = (
        f"cross-entropy of the run's {targets.size:,} validation target tokens under the add-one smoothed "
        f"unigram distribution of the {int(counts.sum()):,} training tokens of source {source!r} "
        f"(the training unigram entropy itself is {entropy(counts):.3f} nats)"
    )
    return value, how
