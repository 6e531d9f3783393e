"""Huginn import: loopnet's forward of the fixture equals the reference code's logits (tests/fixtures/huginn,
written by scripts/fixtures/huginn.py from the reference itself), and a folder that does not match its
config is refused in one line."""

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import loopnet
from loopnet.formats import folder as out_folder
from loopnet.formats.huginn import read_huginn
from loopnet.formats.source import ImportFormatError, read_weights, resolve
from tests.formats.helpers import model_of
from tests.helpers import run_here

FIXTURE = Path(__file__).parents[1] / "fixtures" / "huginn"
GOLDEN = load_file(FIXTURE / "golden.safetensors")
STEPS = (1, 2, 4, 8)
SEED = 1234


def tolerance(cfg, rounds: int, reference: torch.Tensor) -> float:
    """Tolerance on |loopnet − reference| for two fp32 computations of one function in different orders.
    Each of the 2·N sublayer visits (N = P + K·R + C) and the head sums dot products of length at most
    n = max(d, d_ff), whose worst-case rounding is n·2⁻²⁴ relative (unit roundoff); the Norm after every
    sublayer (Post-LN) rescales the stream, so the visits' errors add rather than compound; both sides
    round: 2·(2N + 1)·n·2⁻²⁴·max|logit|. Measured differences are ~1e-6, some 500× below it; a wrong
    weight, pairing or norm placement moves the logits by O(1)."""
    visits = 2 * cfg.depth(rounds) + 1
    return 2 * visits * max(cfg.d_model, cfg.d_ff) * 2.0**-24 * reference.abs().max().item()


@pytest.fixture(scope="module")
def imported():
    return read_huginn(FIXTURE)


def test_config_reads_huginns_architecture(imported):
    cfg, _, meta = imported
    hf = json.loads((FIXTURE / "config.json").read_text())
    assert (cfg.n_prelude, cfg.n_blocks, cfg.n_coda) == (2, 2, 1)
    assert (cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.vocab_size) == (hf["n_embd"], hf["n_heads"], 48, 272)
    assert (cfg.residual, cfg.sandwich, cfg.mlp, cfg.injection, cfg.state_init) == (
        "postln",
        True,
        "swiglu",
        "linear",
        "random",
    )
    assert cfg.rope_base == 50_000 and cfg.qk_bias and cfg.embed_scale and cfg.loop_norm
    assert meta["tokenizer"] == "tokenizer.json" and meta["dtype"] == "float32"


@pytest.mark.parametrize("steps", STEPS)
def test_logits_equal_the_reference_at_each_step_count(imported, steps):
    cfg, state, _ = imported
    model = model_of(cfg, state, state_init="zero")  # the fixture's input_states are zeros
    with torch.no_grad():
        logits, _ = model(GOLDEN["input_ids"], rounds=steps)
    reference = GOLDEN[f"logits_steps_{steps}"]
    error = (logits - reference).abs().max().item()
    assert error <= tolerance(cfg, steps, reference), f"R={steps}: max |Δlogit| {error:.3g}"


def test_random_initial_state_is_huginns_draw(imported):
    """Under the same seed loopnet draws Huginn's initial state and so its logits."""
    cfg, state, _ = imported
    model = model_of(cfg, state)
    ids = GOLDEN["input_ids"]
    with torch.no_grad():
        x0 = model.embed(ids)
        torch.manual_seed(SEED)
        drawn = model._initial_state(x0)
        torch.manual_seed(SEED)
        logits, _ = model(ids, rounds=4)
    assert torch.equal(drawn, GOLDEN[f"state_seed{SEED}"])
    reference = GOLDEN[f"logits_random_seed{SEED}"]
    assert (logits - reference).abs().max().item() <= tolerance(cfg, 4, reference)


def test_single_file_and_bf16_layouts_read_alike(imported, tmp_path):
    """The hub's other layout (one model.safetensors, no index) and its dtype (bf16) read to the same weights."""
    cfg, state, _ = imported
    shutil.copy(FIXTURE / "config.json", tmp_path / "config.json")
    tensors = read_weights(FIXTURE)
    save_file({k: v.to(torch.bfloat16) for k, v in tensors.items()}, tmp_path / "model.safetensors")
    cfg16, state16, meta = read_huginn(tmp_path)
    assert cfg16 == cfg and meta["dtype"] == "bfloat16"
    assert set(state16) == set(state)
    assert all(torch.equal(state16[k], state[k].to(torch.bfloat16)) for k in state)


def write_variant(tmp_path: Path, change) -> Path:
    shutil.copy(FIXTURE / "config.json", tmp_path / "config.json")
    tensors = dict(read_weights(FIXTURE))
    change(tensors)
    save_file(tensors, tmp_path / "model.safetensors")
    return tmp_path


@pytest.mark.parametrize(
    "change, named",
    [
        (
            lambda t: t.pop("transformer.core_block.1.norm_3.weight"),
            "missing tensors for blocks.1.ffn.inner_norm.weight",
        ),
        (
            lambda t: t.update({"transformer.extra.weight": torch.zeros(2)}),
            "unexpected tensors transformer.extra.weight",
        ),
        (lambda t: t.update({"lm_head.weight": torch.zeros(272, 32)}), "lm_head.weight differs"),
        (lambda t: t.update({"freqs_cis": t["freqs_cis"].flip(3)}), "freqs_cis is not the rotary table"),
        (lambda t: t.update({"transformer.adapter.weight": torch.zeros(32, 32)}), "tensor shapes differ"),
    ],
)
def test_a_folder_that_does_not_match_is_refused(tmp_path, change, named):
    with pytest.raises(ImportFormatError, match=named):
        read_huginn(write_variant(tmp_path, change))


def test_hf_source_offline_fails_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # an empty cache: nothing to serve offline
    with pytest.raises(ImportFormatError, match="HF_HUB_OFFLINE is set; fix: ") as err:
        resolve("hf://tomg-group-umd/huginn-0125@main")
    assert "\n" not in str(err.value)


def run_loopnet(*args, cwd=None):
    return run_here(args, cwd=cwd)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """`loopnet import` of the fixture, once for the tests that read the folder: the command's result and the
    folder."""
    out = tmp_path_factory.mktemp("import") / "huginn"
    return run_loopnet("import", str(FIXTURE), str(out)), out


def test_import_command_writes_a_loopnet_folder_that_computes_the_reference(folder):
    proc, out = folder
    assert proc.returncode == 0, proc.stderr
    assert (out / "tokenizer.json").is_file() and (out / "model.safetensors").is_file()
    _, _, source = out_folder.read_folder(out)
    assert source["format"] == "huginn_raven" and source["src"] == str(FIXTURE)
    model = out_folder.load_model(out)  # Huginn's own random initial state: the seeded reference pass
    assert model.lm_head.weight is model.wte.weight
    torch.manual_seed(SEED)
    with torch.no_grad():
        logits, _ = model(GOLDEN["input_ids"], rounds=4)
    reference = GOLDEN[f"logits_random_seed{SEED}"]
    assert (logits - reference).abs().max().item() <= tolerance(model.config, 4, reference)
    opened = loopnet.load(out)  # the Python API: the same weights and the model's own tokenizer
    assert torch.equal(opened.network.wte.weight, model.wte.weight) and opened.tokenizer.name == "tokenizer"
    assert opened.tokenizer.decode(opened.tokenizer.encode("Hello there")) == "Hello there"
    again = run_loopnet("import", str(FIXTURE), str(out))  # nothing written is replaced
    assert again.returncode == 2 and "already exists" in again.stderr and len(again.stderr.strip().splitlines()) == 1


def metrics(stdout: str) -> dict[str, float]:
    """The `name │ value` rows of Lightning's test table."""
    rows = (line.replace("│", " ").split() for line in stdout.splitlines() if "│" in line)
    return {row[0]: float(row[1]) for row in rows if len(row) == 2 and row[0].startswith("test")}


def test_an_imported_huginn_fine_tunes_tests_and_predicts_with_its_own_tokenizer(tmp_path, folder):
    """`loopnet import`; `loopnet test` of the folder itself at other R' with the fixed-point profile and the exit
    frontier; `loopnet fit` from the folder's model.yaml with its tokenizer.json as the data's ids; `loopnet
    predict` from the fit's checkpoint."""
    proc, out = folder
    assert proc.returncode == 0, proc.stderr
    root = Path(__file__).resolve().parents[2] / "configs"
    common = [
        "--config",
        str(root / "base.yaml"),
        "--config",
        str(root / "cpu.yaml"),
        "--config",
        str(out / "model.yaml"),
        "--data.vocab",
        "tokenizer",
        "--data.tokenizer",
        str(out),
        "--data.batch_size",
        "2",
        "--model.eval_rounds",
        "null",
        "--model.config.max_rounds",
        "8",
    ]
    fit = run_loopnet(
        "fit",
        *common,
        "--trainer.max_steps",
        "2",
        "--trainer.val_check_interval",
        "2",
        "--trainer.limit_val_batches",
        "1",
        "--model.optim.lr",
        "1e-3",
        "--model.optim.warmup_steps",
        "1",
        cwd=tmp_path,
    )
    assert fit.returncode == 0, fit.stderr[-3000:]
    (ckpt,) = tmp_path.glob("runs/*/version_0/checkpoints/last.ckpt")
    saved = torch.load(ckpt, weights_only=True)
    assert saved["datamodule_hyper_parameters"]["tokenizer"] == str(out)
    assert loopnet.load(ckpt).tokenizer.name == "tokenizer"  # the fine-tune opens with the tokenizer it trained on
    _, start, _ = out_folder.read_folder(out)
    # Two AdamW steps at lr <= 1e-3 move a weight by at most ~2·lr (|m̂/√v̂| <= 1 in the first steps), plus the
    # decay.
    moved = max((saved["state_dict"][f"model.{k}"] - v).abs().max().item() for k, v in start.items())
    assert 0 < moved <= 2 * 1e-3 * 1.5

    # The imported weights themselves (model.init_weights, no checkpoint). From the zero state (a run setting)
    # every pass is deterministic, so the profile's loss at R = 4 is the test loss.
    test = run_loopnet(
        "test",
        *common,
        "--model.config.state_init",
        "zero",
        "--model.eval_rounds",
        "[1, 8]",
        "--model.extrapolate_rounds",
        "8",
        "--model.frontier.exit",
        "kl",
        "--model.frontier.thresholds",
        "[0.0, 1e9]",
        "--trainer.limit_test_batches",
        "1",
        cwd=tmp_path,
    )
    assert test.returncode == 0, test.stderr[-3000:]
    m = metrics(test.stdout)
    assert m["test_fixed_point/loss/r04"] == pytest.approx(m["test/loss"], rel=1e-5)
    assert m["test_fixed_point/loss/r08"] == pytest.approx(m["test/loss_r8"], rel=1e-5)
    assert all(math.isfinite(m[f"test_fixed_point/sigma_max/r0{r}"]) for r in range(2, 9))
    # The exit frontier: threshold 0 never exits (R = 4 for every token), a huge one exits after round 1.
    assert m["test/frontier/mean_rounds/t0"] == 4.0 and m["test/frontier/mean_rounds/t1"] == 1.0
    assert m["test/frontier/loss/t0"] == pytest.approx(m["test/loss"], rel=1e-5)
    assert m["test/frontier/loss/t1"] == pytest.approx(m["test/loss_r1"], rel=1e-5)

    predict = run_loopnet(
        "predict",
        *common,
        "--ckpt_path",
        str(ckpt),
        "--model.generate.prompt",
        "ROMEO:",
        "--model.generate.max_new_tokens",
        "4",
        cwd=tmp_path,
    )
    assert predict.returncode == 0, predict.stderr[-3000:]
    (text,) = tmp_path.glob("runs/**/predictions.txt")
    assert text.read_text().startswith("ROMEO:")  # the prompt through Huginn's tokenizer and back


def test_hf_source_downloads_the_weights_config_and_tokenizer_at_the_revision(monkeypatch, tmp_path):
    """`hf://org/name@rev` asks huggingface_hub for that revision and only the data files (no remote code); the
    written folder records the commit the cache's snapshot is named by."""
    import huggingface_hub

    snapshot = tmp_path / "cache" / "snapshots" / "0123abcd"
    shutil.copytree(FIXTURE, snapshot)
    asked = {}

    def fake_download(repo_id, revision=None, allow_patterns=None, **kwargs):
        asked.update(repo_id=repo_id, revision=revision, allow_patterns=allow_patterns)
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    assert resolve("hf://tomg-group-umd/huginn-0125@0123abcd") == snapshot
    assert asked["repo_id"] == "tomg-group-umd/huginn-0125" and asked["revision"] == "0123abcd"
    assert not any(p.endswith(".py") or p == "*" for p in asked["allow_patterns"])
    from loopnet.formats.cli import import_main

    import_main(["hf://tomg-group-umd/huginn-0125@0123abcd", str(tmp_path / "out")])
    _, _, source = out_folder.read_folder(tmp_path / "out")
    assert source["commit"] == "0123abcd" and source["src"] == "hf://tomg-group-umd/huginn-0125@0123abcd"
