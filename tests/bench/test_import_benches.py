"""The import benches' plumbing at tiny size: each generated checkpoint is laid out as its format's hub folder (the
names and shapes of the committed fixtures, which the reference code wrote) and loopnet imports it, the memory bench
runs every row in its own process (the ratios at real size are in docs/benchmarks/import.md), and the speed bench
refuses bad arguments and a reference folder without the reference's files before any work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from loopnet.bench import huginn_memory, import_speed
from loopnet.bench import run as bench_run
from loopnet.bench.hub_checkpoints import parcae_config, parcae_shapes, write_checkpoint
from loopnet.formats.huginn import read_huginn
from loopnet.formats.ouro import read_ouro
from loopnet.formats.parcae import read_parcae

FIXTURES = Path(__file__).parents[1] / "fixtures"
TINY = {
    "n_embd": 32,
    "n_heads": 4,
    "intermediate_size": 48,
    "vocab_size": 272,
    "block_size": 64,
    "n_layers_in_prelude": 1,
    "n_layers_in_recurrent_block": 2,
    "n_layers_in_coda": 1,
}
OURO_TINY = {  # the sizes of the fixture tests/fixtures/ouro/gqa
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 48,
    "vocab_size": 272,
    "max_position_embeddings": 64,
    "num_hidden_layers": 2,
    "total_ut_steps": 4,
}
PARCAE_TINY = {  # the sizes of the fixture tests/fixtures/parcae
    "n_embd": 32,
    "num_attention_heads": 4,
    "intermediate_size": 40,
    "vocab_size": 258,
    "block_size": 64,
    "n_layers_in_prelude": 2,
    "n_layers_in_recurrent_block": 2,
    "n_layers_in_coda": 2,
    "mean_recurrence": 4,
    "mean_backprop_depth": 2,
}


def unique(state: dict) -> list[torch.Tensor]:
    return list({id(v): v for v in state.values()}.values())  # a tied head once


def safetensors_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for path in folder.glob("*.safetensors"):
        if path.name != "golden.safetensors":
            with safe_open(path, "pt") as f:
                shapes |= {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    return shapes


def test_the_huginn_checkpoint_is_sharded_as_the_hub_serves_it_and_imports(tmp_path):
    made = write_checkpoint(tmp_path, TINY, shard_bytes=20_000)
    assert made["files"] > 1 and (tmp_path / "model.safetensors.index.json").is_file()
    cfg, state, meta = read_huginn(tmp_path)  # every tensor used, every weight filled, freqs_cis checked
    assert (cfg.d_model, cfg.n_prelude, cfg.n_blocks, cfg.n_coda) == (32, 1, 2, 1) and meta["dtype"] == "bfloat16"
    stored = unique(state)
    assert made["parameters"] == sum(v.numel() for v in stored)
    assert made["weight_bytes"] == 2 * made["parameters"] and all(v.dtype == torch.bfloat16 for v in stored)


def test_the_ouro_checkpoint_is_laid_out_as_the_fixture_the_reference_wrote_and_imports(tmp_path):
    made = write_checkpoint(tmp_path, OURO_TINY, dtype=torch.float32, shard_bytes=20_000, fmt="ouro")
    fixture = FIXTURES / "ouro" / "gqa"
    assert safetensors_shapes(tmp_path) == safetensors_shapes(fixture)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert made["files"] > 1 and len(set(index["weight_map"].values())) == made["files"]
    config = json.loads((tmp_path / "config.json").read_text())
    assert set(config) == set(json.loads((fixture / "config.json").read_text())) - {"transformers_version"}
    cfg, state, meta = read_ouro(tmp_path)
    assert (cfg.d_model, cfg.n_kv_heads, cfg.n_blocks, cfg.n_rounds) == (32, 2, 2, 4)
    assert meta["special_tokens"]["agree"] and meta["tokenizer"] == "tokenizer.json"
    assert (
        made["parameters"] == sum(v.numel() for v in unique(state)) and made["weight_bytes"] == 4 * made["parameters"]
    )


def test_the_parcae_checkpoint_is_laid_out_as_the_fixture_the_reference_wrote_and_imports(tmp_path):
    made = write_checkpoint(tmp_path, PARCAE_TINY, dtype=torch.float32, fmt="parcae")
    fixture = json.loads((FIXTURES / "parcae" / "config.json").read_text())
    config = json.loads((tmp_path / "config.json").read_text())
    assert set(config) == set(fixture)
    # at the fixture's own settings (it adds qk_bias and pads the vocabulary to 8) the tensors are the fixture's
    settings = parcae_config(PARCAE_TINY) | {"qk_bias": True, "padded_vocab_size": fixture["padded_vocab_size"]}
    want = torch.load(FIXTURES / "parcae" / "model.pt", weights_only=True)
    assert parcae_shapes(settings) == {k: tuple(v.shape) for k, v in want.items() if k != "lm_head.weight"}
    saved = torch.load(tmp_path / "model.pt", weights_only=True)
    assert saved["lm_head.weight"].data_ptr() == saved["transformer.wte.weight"].data_ptr()  # tied, stored once
    cfg, state, _ = read_parcae(tmp_path)
    assert (cfg.d_model, cfg.n_prelude, cfg.n_blocks, cfg.n_coda, cfg.vocab_size) == (32, 2, 2, 2, 320)
    assert made["parameters"] == sum(v.numel() for v in unique(state)) and made["files"] == 1


def test_the_writers_refuse_an_unknown_format_and_missing_sizes(tmp_path):
    with pytest.raises(ValueError, match="no checkpoint writer for the format 'gpt2'; fix: give one of huginn"):
        write_checkpoint(tmp_path, TINY, fmt="gpt2")
    with pytest.raises(ValueError, match="needs the sizes total_ut_steps"):
        write_checkpoint(tmp_path, {k: v for k, v in OURO_TINY.items() if k != "total_ut_steps"}, fmt="ouro")


@pytest.mark.slow
def test_the_memory_bench_runs_every_row_in_its_own_process(tmp_path):
    res = huginn_memory.run(1, TINY, str(tmp_path))
    assert set(res["rows"]) == set(huginn_memory.ROWS) and res["weight_bytes"] == 2 * res["parameters"]
    for row in res["rows"].values():
        assert row["seconds"] > 0 and row["peak_bytes"] >= 0 and row["base_bytes"] > 0
    table = huginn_memory.markdown(res, "loopnet bench huginn-memory")
    assert all(f"| {row} |" in table for row in huginn_memory.ROWS)
    assert not any(tmp_path.iterdir())  # the checkpoint and the imported folder are deleted


@pytest.mark.parametrize(
    ("fmt", "message"),
    [
        ("huginn", r"holds no raven_modeling_minimal.py, raven_config_minimal.py, nor does .*recpre;"),
        ("ouro", r"holds no modeling_ouro.py, configuration_ouro.py, nor does .*ouro_rl/modeling;"),
        ("parcae", r"parcae_lm holds no __init__.py, models/parcae/parcae.py, models/parcae/config.py"),
    ],
)
def test_the_speed_bench_refuses_a_folder_without_the_reference(tmp_path, fmt, message):
    with pytest.raises(SystemExit, match=message):
        import_speed.main(["--format", fmt, "--reference", str(tmp_path)])


def test_huginn_speed_is_the_speed_bench_of_huginn(tmp_path):
    with pytest.raises(SystemExit, match="holds no raven_modeling_minimal.py"):
        bench_run.main(["huginn-speed", "--reference", str(tmp_path)])


@pytest.mark.parametrize(
    ("fmt", "place", "files"),
    [
        ("huginn", "recpre", import_speed.REFERENCES["huginn"].files),
        ("ouro", "ouro_rl/modeling", import_speed.REFERENCES["ouro"].files),
        ("parcae", "parcae_lm", (*import_speed.REFERENCES["parcae"].files, "modules/mixer.py")),
    ],
)
def test_the_speed_bench_takes_the_reference_from_a_checkout(tmp_path, fmt, place, files):
    checkout, into = tmp_path / "checkout", tmp_path / "into"
    for name in (*files, "__pycache__/x.pyc"):
        (checkout / place / name).parent.mkdir(parents=True, exist_ok=True)
        (checkout / place / name).write_text(f"# {name}\n")
    into.mkdir()
    import_speed.reference_package(fmt, checkout, into)
    package = into / import_speed.REFERENCES[fmt].package
    assert all((package / name).read_text() == f"# {name}\n" for name in files)
    assert not (package / "__pycache__").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--format", "huginn", "--hidden_size", "64"],
            "--hidden_size sizes no huginn checkpoint; its sizes: --n_embd",
        ),
        (["--format", "ouro", "--dtypes", "float32,int8"], "--dtypes: 'int8' is none of float32, bfloat16, float16"),
        (["--format", "parcae", "--reps", "0"], "--reps must be >= 1"),
        (["--format", "gpt2"], "invalid choice: 'gpt2'"),
    ],
)
def test_the_speed_bench_refuses_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit):
        import_speed.parse([*argv, "--reference", "."])
    assert message in capsys.readouterr().err


def test_the_speed_bench_sizes_the_checkpoint_of_its_format():
    args, sizes = import_speed.parse(["--format", "ouro", "--reference", ".", "--num_hidden_layers", "3"])
    assert args.format == "ouro" and sizes == import_speed.SIZES["ouro"] | {"num_hidden_layers": 3}
    assert import_speed.SIZES["ouro"]["total_ut_steps"] == import_speed.ROUNDS


def test_the_speed_table_has_a_row_per_dtype_with_the_wall_clock_and_cpu_ratios():
    model = {"d_model": 1024, "n_heads": 8, "ffn_width": 2816, "mlp": "swiglu", "vocab_size": 8192, "seq_len": 256}
    row = {"reference": 2.0, "loopnet": 1.8, "ratio": 0.9, "ratios": [0.9, 0.91], "cpu_ratio": 0.95}
    res = {
        "format": "ouro",
        "parameters": 42e6,
        "model": model | {"n_prelude": 0, "n_blocks": 2, "n_coda": 0},
        "rounds": 4,
        "reps": 2,
        "threads": 1,
        "torch": "2.13.0",
        "transformers": "4.57.6",
        "attention": "sdpa",
        "date": "2026-12-05T07:00+00:00",
        "load_average": 3.0,
        "max_abs_logit_diff_fp32": 3e-6,
        "logit_scale": 2.9,
        "dtypes": {"float32": row},
    }
    text = import_speed.markdown(res, "loopnet bench import-speed --format ouro")
    assert "P 0 + K 2·R 4 + C 0" in text and "largest |Δ logit| 3.00e-06" in text
    assert "| float32 | 2.000 s | 1.800 s | 0.900 | 0.950 | 0.90, 0.91 |" in text.splitlines()
