import numpy as np

from loopnet.data.packing import Packer, block_permutation


def drain(packer):
    out = []
    while (w := packer.pop()) is not None:
        out.append(w.copy())
    return out


def test_windows_cover_stream_and_drop_only_final_partial():
    rng = np.random.default_rng(0)
    docs = [
        rng.integers(0, 100, size=n).astype(np.int32) for n in (1, 3, 17, 2, 40, 5)
    ]  # shorter and longer than a window
    seq_len = 8
    p = Packer(seq_len)
    windows = []
    for i, d in enumerate(docs):
        p.push(i, d)
        windows += drain(p)
    stream = np.concatenate(docs)
    assert all(len(w) == seq_len + 1 for w in windows)
    # Consecutive windows share one token; together they are the stream up to the final partial window.
    rebuilt = np.concatenate([windows[0]] + [w[1:] for w in windows[1:]])
    assert np.array_equal(rebuilt, stream[: len(rebuilt)])
    assert len(stream) - len(rebuilt) < seq_len
    assert p.available == len(stream) - len(windows) * seq_len


def test_position_and_offset_resume():
    docs = [np.arange(k * 100, k * 100 + 13, dtype=np.int32) for k in range(5)]
    p = Packer(4)
    for i, d in enumerate(docs):
        p.push(i, d)
    drain_n = [p.pop().copy() for _ in range(6)]
    pos, off = p.position()
    rest = drain(p)
    q = Packer(4)
    q.push(pos, docs[pos], off)
    for i in range(pos + 1, 5):
        q.push(i, docs[i])
    assert all(np.array_equal(a, b) for a, b in zip(rest, drain(q)))
    assert len(drain_n) == 6


def test_block_permutation_is_seeded():
    a = block_permutation(16, 3, 0, 1, 2)
    assert sorted(a) == list(range(16))
    assert np.array_equal(a, block_permutation(16, 3, 0, 1, 2))
    assert not np.array_equal(a, block_permutation(16, 4, 0, 1, 2))
    assert list(block_permutation(1, 3)) == [0]
