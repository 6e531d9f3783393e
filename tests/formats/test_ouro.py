"""Ouro import: loopnet's forward of the fixtures equals the reference code's logits, expected logits and exit
steps (tests/fixtures/ouro, written by scripts/fixtures/ouro.py from the reference itself), a folder that does not
match its config is refused in one line, and the instruments see the imported model."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import loopnet
from loopnet.formats import folder as out_folder
from loopnet.formats.ouro import read_ouro
from loopnet.formats.source import ImportFormatError, read_weights, resolve
from loopnet.model.exit import exit_logits
from loopnet.model.transformer import LoopedTransformer
from loopnet.model.visits import Visit
from tests.helpers import run_here

FIXTURES = Path(__file__).parents[1] / "fixtures" / "ouro"
VARIANTS = ("mha", "gqa")
GOLDEN = {v: load_file(FIXTURES / v / "golden.safetensors") for v in VARIANTS}
STEPS = (1, 2, 3, 4, 6)
THRESHOLDS = (0.5, 0.9)


def tolerance(cfg, rounds: int, reference: torch.Tensor) -> float:
    """Tolerance on |loopnet − reference| for two fp32 computations of one function in different orders (SDPA
    and the fused [q; k; v] and [gate; up] matmuls against separate ones). Each of the 2·K·R sublayer visits and
    the head sums dot products of length at most n = max(d, d_ff), whose worst-case rounding is n·2⁻²⁴ relative
    (unit roundoff); the Norm on every branch output and after every round keeps each visit's contribution at the
    stream's scale, so the visits' errors add rather than compound; both sides round: 2·(2KR + 1)·n·2⁻²⁴·max|logit|.
    Measured differences are ~1e-6, some 100× below it; a wrong weight, pairing or norm placement moves the
    logits by O(1)."""
    visits = 2 * cfg.depth(rounds) + 1
    return 2 * visits * max(cfg.d_model, cfg.d_ff) * 2.0**-24 * reference.abs().max().item()


@pytest.fixture(scope="module", params=VARIANTS)
def imported(request):
    cfg, state, meta = read_ouro(FIXTURES / request.param)
    model = LoopedTransformer(cfg).eval()
    model.load_state_dict(state)
    return request.param, cfg, model, meta


def test_config_reads_ouros_architecture(imported):
    variant, cfg, _, meta = imported
    hf = json.loads((FIXTURES / variant / "config.json").read_text())
    assert (cfg.n_prelude, cfg.n_blocks, cfg.n_coda, cfg.n_rounds) == (0, 2, 0, hf["total_ut_steps"])
    assert (cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.vocab_size) == (32, 4, 48, 272)
    assert cfg.kv_heads == hf["num_key_value_heads"] and (cfg.n_kv_heads is None) == (variant == "mha")
    assert (cfg.residual, cfg.sandwich, cfg.round_norm, cfg.exit_gate, cfg.loss_rounds) == (
        "preln",
        True,
        True,
        True,
        "expected",
    )
    assert cfg.mlp == "swiglu" and cfg.rope_base == 1e6 and not cfg.tie_embeddings and not cfg.bias
    assert meta["early_exit_threshold"] == 1.0 and meta["dtype"] == "float32" and meta["special_tokens"]["agree"]


@pytest.mark.parametrize("steps", STEPS)
def test_logits_equal_the_reference_at_each_step_count(imported, steps):
    """The last step's head, as the reference computes it without exit or weighting, at total_ut_steps = R'."""
    variant, cfg, model, _ = imported
    golden = GOLDEN[variant]
    logits, rounds = exit_logits(model, golden["input_ids"], "none", None, steps)
    reference = golden[f"logits_steps_{steps}"]
    error = (logits - reference).abs().max().item()
    assert error <= tolerance(cfg, steps, reference), f"{variant} R={steps}: max |Δlogit| {error:.3g}"
    assert bool((rounds == steps).all())


def test_forward_gives_the_expected_logits_of_the_exit_gate(imported):
    """`loss_rounds: expected`: the forward returns Σ_t p_t·head(h_t), the reference's use_weighted_exit."""
    variant, cfg, model, _ = imported
    golden = GOLDEN[variant]
    for key in (k for k in golden if k.startswith("expected_steps_")):
        steps = int(key.rsplit("_", 1)[1])
        with torch.no_grad():
            logits, _ = model(golden["input_ids"], rounds=steps)
        error = (logits - golden[key]).abs().max().item()
        assert error <= tolerance(cfg, steps, golden[key]), f"{variant} {key}: max |Δlogit| {error:.3g}"


@pytest.mark.parametrize("threshold", THRESHOLDS)
def test_exit_steps_equal_the_references(imported, threshold):
    """Exit 'gate' stops each token at the reference's step (the first whose cumulative exit probability reaches
    the threshold), and gives that step's logits; generation (recomputing the context) exits at the same step."""
    variant, cfg, model, _ = imported
    golden = GOLDEN[variant]
    ids, want = golden["input_ids"], golden[f"exit_round_q{threshold}"]
    logits, rounds = exit_logits(model, ids, "gate", threshold, cfg.n_rounds)
    assert torch.equal(rounds, want), f"{variant} q={threshold}: {rounds.tolist()} vs {want.tolist()}"
    assert len(set(want.flatten().tolist())) > 1  # the fixture's tokens exit at different steps
    for r in set(want.flatten().tolist()):
        at = want == r
        reference = golden[f"logits_steps_{r}"]
        assert (logits[at] - reference[at]).abs().max().item() <= tolerance(cfg, r, reference)
    for cache in (False, True):
        made = model.generate(ids.tolist(), 1, exit="gate", exit_threshold=threshold, cache=cache, temperature=0)
        assert [row[0] for row in made.rounds] == want[:, -1].tolist()


def test_every_visit_is_observed(imported):
    """The per-visit instruments' hook sees the 2·K·R loop visits of the imported model in order."""
    _, cfg, model, _ = imported
    seen: list[Visit] = []

    class Recorder:
        def on_visit(self, visit, trace):
            seen.append(visit)

    model.attach_observer(Recorder())
    try:
        with torch.no_grad():
            model(GOLDEN["mha"]["input_ids"], rounds=3)
    finally:
        model.attach_observer(None)
    assert [(v.round, v.block, v.sublayer) for v in seen] == [
        (r, k, s) for r in range(1, 4) for k in range(1, cfg.n_blocks + 1) for s in ("attn", "ffn")
    ]


def write_variant(tmp_path: Path, change, config_change=None) -> Path:
    hf = json.loads((FIXTURES / "mha" / "config.json").read_text())
    if config_change is not None:
        config_change(hf)
    (tmp_path / "config.json").write_text(json.dumps(hf))
    tensors = dict(read_weights(FIXTURES / "mha"))
    change(tensors)
    save_file(tensors, tmp_path / "model.safetensors")
    return tmp_path


@pytest.mark.parametrize(
    "change, named",
    [
        (lambda t: t.pop("model.layers.1.input_layernorm_2.weight"), "missing tensors for blocks.1.attn.out_norm"),
        (lambda t: t.pop("model.early_exit_gate.bias"), "missing tensors for exit_gate.bias"),
        (
            lambda t: t.update({"model.layers.0.self_attn.q_proj.bias": torch.zeros(32)}),
            "unexpected tensors model.layers.0.self_attn.q_proj.bias",
        ),
        (lambda t: t.update({"model.norm.weight": torch.ones(16)}), "tensor shapes differ"),
    ],
)
def test_a_folder_that_does_not_match_is_refused(tmp_path, change, named):
    with pytest.raises(ImportFormatError, match=named) as err:
        read_ouro(write_variant(tmp_path, change))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "config_change, named",
    [
        (lambda hf: hf.update(use_sliding_window=True), "sliding-window"),
        (lambda hf: hf.update(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope_scaling"),
        (lambda hf: hf.update(hidden_act="gelu"), "hidden_act"),
        (lambda hf: hf.update(tie_word_embeddings=True), "lm_head.weight differs"),
        (lambda hf: hf.update(num_key_value_heads=2), "tensor shapes differ"),
    ],
)
def test_a_config_loopnet_does_not_compute_is_refused(tmp_path, config_change, named):
    with pytest.raises(ImportFormatError, match=named):
        read_ouro(write_variant(tmp_path, lambda t: None, config_change))


def run_loopnet(*args, cwd=None):
    return run_here(args, cwd=cwd)


@pytest.fixture(scope="module")
def mha_folder(tmp_path_factory):
    """`loopnet import` of the mha fixture, once for the tests that read the folder: the command's result and the
    folder."""
    out = tmp_path_factory.mktemp("import") / "ouro"
    return run_loopnet("import", str(FIXTURES / "mha"), str(out)), out


def test_import_command_writes_a_folder_that_computes_the_reference(mha_folder):
    """`loopnet import` of the hub layout (shards and their index, tokenizer files); `loopnet.load` opens it with
    Ouro's tokenizer, whose end-of-text is the <|endoftext|> its files name."""
    proc, out = mha_folder
    assert proc.returncode == 0, proc.stderr
    assert "ouro as loopnet" in proc.stdout and "note:" not in proc.stdout
    assert (out / "tokenizer.json").is_file() and (out / "model.safetensors").is_file()
    _, _, source = out_folder.read_folder(out)
    assert source["format"] == "ouro" and source["early_exit_threshold"] == 1.0
    opened = loopnet.load(out)
    ids = GOLDEN["mha"]["input_ids"]
    logits, _ = exit_logits(opened.network, ids, "none", None, 4)
    reference = GOLDEN["mha"]["logits_steps_4"]
    assert (logits - reference).abs().max().item() <= tolerance(opened.network.config, 4, reference)
    assert opened.tokenizer.table.eot_token == 0 and opened.tokenizer.decode(opened.tokenizer.encode("Hi!")) == "Hi!"


def test_special_tokens_that_differ_between_files_are_reported(tmp_path):
    """Ouro's files may name different ids (a chat variant's generation_config ends at <|im_end|>): the import says
    so in one line and records each file's ids."""
    src = tmp_path / "src"
    shutil.copytree(FIXTURES / "gqa", src)
    generation = json.loads((src / "generation_config.json").read_text())
    (src / "generation_config.json").write_text(json.dumps({**generation, "bos_token_id": 1, "eos_token_id": 2}))
    proc = run_loopnet("import", str(src), str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    (note,) = [line for line in proc.stdout.splitlines() if line.startswith("note:")]
    assert '"eos": 2' in note and "tokenizer_config.json" in note
    _, _, source = out_folder.read_folder(tmp_path / "out")
    assert not source["special_tokens"]["agree"]
    assert source["special_tokens"]["files"]["generation_config.json"]["eos"] == 2


def test_hf_source_downloads_and_refuses_offline(monkeypatch, tmp_path):
    """`hf://ByteDance/Ouro-1.4B@rev` asks huggingface_hub for that revision and the data files only; offline with
    an empty cache it fails in one line naming the fix."""
    import huggingface_hub

    snapshot = tmp_path / "cache" / "snapshots" / "89abcdef"
    shutil.copytree(FIXTURES / "mha", snapshot)
    asked = {}

    def fake_download(repo_id, revision=None, allow_patterns=None, **kwargs):
        asked.update(repo_id=repo_id, revision=revision, allow_patterns=allow_patterns)
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    from loopnet.formats.cli import import_main

    import_main(["hf://ByteDance/Ouro-1.4B@89abcdef", str(tmp_path / "out")])
    assert asked["repo_id"] == "ByteDance/Ouro-1.4B" and asked["revision"] == "89abcdef"
    assert not any(p.endswith(".py") or p == "*" for p in asked["allow_patterns"])
    _, _, source = out_folder.read_folder(tmp_path / "out")
    assert source["commit"] == "89abcdef"
    monkeypatch.undo()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    with pytest.raises(ImportFormatError, match="HF_HUB_OFFLINE is set; fix: ") as err:
        resolve("hf://ByteDance/Ouro-1.4B@main")
    assert "\n" not in str(err.value)


def metrics(stdout: str) -> dict[str, float]:
    """The `name │ value` rows of Lightning's test table."""
    rows = (line.replace("│", " ").split() for line in stdout.splitlines() if "│" in line)
    return {row[0]: float(row[1]) for row in rows if len(row) == 2 and row[0].startswith("test")}


def test_loopnet_test_measures_an_imported_ouro(tmp_path, mha_folder):
    """`loopnet test` of the imported folder at other R' with the per-visit diagnostics, the fixed-point profile
    and the gate's exit frontier: threshold 0 exits every token after round 1, one above 1 never early."""
    proc, out = mha_folder
    assert proc.returncode == 0, proc.stderr
    root = Path(__file__).resolve().parents[2] / "configs"
    test = run_loopnet(
        "test",
        *("--config", str(root / "base.yaml"), "--config", str(root / "cpu.yaml"), "--config", str(out / "model.yaml")),
        *("--data.vocab", "tokenizer", "--data.tokenizer", str(out), "--data.batch_size", "2"),
        *("--model.eval_rounds", "[1, 6]", "--model.extrapolate_rounds", "6"),
        *("--model.frontier.exit", "gate", "--model.frontier.thresholds", "[0.0, 2.0]"),
        "--trainer.limit_test_batches",
        "1",
        cwd=tmp_path,
    )
    assert test.returncode == 0, test.stderr[-3000:]
    m = metrics(test.stdout)
    assert m["test/frontier/mean_rounds/t0"] == 1.0 and m["test/frontier/mean_rounds/t1"] == 4.0
    assert m["test/frontier/loss/t0"] == pytest.approx(m["test_fixed_point/loss/r01"], rel=1e-5)
    assert m["test/frontier/loss/t1"] == pytest.approx(m["test_fixed_point/loss/r04"], rel=1e-5)
    assert all(0 < m[f"test_fixed_point/sigma_max/r0{r}"] < float("inf") for r in range(2, 7))


def test_loopnet_eval_scores_an_imported_ouro_with_and_without_the_gate(tmp_path, mha_folder, monkeypatch, capsys):
    """`loopnet eval` of the imported folder with its own tokenizer: without exit every token runs R' = 4 steps;
    with --exit gate at threshold 0 every token stops after step 1 and scores as R' = 1 does."""
    pytest.importorskip("lm_eval", reason="the eval extra (lm-eval) is not installed")
    from loopnet.eval.cli import main
    from tests.eval.helpers import DATA_DIR, TASK

    proc, out = mha_folder
    assert proc.returncode == 0, proc.stderr
    monkeypatch.chdir(DATA_DIR)  # where the task YAML's relative data_files points
    reports = {}
    for name, extra in {
        "plain": ["--rounds", "1,4"],
        "gate": ["--rounds", "4", "--exit", "gate", "--exit_threshold", "0"],
    }.items():
        folder = tmp_path / name
        try:
            main(
                [
                    "--ckpt_path",
                    str(out),
                    "--tasks",
                    TASK,
                    "--include_path",
                    str(DATA_DIR),
                    "--output_dir",
                    str(folder),
                    *extra,
                ]
            )
        except SystemExit as exit_:
            assert exit_.code == 0, capsys.readouterr().err
        (path,) = folder.glob("eval_*.json")
        reports[name] = json.loads(path.read_text())
    plain, gate = reports["plain"], reports["gate"]
    assert plain["mean_rounds"]["4"][TASK] == 4.0 and gate["mean_rounds"]["4"][TASK] == 1.0
    assert gate["table"][TASK]["acc"]["4"]["value"] == plain["table"][TASK]["acc"]["1"]["value"]


def test_ouros_options_train(imported):
    """The options train: one backward of the expected-logits loss reaches every weight, the exit gate's too."""
    _, cfg, model, _ = imported
    model.train()
    try:
        ids = GOLDEN["mha"]["input_ids"]
        _, loss = model(ids[:, :-1], ids[:, 1:])
        loss.backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    finally:
        model.zero_grad(set_to_none=True)
        model.eval()


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"loss_rounds": "expected"}, "exit_gate: true"),
        ({"round_norm": True, "n_coda": 1}, "round_norm"),
        ({"round_norm": True, "loop_norm": True}, "round_norm"),
    ],
)
def test_options_that_do_not_fit_together_are_refused(changes, named):
    from loopnet.model.config import LoopConfig

    with pytest.raises(ValueError, match=named):
        LoopConfig(residual="preln", **changes)


def test_loopnet_fit_fine_tunes_an_imported_ouro(tmp_path):
    """`loopnet fit` from the folder's model.yaml with Ouro's tokenizer: two steps on the expected-logits loss."""
    out = tmp_path / "ouro"
    assert run_loopnet("import", str(FIXTURES / "gqa"), str(out)).returncode == 0
    root = Path(__file__).resolve().parents[2] / "configs"
    fit = run_loopnet(
        "fit",
        *("--config", str(root / "base.yaml"), "--config", str(root / "cpu.yaml"), "--config", str(out / "model.yaml")),
        *("--data.vocab", "tokenizer", "--data.tokenizer", str(out), "--data.batch_size", "2"),
        *("--model.eval_rounds", "null", "--trainer.max_steps", "2", "--trainer.val_check_interval", "2"),
        *("--trainer.limit_val_batches", "1", "--model.optim.lr", "1e-3", "--model.optim.warmup_steps", "1"),
        cwd=tmp_path,
    )
    assert fit.returncode == 0, fit.stderr[-3000:]
    (ckpt,) = tmp_path.glob("runs/*/version_0/checkpoints/last.ckpt")
    saved = torch.load(ckpt, weights_only=True)
    _, start, _ = out_folder.read_folder(out)
    # Two AdamW steps at lr <= 1e-3 move a weight by at most ~2·lr (|m̂/√v̂| <= 1 in the first steps), plus the decay.
    moved = {k: (saved["state_dict"][f"model.{k}"] - v).abs().max().item() for k, v in start.items()}
    assert 0 < max(moved.values()) <= 2 * 1e-3 * 1.5 and moved["exit_gate.weight"] > 0
