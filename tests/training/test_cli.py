"""End to end through the real `loopnet` CLI on the embedded corpus, in this process (`tests.helpers.run_here`:
what the commands do; their processes, entry point and start-up are tested in tests/reliability and
test_startup.py), and the configs' parsing (`--print_config`)."""

import glob
import subprocess
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.helpers import run_here
from tests.reliability.helpers import loopnet as loopnet_here

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
OVERLAYS = (
    "cpu.yaml",
    "study_cpu.yaml",
    "study_map.yaml",
    "fsdp.yaml",
)  # composed on top of a method config, not run alone
CONFIGS = sorted(p.name for p in (ROOT / "configs").glob("*.yaml") if p.name not in OVERLAYS)
TINY = [
    "--config",
    str(ROOT / "configs/deeploop_r6.yaml"),
    "--config",
    str(ROOT / "configs/cpu.yaml"),
    "--model.config.d_model",
    "32",
    "--model.config.n_heads",
    "2",
    "--model.config.seq_len",
    "32",
    "--model.config.n_rounds",
    "3",
    "--data.batch_size",
    "4",
    "--trainer.max_steps",
    "6",
    "--trainer.val_check_interval",
    "3",
    "--trainer.limit_val_batches",
    "2",
    "--trainer.limit_test_batches",
    "2",
    "--trainer.log_every_n_steps",
    "1",
]


def loopnet(*args, cwd):
    proc = run_here(args, cwd=cwd)
    if proc.returncode != 0:
        raise AssertionError(f"loopnet {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("fit")
    loopnet("fit", *TINY, cwd=cwd)
    (run,) = glob.glob(str(cwd / "runs/deeploop_carry_k2_r3_d32_h2_ctx32/version_0"))
    return cwd, Path(run)


def test_fit_writes_checkpoint_events_and_config(fitted):
    cwd, run = fitted
    assert (run / "checkpoints/last.ckpt").is_file()
    assert list((run / "checkpoints").glob("best-step*.ckpt"))
    assert (run / "config.yaml").is_file()
    acc = EventAccumulator(str(run)).Reload()
    tags = acc.Tags()["scalars"]
    assert {"train/loss", "val/loss", "val/ppl"} <= set(tags)
    assert len(acc.Scalars("val/loss")) == 2  # validated at steps 3 and 6


def test_test_reproduces_validation_loss(fitted):
    cwd, run = fitted
    logged = EventAccumulator(str(run)).Reload().Scalars("val/loss")[-1].value
    out = loopnet(
        "test", *TINY, "--ckpt_path", str(run / "checkpoints/last.ckpt"), "--model.eval_rounds", "[1,2,6]", cwd=cwd
    ).stdout
    line = next(l for l in out.splitlines() if "test/loss " in l or "test/loss" in l.split())
    reported = float(line.replace("│", " ").split()[-1])
    assert reported == pytest.approx(logged, rel=1e-5)
    for r in (1, 2, 6):
        assert f"test/loss_r{r}" in out


def test_checkpoint_from_another_config_is_refused(fitted, tmp_path):
    _, run = fitted
    # in this process: the refusal, not the start-up, is tested
    res = loopnet_here(
        "test", *TINY, "--model.config.n_rounds", "4", "--ckpt_path", str(run / "checkpoints/last.ckpt"), cwd=tmp_path
    )
    assert res.code != 0
    assert "another model config (n_rounds: checkpoint 3 vs config 4)" in res.err


def test_checkpoint_is_safe_to_load(fitted):
    _, run = fitted
    ckpt = torch.load(run / "checkpoints/last.ckpt", weights_only=True)
    assert ckpt["hyper_parameters"]["config"]["n_rounds"] == 3


def printed_config(*args, cwd) -> str:
    """`loopnet fit <args> --print_config` in this process: the config as LightningCLI reads it."""
    res = loopnet_here("fit", *args, "--print_config", cwd=cwd)
    assert res.code == 0, res.err[-5000:]
    return res.out


@pytest.mark.parametrize("name", CONFIGS)
def test_every_config_parses(name, tmp_path):
    out = printed_config("--config", str(ROOT / "configs" / name), cwd=tmp_path)
    assert "residual:" in out and "d_model: 768" in out


def test_cpu_overlay_composes(tmp_path):
    out = printed_config(
        "--config", str(ROOT / "configs/flt_r6.yaml"), "--config", str(ROOT / "configs/cpu.yaml"), cwd=tmp_path
    )
    assert "wiring: flt" in out and "d_model: 128" in out and "accelerator: cpu" in out
    out = printed_config(
        "--config",
        str(ROOT / "configs/flt_r6.yaml"),
        "--config",
        str(ROOT / "configs/cpu.yaml"),
        "--config",
        str(ROOT / "configs/study_cpu.yaml"),
        cwd=tmp_path,
    )
    assert "wiring: flt" in out and "d_model: 64" in out and "vocab: compact" in out and "vocab_size: 19136" in out


@pytest.mark.parametrize(
    "args,message",
    [
        (["--model.config.residual", "deepnet"], "residual"),
        (["--model.config.wiring", "loop"], "wiring"),
        (["--model.config.n_rounds", "0"], "n_rounds must be >= 1"),
        (["--model.config.d_model", "33"], "not divisible by n_heads"),
        (["--model.config.not_a_key", "1"], "not_a_key"),
    ],
)
def test_bad_input_fails_before_training(args, message, tmp_path):
    res = loopnet_here("fit", *TINY, *args, cwd=tmp_path)  # in this process: the refusal, not the start-up, is tested
    proc = subprocess.CompletedProcess(["loopnet", "fit"], res.code, res.out, res.err)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").rglob("*.ckpt"))


def test_predict_continues_a_prompt(fitted):
    cwd, run = fitted
    out = loopnet(
        "predict",
        *TINY,
        "--ckpt_path",
        str(run / "checkpoints/last.ckpt"),
        "--model.generate.prompt",
        "ROMEO:",
        "--model.generate.max_new_tokens",
        "5",
        "--model.generate.temperature",
        "0",
        cwd=cwd,
    ).stdout
    text = out[out.index("ROMEO:") :].splitlines()[0]
    assert len(text) > len("ROMEO:")  # the prompt and its continuation
