"""loopnet's one model folder: `loopnet import` writes the layout of `loopnet export` (`hf.write_model`), with the
source's provenance in config.json's `loopnet_export.source`; `hf.read_exported` reads it, and still reads the
folders import wrote in its earlier layout; a folder that holds files is never written into."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import loopnet
from loopnet.formats import hf
from loopnet.formats.cli import import_main
from loopnet.formats.folder import load_weights, read_folder
from loopnet.formats.huginn import read_huginn
from loopnet.model import LoopedTransformer
from tests.formats.helpers import EXPORTED_FILES

FIXTURE = Path(__file__).parents[1] / "fixtures" / "huginn"


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    out = tmp_path_factory.mktemp("import") / "huginn"
    import_main([str(FIXTURE), str(out)])
    return out


def same_state(state: dict, reference: dict) -> None:
    assert state.keys() == reference.keys()
    for key, tensor in reference.items():
        assert state[key].dtype == tensor.dtype and torch.equal(state[key], tensor), key


def test_an_imported_folder_holds_the_export_layout_and_its_source(imported):
    cfg, state, _ = read_huginn(FIXTURE)
    names = {p.name for p in imported.iterdir()}
    assert names == EXPORTED_FILES | {"model.yaml", "special_tokens_map.json"}  # Huginn's own tokenizer files, copied
    config = json.loads((imported / "config.json").read_text())
    assert config["model_type"] == "loopnet" and config["loopnet_vocab"] == "tokenizer"
    assert config["loopnet_n_vocab"] is None and config["dtype"] == "float32"
    assert {k: config[k] for k in dataclasses.asdict(cfg)} == dataclasses.asdict(cfg)
    record = config["loopnet_export"]
    assert record["source"]["format"] == "huginn_raven" and record["source"]["src"] == str(FIXTURE)
    assert record["parameters"] == LoopedTransformer(cfg).num_params(non_embedding=False)
    assert (imported / "generation_config.json").read_bytes() == (FIXTURE / "generation_config.json").read_bytes()
    assert "huginn_raven read from" in (imported / "README.md").read_text()
    config_back, state_back, meta = hf.read_exported(imported)
    assert config_back == cfg and meta["vocab"] == "tokenizer" and meta["source"] == record["source"]
    same_state(state_back, state)
    assert state_back["lm_head.weight"] is state_back["wte.weight"]  # the tied head stored once


def test_transformers_opens_an_imported_folder_with_loopnets_logits(imported):
    """The shipped code runs the imported architecture (Huginn's sandwich block, linear adapter, random state): the
    same operations in the same order as loopnet's, so, from one seed, the same logits bit for bit."""
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM

    model = loopnet.load(imported).network
    wrapped = AutoModelForCausalLM.from_pretrained(imported, trust_remote_code=True).eval()
    ids = torch.tensor([[1, 5, 9, 42, 7, 3]])
    with torch.no_grad():
        torch.manual_seed(0)
        ours, _ = model(ids, rounds=3)
        torch.manual_seed(0)
        theirs = wrapped(ids, rounds=3).logits
    assert torch.equal(theirs, ours)


def write_legacy(folder: Path, cfg, state: dict, source: dict) -> Path:
    """A folder in the layout `loopnet import` wrote before it wrote the export layout."""
    folder.mkdir()
    kept = {k: v.contiguous() for k, v in state.items() if not (cfg.tie_embeddings and k == "lm_head.weight")}
    save_file(kept, folder / "model.safetensors", metadata={"format": "pt"})
    meta = {"format": "loopnet", "config": dataclasses.asdict(cfg), "source": source}
    (folder / "config.json").write_text(json.dumps(meta, indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        (folder / name).write_bytes((FIXTURE / name).read_bytes())
    return folder


def test_a_folder_in_the_earlier_import_layout_is_still_read(tmp_path):
    cfg, state, _ = read_huginn(FIXTURE)
    source = {"src": str(FIXTURE), "format": "huginn_raven", "dtype": "float32"}
    legacy = write_legacy(tmp_path / "legacy", cfg, state, source)
    config, read, meta = hf.read_exported(legacy)
    assert config == cfg and meta == {"source": source, "vocab": "tokenizer", "dtype": "float32"}
    same_state(read, state)
    assert read_folder(legacy)[2] == source
    opened = loopnet.load(legacy)  # with its own tokenizer
    assert opened.tokenizer.name == "tokenizer" and torch.equal(opened.network.wte.weight, state["wte.weight"])
    model = LoopedTransformer(cfg)
    load_weights(model, legacy)  # a fit's model.init_weights, as the folder's model.yaml names it
    same_state(model.state_dict(), state)


def test_a_folder_that_holds_files_is_never_written_into(imported, tmp_path):
    cfg, state, _ = read_huginn(FIXTURE)
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    for overwrite in (None, False):  # import and retrofit have no --overwrite; export without it
        with pytest.raises(hf.ExportError, match="already exists and is not empty; fix: give a new folder") as err:
            hf.write_model(full, cfg, state, {}, tokenizer_dir=FIXTURE, overwrite=overwrite)
        assert "\n" not in str(err.value)
    assert [p.name for p in full.iterdir()] == ["keep.txt"] and (full / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]  # no temporary sibling left
    before = {p.name: p.read_bytes() for p in imported.iterdir()}
    with pytest.raises(SystemExit) as exit_:  # the command: one line, exit status 2
        import_main([str(FIXTURE), str(imported)])
    assert exit_.value.code == 2
    assert {p.name: p.read_bytes() for p in imported.iterdir()} == before
