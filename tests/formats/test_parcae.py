"""Parcae import: loopnet's forward of the fixture equals the reference code's logits (tests/fixtures/parcae,
written by scripts/fixtures/parcae.py from the reference itself), a folder that does not match its config is
refused in one line, and the per-visit instruments see the imported model."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import loopnet
from loopnet.formats import folder as out_folder
from loopnet.formats.parcae import parcae_config, read_parcae, read_tensors
from loopnet.formats.source import ImportFormatError
from tests.formats.helpers import model_of
from tests.helpers import run_here

FIXTURE = Path(__file__).parents[1] / "fixtures" / "parcae"
GOLDEN = load_file(FIXTURE / "golden.safetensors")
STEPS = (1, 2, 4, 8)
SEED = 1234


def tolerance(cfg, rounds: int, reference: torch.Tensor) -> float:
    """Tolerance on |loopnet − reference| for two fp32 computations of one function in different orders (fused
    against separate q, k, v; loopnet's rotary pairing against Parcae's). Each of the 2·N sublayer visits
    (N = P + K·R + C), the injections and the head sum dot products of length at most n = max(d, d_ff), whose
    worst-case rounding is n·2⁻²⁴ relative; the Norm in front of every branch and the contracting injection keep
    the errors adding rather than compounding; both sides round: 2·(2N + R + 2)·n·2⁻²⁴·max|logit|. Measured
    differences are below 1e-6, some 300× under it; a wrong weight, pairing or norm placement moves the logits
    by O(0.1)."""
    terms = 2 * cfg.depth(rounds) + rounds + 2
    return 2 * terms * max(cfg.d_model, cfg.d_ff) * 2.0**-24 * reference.abs().max().item()


@pytest.fixture(scope="module")
def imported():
    return read_parcae(FIXTURE)


def test_config_reads_parcaes_architecture(imported):
    cfg, _, meta = imported
    hf = json.loads((FIXTURE / "config.json").read_text())
    assert hf["_class_name"] == "ParcaeConfig"
    assert (cfg.n_prelude, cfg.n_blocks, cfg.n_coda, cfg.n_rounds) == (2, 2, 2, 4)
    assert (cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.vocab_size) == (32, 4, 40, 264)
    assert (cfg.residual, cfg.mlp, cfg.injection, cfg.state_init, cfg.round_sampling) == (
        "preln",
        "relu2",
        "diagonal",
        "random",
        "poisson_truncated",
    )
    assert cfg.qk_norm and not cfg.qk_norm_gain and cfg.prelude_norm and cfg.loop_proj and cfg.value_embeds
    assert cfg.backprop_rounds == 2 and cfg.norm_eps == 1e-5 and cfg.rope_base == 50_000
    assert hf["recurrent_iteration_method"] == "per-sequence" and cfg.round_draw == "sequence"
    assert meta["tokenizer"] == "tokenizer.json" and meta["dtype"] == "float32"


@pytest.mark.parametrize("steps", STEPS)
def test_logits_equal_the_reference_at_each_step_count(imported, steps):
    cfg, state, _ = imported
    model = model_of(cfg, state, state_init="zero")  # the fixture's zero-state passes
    with torch.no_grad():
        logits, _ = model(GOLDEN["input_ids"], rounds=steps)
    reference = GOLDEN[f"logits_steps_{steps}"]
    error = (logits - reference).abs().max().item()
    assert error <= tolerance(cfg, steps, reference), f"R={steps}: max |Δlogit| {error:.3g}"


def test_random_initial_state_is_parcaes_draw(imported):
    """Under the same seed loopnet draws Parcae's like-init state (the same calls in the same order), and so its
    logits; from the zero state they differ by over 10× the tolerance (the drawn state is small: std √(2/5d))."""
    cfg, state, _ = imported
    model = model_of(cfg, state)
    reference = GOLDEN[f"logits_random_seed{SEED}"]
    torch.manual_seed(SEED)
    with torch.no_grad():
        logits, _ = model(GOLDEN["input_ids"], rounds=4)
    assert (logits - reference).abs().max().item() <= tolerance(cfg, 4, reference)
    assert (GOLDEN["logits_steps_4"] - reference).abs().max().item() > 10 * tolerance(cfg, 4, reference)


def test_each_sequence_at_its_own_rounds_gives_the_references_logits(imported):
    """The per-sequence loop (round_draw "sequence") on the imported model: sequence 0 runs 1 round, sequence 1
    runs 4, and each gets the reference's logits at its own step count. Sequence 0 has no round without grad
    (k = min(2, 1)), so it waits through sequence 1's two and starts at round 3 as at round 1."""
    cfg, state, _ = imported
    model = model_of(cfg, state, state_init="zero")
    with torch.no_grad():
        logits, _ = model(GOLDEN["input_ids"], rounds=torch.tensor([1, 4]))
    for i, steps in enumerate((1, 4)):
        reference = GOLDEN[f"logits_steps_{steps}"][i]
        error = (logits[i] - reference).abs().max().item()
        assert error <= tolerance(cfg, steps, reference), f"sequence {i} at R={steps}: max |Δlogit| {error:.3g}"


@pytest.mark.parametrize("method, draw", [("per-sequence", "sequence"), ("per-batch", "batch"), (None, "batch")])
def test_the_depth_is_drawn_as_the_configs_recurrent_iteration_method_says(method, draw):
    """Parcae's released configs draw per sequence; a config without the key has the reference's default,
    per-batch."""
    hf = json.loads((FIXTURE / "config.json").read_text())
    if method is None:
        del hf["recurrent_iteration_method"]
    else:
        hf["recurrent_iteration_method"] = method
    assert parcae_config(hf).round_draw == draw


def copy_with(tmp_path: Path, tensors: dict, name: str = "pytorch_model.bin") -> Path:
    shutil.copy(FIXTURE / "config.json", tmp_path / "config.json")
    torch.save(tensors, tmp_path / name)
    return tmp_path


def test_hub_weight_names_and_wrapped_keys_read_alike(imported, tmp_path):
    """pytorch_model.bin (the eval loader's name) with torch.compile's `_orig_mod.` prefix reads as model.pt does."""
    cfg, state, _ = imported
    tensors = {f"_orig_mod.{k}": v for k, v in read_tensors(FIXTURE).items()}
    cfg2, state2, _ = read_parcae(copy_with(tmp_path, tensors))
    assert cfg2 == cfg and set(state2) == set(state)
    assert all(torch.equal(state2[k], state[k]) for k in state)


@pytest.mark.parametrize(
    "change, named",
    [
        (lambda t: t.pop("transformer.core_block.1.norm_2.weight"), "missing tensors for blocks.1.ffn.norm.weight"),
        (lambda t: t.pop("value_embeds.3.weight"), "missing tensors for blocks.1.attn.f.value_embed.weight"),
        (lambda t: t.update({"transformer.extra.weight": torch.zeros(2)}), "unexpected tensors transformer.extra"),
        (lambda t: t.update({"lm_head.weight": torch.zeros(264, 32)}), "lm_head.weight differs"),
        (lambda t: t.update({"freqs_cis": t["freqs_cis"].flip(3)}), "freqs_cis is not the rotary table"),
        (lambda t: t.update({"transformer.C.weight": torch.zeros(32, 16)}), "tensor shapes differ"),
        (lambda t: t.pop("transformer.prelude.0.attn.c_k.weight"), "the attention lacks prelude.0 c_k"),
    ],
)
def test_a_folder_that_does_not_match_is_refused(tmp_path, change, named):
    tensors = dict(read_tensors(FIXTURE))
    change(tensors)
    with pytest.raises(ImportFormatError, match=named) as err:
        read_parcae(copy_with(tmp_path, tensors))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "key, value, named",
    [
        ("injection_type", "add", "injection_type='add'"),
        ("logit_softcap", 15.0, "logit_softcap=15.0"),
        ("recurrent_embedding_dimension", 64, "a core of width 64"),
        ("mlp_class_name", "GatedMLP", "mlp GatedMLP with ReLU2"),
        ("recurrent_iteration_method", "per-token", "recurrent_iteration_method='per-token'"),
    ],
)
def test_a_config_loopnet_does_not_compute_is_refused(tmp_path, key, value, named):
    hf = json.loads((FIXTURE / "config.json").read_text())
    hf[key] = value
    (tmp_path / "config.json").write_text(json.dumps(hf))
    shutil.copy(FIXTURE / "model.pt", tmp_path / "model.pt")
    with pytest.raises(ImportFormatError, match=named):
        read_parcae(tmp_path)


def test_visit_instruments_see_every_visit(imported):
    """The per-visit observer sees the prelude, every (round, block) of the loop and the coda, each visit with its
    stream and branch, and a visit's weights' gradient reaches the value embedding."""
    cfg, state, _ = imported
    model = model_of(cfg, state, state_init="zero")
    seen, views = [], {}

    class Observer:
        def on_visit(self, visit, trace):
            seen.append((visit, trace.branch.norm(dim=-1).mean().item()))
            if visit == (2, 2, "attn", "loop"):  # the per-visit views: their gradients are this visit's share
                views.update(trace.params)

    model.attach_observer(Observer())
    ids = GOLDEN["input_ids"]
    logits, loss = model(ids, ids, rounds=3)
    loss.backward()
    parts = [(v.part, v.round, v.block, v.sublayer) for v, _ in seen]
    loop = [p for p in parts if p[0] == "loop"]
    assert len(loop) == 3 * 2 * 2 and len(parts) == (2 + 3 * 2 + 2) * 2
    assert all(n > 0 for _, n in seen)
    table = model.blocks[1].attn.f.value_embed.weight
    assert "f.value_embed.weight" in views and "f.value_gate.weight" in views
    assert table.grad.abs().sum() > 0


def test_hf_source_offline_fails_in_one_line(monkeypatch, tmp_path):
    from loopnet.formats.source import resolve

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ImportFormatError, match="HF_HUB_OFFLINE is set; fix: ") as err:
        resolve("hf://SandyResearch/parcae-140m")
    assert "\n" not in str(err.value)


def test_hf_source_fetches_the_tokenizer_repository_when_the_model_has_none(monkeypatch, tmp_path):
    """The hub serves Parcae's weights and config without a tokenizer: an hf:// import takes it from
    SandyResearch/parcae-tokenizer; only data files are asked for."""
    import huggingface_hub

    model_snap = tmp_path / "m" / "snapshots" / "0123abcd"
    model_snap.mkdir(parents=True)
    for name in ("config.json", "model.pt"):
        shutil.copy(FIXTURE / name, model_snap / name)
    tok_snap = tmp_path / "t" / "snapshots" / "4567"
    shutil.copytree(FIXTURE, tok_snap, ignore=shutil.ignore_patterns("config.json", "*.pt", "golden*"))
    asked = []

    def fake_download(repo_id, revision=None, allow_patterns=None, **kwargs):
        asked.append((repo_id, allow_patterns))
        return str(model_snap if repo_id == "SandyResearch/parcae-140m" else tok_snap)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    from loopnet.formats.cli import import_main

    import_main(["hf://SandyResearch/parcae-140m@0123abcd", str(tmp_path / "out")])
    assert [a[0] for a in asked] == ["SandyResearch/parcae-140m", "SandyResearch/parcae-tokenizer"]
    assert "model.pt" in asked[0][1] and not any(p.endswith(".py") for p in asked[0][1])
    assert (tmp_path / "out" / "tokenizer.json").is_file()
    _, _, source = out_folder.read_folder(tmp_path / "out")
    assert source["format"] == "parcae" and source["commit"] == "0123abcd"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """`loopnet import` of the fixture, once for the tests that read the folder: the command's result and the
    folder."""
    out = tmp_path_factory.mktemp("import") / "parcae"
    proc = subprocess.run(
        [sys.executable, "-m", "loopnet", "import", str(FIXTURE), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return proc, out


def test_import_command_writes_a_folder_that_computes_the_reference(folder):
    proc, out = folder
    assert proc.returncode == 0, proc.stderr
    assert "parcae as loopnet" in proc.stdout
    model = out_folder.load_model(out)
    torch.manual_seed(SEED)
    with torch.no_grad():
        logits, _ = model(GOLDEN["input_ids"], rounds=4)
    reference = GOLDEN[f"logits_random_seed{SEED}"]
    assert (logits - reference).abs().max().item() <= tolerance(model.config, 4, reference)
    opened = loopnet.load(out)
    assert torch.equal(opened.network.wte.weight, model.wte.weight)
    assert opened.tokenizer.decode(opened.tokenizer.encode("Hello there")) == "Hello there"


def metrics(stdout: str) -> dict[str, float]:
    """The `name │ value` rows of Lightning's test table."""
    rows = (line.replace("│", " ").split() for line in stdout.splitlines() if "│" in line)
    return {row[0]: float(row[1]) for row in rows if len(row) == 2 and row[0].startswith("test")}


def test_an_imported_parcae_fine_tunes_and_tests_with_the_instruments(tmp_path, folder):
    """`loopnet fit` from the imported folder's model.yaml (Parcae's poisson_truncated draw, its tokenizer), then
    `loopnet test` of the folder at other R' with the fixed-point profile and the exit frontier."""
    proc, out = folder
    assert proc.returncode == 0, proc.stderr
    run = lambda *args: run_here(args, cwd=tmp_path)  # noqa: E731
    root = Path(__file__).resolve().parents[2] / "configs"
    common = [
        "--config",
        str(root / "base.yaml"),
        "--config",
        str(root / "cpu.yaml"),
        "--config",
        str(out / "model.yaml"),
    ]
    common += ["--data.vocab", "tokenizer", "--data.tokenizer", str(out), "--data.batch_size", "2"]
    common += ["--model.eval_rounds", "null", "--model.config.max_rounds", "8"]
    fit = run(
        "fit", *common, "--trainer.max_steps", "2", "--trainer.limit_val_batches", "1", "--model.optim.lr", "1e-3"
    )
    assert fit.returncode == 0, fit.stderr[-3000:]
    (ckpt,) = tmp_path.glob("runs/*/version_0/checkpoints/last.ckpt")
    saved = torch.load(ckpt, weights_only=True)["state_dict"]
    _, start, _ = out_folder.read_folder(out)
    assert any(not torch.equal(saved[f"model.{k}"], v) for k, v in start.items() if "value_embed" in k)
    test = run(
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
    )
    assert test.returncode == 0, test.stderr[-3000:]
    m = metrics(test.stdout)
    assert m["test_fixed_point/loss/r04"] == pytest.approx(m["test/loss"], rel=1e-5)
    assert m["test_fixed_point/loss/r08"] == pytest.approx(m["test/loss_r8"], rel=1e-5)
    assert m["test/frontier/mean_rounds/t0"] == 4.0 and m["test/frontier/mean_rounds/t1"] == 1.0
