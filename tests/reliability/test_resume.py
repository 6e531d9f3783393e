"""Exact resume: a run stopped at step S and resumed logs the same loss at every later step as the
uninterrupted run, compared exactly, from either kind of checkpoint (the interruption checkpoint
written between steps, and last.ckpt written at a validation)."""

import json
import shutil

import pytest
import torch

from .helpers import RUN, TINY, SignalAt, callbacks, event_files, load, loopnet, scalars, snapshot

pytestmark = pytest.mark.slow

# Dropout on, so the resumed run must also continue the RNG streams, not only weights and data.
ARGS = [*TINY, "--model.config.dropout", "0.1"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("reference")
    res = loopnet("fit", *ARGS, cwd=cwd)
    assert res.code == 0, res.err[-3000:]
    losses = scalars(cwd / "runs" / RUN / "version_0")
    assert sorted(losses) == list(range(8))
    return losses


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """The same run, stopped by SIGTERM at the end of step 6 (after the validation at step 4)."""
    cwd = tmp_path_factory.mktemp("interrupted")
    res = loopnet("fit", *ARGS, *callbacks((SignalAt, {"step": 6})), cwd=cwd)
    assert res.code == 0, res.err[-3000:]
    ckpts = cwd / "runs" / RUN / "version_0" / "checkpoints"
    assert "stopped at step 6" in res.err and "--ckpt_path last" in res.err
    shutil.copy(ckpts / "last.ckpt", cwd / "step4.ckpt")  # the resumed run overwrites last.ckpt
    return cwd


def test_checkpoint_carries_the_whole_training_state(interrupted):
    ckpts = interrupted / "runs" / RUN / "version_0" / "checkpoints"
    for name, step in (("last-interrupted.ckpt", 6), ("last.ckpt", 4)):
        assert torch.serialization.get_unsafe_globals_in_checkpoint(str(ckpts / name)) == []  # plain data only
        ckpt = load(ckpts / name)  # with the restricted unpickler
        assert ckpt["global_step"] == step
        assert ckpt["state_dict"] and ckpt["optimizer_states"][0]["state"]
        assert ckpt["lr_schedulers"][0]["last_epoch"] == step
        (rng,) = ckpt["rng_states"]  # one per rank
        assert {"torch", "cuda", "numpy", "python"} <= set(rng)
        data = ckpt["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]
        assert data["ranks"][0]["consumed"] == step  # the data position: batches trained on


def test_resume_from_interruption_matches_uninterrupted_run(reference, interrupted):
    ckpts = interrupted / "runs" / RUN / "version_0" / "checkpoints"
    res = loopnet("fit", *ARGS, "--ckpt_path", "last", cwd=interrupted)
    assert res.code == 0, res.err[-3000:]
    assert "resuming from" in res.err and "last-interrupted.ckpt" in res.err  # the newer one: step 6, not 4
    assert not (interrupted / "runs" / RUN / "version_1").exists()  # continued in the same folder
    resumed = scalars(interrupted / "runs" / RUN / "version_0")
    assert resumed == reference  # every step, exactly: 0-5 before the stop, 6-7 after
    assert not (ckpts / "last-interrupted.ckpt").exists()  # removed once the fit completed
    assert load(ckpts / "last.ckpt")["global_step"] == 8
    # The run summary covers the whole run: the validation before the stop (step 4) is still in it.
    summary = json.loads((interrupted / "runs" / RUN / "version_0" / "summary.json").read_text())
    assert summary["status"] == "completed" and [s for s, _ in summary["val_history"]] == [4, 8]
    assert summary["best_val_loss"] == min(v for _, v in summary["val_history"])


def test_resume_from_validation_checkpoint_matches_uninterrupted_run(reference, interrupted, tmp_path):
    res = loopnet("fit", *ARGS, "--ckpt_path", str(interrupted / "step4.ckpt"), cwd=tmp_path)
    assert res.code == 0, res.err[-3000:]
    resumed = scalars(tmp_path / "runs" / RUN / "version_0")
    assert sorted(resumed) == [4, 5, 6, 7]
    assert resumed == {step: loss for step, loss in reference.items() if step >= 4}


def test_resume_without_rng_states_is_not_exact(reference, interrupted, tmp_path):
    """The RNG states matter (dropout): the same checkpoint without them diverges. Guards the test above."""
    ckpt = torch.load(interrupted / "step4.ckpt", weights_only=True)
    del ckpt["rng_states"]
    torch.save(ckpt, tmp_path / "no_rng.ckpt")
    # One step is enough: its loss is computed before any update, with this dropout mask.
    res = loopnet("fit", *ARGS, "--trainer.max_steps", "5", "--ckpt_path", str(tmp_path / "no_rng.ckpt"), cwd=tmp_path)
    assert res.code == 0, res.err[-3000:]
    resumed = scalars(tmp_path / "runs" / RUN / "version_0")
    assert sorted(resumed) == [4] and resumed[4] != reference[4]


def test_fit_without_ckpt_path_never_resumes(interrupted, tmp_path):
    """Only `--ckpt_path` resumes: a plain fit pointed at a folder holding last*.ckpt starts afresh
    (Lightning would turn it into ckpt_path="last" were the interruption callback an OnExceptionCheckpoint)."""
    shutil.copytree(interrupted / "runs", tmp_path / "runs")
    before = event_files(tmp_path / "runs" / RUN / "version_0")
    # (A fit pinned with --trainer.logger.init_args.version to that folder is refused: it would overwrite the run.)
    with pytest.warns(UserWarning, match="Checkpoint directory .* exists and is not empty"):  # Lightning's, rightly
        res = loopnet(
            "fit",
            *ARGS,
            "--trainer.max_steps",
            "2",
            "--checkpoint.dirpath",
            f"runs/{RUN}/version_0/checkpoints",
            cwd=tmp_path,
        )
    assert res.code == 0, res.err[-3000:]
    assert event_files(tmp_path / "runs" / RUN / "version_0") == before
    assert sorted(scalars(tmp_path / "runs" / RUN / "version_1")) == [0, 1]


def test_a_resume_with_no_step_left_keeps_the_newer_interruption_checkpoint(tmp_path):
    """Stopped at step 6 (last.ckpt at step 4), resumed with max_steps 6: no step runs, and the fit that
    completes keeps last-interrupted.ckpt, the newest weights, and its summary names it."""
    cwd = tmp_path
    res = loopnet("fit", *ARGS, *callbacks((SignalAt, {"step": 6})), cwd=cwd)
    assert res.code == 0 and "stopped at step 6" in res.err, res.err[-3000:]
    ckpts = cwd / "runs" / RUN / "version_0" / "checkpoints"
    # Below the step reached: refused in one line before the fit, the run folder untouched.
    before = snapshot(cwd / "runs")
    res = loopnet("fit", *ARGS, "--trainer.max_steps", "5", "--ckpt_path", "last", cwd=cwd)
    assert res.code != 0 and "--trainer.max_steps 5 is below step 6" in res.last_err_line, res.err[-3000:]
    assert "Traceback" not in res.err and snapshot(cwd / "runs") == before
    res = loopnet("fit", *ARGS, "--trainer.max_steps", "6", "--ckpt_path", "last", cwd=cwd)
    assert res.code == 0, res.err[-3000:]
    assert load(ckpts / "last-interrupted.ckpt")["global_step"] == 6 and load(ckpts / "last.ckpt")["global_step"] == 4
    summary = json.loads((cwd / "runs" / RUN / "version_0" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["global_step"] == 6
    assert summary["last_checkpoint"] == str(ckpts / "last-interrupted.ckpt")
    # Resumed to the end, the fit passes it (last.ckpt at step 8), and removes it.
    res = loopnet("fit", *ARGS, "--ckpt_path", "last", cwd=cwd)
    assert res.code == 0, res.err[-3000:]
    assert not (ckpts / "last-interrupted.ckpt").exists() and load(ckpts / "last.ckpt")["global_step"] == 8
