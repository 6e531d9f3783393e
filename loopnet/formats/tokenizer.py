"""An imported model's own tokenizer: a `tokenizer.json` read with Hugging Face `tokenizers`, with the
interface loopnet reads of GPT-2's tiktoken Encoding (`loopnet.data.tokenizer.gpt2_encoding`):
`encode_ordinary`, `encode`, `decode`, `n_vocab`, `eot_token`, `name`, plus `document(text)`, a document's
ids and end-of-text as the data stream packs them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from loopnet.data.errors import DataConfigError

# Where a model folder names its end-of-text token, in the order read (tokenizer_config.json's own, then the map).
EOS_FILES = ("tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


class TokenizerFileError(DataConfigError):
    """A tokenizer path that is no tokenizer.json, or one without an end-of-text token."""


def _eos(folder: Path, tokenizer) -> int:
    """The id of the end-of-text token that the folder's files name (eos_token, or eos_token_id)."""
    for name in EOS_FILES:
        path = folder / name
        if not path.is_file():
            continue
        meta = json.loads(path.read_text())
        token = meta.get("eos_token")
        if isinstance(token, dict):  # {"content": "<|end_text|>", ...}
            token = token.get("content")
        if isinstance(token, str) and tokenizer.token_to_id(token) is not None:
            return tokenizer.token_to_id(token)
        if isinstance(meta.get("eos_token_id"), int):
            return meta["eos_token_id"]
    raise TokenizerFileError(
        f"{folder}: no end-of-text token named (eos_token in tokenizer_config.json or "
        f"special_tokens_map.json); fix: give the model folder the tokenizer came with"
    )


class HFTokenizer:
    """The tokenizer of `path` (a tokenizer.json, or a folder holding one and its tokenizer_config.json)."""

    def __init__(self, path: str | Path):
        from tokenizers import Tokenizer

        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise TokenizerFileError(
                f"{path}: no tokenizer.json; fix: give an imported model's folder or its tokenizer.json"
            )
        self.path = str(file)
        self.name = f"tokenizer:{file.parent.name or file.name}"
        self._tok = Tokenizer.from_file(self.path)
        self.eot_token = _eos(file.parent, self._tok)
        self.n_vocab = self._tok.get_vocab_size(with_added_tokens=True)

    def __getstate__(self) -> dict:  # data-loader workers rebuild it from the file
        return {"path": self.path, "name": self.name, "eot_token": self.eot_token, "n_vocab": self.n_vocab}

    def __setstate__(self, state: dict) -> None:
        from tokenizers import Tokenizer

        self.__dict__.update(state)
        self._tok = Tokenizer.from_file(self.path)

    def encode_ordinary(self, text: str) -> list[int]:
        """Ids of `text` with special tokens' text encoded as ordinary text (as tiktoken's encode_ordinary)."""
        self._tok.encode_special_tokens = True
        try:
            return self._tok.encode(text, add_special_tokens=False).ids
        finally:
            self._tok.encode_special_tokens = False

    def encode(self, text: str, allowed_special: object = "all") -> list[int]:
        """Ids of `text`, special tokens written in it recognised as such (no template tokens added);
        `allowed_special` is tiktoken's argument, accepted for its callers (every special is allowed)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def document(self, text: str) -> np.ndarray:
        """A document's ids followed by end-of-text, int32 (the stream packs these)."""
        ids = self.encode_ordinary(text)
        ids.append(self.eot_token)
        return np.asarray(ids, dtype=np.int32)
