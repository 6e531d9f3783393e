"""`loopnet eval` / `python -m loopnet.eval`: the task × R' table, offline errors, presets."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("lm_eval", reason="the eval extra (lm-eval) is not installed")

from loopnet.eval.cli import main
from loopnet.eval.results import write_report
from loopnet.eval.tasks import DEEPLOOP_TASKS, TaskSetupError, check_datasets, expand_tasks
from tests.eval.helpers import DATA_DIR, TASK
from tests.helpers import run_command


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of main(argv)."""
    try:
        main(list(argv))
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def test_table_for_each_round_count(tiny_ckpt, reference_scores, in_data_dir, tmp_path, capsys):
    code, out, err = run_cli(
        capsys,
        "--ckpt_path",
        tiny_ckpt,
        "--tasks",
        TASK,
        "--rounds",
        "1,2",
        "--batch_size",
        "16",
        "--include_path",
        str(DATA_DIR),
        "--output_dir",
        str(tmp_path),
    )
    assert code == 0, err
    stem = "eval_" + Path(tiny_ckpt).stem
    report = json.loads((tmp_path / f"{stem}.json").read_text())
    markdown = (tmp_path / f"{stem}.md").read_text()

    assert report["rounds"] == [1, 2] and report["train_rounds"] == 2 and report["tasks"] == [TASK]
    for rounds in (1, 2):
        cells = report["table"][TASK]
        assert cells["acc"][str(rounds)]["value"] == pytest.approx(reference_scores(rounds)["acc"])
        assert cells["acc_norm"][str(rounds)]["value"] == pytest.approx(reference_scores(rounds)["acc_norm"])
        assert cells["acc"][str(rounds)]["stderr"] is not None
        assert report["harness"][str(rounds)]["results"][TASK]["acc,none"] == cells["acc"][str(rounds)]["value"]
    assert "| task | metric | R'=1 | R'=2 (train) |" in markdown
    assert f"| {TASK} | acc | " in markdown and f"| {TASK} | acc_norm | " in markdown
    assert markdown in out  # the table is also printed


def test_results_files_are_never_overwritten(tmp_path):
    report = {
        "checkpoint": "x.ckpt",
        "rounds": [1],
        "train_rounds": 1,
        "lm_eval_version": "0",
        "num_fewshot": None,
        "limit": None,
        "table": {"t": {"acc": {"1": {"value": 0.5, "stderr": 0.1}}}},
    }
    first = write_report(report, tmp_path, "eval_x")
    before = first[0].read_bytes()
    second = write_report({**report, "rounds": [1]}, tmp_path, "eval_x")
    assert [p.name for p in first] == ["eval_x.json", "eval_x.md"]
    assert [p.name for p in second] == ["eval_x-2.json", "eval_x-2.md"]
    assert first[0].read_bytes() == before
    (tmp_path / "eval_y.md").write_text("kept")  # one of the pair taken is enough to move on
    assert [p.name for p in write_report(report, tmp_path, "eval_y")] == ["eval_y-2.json", "eval_y-2.md"]
    assert (tmp_path / "eval_y.md").read_text() == "kept"


def test_missing_checkpoint_fails_before_loading_the_harness(tmp_path):
    """One line on stderr, status 2, and lm_eval never imported (checked in a fresh interpreter)."""
    code = (
        "import sys\n"
        "from loopnet.eval.cli import main\n"
        "try:\n"
        f"    main(['--ckpt_path', {str(tmp_path / 'nope.ckpt')!r}, '--tasks', 'arc_easy'])\n"
        "except SystemExit as e:\n"
        "    print('lm_eval' in sys.modules, e.code)\n"
    )
    proc = run_command([sys.executable, "-c", code])
    assert proc.stdout.split() == ["False", "2"]
    [line] = proc.stderr.strip().splitlines()
    assert "checkpoint not found" in line and "nope.ckpt" in line


def test_standard_task_without_hub_fails_fast_with_instructions(tiny_ckpt, tmp_path, capsys):
    """tests/conftest.py sets HF_HUB_OFFLINE=1: arc_easy's hub dataset cannot be fetched."""
    code, _, err = run_cli(capsys, "--ckpt_path", tiny_ckpt, "--tasks", "arc_easy", "--output_dir", str(tmp_path))
    assert code == 2
    [line] = err.strip().splitlines()
    assert "task 'arc_easy'" in line and "allenai/ai2_arc" in line
    assert "dataset_path: json" in line and "data_files" in line and "--include_path" in line
    assert "include: " in line and "arc_easy.yaml" in line and "training_split: null" in line
    assert not list(tmp_path.iterdir())  # nothing written


def test_standard_task_name_on_local_files(tiny_ckpt, tmp_path, capsys):
    """Following the error's advice: arc_easy, redefined on local JSON lines, runs without the hub."""
    import lm_eval

    builtin = Path(lm_eval.__file__).parent / "tasks" / "arc" / "arc_easy.yaml"
    items = [
        ("Which is a liquid?", ["rock", "water", "wood"], "B"),
        ("What do plants need to grow?", ["sunlight", "plastic", "metal"], "A"),
    ]
    data = tmp_path / "arc_easy.jsonl"
    data.write_text(
        "".join(
            json.dumps({"id": str(i), "question": q, "choices": {"text": c, "label": ["A", "B", "C"]}, "answerKey": k})
            + "\n"
            for i, (q, c, k) in enumerate(items)
        )
    )
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "arc_easy_local.yaml").write_text(
        f"include: {builtin}\ntask: arc_easy\ndataset_path: json\ndataset_name: null\n"
        "training_split: null\nvalidation_split: null\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
    )
    code, _, err = run_cli(
        capsys,
        "--ckpt_path",
        tiny_ckpt,
        "--tasks",
        "arc_easy",
        "--rounds",
        "1",
        "--include_path",
        str(tasks),
        "--output_dir",
        str(tmp_path),
    )
    assert code == 0, err
    report = json.loads((tmp_path / f"eval_{Path(tiny_ckpt).stem}.json").read_text())
    assert report["harness"]["1"]["n-samples"]["arc_easy"]["effective"] == 2
    assert set(report["table"]["arc_easy"]) == {"acc", "acc_norm"}


def test_local_task_with_missing_data_file(tmp_path):
    from lm_eval.tasks import TaskManager

    (tmp_path / "broken.yaml").write_text(
        (DATA_DIR / "tiny_mc.yaml")
        .read_text()
        .replace(f"task: {TASK}", "task: broken_task")
        .replace("test: tiny_mc.jsonl", "test: /nonexistent/x.jsonl")
    )
    manager = TaskManager(include_path=str(tmp_path), include_defaults=False)
    with pytest.raises(TaskSetupError, match="broken_task.*/nonexistent/x.jsonl.*not found"):
        check_datasets(manager, ["broken_task"])
    with pytest.raises(TaskSetupError, match="unknown task 'no_such_task'"):
        check_datasets(manager, ["no_such_task"])


def test_deeploop_preset():
    assert expand_tasks("deeploop") == list(DEEPLOOP_TASKS)
    assert len(DEEPLOOP_TASKS) == 8 and "social_iqa" in DEEPLOOP_TASKS
    assert expand_tasks("arc_easy, deeploop,my_task") == [
        "arc_easy",
        *[t for t in DEEPLOOP_TASKS if t != "arc_easy"],
        "my_task",
    ]
    with pytest.raises(TaskSetupError):
        expand_tasks(" , ")


@pytest.mark.parametrize("bad", [["--rounds", "0"], ["--rounds", "a,b"], ["--limit", "-1"]])
def test_bad_arguments_exit_2(capsys, bad):
    code, _, err = run_cli(capsys, "--ckpt_path", "x.ckpt", "--tasks", TASK, *bad)
    assert code == 2 and bad[0] in err


class _Payload:
    """Unpickling this runs a shell command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize(
    "kind, problem",
    [
        ("zero_byte", "is empty (0 bytes), not a checkpoint"),  # not torch's "cannot mmap an empty file"
        ("truncated", "is not a readable checkpoint, it is corrupt or truncated"),
        ("malicious", "unpickling it would import or run code (posix.system"),
    ],
)
def test_bad_checkpoint_is_one_line_before_evaluating(kind, problem, tiny_ckpt, tmp_path, capsys, monkeypatch):
    """These gave raw tracebacks (with torch's hint to use weights_only=False)."""
    import lm_eval
    import torch

    monkeypatch.setattr(lm_eval, "simple_evaluate", lambda **kw: pytest.fail("evaluated a bad checkpoint"))
    path, marker = tmp_path / f"{kind}.ckpt", tmp_path / "pwned"
    if kind == "zero_byte":
        path.write_bytes(b"")
    elif kind == "truncated":
        path.write_bytes(Path(tiny_ckpt).read_bytes()[:5000])
    else:
        torch.save({"state_dict": {}, "hyper_parameters": {"config": _Payload(marker)}}, path)
    code, _, err = run_cli(capsys, "--ckpt_path", str(path), "--tasks", TASK, "--include_path", str(DATA_DIR))
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err and "weights_only=False" not in err, err
    assert lines[0].startswith("loopnet eval: error: ") and problem in lines[0] and "fix: " in lines[0], err
    assert not marker.exists()


def test_unwritable_output_folder_fails_before_evaluating(tiny_ckpt, tmp_path, capsys, monkeypatch):
    import lm_eval

    monkeypatch.setattr(lm_eval, "simple_evaluate", lambda **kw: pytest.fail("evaluated before checking --output_dir"))
    (tmp_path / "a_file").write_text("not a folder\n")
    code, _, err = run_cli(
        capsys,
        "--ckpt_path",
        tiny_ckpt,
        "--tasks",
        TASK,
        "--include_path",
        str(DATA_DIR),
        "--output_dir",
        str(tmp_path / "a_file" / "out"),
    )
    assert code == 2, err
    assert f"cannot write to the folder {tmp_path / 'a_file' / 'out'} given by --output_dir (Not a directory)" in err
    assert "fix: pass a writable folder with --output_dir" in err
