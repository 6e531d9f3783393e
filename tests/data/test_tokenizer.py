import shutil

import pytest
import tiktoken.load
from tiktoken_ext import openai_public

from loopnet.data import EOT_ID, gpt2_encoding
from loopnet.data.tokenizer import TokenizerFilesError, _default_data_dir


def test_known_gpt2_ids():
    enc = gpt2_encoding()
    assert enc.encode_ordinary("Hello world") == [15496, 995]
    assert enc.encode_ordinary(" the") == [262]
    assert enc.n_vocab == 50257 and EOT_ID == 50256 == enc.eot_token
    assert enc.name == "gpt2"
    text = "Shall I compare thee to a summer's day?\n  Thou art more lovely 123 ÄΩ 🙂"
    assert enc.decode(enc.encode_ordinary(text)) == text


def test_identical_to_tiktoken_gpt2(monkeypatch):
    # Build tiktoken's own gpt2 definition, with its URLs served from the local files.
    local = _default_data_dir()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")
    monkeypatch.setattr(tiktoken.load, "read_file", lambda url: (local / url.rsplit("/", 1)[1]).read_bytes())
    ref = openai_public.gpt2()
    enc = gpt2_encoding()
    assert enc._pat_str == ref["pat_str"]
    assert enc._special_tokens == ref["special_tokens"]
    assert enc._mergeable_ranks == ref["mergeable_ranks"]
    assert enc.n_vocab == ref["explicit_n_vocab"]


def test_missing_file(tmp_path):
    shutil.copy(_default_data_dir() / "vocab.bpe", tmp_path / "vocab.bpe")
    with pytest.raises(TokenizerFilesError, match="missing.*encoder.json"):
        gpt2_encoding(str(tmp_path))


def test_altered_file(tmp_path):
    for name in ("vocab.bpe", "encoder.json"):
        shutil.copy(_default_data_dir() / name, tmp_path / name)
    with open(tmp_path / "encoder.json", "a") as f:
        f.write(" ")
    with pytest.raises(TokenizerFilesError, match="altered.*SHA-256"):
        gpt2_encoding(str(tmp_path))


def test_writes_no_cache(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    gpt2_encoding.__wrapped__()  # bypass the in-process cache
    assert not cache.exists()
    import os

    assert os.environ["TIKTOKEN_CACHE_DIR"] == str(cache)  # restored
