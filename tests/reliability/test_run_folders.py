"""What commands leave in `runs/`: evaluations add no version folder and never touch a
fit's files, a finished run is not overwritten, a config.yaml link is not written through, a fit that
fails in its first step leaves no empty version folder."""

import contextlib
import io
import json
import shutil
import sys

import pytest
import torch

from .helpers import RUN, SHORT, RaiseAt, callbacks, finished_run, loopnet, snapshot

pytestmark = pytest.mark.slow


def scalar_tags(folder) -> set[str]:
    """The scalar tags TensorBoard reads in `folder` (one run: its own event files only)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return set(acc.Tags()["scalars"])


def failing_fit(cwd, step: int) -> str:
    """`loopnet fit` of SHORT in `cwd` (in this process) that runs out of memory in training step `step`;
    the error propagates as it does from the command. Returns what it printed on stderr."""
    from loopnet.training.cli import main

    err, argv = io.StringIO(), sys.argv
    sys.argv = ["loopnet"]
    try:
        with (
            contextlib.chdir(cwd),
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(err),
            pytest.raises(torch.OutOfMemoryError, match="CUDA out of memory"),
        ):
            main(["fit", *SHORT, "--trainer.max_steps", "4", *callbacks((RaiseAt, {"step": step}))])
    finally:
        sys.argv = argv
    return err.getvalue()


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("finished")
    (cwd / "fit.err").write_text(finished_run(cwd).err)
    return cwd


def test_a_fit_says_where_its_run_went(finished):
    """Fits never printed where the run folder, checkpoints and summary went."""
    lines = (finished / "fit.err").read_text().splitlines()
    folder = f"{finished}/runs/{RUN}/version_0"  # save_dir is made absolute: the same path on every node
    assert f"loopnet: run folder: {folder} (curves: tensorboard --logdir {finished}/runs)" in lines
    assert (
        f"loopnet: checkpoints: last {folder}/checkpoints/last.ckpt, best {folder}/checkpoints/best-step000002.ckpt"
        in lines
    )
    assert f"loopnet: summary: {folder}/summary.json" in lines


@pytest.fixture
def run(finished, tmp_path):
    shutil.copytree(finished / "runs", tmp_path / "runs")
    return tmp_path


def test_evaluations_log_beside_the_fit_without_a_new_version(run):
    version = run / "runs" / RUN / "version_0"
    before = snapshot(version)
    for sub in ("test", "validate"):
        res = loopnet(sub, *SHORT, "--ckpt_path", f"runs/{RUN}/version_0/checkpoints/last.ckpt", cwd=run)
        assert res.code == 0, res.err[-3000:]
    res = loopnet("test", *SHORT, "--ckpt_path", "last", cwd=run)
    assert res.code == 0, res.err[-3000:]
    assert sorted(p.name for p in (run / "runs" / RUN).iterdir()) == ["version_0"]
    after = snapshot(version)
    assert {k: after[k] for k in before} == before  # the fit's own files are untouched
    assert (version / "test" / "test_config.yaml").is_file() and (
        version / "validate" / "validate_config.yaml"
    ).is_file()
    assert not list(version.rglob("TrainerFn*"))
    # TensorBoard: test's scalars join the fit's run (no `test/` run); validate, which logs the fit's own
    # val/ tags, stays a run of its own.
    runs = {p.parent.relative_to(version).as_posix() for p in version.rglob("events.out.tfevents.*")}
    assert runs == {".", "validate"}
    tags = scalar_tags(version)
    assert {"train/loss", "val/loss", "test/loss"} <= tags
    assert "test/loss" not in scalar_tags(version / "validate") and "val/loss" in scalar_tags(version / "validate")


def test_evaluations_of_a_checkpoint_elsewhere_log_beside_its_run(run):
    """A checkpoint of a run with its own name and save_dir, evaluated without repeating either, goes into that
    run's folder (not a new `runs/<default name>/`)."""
    version = run / "elsewhere" / "my_name" / "version_0"
    version.parent.mkdir(parents=True)
    (run / "runs" / RUN / "version_0").rename(version)
    for sub in ("predict", "test"):
        res = loopnet(
            sub,
            *SHORT,
            "--ckpt_path",
            str(version / "checkpoints" / "last.ckpt"),
            "--model.generate.max_new_tokens",
            "2",
            cwd=run,
        )
        assert res.code == 0, res.err[-3000:]
        assert (version / sub / f"{sub}_config.yaml").is_file()
    assert (version / "predict" / "predictions.txt").is_file()
    assert sorted(p.name for p in (run / "elsewhere" / "my_name").iterdir()) == ["version_0"]
    assert not list((run / "runs").rglob("*.yaml"))  # nothing under the default run name


def test_a_fit_pinned_to_a_finished_run_is_refused(run):
    before = snapshot(run)
    res = loopnet("fit", *SHORT, "--trainer.logger.init_args.version", "0", cwd=run)
    assert res.code == 2, res.err[-3000:]
    assert res.last_err_line.startswith(
        f"loopnet: error: {run}/runs/{RUN}/version_0 already holds a run (config.yaml, summary.json, checkpoints)"
    ), res.err[-3000:]
    assert "fix: resume it with --ckpt_path last" in res.last_err_line
    assert snapshot(run) == before


def test_a_config_link_is_replaced_not_written_through(run):
    target = run / "elsewhere.yaml"
    target.write_text("precious\n")
    config = run / "runs" / RUN / "version_0" / "config.yaml"
    config.unlink()
    config.symlink_to(target)
    res = loopnet("fit", *SHORT, "--trainer.max_steps", "3", "--ckpt_path", "last", cwd=run)
    assert res.code == 0, res.err[-3000:]
    assert target.read_text() == "precious\n"
    assert not config.is_symlink() and "max_steps: 3" in config.read_text()


def test_predict_prints_and_saves_the_text(run):
    """`predict` printed into the progress bar and saved nothing."""
    res = loopnet(
        "predict",
        *SHORT,
        "--ckpt_path",
        "last",
        "--model.generate.max_new_tokens",
        "4",
        "--model.generate.prompt",
        "To be",
        "--trainer.enable_progress_bar",
        "true",
        cwd=run,
    )
    assert res.code == 0, res.err[-3000:]
    saved = run / "runs" / RUN / "version_0" / "predict" / "predictions.txt"
    text = saved.read_text().rstrip("\n")
    assert text.startswith("To be") and res.out.splitlines()[-1] == text.splitlines()[-1]
    assert f"loopnet: saved the generated text to {run}/runs/{RUN}/version_0/predict/predictions.txt" in res.err
    assert not list(saved.parent.glob("events.out.tfevents.*"))  # no `predict/` run in TensorBoard


def test_a_fit_failing_in_its_first_step_leaves_no_empty_run_folder(run):
    """Failed starts each added a version_N (6 empty runs of 14 in TensorBoard): a fit past the
    start-up checks that fails in step 1 removes the version folder it created; earlier runs stay as they were."""
    before = snapshot(run / "runs")
    err = failing_fit(run, step=0)
    assert sorted(p.name for p in (run / "runs" / RUN).iterdir()) == ["version_0"]
    assert snapshot(run / "runs") == before
    (line,) = [l for l in err.splitlines() if "removed the run folder" in l]
    assert line == (
        f"loopnet: the fit failed before its first step completed (OutOfMemoryError: CUDA out of memory. "
        f"Tried to allocate 2.00 GiB (forced by the test)); removed the run folder it had created, "
        f"runs/{RUN}/version_1 (no checkpoint, no step)"
    )


def test_a_fit_failing_later_keeps_its_record(tmp_path):
    """In a fresh folder the run-name folder and `runs/` it made go too; a fit that failed after completing
    steps keeps its folder and the summary that names the error."""
    failing_fit(tmp_path, step=0)
    assert not (tmp_path / "runs").exists()
    err = failing_fit(tmp_path, step=1)
    assert "removed the run folder" not in err
    summary = json.loads((tmp_path / "runs" / RUN / "version_0" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["global_step"] == 1
    assert "OutOfMemoryError" in summary["error"]
