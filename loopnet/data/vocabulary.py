"""The vocabularies a data module's batches can hold (`data.vocab`), each an object that knows its size,
how text becomes its ids and back, and whether a model's embedding fits it. Light to import for the
early checks (NumPy, the tokenizer and the byte table load when a vocabulary is first used).

    gpt2     GPT-2's 50257 BPE ids
    compact  the GPT-2 ids that occur in the corpus, renumbered 0..V-1 in GPT-2 order (V known once read)
    bytes    UTF-8 bytes and end-of-text, 257 ids (`loopnet.data.bytelevel`)
    tokenizer   an imported model's own tokenizer.json (`data.tokenizer`; `loopnet.formats.tokenizer`)
"""

from __future__ import annotations

import hashlib
from typing import get_args

from loopnet.data.token_ids import EOT_ID, N_VOCAB, VocabName, check_fits


class Vocabulary:
    """Text <-> the ids a data module's batches hold.

    `table`: what the stream maps a document with (`loopnet.data.stream.encode`; None: GPT-2's ids as
    they are). `reads_corpus`: built from the corpus's documents (so the corpus must be local)."""

    name: str
    reads_corpus = False
    table = None

    @classmethod
    def known_size(cls) -> int | None:
        """The id count when known without reading the corpus (None: known once read)."""
        return None

    @property
    def size(self) -> int:
        return self.known_size()

    @property
    def cache_key(self) -> str:
        """Names the ids in the held-out windows' cache key."""
        return self.name

    @property
    def eot(self) -> int:
        """The end-of-text id (what an empty prompt starts from)."""
        raise NotImplementedError

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids) -> str:
        raise NotImplementedError

    def check_fits(self, model_vocab: int) -> None:
        check_fits(model_vocab, self.size, self.name)


class GPT2Vocab(Vocabulary):
    name = "gpt2"

    @classmethod
    def known_size(cls) -> int:
        return N_VOCAB

    @property
    def eot(self) -> int:
        return EOT_ID

    def encode(self, text: str) -> list[int]:
        from loopnet.data.tokenizer import gpt2_encoding

        return gpt2_encoding().encode_ordinary(text)

    def decode(self, ids) -> str:
        from loopnet.data.tokenizer import gpt2_encoding

        return gpt2_encoding().decode(list(ids))


class CompactVocab(Vocabulary):
    """The corpus's own GPT-2 ids (`ids`, ascending), renumbered 0..V-1; a GPT-2 token outside them
    encodes as end-of-text."""

    name, reads_corpus = "compact", True

    def __init__(self, ids):
        import numpy as np

        self.ids = np.asarray(ids, dtype=np.int32)
        self.table = np.full(N_VOCAB, -1, dtype=np.int32)  # GPT-2 id -> compact id (-1: not in the corpus)
        self.table[self.ids] = np.arange(len(self.ids), dtype=np.int32)

    @classmethod
    def of_texts(cls, texts) -> CompactVocab:
        """The vocabulary of documents `texts` (end-of-text always included)."""
        import numpy as np

        gpt2 = GPT2Vocab()
        seen = np.zeros(N_VOCAB, dtype=bool)
        seen[EOT_ID] = True
        for text in texts:
            if text:
                seen[gpt2.encode(text)] = True
        return cls(np.flatnonzero(seen))

    @property
    def size(self) -> int:
        return len(self.ids)

    @property
    def cache_key(self) -> str:
        return "compact-" + hashlib.sha256(self.ids.tobytes()).hexdigest()[:16]

    @property
    def eot(self) -> int:
        return int(self.table[EOT_ID])

    def encode(self, text: str) -> list[int]:
        import numpy as np

        ids = GPT2Vocab().encode(text)
        compact = self.table[np.asarray(ids, dtype=np.int64)] if ids else np.zeros(0, dtype=np.int32)
        return np.where(compact < 0, self.table[EOT_ID], compact).tolist()

    def decode(self, ids) -> str:
        import numpy as np

        return GPT2Vocab().decode(self.ids[np.asarray(ids, dtype=np.int64)].tolist())


class BytesVocab(Vocabulary):
    name = "bytes"

    @classmethod
    def known_size(cls) -> int:
        from loopnet.data.bytelevel import N_BYTE_VOCAB

        return N_BYTE_VOCAB

    @property
    def table(self):
        from loopnet.data.bytelevel import ByteVocab

        return ByteVocab()  # the stream reads a document's bytes through it

    @property
    def eot(self) -> int:
        from loopnet.data.bytelevel import BYTE_EOT_ID

        return BYTE_EOT_ID

    def encode(self, text: str) -> list[int]:
        return self.table.encode(text)

    def decode(self, ids) -> str:
        return self.table.decode(ids)


class TokenizerVocab(Vocabulary):
    """The ids of a tokenizer.json (an imported model's, `data.tokenizer`); its size is known once it is read."""

    name = "tokenizer"

    def __init__(self, path: str):
        from loopnet.formats.tokenizer import HFTokenizer

        self.table = HFTokenizer(path)  # the stream encodes each document through it (`document`)
        self.digest = hashlib.sha256(open(self.table.path, "rb").read()).hexdigest()[:16]

    @property
    def size(self) -> int:
        return self.table.n_vocab

    @property
    def cache_key(self) -> str:
        return f"tokenizer-{self.digest}"

    def encode(self, text: str) -> list[int]:
        return self.table.encode_ordinary(text)

    def decode(self, ids) -> str:
        return self.table.decode(ids)


VOCABULARIES: dict[str, type[Vocabulary]] = {
    cls.name: cls for cls in (GPT2Vocab, CompactVocab, BytesVocab, TokenizerVocab)
}
assert tuple(VOCABULARIES) == get_args(VocabName)


def known_size(name: str) -> int | None:
    """The id count of vocabulary `name` when known before the corpus is read (None: unknown name, or compact)."""
    cls = VOCABULARIES.get(name)
    return cls.known_size() if cls is not None else None
