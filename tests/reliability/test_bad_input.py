"""The bad-input matrix, one test per row: each gives a one-line error on stderr that names the
problem and the fix, exits non-zero (2), and leaves every file already written intact."""

import shutil

import pytest

from .helpers import RUN, SHORT, finished_run, load, loopnet, snapshot

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def prior(tmp_path_factory):
    """A folder holding a finished run (checkpoints, events, config, summary) and some inputs."""
    cwd = tmp_path_factory.mktemp("prior")
    finished_run(cwd)
    (cwd / "malformed.yaml").write_text("model:\n  config: [d_model: 32\ntrainer:\n  max_steps: 2\n")
    (cwd / "unknown_key.yaml").write_text("trainer:\n  max_stepz: 5\n")
    (cwd / "empty.txt").write_text("")
    (cwd / "a_file").write_text("not a folder\n")
    good = (cwd / "runs" / RUN / "version_0" / "checkpoints" / "last.ckpt").read_bytes()
    (cwd / "corrupt.ckpt").write_bytes(good[: len(good) // 3])  # a checkpoint cut short
    return cwd


def check(res, problem: str, fix: str) -> None:
    assert res.code == 2, (res.code, res.err[-3000:])
    assert "Traceback" not in res.err, res.err[-3000:]
    line = res.last_err_line
    assert line.startswith("loopnet: error: "), res.err[-3000:]
    assert problem in line, line
    assert fix in line, line


@pytest.fixture
def unchanged(prior):
    """Asserts after the test that every file of the prior run is byte-identical (new files may appear)."""
    before = snapshot(prior)
    yield prior
    after = snapshot(prior)
    assert {k: after.get(k) for k in before} == before


def test_malformed_yaml(unchanged):
    res = loopnet("fit", *SHORT, "--config", "malformed.yaml", cwd=unchanged)
    check(res, "the config file malformed.yaml is not valid YAML", "fix: correct its syntax")
    assert "line 3" in res.last_err_line  # where the flow sequence breaks


def test_unknown_key(unchanged):
    res = loopnet("fit", *SHORT, "--config", "unknown_key.yaml", cwd=unchanged)
    check(res, "does not accept option 'trainer.max_stepz'", "did you mean 'trainer.max_steps'?")


def test_unknown_key_on_the_command_line(unchanged):
    res = loopnet("fit", *SHORT, "--model.config.n_raunds", "3", cwd=unchanged)
    check(res, "--model.config.n_raunds", "did you mean 'model.config.n_rounds'?")


def test_wrong_type(unchanged):
    res = loopnet("fit", *SHORT, "--trainer.max_steps", "many", cwd=unchanged)
    check(res, "Parser key \"trainer.max_steps\": Expected a <class 'int'>. Got value: many", "of the expected type")


def test_impossible_shapes(unchanged):
    res = loopnet("fit", *SHORT, "--model.config.d_model", "33", cwd=unchanged)
    check(res, "d_model=33 is not divisible by n_heads=2", "pick n_heads among the divisors")


def test_data_glob_matching_nothing(unchanged):
    res = loopnet("fit", *SHORT, "--data.source", "files", "--data.path", "corpus/*.txt", cwd=unchanged)
    check(res, "No file matches 'corpus/*.txt'", "Fix: check the path or glob")


def test_empty_corpus(unchanged):
    res = loopnet("fit", *SHORT, "--data.source", "files", "--data.path", "empty.txt", cwd=unchanged)
    check(res, "The corpus is empty: 1 document(s), none with text", "Fix: point data.path at files that hold text")


def test_corrupt_checkpoint(unchanged):
    res = loopnet("fit", *SHORT, "--ckpt_path", "corrupt.ckpt", cwd=unchanged)
    check(res, "corrupt.ckpt is not a readable checkpoint, it is corrupt or truncated", "fix: pass another one")


def test_corrupt_last_checkpoint(prior, tmp_path):
    """`--ckpt_path last` checks the checkpoint it picks as thoroughly as a given path."""
    shutil.copytree(prior / "runs", tmp_path / "runs")
    last = tmp_path / "runs" / RUN / "version_0" / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[:1000])
    before = snapshot(tmp_path)
    res = loopnet("fit", *SHORT, "--ckpt_path", "last", cwd=tmp_path)
    check(res, "version_0/checkpoints/last.ckpt is not a readable checkpoint", "fix: pass another one")
    assert snapshot(tmp_path) == before


def test_checkpoint_from_another_config(unchanged):
    # Another width names another run folder (run_folders.run_name): pinned to the prior run's, `last` finds its checkpoint.
    res = loopnet(
        "fit",
        *SHORT,
        "--model.config.d_model",
        "64",
        "--trainer.logger.init_args.name",
        RUN,
        "--ckpt_path",
        "last",
        cwd=unchanged,
    )
    check(res, "another model config (d_model: checkpoint 32 vs config 64)", "run with the config saved beside it")


def test_missing_checkpoint(unchanged):
    res = loopnet("test", *SHORT, "--ckpt_path", "runs/nope.ckpt", cwd=unchanged)
    check(res, "--ckpt_path runs/nope.ckpt does not exist", "give a .ckpt file")


def test_unwritable_log_folder(unchanged):
    # Running as root, permission bits do not stop writes; a path under a regular file fails for everyone.
    res = loopnet("fit", *SHORT, "--trainer.logger.init_args.save_dir", "a_file/runs", cwd=unchanged)
    check(
        res,
        "cannot write to the folder a_file/runs given by --trainer.logger.init_args.save_dir (Not a directory)",
        "fix: pass a writable folder",
    )


def test_unwritable_checkpoint_folder(unchanged):
    res = loopnet("fit", *SHORT, "--checkpoint.dirpath", "a_file/ckpts", cwd=unchanged)
    check(res, "cannot write to the folder a_file/ckpts given by --checkpoint.dirpath", "fix: pass a writable folder")


def test_prior_run_still_loads(prior):
    assert load(prior / "runs" / RUN / "version_0" / "checkpoints" / "last.ckpt")["global_step"] == 2


def test_resume_on_another_data_stream_is_refused_before_anything_is_written(unchanged):
    # Found by a walkthrough: this was refused only at the restore, after the finished run's summary.json
    # (status "interrupted", no losses) and config.yaml had been overwritten.
    versions = sorted((unchanged / "runs" / RUN).iterdir())
    res = loopnet("fit", *SHORT, "--data.batch_size", "2", "--ckpt_path", "last", cwd=unchanged)
    check(
        res,
        "was trained on another data stream (checkpoint, now): {'batch_size': (4, 2)}",
        "fix: resume with the data settings it was trained with",
    )
    assert sorted((unchanged / "runs" / RUN).iterdir()) == versions  # no new log folder either


def test_resume_that_fails_at_the_restore_keeps_the_run_summary(unchanged, monkeypatch):
    """Checks that only the restore can make (the device count, the hub commit) still fail late: the
    finished run's summary is kept, not replaced by an 'interrupted' one without losses."""
    from loopnet.data.errors import DataConfigError
    from loopnet.data.stream import ResumableLoader

    def refuse(self, state_dict):
        raise DataConfigError("The checkpoint's data state is for 2 ranks, this run has 1")

    monkeypatch.setattr(ResumableLoader, "load_state_dict", refuse)
    summary = unchanged / "runs" / RUN / "version_0" / "summary.json"
    before = summary.read_bytes()
    with pytest.warns(UserWarning, match="the resumed run stopped before its first step .* is kept as it was"):
        res = loopnet("fit", *SHORT, "--trainer.max_steps", "4", "--ckpt_path", "last", cwd=unchanged)
    assert res.code == 2 and "data state is for 2 ranks" in res.last_err_line, res.err[-3000:]
    assert summary.read_bytes() == before


@pytest.mark.parametrize("sub", ["test", "validate", "predict"])
def test_evaluation_needs_a_checkpoint(tmp_path, sub):
    res = loopnet(sub, *SHORT, cwd=tmp_path)
    check(
        res,
        f"`loopnet {sub}` needs --ckpt_path: without one it would run the model with its random initial weights",
        "fix: --ckpt_path runs/<run>/version_N/checkpoints/last.ckpt",
    )
    assert not (tmp_path / "runs").exists()


def test_evaluation_of_last_takes_the_newest_checkpoint_of_the_run(unchanged):
    res = loopnet("test", *SHORT, "--ckpt_path", "last", cwd=unchanged)
    assert res.code == 0, res.err[-3000:]
    assert (
        f"loopnet: evaluating {unchanged}/runs/{RUN}/version_0/checkpoints/last.ckpt" in res.err
    )  # save_dir made absolute
    res = loopnet("test", *SHORT, "--model.config.n_rounds", "3", "--ckpt_path", "last", cwd=unchanged)
    check(
        res,
        f"--ckpt_path last: no {unchanged}/runs/deeploop_carry_k2_r3_d32_h2_ctx32/version_*/checkpoints/last*.ckpt",
        "fix: give the .ckpt file with --ckpt_path",
    )
    res = loopnet("test", *SHORT, "--trainer.logger.init_args.version", "0", "--ckpt_path", "last", cwd=unchanged)
    assert res.code == 0 and f"evaluating {unchanged}/runs/{RUN}/version_0/checkpoints/last.ckpt" in res.err, res.err[
        -3000:
    ]
    res = loopnet("test", *SHORT, "--ckpt_path", "best", cwd=unchanged)
    check(res, "--ckpt_path best names a checkpoint of a fit in this process", "fix: give the .ckpt file")


def test_scaled_residual_without_p(tmp_path):
    res = loopnet("fit", *SHORT, "--model.config.residual", "scaled", cwd=tmp_path)
    check(res, "LoopConfig.residual='scaled' needs p > 0", "e.g. p: 0.4")
    assert not (tmp_path / "runs").exists()


def test_missing_config_file(tmp_path):
    res = loopnet("fit", "--config", "nope.yaml", cwd=tmp_path)
    check(res, "nope.yaml", "check the path given with --config")


def test_summary_is_readable_like_the_checkpoints(prior):
    run = prior / "runs" / RUN / "version_0"
    assert (run / "summary.json").stat().st_mode & 0o777 == (run / "checkpoints" / "last.ckpt").stat().st_mode & 0o777


# Each of these failed only after `fit` had created runs/<run>/version_N with an
# "interrupted" summary.json (the vocabulary one with an IndexError in the first step).
DATA_ERRORS = {
    "empty": (b"", "The corpus is empty", "Fix: point data.path at files that hold text"),
    "whitespace": (b"  \n\n\t \n", "The corpus is empty", "Fix: point data.path at files that hold text"),
    "binary": (bytes(range(256)) * 8, "is not valid UTF-8", "Fix: re-encode it as UTF-8"),
    "latin1": ("Ça va très bien, Hélène. ".encode("latin-1") * 50, "is not valid UTF-8", "Fix: re-encode it"),
    "one_document": (
        b"To be or not to be, that is the question. " * 40,
        "so val_fraction 0.0005 selects none",
        "Fix: cut the files into documents with data.sample_by: paragraph",
    ),
}


@pytest.mark.parametrize("kind", list(DATA_ERRORS))
def test_unusable_corpus_fails_before_anything_is_written(tmp_path, kind):
    data, problem, fix = DATA_ERRORS[kind]
    (tmp_path / "corpus.txt").write_bytes(data)
    res = loopnet("fit", *SHORT, "--data.source", "files", "--data.path", "corpus.txt", cwd=tmp_path)
    check(res, problem, fix)
    assert not (tmp_path / "runs").exists()


def test_corpus_all_held_out_fails_before_anything_is_written(tmp_path):
    (tmp_path / "corpus.txt").write_text("To be or not to be, that is the question. " * 40)
    res = loopnet(
        "fit",
        *SHORT,
        "--data.source",
        "files",
        "--data.path",
        "corpus.txt",
        "--data.val_fraction",
        "0.999",
        cwd=tmp_path,
    )
    check(res, "the training split has 0 tokens per epoch", "Fix: add data")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "args, problem, fix",
    [
        (
            ["--data.source", "hub"],
            "offline mode is set",
            "fix: read the embedded corpus with `--data.source shakespeare`",
        ),
        (["--trainer.max_steps", "0"], "--trainer.max_steps 0 trains no step", "fix: give max_steps ≥ 1"),
        (
            ["--model.config.vocab_size", "1000"],
            "model.config.vocab_size=1000 is smaller than the data's 50257 token ids",
            "fix: set model.config.vocab_size to at least 50257",
        ),
        (
            [
                "--data.vocab",
                "compact",
                "--model.config.vocab_size",
                "1000",
            ],  # its size is known once the corpus is read
            "model.config.vocab_size=1000 is smaller than the data's 19083 token ids (data.vocab: compact)",
            "fix: set model.config.vocab_size to at least 19083",
        ),
    ],
)
def test_bad_run_settings_fail_before_anything_is_written(tmp_path, args, problem, fix):
    res = loopnet("fit", *SHORT, *args, cwd=tmp_path)
    check(res, problem, fix)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("sub", ["test", "fit"])
def test_last_is_refused_when_several_versions_hold_checkpoints(prior, tmp_path, sub):
    """`--ckpt_path last` took the newest last*.ckpt by file time across versions, so a
    later short fit silently replaced the model `loopnet test` evaluated (or `fit` resumed)."""
    shutil.copytree(prior / "runs", tmp_path / "runs")
    run = tmp_path / "runs" / RUN
    shutil.copytree(run / "version_0", run / "version_9")  # a later fit of the same run name
    before = snapshot(tmp_path)
    res = loopnet(sub, *SHORT, "--ckpt_path", "last", cwd=tmp_path)
    check(
        res,
        f"--ckpt_path last is ambiguous: 2 versions of {tmp_path}/runs/{RUN} hold a last*.ckpt: "
        "version_0 (completed at step 2), version_9 (completed at step 2)",
        "fix: pick one with --trainer.logger.init_args.version N (e.g. 9), or give the .ckpt file",
    )
    assert snapshot(tmp_path) == before
    if sub == "test":
        res = loopnet(sub, *SHORT, "--trainer.logger.init_args.version", "0", "--ckpt_path", "last", cwd=tmp_path)
        assert res.code == 0 and f"evaluating {tmp_path}/runs/{RUN}/version_0/checkpoints/last.ckpt" in res.err, (
            res.err[-3000:]
        )


def test_option_prefix_is_not_taken_for_the_option(tmp_path):
    """`--model.config.n_round 3` ran a whole R = 3 fit (argparse's abbreviations)."""
    res = loopnet("fit", *SHORT, "--model.config.n_round", "3", cwd=tmp_path)
    check(res, "--model.config.n_round", "did you mean 'model.config.n_rounds'?")
    assert not (tmp_path / "runs").exists()
