"""The README's reference tables stay complete: every key the sweep reader accepts is documented in
its sweep section (issue 23: they were not), and the eval example names folders that exist."""

import re
from pathlib import Path

from loopnet.study.grid import SWEEP_KEYS

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def section(title: str) -> str:
    return README.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_every_sweep_key_is_documented():
    rows = set(re.findall(r"^\| `(\w+)` \|", section("Stability studies: sweep and report"), flags=re.M))
    assert rows == SWEEP_KEYS


def test_the_eval_examples_folders_exist():
    root = Path(__file__).resolve().parents[2]
    for folder in re.findall(r"cd (\S+) && loopnet eval", section("Downstream evaluation")):
        assert (root / folder).is_dir(), folder
    assert "--include_path tasks/" not in README
