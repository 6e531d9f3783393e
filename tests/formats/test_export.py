"""`loopnet export`: the files it writes, the round trip back to loopnet's weights, and what it refuses."""

from __future__ import annotations

import dataclasses
import json
import pickle
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

from loopnet.formats import hf
from loopnet.model import LoopConfig

from .helpers import EXPORTED_FILES, save_checkpoint, tiny_model

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(model, checkpoint path, exported folder) of a tiny model with a prelude, a coda and an untied head,
    exported from a run's version folder that holds a summary.json."""
    root = tmp_path_factory.mktemp("run")
    model = tiny_model(n_prelude=1, n_coda=1, tie_embeddings=False)
    ckpt = save_checkpoint(model, root / "version_0" / "checkpoints" / "last.ckpt", step=12)
    (root / "version_0" / "summary.json").write_text(json.dumps({"best_val_loss": 3.25, "global_step": 12}))
    return model, ckpt, hf.export(ckpt, root / "out")


def test_the_folder_holds_the_hugging_face_layout(exported):
    model, _, out = exported
    assert {p.name for p in out.iterdir()} == EXPORTED_FILES
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "loopnet" and config["architectures"] == ["LoopnetForCausalLM"]
    assert config["auto_map"] == {
        "AutoConfig": "configuration_loopnet.LoopnetConfig",
        "AutoModelForCausalLM": "modeling_loopnet.LoopnetForCausalLM",
    }
    assert {k: config[k] for k in dataclasses.asdict(model.config)} == dataclasses.asdict(model.config)
    assert config["dtype"] == "float32" and config["loopnet_vocab"] == "gpt2" and config["tie_word_embeddings"] is False
    card = (out / "README.md").read_text()
    for fact in ("K=2·R=3", "| steps | 12 |", "3.2500", "shakespeare", "last.ckpt"):
        assert fact in card


def test_read_exported_returns_the_checkpoints_weights_bit_for_bit(exported):
    model, _, out = exported
    config, state, meta = hf.read_exported(out)
    assert config == model.config
    reference = model.state_dict()
    assert state.keys() == reference.keys()
    for key, tensor in reference.items():
        assert state[key].dtype == tensor.dtype and torch.equal(state[key], tensor), key
    assert meta["vocab"] == "gpt2" and meta["global_step"] == 12 and meta["dtype"] == "float32"


def test_a_tied_head_is_stored_once_and_read_back_as_the_embedding(tmp_path):
    model = tiny_model()
    out = hf.export(save_checkpoint(model, tmp_path / "a.ckpt"), tmp_path / "out")
    from safetensors import safe_open

    with safe_open(out / "model.safetensors", "pt") as f:
        keys = set(f.keys())
    assert "model.wte.weight" in keys and "model.lm_head.weight" not in keys
    _, state, _ = hf.read_exported(out)
    assert state["lm_head.weight"] is state["wte.weight"]
    assert torch.equal(state["lm_head.weight"], model.lm_head.weight)


def test_weights_past_the_shard_size_go_into_shards_with_an_index(tmp_path):
    model = tiny_model()
    out = hf.export(save_checkpoint(model, tmp_path / "a.ckpt"), tmp_path / "out", max_shard_size=20_000)
    index = json.loads((out / hf.INDEX).read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and not (out / hf.WEIGHTS).exists()
    assert all((out / f).is_file() for f in files)
    _, state, _ = hf.read_exported(out)
    for key, tensor in model.state_dict().items():
        assert torch.equal(state[key], tensor), key


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_lower_precision_export_holds_the_weights_rounded_once(tmp_path, dtype):
    model = tiny_model()
    out = hf.export(save_checkpoint(model, tmp_path / "a.ckpt"), tmp_path / "out", dtype=dtype)
    _, state, meta = hf.read_exported(out)
    assert meta["dtype"] == dtype
    for key, tensor in model.state_dict().items():
        assert torch.equal(state[key], tensor.to(getattr(torch, dtype))), key


def test_nothing_in_the_folder_is_a_pickle_and_reading_it_never_unpickles(exported):
    _, _, out = exported
    for path in out.iterdir():
        head = path.read_bytes()[:4]
        assert head[:1] != b"\x80" and head != b"PK\x03\x04", f"{path.name} looks like a pickle or a torch.save zip"
    refuse = mock.Mock(side_effect=AssertionError("unpickled while loading an exported folder"))
    with (
        mock.patch("pickle.load", refuse),
        mock.patch("pickle.loads", refuse),
        mock.patch.object(pickle, "Unpickler", refuse),
        mock.patch("torch.load", refuse),
    ):
        hf.read_exported(out)
        from transformers import AutoModelForCausalLM

        AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    refuse.assert_not_called()


def test_the_byte_vocabulary_gets_a_byte_tokenizer_with_the_training_ids(tmp_path):
    from transformers import AutoTokenizer

    from loopnet.data.bytelevel import BYTE_EOT_ID, ByteVocab

    model = tiny_model(vocab_size=320)
    out = hf.export(save_checkpoint(model, tmp_path / "a.ckpt", vocab="bytes"), tmp_path / "out")
    tokenizer = AutoTokenizer.from_pretrained(out, trust_remote_code=True)
    text = "ROMEO: ça va? ✓ 12"
    assert tokenizer(text).input_ids == ByteVocab.encode(text)
    assert tokenizer.decode(ByteVocab.encode(text)) == text
    assert tokenizer.eos_token_id == BYTE_EOT_ID
    assert json.loads((out / "config.json").read_text())["loopnet_n_vocab"] == 257


def test_the_gpt2_tokenizer_gives_the_ids_loopnet_trains_on(exported):
    from transformers import AutoTokenizer

    from loopnet.data import gpt2_encoding

    tokenizer = AutoTokenizer.from_pretrained(exported[2], trust_remote_code=True)
    text = "First Citizen:\nBefore we proceed any further, hear me speak.<|endoftext|>  ça  "
    assert tokenizer(text).input_ids == gpt2_encoding().encode(text, allowed_special="all")
    assert tokenizer.eos_token_id == 50256


# ----------------------------------------------------------------------------------------- refusals
def test_export_refuses_in_one_line(tmp_path):
    ckpt = save_checkpoint(tiny_model(), tmp_path / "a.ckpt")
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    (tmp_path / "plain.ckpt").write_bytes(b"not a checkpoint")
    torch.save({"state_dict": {}}, tmp_path / "other.ckpt")
    cases = {
        (str(tmp_path / "missing.ckpt"), "o1"): "does not exist",
        (str(tmp_path / "plain.ckpt"), "o2"): "is not a readable checkpoint",
        (str(tmp_path / "other.ckpt"), "o3"): "is not a loopnet checkpoint",
        (str(tmp_path), "o4"): "is a folder, not a checkpoint file",
        (str(ckpt), "full"): "exists and is not empty; fix: give a new folder, or pass --overwrite",
    }
    for (source, out), message in cases.items():
        with pytest.raises(ValueError, match=message) as err:
            hf.export(source, tmp_path / out)
        assert "\n" not in str(err.value)
        assert not (tmp_path / out).exists() or out == "full"
    with pytest.raises(ValueError, match=r"^--dtype float64 is not supported; fix: give one of float32, bfloat16"):
        hf.export(ckpt, tmp_path / "o5", dtype="float64")
    assert (full / "keep.txt").read_text() == "mine"
    with (
        mock.patch("importlib.util.find_spec", return_value=None),
        pytest.raises(ValueError, match=r"^loopnet export needs transformers, .* fix: pip install -e '\.\[hf\]'$"),
    ):
        hf.export(ckpt, tmp_path / "o7")
    compact = save_checkpoint(tiny_model(), tmp_path / "c.ckpt", vocab="compact")
    with pytest.raises(ValueError, match="data.vocab: compact"):
        hf.export(compact, tmp_path / "o6")


def test_the_command_says_what_is_wrong_in_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "loopnet", "export", str(tmp_path / "x.ckpt"), str(tmp_path / "o"), "--dtype", "int8"],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "loopnet export: error: --dtype int8 is not supported; fix: give one of float32, bfloat16, float16"
    ]


def test_a_failed_export_leaves_no_folder_and_keeps_the_previous_one(tmp_path):
    ckpt = save_checkpoint(tiny_model(), tmp_path / "a.ckpt")
    out = tmp_path / "out"
    with (
        mock.patch.object(hf, "write_tokenizer", side_effect=RuntimeError("disk full")),
        pytest.raises(RuntimeError, match="disk full"),
    ):
        hf.export(ckpt, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.ckpt"]  # no out, no temporary sibling
    hf.export(ckpt, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with (
        mock.patch.object(hf, "model_card", side_effect=RuntimeError("killed")),
        pytest.raises(RuntimeError, match="killed"),
    ):
        hf.export(ckpt, out, overwrite=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.ckpt", "out"]
    other = tiny_model(seed=1)
    hf.export(save_checkpoint(other, tmp_path / "a.ckpt"), out, overwrite=True)
    assert torch.equal(hf.read_exported(out)[1]["wte.weight"], other.wte.weight)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.ckpt", "out"]


# ----------------------------------------------------------------------------------------- sharded checkpoints
def test_a_sharded_checkpoint_folder_exports_like_its_consolidated_file(tmp_path):
    """A folder in the layout Lightning's FSDPStrategy writes with state_dict_type "sharded" (the LightningModule's
    state dict under "model" through torch.distributed.checkpoint, the rest in meta.pt; tests/reliability/test_fsdp.py
    exports one written by FSDP itself)."""
    import torch.distributed.checkpoint as dcp

    from .helpers import checkpoint_dict

    model = tiny_model(n_coda=1)
    ckpt = checkpoint_dict(model)
    folder = tmp_path / "last.ckpt"
    dcp.save({"model": ckpt.pop("state_dict")}, checkpoint_id=folder, no_dist=True)
    torch.save(ckpt, folder / "meta.pt")
    out = hf.export(folder, tmp_path / "out")
    config, state, meta = hf.read_exported(out)
    assert config == LoopConfig(**dataclasses.asdict(model.config)) and meta["global_step"] == 7
    for key, tensor in model.state_dict().items():
        assert torch.equal(state[key], tensor), key


SPY = """
import builtins, sys
importers, plain = set(), builtins.__import__

def spy(name, globals=None, *args, **kwargs):  # every import statement, also of a module already loaded
    if name.split(".")[0] == "transformers":
        importers.add((globals or {}).get("__name__"))
    return plain(name, globals, *args, **kwargs)

builtins.__import__ = spy
for modules in sys.argv[1:]:  # each group after the ones before it: the importers so far
    exec("import " + modules)
    print("IMPORTERS", sorted(importers, key=str))
"""
TRAINING_PATH = "loopnet.training.cli, loopnet.training.module, loopnet.data.datamodule, loopnet.diagnostics"


def importers_of_transformers(*groups: str) -> list[list]:
    """The modules that import transformers, in one fresh process, after each group of modules in turn."""
    proc = subprocess.run([sys.executable, "-c", SPY, *groups], check=False, capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [eval(line.removeprefix("IMPORTERS ")) for line in proc.stdout.splitlines() if line.startswith("IMPORTERS ")]


def test_no_loopnet_module_of_the_training_path_imports_transformers():
    """The fit's imports (the CLI, the LightningModule, the data module, the callbacks) and the exported-folder reader
    import no transformers themselves: only `loopnet export` and the exported model's code need it. (Lightning's
    torchmetrics imports it when it is installed: the spy names who asks.)"""
    importers, control = importers_of_transformers(
        f"{TRAINING_PATH}, loopnet.formats.hf", "loopnet.formats.modeling_loopnet"
    )
    assert not [name for name in importers if (name or "").split(".")[0] == "loopnet"], importers
    assert "loopnet.formats.modeling_loopnet" in control  # the control: the spy sees a module that does import it
