"""`loopnet.load`: a checkpoint, a run folder or an exported folder becomes a `loopnet.Model` with the
checkpoint's weights, on the device and dtype asked, in eval mode, with the tokenizer of its data; what is not
one is refused in one line."""

from __future__ import annotations

import sys

import pytest
import torch

import loopnet
from loopnet.data.vocabulary import BytesVocab, CompactVocab, GPT2Vocab
from tests.api.conftest import RUN, TEXT
from tests.helpers import run_command
from tests.reliability.helpers import ROOT, env


def same_weights(model: loopnet.Model, saved: dict[str, torch.Tensor]) -> None:
    state = model.network.state_dict()
    assert state.keys() == saved.keys()
    for name, tensor in saved.items():
        assert torch.equal(state[name], tensor), name


def test_a_checkpoint_and_its_run_folder_load_the_checkpoints_weights(run_root, ckpt, saved_weights):
    for path in (ckpt, str(ckpt), run_root / RUN, run_root / RUN / "version_0", ckpt.parent):
        model = loopnet.load(path)
        same_weights(model, saved_weights)
        assert model.config.n_blocks == 2 and model.config.n_rounds == 3 and model.config.residual == "deeploop"
        assert model.network.lm_head.weight is model.network.wte.weight  # tied, as trained
        assert not any(m.training for m in model.network.modules())
        assert isinstance(model.tokenizer, GPT2Vocab)


def test_device_and_dtype_are_honoured(ckpt, saved_weights):
    model = loopnet.load(ckpt, dtype=torch.bfloat16)
    assert {p.dtype for p in model.network.parameters()} == {torch.bfloat16}
    assert {p.device.type for p in model.network.parameters()} == {"cpu"}
    assert not model.network.training
    for name, tensor in model.network.state_dict().items():  # bf16 of the saved fp32 weights: one rounding
        if name in saved_weights:
            assert torch.equal(tensor, saved_weights[name].to(torch.bfloat16)), name
    out = model.generate("ROMEO:", 3, rounds=2)
    assert len(out.tokens) == 3 and out.rounds == [2, 2, 2]


def test_the_tokenizer_round_trips_text(ckpt):
    model = loopnet.load(ckpt)
    assert model.tokenizer.decode(model.tokenizer.encode(TEXT)) == TEXT
    assert model.encode(TEXT).shape == (1, len(model.tokenizer.encode(TEXT)))


def with_data(ckpt, tmp_path, data: dict):
    """The checkpoint as if its data module had been `data` (the settings Lightning saves beside the weights)."""
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    path = tmp_path / "other.ckpt"
    torch.save(state | {"datamodule_hyper_parameters": data}, path)
    return path


def test_the_tokenizer_is_the_one_the_run_trained_with(ckpt, tmp_path):
    """bytes: UTF-8 bytes; compact: the corpus's own ids, rebuilt from the corpus the settings name."""
    model = loopnet.load(with_data(ckpt, tmp_path, {"vocab": "bytes"}))
    assert isinstance(model.tokenizer, BytesVocab)
    assert model.tokenizer.encode("Romeo") == list(b"Romeo") and model.tokenizer.decode(list(b"Romeo")) == "Romeo"
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT * 3)
    data = dict(seq_len=16, batch_size=2, source="files", path=str(corpus), vocab="compact")
    model = loopnet.load(with_data(ckpt, tmp_path, data))
    assert isinstance(model.tokenizer, CompactVocab)
    ids = model.tokenizer.encode(TEXT)
    assert max(ids) < model.tokenizer.size < 100 and model.tokenizer.decode(ids) == TEXT
    assert model.generate("ROMEO:", 4).tokens and max(model.generate("ROMEO:", 4).tokens) < model.tokenizer.size
    corpus.unlink()
    with pytest.raises(ValueError) as err:
        loopnet.load(tmp_path / "other.ckpt")
    assert "compact vocabulary" in str(err.value) and "\n" not in str(err.value)


def test_an_exported_folder_loads_the_checkpoints_weights_bit_for_bit(ckpt, tmp_path, saved_weights):
    """`loopnet export` then `loopnet.load` of the folder: the weights as the checkpoint holds them (read from
    the safetensors, the shared head stored once and tied again), with the run's tokenizer."""
    from loopnet.formats.hf import export

    folder = tmp_path / "exported"
    export(ckpt, folder)
    model = loopnet.load(folder)
    same_weights(model, saved_weights)
    assert model.network.lm_head.weight is model.network.wte.weight
    assert isinstance(model.tokenizer, GPT2Vocab)  # the run's data.vocab
    assert not model.network.training


def one_line(error, *fragments):
    message = str(error.value)
    assert "\n" not in message and "fix:" in message, message
    for fragment in fragments:
        assert fragment in message, message


def test_what_is_not_a_checkpoint_is_refused_in_one_line(run_root, ckpt, tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        loopnet.load(tmp_path / "nothing.ckpt")
    one_line(err, "does not exist")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError) as err:
        loopnet.load(tmp_path / "empty")
    one_line(err, "is not a loopnet checkpoint, run folder or exported folder")
    with pytest.raises(ValueError) as err:  # the folder of the runs: one of them is named
        loopnet.load(run_root / "runs")
    one_line(err, f"e.g. {ckpt}")
    notes = tmp_path / "notes.txt"
    notes.write_text("not a checkpoint")
    with pytest.raises(ValueError) as err:
        loopnet.load(notes)
    one_line(err, "is not a readable checkpoint")
    plain = tmp_path / "plain.ckpt"
    torch.save({"weights": torch.zeros(2)}, plain)
    with pytest.raises(ValueError) as err:
        loopnet.load(plain)
    assert "is not a Lightning checkpoint" in str(err.value) and "\n" not in str(err.value)
    sharded = tmp_path / "sharded.ckpt"
    sharded.mkdir()
    torch.save({"hyper_parameters": {}}, sharded / "meta.pt")
    with pytest.raises(ValueError) as err:
        loopnet.load(sharded)
    one_line(err, "sharded (FSDP)", "consolidate_checkpoint")
    with pytest.raises(ValueError) as err:
        loopnet.load(ckpt, dtype=torch.int64)
    one_line(err, "not a floating-point torch dtype")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError) as err:
            loopnet.load(ckpt, device="cuda")
        one_line(err, "CUDA is not available")


def test_a_run_folder_with_several_versions_is_refused(ckpt, tmp_path):
    for version in ("version_0", "version_1"):
        (tmp_path / "run" / version / "checkpoints").mkdir(parents=True)
        (tmp_path / "run" / version / "checkpoints" / "last.ckpt").write_bytes(ckpt.read_bytes())
    with pytest.raises(ValueError) as err:
        loopnet.load(tmp_path / "run")
    one_line(err, "2 versions (version_0, version_1)", str(tmp_path / "run" / "version_1"))
    assert loopnet.load(tmp_path / "run" / "version_1").config.n_rounds == 3


def test_import_loopnet_stays_light():
    """`import loopnet` loads neither torch nor Lightning; `loopnet.load` brings the API when first used."""
    code = (
        "import sys, loopnet; print(loopnet.__file__, sorted({'torch', 'lightning'} & set(sys.modules)), "
        "'load' in dir(loopnet))"
    )
    out = run_command([sys.executable, "-c", code], env=env()).stdout.split()
    assert out == [str(ROOT / "loopnet" / "__init__.py"), "[]", "True"]


def test_the_weights_are_used_as_read_on_their_own_device_and_dtype(ckpt):
    """The checkpoint's tensors (memory-mapped by the restricted loader) become the parameters: no copy of the
    weights unless the dtype (or device) asks for one."""
    from loopnet.checkpoints import build_network
    from loopnet.checkpoints import load_checkpoint_meta, model_weights

    config, weights = model_weights(load_checkpoint_meta(str(ckpt)), ckpt)
    params = dict(build_network(config, weights).named_parameters())
    assert params and all(p.data_ptr() == weights[name].data_ptr() for name, p in params.items())
    halves = dict(build_network(config, weights, dtype=torch.bfloat16).named_parameters())
    assert all(p.data_ptr() != weights[name].data_ptr() for name, p in halves.items())
