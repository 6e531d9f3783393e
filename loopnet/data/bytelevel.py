"""A byte-level vocabulary (`data.vocab: bytes`): every UTF-8 byte of a document is a token (ids
0-255), end-of-text is 256, so V = 257 and no BPE is involved.

For the CPU proxy of the stability study (docs/results/map/): with GPT-2's ids even the corpus's own 19,083
(`vocab: compact`) make the tied head most of a small model's parameters and of its step; with 257
the blocks carry the model. What it changes: a token is a byte (~3.0 bytes per GPT-2 token in the
embedded corpus), so losses are in nats per *byte*, not comparable to GPT-2-token losses, and a
sequence of T bytes holds the context of ~T/3 GPT-2 tokens. Works with every source (no corpus
scan needed)."""

from __future__ import annotations

import numpy as np

N_BYTE_VOCAB = 257
BYTE_EOT_ID = 256


class ByteVocab:
    """Stands where the stream's GPT-2 -> compact id table would (`loopnet.data.stream.encode`'s `table`):
    a plain, picklable object, so DataLoader workers get it as they get a table."""

    size = N_BYTE_VOCAB

    @staticmethod
    def document(text: str) -> np.ndarray:
        """A document's ids: its UTF-8 bytes, then end-of-text."""
        ids = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)
        return np.append(ids, np.int32(BYTE_EOT_ID))

    @staticmethod
    def encode(text: str) -> list[int]:
        return list(text.encode("utf-8"))

    @staticmethod
    def decode(ids) -> str:
        """Text of ids; end-of-text and ids outside the bytes are dropped, broken UTF-8 replaced."""
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")
