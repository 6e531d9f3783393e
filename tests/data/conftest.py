import json
import os

# Offline before `datasets` is imported (it reads these at import time).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest  # noqa: E402


def make_docs(n: int, words: int = 40, tag: str = "doc") -> list[str]:
    """n distinct documents of about `words` words each."""
    return [" ".join(f"{tag}{i} word{j}" for j in range(words)) for i in range(n)]


@pytest.fixture
def txt_corpus(tmp_path):
    """12 text files, one document each, plus the list of their texts."""
    texts = make_docs(12)
    d = tmp_path / "txt"
    d.mkdir()
    for i, t in enumerate(texts):
        (d / f"f{i:02d}.txt").write_text(t, encoding="utf-8")
    return str(d / "*.txt"), texts


@pytest.fixture
def jsonl_corpus(tmp_path):
    """4 jsonl files of 10 documents each (column `body`), plus the texts."""
    texts = make_docs(40, tag="j")
    d = tmp_path / "jsonl"
    d.mkdir()
    for k in range(4):
        with open(d / f"part{k}.jsonl", "w", encoding="utf-8") as f:
            for t in texts[k * 10 : (k + 1) * 10]:
                f.write(json.dumps({"body": t, "id": 1}) + "\n")
    return str(d / "*.jsonl"), texts
