"""Refused in one line before Lightning's import: a checkpoint's content (its pickle, its model's shape
against the config), a corpus that is missing or empty, a `--data.path` the source ignores, an
accelerator the machine lacks, a local folder that is not there."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import run_command
from tests.reliability.helpers import SHORT, env

# Every case's `loopnet <args>` runs in one process (a process's start-up costs more than a case), in the
# case's folder, its stderr captured at the descriptor. What each leaves is whether
# Lightning was imported by then: once imported it stays, so a case that imports it fails its own check (and
# those after it); none passes for another's sake.
PROBE = """
import json, os, sys, traceback
from loopnet.commands import main
results = {}
for name, cwd, args in json.loads(sys.argv[1]):
    os.chdir(cwd)
    sys.stderr.flush()
    saved, log = os.dup(2), os.open("stderr.txt", os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    os.dup2(log, 2)
    code = None
    try:
        main(args)
    except SystemExit as e:
        code = e.code
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved), os.close(log)
    err = open(os.path.join(cwd, "stderr.txt")).read()
    results[name] = {"err": err, "code": code, "lightning": "lightning" in sys.modules}
print(json.dumps(results))
"""


class Evil:
    def __reduce__(self):
        import os

        return os.system, ("touch pwned.txt",)


CORPORA = {
    "missing": ["--data.source", "files", "--data.path", "nope/*.txt"],
    "a_folder": ["--data.source", "files", "--data.path", "pq"],
    "nested": ["--data.source", "files", "--data.path", "[empty.txt,deep]"],
    "no_data": ["--data.source", "files", "--data.path", "other"],
    "empty": ["--data.source", "files", "--data.path", "empty.txt"],
    "ignored": ["--data.path", "/tmp/nope"],  # SHORT's cpu.yaml: the embedded Shakespeare
    "no_folder": ["--data.source", "hub", "--data.path", "owt"],
}


def _cases(root) -> list[tuple[str, str, list[str]]]:
    """(name, folder, args) of every case, each folder made ready."""
    cases = []

    def folder(name):
        (root / name).mkdir()
        cases.append((name, str(root / name)))
        return root / name

    # a checkpoint in torch's zip format, a pickle inside that would run code
    torch.save({"state_dict": {}, "x": Evil()}, folder("evil") / "evil.ckpt")
    # what `loopnet fit` writes, reduced to what the check reads: the model config (d_model 48, not 32)
    from tests.helpers import tiny_config

    config = {**tiny_config().__dict__, "d_model": 48}
    torch.save({"state_dict": {}, "hyper_parameters": {"config": config}}, folder("other_shape") / "other.ckpt")
    for case in CORPORA:
        cwd = folder(case)
        (cwd / "empty.txt").write_text("")
        for name in (
            "pq/a.parquet",
            "pq/b.parquet",
            "deep/x/a.jsonl",
            "deep/notes.md",
            "deep/y/b.jsonl",
            "other/a.csv",
        ):
            (cwd / name).parent.mkdir(parents=True, exist_ok=True)
            (cwd / name).write_text("")
    if not torch.cuda.is_available():
        folder("accelerator")
    args = {
        "evil": ["test", *SHORT, "--ckpt_path", "evil.ckpt"],
        "other_shape": ["test", *SHORT, "--ckpt_path", "other.ckpt"],
        **{case: ["fit", *SHORT, *extra] for case, extra in CORPORA.items()},
        "accelerator": ["fit", *SHORT, "--trainer.accelerator", "gpu"],
    }
    return [(name, cwd, args[name]) for name, cwd in cases]


@pytest.fixture(scope="module")
def refused(tmp_path_factory) -> dict:
    """Each case's `loopnet <args>` (one process for all): name -> its stderr, exit code, whether Lightning
    was imported by its end, and its folder."""
    cases = _cases(tmp_path_factory.mktemp("refusals"))
    proc = run_command([sys.executable, "-c", PROBE, json.dumps(cases)], env=env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    return {name: {**results[name], "cwd": Path(cwd)} for name, cwd, _ in cases}


def _refused(refused, name: str) -> str:
    """The case's `loopnet <args>` failed in one line with Lightning never imported; returns that line."""
    res = refused[name]
    assert not res["lightning"], res["err"][-3000:]  # Lightning was not imported
    assert res["code"] == 2, res["err"][-3000:]
    errors = [line for line in res["err"].splitlines() if line.startswith("loopnet: error:")]
    assert len(errors) == 1 and "Traceback" not in res["err"], res["err"][-3000:]
    return errors[0]


def test_a_checkpoint_that_would_run_code_is_refused_before_lightning(refused):
    line = _refused(refused, "evil")
    assert "refused to load evil.ckpt" in line and "fix:" in line
    assert not (refused["evil"]["cwd"] / "pwned.txt").exists()


def test_a_checkpoint_of_another_shape_is_refused_before_lightning(refused):
    line = _refused(refused, "other_shape")
    assert "other.ckpt: the checkpoint was trained with another model config" in line and "d_model" in line


@pytest.mark.parametrize("case", list(CORPORA))
def test_a_corpus_that_cannot_be_read_is_refused_before_lightning(refused, case):
    line = _refused(refused, case)
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
        "no_folder": f"--data.path owt is not a local folder (no {refused[case]['cwd'] / 'owt'})",
    }[case] in line
    assert "fix:" in line.lower()
    if case == "ignored":
        assert "--data.source files" in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has a GPU")
def test_an_accelerator_the_machine_lacks_is_one_line_before_lightning(refused):
    line = _refused(refused, "accelerator")
    assert "--trainer.accelerator gpu: this machine has no CUDA GPU" in line and "--trainer.accelerator cpu" in line
