"""A Trainer command's input is checked before Lightning's import wherever that needs no Lightning
(loopnet.training.precheck): each bad input below gets one line with the fix, exit status 2, in a fresh
interpreter that never imported Lightning, and no folder is written."""

import sys

import pytest

from loopnet.training.precheck import normalize_argv, precheck
from tests.helpers import run_command

from .helpers import ROOT, SHORT, env, loopnet

# `loopnet <argv>` through the console script's entry point; prints whether Lightning was imported.
LIGHT = """
import sys
from loopnet.commands import main
try:
    main(sys.argv[1:])
except SystemExit as e:
    print('lightning' in sys.modules, e.code)
"""

BAD = {  # id: (arguments after `fit` SHORT, problem, fix)
    "unknown key": (
        ["--model.config.n_raunds", "3"],
        "unrecognized arguments: --model.config.n_raunds 3",
        "did you mean 'model.config.n_rounds'?",
    ),
    "unknown key in a file": (
        ["--config", "typo.yaml"],
        "Group 'model' does not accept option 'optim.warmup_step'",
        "did you mean 'model.optim.warmup_steps'?",
    ),
    "wrong type": (
        ["--model.config.n_rounds", "many"],
        "\"model.config.n_rounds\": Expected a <class 'int'>. Got value: many",
        "of the expected type",
    ),
    "max_steps -5": (
        ["--trainer.max_steps", "-5"],
        "--trainer.max_steps -5 is not a step count",
        "fix: give max_steps ≥ 1",
    ),
    "lr -1e-3": (["--model.optim.lr", "-1e-3"], "model.optim.lr=-0.001 must be >= 0", "fix: give a positive"),
    "lr=-1e-3": (["--model.optim.lr=-1e-3"], "model.optim.lr=-0.001 must be >= 0", "fix: give a positive"),
    "warmup -5": (
        ["--model.optim.warmup_steps", "-5"],
        "model.optim.warmup_steps=-5 must be >= 0",
        "fix: give the number of linear warm-up steps",
    ),
    "n_rounds 0": (
        ["--model.config.n_rounds", "0"],
        "LoopConfig.n_rounds must be >= 1, got 0",
        "fix: set model.config.n_rounds to a positive integer",
    ),
    "seq_len 0": (
        ["--model.config.seq_len", "0"],
        "LoopConfig.seq_len must be >= 1, got 0",
        "fix: set model.config.seq_len to a positive integer",
    ),
    "no checkpointing": (
        ["--trainer.enable_checkpointing", "false"],
        "--trainer.enable_checkpointing false: loopnet fit always keeps last.ckpt",
        "fix: drop the option",
    ),
    "batch_size 0": (
        ["--data.batch_size", "0"],
        "--data.batch_size 0 gives no sequence to a step",
        "fix: give data.batch_size ≥ 1",
    ),
    "checkpoint folder": (
        ["--ckpt_path", "runs"],
        "--ckpt_path runs is a folder, not a checkpoint file",
        "fix: give a .ckpt file in it",
    ),
    "empty checkpoint": (
        ["--ckpt_path", "empty.ckpt"],
        "empty.ckpt is empty (0 bytes), not a checkpoint",
        "fix: pass another one with --ckpt_path",
    ),
    "missing config": (["--config", "nope.yaml"], "File does not exist", "fix: check the path given with --config"),
    "bad value in an included config": (
        ["--config", "outer.yaml"],
        "LoopConfig.n_rounds must be >= 1, got 0",
        "fix: set model.config.n_rounds to a positive integer",
    ),
}


@pytest.fixture
def inputs(tmp_path):
    (tmp_path / "typo.yaml").write_text("model:\n  optim:\n    warmup_step: 5\n")
    (tmp_path / "bad_base.yaml").write_text("model:\n  config:\n    n_rounds: 0\n")
    (tmp_path / "outer.yaml").write_text("config: bad_base.yaml\ntrainer:\n  max_steps: 3\n")
    (tmp_path / "empty.ckpt").write_bytes(b"")
    (tmp_path / "runs").mkdir()
    return tmp_path


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_fails_before_lightning_is_imported(inputs, case):
    args, problem, fix = BAD[case]
    proc = run_command([sys.executable, "-c", LIGHT, "fit", *SHORT, *args], env=env(), cwd=inputs)
    assert proc.stdout.split() == ["False", "2"], (proc.stdout, proc.stderr[-3000:])
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("loopnet: error: ") and problem in line and fix in line, line
    assert sorted(p.name for p in inputs.iterdir()) == [
        "bad_base.yaml",
        "empty.ckpt",
        "outer.yaml",
        "runs",
        "typo.yaml",
    ]  # nothing written
    assert not any((inputs / "runs").iterdir())


@pytest.mark.parametrize("case", ["lr -1e-3", "max_steps -5", "empty checkpoint"])
def test_in_process_cli_gives_the_same_line(inputs, case):
    """`python -m loopnet.training.cli` and the sweep's in-process checks go through the same checks."""
    args, problem, fix = BAD[case]
    res = loopnet("fit", *SHORT, *args, cwd=inputs)
    assert res.code == 2 and problem in res.last_err_line and fix in res.last_err_line, res.err[-3000:]
    assert "mmap" not in res.err and not any((inputs / "runs").iterdir())


def test_negative_numbers_are_values_not_options():
    assert normalize_argv(["--model.optim.lr", "-1e-3", "--trainer.max_steps", "-5", "--a", "-.5", "-c", "x.yaml"]) == [
        "--model.optim.lr=-1e-3",
        "--trainer.max_steps=-5",
        "--a=-.5",
        "-c",
        "x.yaml",
    ]
    assert normalize_argv(["--x=-1", "-c", "-1"]) == ["--x=-1", "-c", "-1"]  # only a `--key` takes one


@pytest.mark.parametrize("config", sorted(p.name for p in (ROOT / "configs").glob("*.yaml")))
def test_every_shipped_config_passes_the_early_checks(config):
    """Nothing the full parser accepts is refused early: each config on a method config (an overlay such as
    fsdp.yaml holds no data settings of its own), and with the CPU overlays."""
    configs = ROOT / "configs"
    precheck(["fit", "--config", str(configs / "deeploop_r6.yaml"), "--config", str(configs / config)])
    precheck(
        [
            "fit",
            "--config",
            str(configs / "deeploop_r6.yaml"),
            "--config",
            str(configs / "cpu.yaml"),
            "--config",
            str(configs / config),
            "--model.generate.prompt",
            "ROMEO:",
            "--model.optim.betas",
            "[0.9, 0.99]",
            "--model.config.init",
            "null",
            "--model.optim.lr",
            "1e-3",
        ]
    )


def test_eval_on_a_folder_says_it_is_a_folder(tmp_path):
    """`loopnet eval --ckpt_path <run folder>` said "checkpoint not found"."""
    ckpts = tmp_path / "version_0" / "checkpoints"
    ckpts.mkdir(parents=True)
    (ckpts / "last.ckpt").write_bytes(b"x")
    code = "from loopnet.commands import main\nimport sys\nmain(sys.argv[1:])"
    proc = run_command(
        [sys.executable, "-c", code, "eval", "--ckpt_path", str(tmp_path), "--tasks", "arc_easy"], env=env()
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    [line] = proc.stderr.strip().splitlines()
    assert f"--ckpt_path {tmp_path} is a folder" in line and f"e.g. {ckpts / 'last.ckpt'}" in line, line
