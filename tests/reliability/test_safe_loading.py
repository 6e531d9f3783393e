"""Safe loading: checkpoints are read with torch's restricted (weights_only) unpickler, so one
carrying pickled code is refused with a clear error, and the code never runs."""

import os
import uuid

import pytest
import torch

from loopnet.model import LoopConfig
from loopnet.checkpoints import load_checkpoint_meta
from loopnet.training.module import OptimConfig

from .helpers import RUN, TINY, loopnet

pytestmark = pytest.mark.slow

SHORT = [*TINY, "--trainer.max_steps", "2", "--trainer.val_check_interval", "2"]


class Payload:
    """Unpickling this runs a shell command (the classic malicious-pickle shape)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture
def evil(tmp_path):
    marker = tmp_path / f"pwned_{uuid.uuid4().hex}"
    path = tmp_path / "evil.ckpt"
    # Looks like a Lightning checkpoint of this very config, with the payload in its hyperparameters.
    torch.save({"state_dict": {}, "global_step": 0, "hyper_parameters": {"config": Payload(marker)}}, path)
    return path, marker


def test_the_payload_is_real(evil):
    path, marker = evil
    torch.load(path, weights_only=False)  # what an unrestricted load would do
    assert marker.exists()


@pytest.mark.parametrize("subcommand", ["fit", "validate", "test", "predict"])
def test_checkpoint_with_code_is_refused(subcommand, evil, tmp_path):
    path, marker = evil
    res = loopnet(subcommand, *SHORT, "--ckpt_path", str(path), cwd=tmp_path)
    assert res.code == 2
    line = res.last_err_line
    assert line.startswith(
        f"loopnet: error: refused to load {path}: unpickling it would import or run code (posix.system)"
    )
    assert "fix: use a checkpoint written by `loopnet fit`" in line
    assert not marker.exists()  # nothing ran


def test_last_checkpoint_with_code_is_refused(evil, tmp_path):
    """`fit --ckpt_path last` checks the file it picks the same way."""
    path, marker = evil
    folder = tmp_path / "runs" / RUN / "version_0" / "checkpoints"
    folder.mkdir(parents=True)
    os.replace(path, folder / "last.ckpt")
    res = loopnet("fit", *SHORT, "--ckpt_path", "last", cwd=tmp_path)
    assert res.code == 2 and "refused to load" in res.last_err_line and "posix.system" in res.last_err_line
    assert not marker.exists()


def test_trainer_loads_with_weights_only_by_default(evil, tmp_path, monkeypatch):
    """Below the CLI's own checks (the early one and the CLI's, both switched off here), the Trainer's own
    loading is restricted too: the CLI passes weights_only=True to fit/validate/test/predict unless told
    otherwise."""
    import pickle

    import loopnet.checkpoints as checkpoints
    import loopnet.training.resume as resume

    path, marker = evil
    monkeypatch.setattr(resume, "check_for_command", lambda *args: None)
    monkeypatch.setattr(checkpoints, "check_checkpoint", lambda *args: {})
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        loopnet("test", *SHORT, "--ckpt_path", str(path), cwd=tmp_path)
    assert not marker.exists()


def load_hparams(path: str) -> dict:
    """A checkpoint's hyperparameters, read with torch's restricted (weights_only) unpickler."""
    return load_checkpoint_meta(path).get("hyper_parameters", {})


def test_loopnet_config_types_are_allow_listed(tmp_path):
    """A checkpoint holding loopnet's config dataclasses (not only dicts) still loads restricted."""
    path = tmp_path / "dataclasses.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {"config": LoopConfig(n_rounds=3), "optim": OptimConfig()}}, path)
    hparams = load_hparams(str(path))
    assert hparams["config"].n_rounds == 3 and isinstance(hparams["optim"], OptimConfig)
