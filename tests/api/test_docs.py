"""docs/python.md's examples run: every ```python block of the page, in order and in one namespace, from a
folder holding the run folder its examples load (a tiny model trained in the test session)."""

from __future__ import annotations

import re

from tests.api.conftest import RUN
from tests.reliability.helpers import ROOT

PAGE = ROOT / "docs" / "python.md"


def blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", PAGE.read_text(encoding="utf-8"), flags=re.S | re.M)


def test_the_page_loads_the_run_folder_the_test_trains():
    assert len(blocks()) >= 4
    assert f'loopnet.load("{RUN}")' in blocks()[0]


def test_the_python_page_runs(run_root, monkeypatch, capsys):
    monkeypatch.chdir(run_root)
    namespace: dict = {}
    for i, block in enumerate(blocks()):
        exec(compile(block, f"{PAGE.name}, block {i + 1}", "exec"), namespace)
    out = capsys.readouterr().out
    assert "loopnet.Model(deeploop carry, K=2, R=3, d=32, vocab gpt2, cpu float32)" in out
    assert "r06_k2_ffn" in out  # the visit table printed
    assert namespace["profile"].column("sigma_max")[1] is not None
