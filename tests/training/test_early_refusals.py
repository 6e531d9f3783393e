"""Refused in one line before Lightning's import: a checkpoint's content (its pickle, its model's shape
against the config), a corpus that is missing or empty, a `--data.path` the source ignores, an
accelerator the machine lacks, a local folder that is not there."""

from __future__ import annotations

import sys

import pytest
import torch

from tests.helpers import run_command
from tests.reliability.helpers import SHORT, env

PROBE = """
import sys
from loopnet.commands import main
try:
    main(sys.argv[1:])
except SystemExit as e:
    print('exit', e.code, file=sys.stderr)
print('lightning' in sys.modules, file=sys.stderr)
"""


def _refused(tmp_path, *args: str) -> str:
    """`loopnet <args>` fails in one line with Lightning never imported; returns that line."""
    proc = run_command([sys.executable, "-c", PROBE, *args], env=env(), cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert lines[-1] == "False", proc.stderr[-3000:]  # Lightning was not imported
    assert lines[-2] == "exit 2", proc.stderr[-3000:]
    errors = [line for line in lines if line.startswith("loopnet: error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return errors[0]


class Evil:
    def __reduce__(self):
        import os

        return os.system, ("touch pwned.txt",)


def test_a_checkpoint_that_would_run_code_is_refused_before_lightning(tmp_path):
    torch.save({"state_dict": {}, "x": Evil()}, tmp_path / "evil.ckpt")  # torch's zip format, a pickle inside
    line = _refused(tmp_path, "test", *SHORT, "--ckpt_path", "evil.ckpt")
    assert "refused to load evil.ckpt" in line and "fix:" in line
    assert not (tmp_path / "pwned.txt").exists()


def test_a_checkpoint_of_another_shape_is_refused_before_lightning(tmp_path):
    # What `loopnet fit` writes, reduced to what the check reads: the model config (d_model 48, not 32).
    from tests.helpers import tiny_config

    config = {**tiny_config().__dict__, "d_model": 48}
    torch.save({"state_dict": {}, "hyper_parameters": {"config": config}}, tmp_path / "other.ckpt")
    line = _refused(tmp_path, "test", *SHORT, "--ckpt_path", "other.ckpt")
    assert "other.ckpt: the checkpoint was trained with another model config" in line and "d_model" in line


@pytest.mark.parametrize("case", ["missing", "empty", "ignored", "no_folder", "a_folder", "nested", "no_data"])
def test_a_corpus_that_cannot_be_read_is_refused_before_lightning(tmp_path, case):
    (tmp_path / "empty.txt").write_text("")
    for name in ("pq/a.parquet", "pq/b.parquet", "deep/x/a.jsonl", "deep/notes.md", "deep/y/b.jsonl", "other/a.csv"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    args = {
        "missing": ["--data.source", "files", "--data.path", "nope/*.txt"],
        "a_folder": ["--data.source", "files", "--data.path", "pq"],
        "nested": ["--data.source", "files", "--data.path", "[empty.txt,deep]"],
        "no_data": ["--data.source", "files", "--data.path", "other"],
        "empty": ["--data.source", "files", "--data.path", "empty.txt"],
        "ignored": ["--data.path", "/tmp/nope"],  # SHORT's cpu.yaml: the embedded Shakespeare
        "no_folder": ["--data.source", "hub", "--data.path", "owt"],
    }[case]
    line = _refused(tmp_path, "fit", *SHORT, *args)
    assert {
        "missing": "No file matches 'nope/*.txt'",
        "a_folder": "data.path 'pq' is a folder (2 data file(s) in it), and `source: files` reads files. Fix: "
        "give its files with a glob, --data.path 'pq/*.parquet' or read it as a dataset folder with "
        "--data.source hub",
        "nested": "data.path 'deep' is a folder (3 data file(s) in it), and `source: files` reads files. Fix: "
        "give its files with a glob, --data.path 'deep/**/*.jsonl'",
        "no_data": "data.path 'other' is a folder holding no .json, .jsonl, .md, .parquet, .text, .txt file",
        "empty": "The corpus is empty: 1 document(s), none with text (every file of data.path is 0 bytes",
        "ignored": "--data.path /tmp/nope is ignored by the source 'shakespeare'",
        "no_folder": f"--data.path owt is not a local folder (no {tmp_path / 'owt'})",
    }[case] in line
    assert "fix:" in line.lower()
    if case == "ignored":
        assert "--data.source files" in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has a GPU")
def test_an_accelerator_the_machine_lacks_is_one_line_before_lightning(tmp_path):
    line = _refused(tmp_path, "fit", *SHORT, "--trainer.accelerator", "gpu")
    assert "--trainer.accelerator gpu: this machine has no CUDA GPU" in line and "--trainer.accelerator cpu" in line
