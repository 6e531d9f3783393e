"""loopnet.checkpoints in-process (quick): the restricted loader (weights_only passed explicitly, a
pickle that runs code refused before it runs), the checks of a checkpoint file and its config, the
weights `loopnet eval` reads, what `--ckpt_path last` finds, and the run folder's lock."""

import os
import uuid
from pathlib import Path

import pytest
import torch
from jsonargparse import Namespace

from loopnet import checkpoints as ck
from tests.helpers import tiny_config


class Payload:
    """Unpickling this runs a shell command (the classic malicious-pickle shape)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def save(path: Path, obj) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(obj, path)
    return path


def config_dict(**overrides) -> dict:
    import dataclasses

    return dataclasses.asdict(tiny_config(**overrides))


# ----------------------------------------------------------------------------------------- reading
def test_a_pickle_that_runs_code_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / f"pwned_{uuid.uuid4().hex}"
    path = save(tmp_path / "evil.ckpt", {"state_dict": {}, "hyper_parameters": {"config": Payload(marker)}})
    with pytest.raises(ValueError) as err:
        ck.load_checkpoint_meta(str(path))
    assert str(err.value) == (
        f"refused to load {path}: unpickling it would import or run code (posix.system), which loopnet's restricted "
        "(weights_only) loader does not allow; fix: use a checkpoint written by `loopnet fit`, and never load files "
        "from untrusted sources"
    )
    assert not marker.exists()


def test_the_loader_asks_torch_for_weights_only_explicitly(tmp_path, monkeypatch):
    """Explicit, whatever torch's default (False before torch 2.6)."""
    calls = []
    real = torch.load

    def recording(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "load", recording)
    path = save(tmp_path / "ok.ckpt", {"state_dict": {"w": torch.ones(2)}, "global_step": 3})
    ckpt = ck.load_checkpoint_meta(str(path))
    assert ckpt["global_step"] == 3 and torch.equal(ckpt["state_dict"]["w"], torch.ones(2))
    assert len(calls) == 1 and calls[0]["weights_only"] is True and calls[0]["map_location"] == "cpu"
    assert calls[0]["mmap"] is True  # a check: the tensors stay on disk, only the pickled metadata is read


def test_unreadable_files_are_named_with_the_fix(tmp_path):
    good = save(tmp_path / "good.ckpt", {"state_dict": {"w": torch.zeros(1000)}})
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(good.read_bytes()[:200])
    with pytest.raises(
        ValueError,
        match=rf"^{cut} is not a readable checkpoint, it is corrupt or truncated \(\w+: .+\); "
        r"fix: pass another one with --ckpt_path, e\.g\. best-\*\.ckpt",
    ):
        ck.load_checkpoint_meta(str(cut))
    empty = tmp_path / "empty.ckpt"
    empty.touch()
    with pytest.raises(
        ValueError, match=rf"^{empty} is empty \(0 bytes\), not a checkpoint: its write never completed"
    ):
        ck.load_checkpoint_meta(str(empty))
    for obj in ({"weights": {}}, [1, 2]):
        path = save(tmp_path / "plain.ckpt", obj)
        with pytest.raises(
            ValueError,
            match=rf"^{path} is not a Lightning checkpoint \(no state_dict\); give a \.ckpt "
            "written by loopnet fit$",
        ):
            ck.load_checkpoint_meta(str(path))


def test_a_sharded_checkpoint_is_read_from_its_meta_file(tmp_path):
    folder = tmp_path / "last.ckpt"
    save(folder / ck.SHARDED_META, {"global_step": 7})  # FSDP's meta.pt holds no state_dict
    assert ck.is_sharded_checkpoint(folder) and ck.is_sharded_checkpoint(str(folder))
    assert ck.load_checkpoint_meta(str(folder)) == {"global_step": 7}
    ck.check_checkpoint_file(str(folder))  # a folder, by design: accepted
    assert not ck.is_sharded_checkpoint(tmp_path)


def test_check_checkpoint_file(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(FileNotFoundError, match=rf"^--ckpt_path {run}/x.ckpt does not exist; fix: give a \.ckpt file"):
        ck.check_checkpoint_file(str(run / "x.ckpt"))
    folder = run / "version_0" / "checkpoints"
    folder.mkdir(parents=True)
    with pytest.raises(
        ValueError,
        match=rf"^--ckpt_path {folder} is a folder, not a checkpoint file; fix: give a "
        rf"\.ckpt file in it, e\.g\. {folder}/last\.ckpt$",
    ):
        ck.check_checkpoint_file(str(folder))  # none in it: the name to expect
    old, new = save(folder / "last.ckpt", {"state_dict": {}}), save(folder / "last-v1.ckpt", {"state_dict": {}})
    os.utime(old, (1000, 1000))
    for given in (folder, run / "version_0", run):  # checkpoints/, version or run folder: its newest last*.ckpt
        with pytest.raises(ValueError, match=rf"--opt {given} is a folder, not a checkpoint file; .* e\.g\. {new}$"):
            ck.check_checkpoint_file(str(given), option="--opt")
    empty = folder / "empty.ckpt"
    empty.touch()
    with pytest.raises(
        ValueError,
        match=rf"^{empty} is empty \(0 bytes\), not a checkpoint: its write never completed; "
        r"fix: pass another one with --ckpt_path, e\.g\. best-\*\.ckpt",
    ):
        ck.check_checkpoint_file(str(empty))
    ck.check_checkpoint_file(str(old))  # a file with bytes


# ----------------------------------------------------------------------------------------- config
def test_check_model_config_names_each_differing_field():
    current = config_dict()
    ck.check_model_config(None, current)
    ck.check_model_config(dict(current), current)
    ck.check_model_config(tiny_config(), current)  # a LoopConfig instance too
    # Run-time fields may differ.
    ck.check_model_config(
        config_dict(dropout=0.1, truncate_rounds=1, checkpoint_rounds=True, loss_rounds="all"), current
    )
    saved = config_dict(n_rounds=4, d_model=64)
    with pytest.raises(ValueError) as err:
        ck.check_model_config(saved, current)
    assert str(err.value) == (
        "the checkpoint was trained with another model config (d_model: checkpoint 64 vs config 32; "
        "n_rounds: checkpoint 4 vs config 3); run with the config saved beside it "
        "(runs/<run>/version_N/config.yaml), and use --model.eval_rounds to evaluate other round counts"
    )


def test_a_field_the_checkpoint_lacks_counts_as_its_default():
    current = config_dict()
    older = {k: v for k, v in current.items() if k != "sandwich"}
    ck.check_model_config(older, current)  # current sandwich is the default False
    with pytest.raises(ValueError, match=r"\(sandwich: checkpoint False vs config True\)"):
        ck.check_model_config(older, config_dict(sandwich=True))


def test_check_checkpoint_names_the_file(tmp_path):
    path = save(tmp_path / "a.ckpt", {"state_dict": {}, "hyper_parameters": {"config": config_dict(n_rounds=5)}})
    with pytest.raises(
        ValueError,
        match=rf"^{path}: the checkpoint was trained with another model config \(n_rounds: "
        "checkpoint 5 vs config 3\\)",
    ):
        ck.check_checkpoint(str(path), config_dict())
    assert ck.check_checkpoint(str(path), config_dict(n_rounds=5))["hyper_parameters"]["config"]["n_rounds"] == 5
    bare = save(tmp_path / "b.ckpt", {"state_dict": {}})
    assert ck.check_checkpoint(str(bare), config_dict()) == {"state_dict": {}}


# ----------------------------------------------------------------------------------------- weights
def test_model_weights_are_the_models_own_entries(tmp_path):
    config = config_dict()
    ckpt = {
        "hyper_parameters": {"config": config},
        "state_dict": {"model.wte.weight": torch.ones(2), "model.blocks.0.x": torch.zeros(1), "eval_loss.3.mean": 1},
    }
    got_config, weights = ck.model_weights(ckpt, tmp_path / "a.ckpt")
    assert got_config == config and set(weights) == {"wte.weight", "blocks.0.x"}
    assert ck.model_weights({**ckpt, "datamodule_hyper_parameters": {"vocab": "gpt2"}}, "a")[1].keys() == weights.keys()
    with pytest.raises(
        ValueError,
        match=r"^a\.ckpt was trained with data\.vocab: compact .* fix: evaluate a model "
        "trained with data.vocab: gpt2$",
    ):
        ck.model_weights({**ckpt, "datamodule_hyper_parameters": {"vocab": "compact"}}, "a.ckpt")
    for broken in ({"state_dict": {}}, {"hyper_parameters": {"config": config}}, [1]):
        with pytest.raises(
            ValueError,
            match=r"^b\.ckpt is not a loopnet checkpoint \(expected hyper_parameters\.config "
            r"and state_dict, as saved by loopnet fit\)$",
        ):
            ck.model_weights(broken, "b.ckpt")
    folder = tmp_path / "sharded.ckpt"
    save(folder / ck.SHARDED_META, {})
    with pytest.raises(
        ValueError,
        match=rf"^{folder} is a sharded \(FSDP\) checkpoint folder; fix: consolidate it .*"
        rf"consolidate_checkpoint {folder}$",
    ):
        ck.model_weights(ckpt, folder)


# ----------------------------------------------------------------------------------------- finding
def logger(save_dir, name="run", version=None):
    return Namespace(
        class_path="lightning.pytorch.loggers.TensorBoardLogger",
        init_args=Namespace(save_dir=str(save_dir), name=name, version=version),
    )


def test_version_folder():
    assert ck.version_folder(Namespace(save_dir="runs", name="a", version=3)) == Path("runs/a/version_3")
    assert ck.version_folder(Namespace(save_dir="runs", name="a", version="")) == Path("runs/a")  # a sweep cell
    assert ck.version_folder(Namespace(save_dir="runs", name=None, version="v")) == Path("runs/v")


def test_newest_last_checkpoint_is_the_newest_by_time(tmp_path):
    assert ck.newest_last_checkpoint(tmp_path / "none") is None
    assert ck.newest_last_checkpoint(tmp_path) is None
    a, b = save(tmp_path / "last-v1.ckpt", {}), save(tmp_path / "last.ckpt", {})
    save(tmp_path / "best-1.ckpt", {})
    os.utime(a, (2000, 2000))
    os.utime(b, (1000, 1000))
    assert ck.newest_last_checkpoint(tmp_path) == a
    os.utime(b, (3000, 3000))
    assert ck.newest_last_checkpoint(tmp_path) == b


def test_run_checkpoint_is_the_one_version_with_checkpoints(tmp_path):
    root = tmp_path / "run"
    assert ck.run_checkpoint(root) is None
    (root / "version_0").mkdir(parents=True)  # a version without checkpoints does not count
    one = save(root / "version_1" / "checkpoints" / "last.ckpt", {})
    assert ck.run_checkpoint(root) == one
    save(root / "version_10" / "checkpoints" / "last.ckpt", {})
    (root / "version_10" / "summary.json").write_text('{"status": "completed", "global_step": 8}')
    with pytest.raises(ValueError) as err:
        ck.run_checkpoint(root)
    assert str(err.value) == (
        f"--ckpt_path last is ambiguous: 2 versions of {root} hold a last*.ckpt: version_1 (no summary), "
        "version_10 (completed at step 8); fix: pick one with --trainer.logger.init_args.version N (e.g. 10), "
        "or give the .ckpt file with --ckpt_path"
    )


def test_last_checkpoint_looks_where_the_command_says(tmp_path):
    root = tmp_path / "runs" / "run"
    ckpt = save(root / "version_2" / "checkpoints" / "last.ckpt", {})
    cfg = Namespace(trainer=Namespace(logger=logger(tmp_path / "runs")))
    assert ck.pinned_checkpoint_folder(cfg) is None
    assert ck.last_checkpoint(cfg) == (ckpt, f"{root}/version_*/checkpoints/last*.ckpt")
    pinned = Namespace(trainer=Namespace(logger=logger(tmp_path / "runs", version=5)))
    folder = root / "version_5" / "checkpoints"
    assert ck.pinned_checkpoint_folder(pinned) == folder
    assert ck.last_checkpoint(pinned) == (None, f"{folder}/last*.ckpt")
    mine = save(tmp_path / "mine" / "last.ckpt", {})
    by_dirpath = Namespace(
        checkpoint=Namespace(dirpath=str(tmp_path / "mine")), trainer=Namespace(logger=logger(tmp_path))
    )
    assert ck.pinned_checkpoint_folder(by_dirpath) == tmp_path / "mine"
    assert ck.last_checkpoint(by_dirpath) == (mine, f"{tmp_path / 'mine'}/last*.ckpt")
    for no_folder in (
        Namespace(trainer=Namespace(logger=False)),
        Namespace(trainer=Namespace(logger=Namespace(class_path="x", init_args=Namespace(save_dir=None)))),
    ):
        with pytest.raises(
            ValueError,
            match=r"^--ckpt_path last needs the TensorBoard logger's run folder or "
            r"--checkpoint\.dirpath to look in; fix: give the \.ckpt file with --ckpt_path$",
        ):
            ck.last_checkpoint(no_folder)


def test_resume_in_last_version(tmp_path):
    args = logger(tmp_path).init_args
    ck.resume_in_last_version(args)
    assert args.version is None  # nothing to resume: a new version
    save(tmp_path / "run" / "version_4" / "checkpoints" / "last.ckpt", {})
    ck.resume_in_last_version(args)
    assert args.version == "version_4"
    pinned = logger(tmp_path, version=7).init_args
    ck.resume_in_last_version(pinned)
    assert pinned.version == 7


# ----------------------------------------------------------------------------------------- one writer
def test_one_fit_per_version_folder(tmp_path):
    folder = tmp_path / "runs" / "run" / "version_0"
    ck.lock_version(folder)
    try:
        lock = folder / ck.LOCK_NAME
        assert lock.read_text() == str(os.getpid())
        with pytest.raises(ValueError) as err:
            ck.lock_version(folder)  # another open file: flock refuses it, even in this process
        assert str(err.value) == (
            f"{folder} is in use by another loopnet fit (pid {os.getpid()}) pinned to the same version; fix: wait for "
            "it to end (then resume it with --ckpt_path last), or pin another version with "
            "--trainer.logger.init_args.version"
        )
    finally:
        ck.release_version_locks()
    assert not lock.exists() and not (tmp_path / "runs").exists()  # the folders made for the lock, empty: removed
    kept = tmp_path / "kept" / "version_1"
    ck.lock_version(kept)
    (kept / "events.out").write_text("x")
    ck.release_version_locks()
    assert (kept / "events.out").exists() and not (kept / ck.LOCK_NAME).exists()
    ck.lock_version(kept)  # free again
    ck.release_version_locks()


def test_ambiguous_versions_are_listed_in_numeric_order(tmp_path):
    """version_2 before version_10 (a string sort puts version_10 first), and the example is the newest."""
    root = tmp_path / "run"
    for n in (10, 2):
        save(root / f"version_{n}" / "checkpoints" / "last.ckpt", {})
    with pytest.raises(
        ValueError,
        match=r"hold a last\*\.ckpt: version_2 \(no summary\), version_10 \(no summary\); "
        r"fix: pick one with --trainer.logger.init_args.version N \(e\.g\. 10\)",
    ):
        ck.run_checkpoint(root)


def test_the_lock_file_is_readable_by_others_and_writable_by_its_owner(tmp_path):
    old = os.umask(0o022)
    try:
        ck.lock_version(tmp_path / "v")
        assert (tmp_path / "v" / ck.LOCK_NAME).stat().st_mode & 0o777 == 0o644
    finally:
        os.umask(old)
        ck.release_version_locks()


def test_a_lock_file_replaced_between_open_and_lock_is_taken_anew(tmp_path, monkeypatch):
    """The holder before us removes the lock file at its end, between our open and our flock: the lock we got
    is on a file no longer at the path, so the loop opens the new file and locks that one."""
    import fcntl

    folder = tmp_path / "v"
    folder.mkdir()
    path = folder / ck.LOCK_NAME
    real, calls = fcntl.flock, []

    def flock(fd, op):
        calls.append(fd)
        if len(calls) == 1:  # the file our first open found is replaced before it is locked
            path.unlink()
            path.write_text("")
        return real(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    try:
        ck.lock_version(folder)
        held_fd = ck._held[-1][0]
        assert len(calls) == 2 and os.stat(path).st_ino == os.fstat(held_fd).st_ino
        assert path.read_text() == str(os.getpid())
    finally:
        monkeypatch.setattr(fcntl, "flock", real)
        ck.release_version_locks()


# ----------------------------------------------------------------------------------------- more edges
class Unsafe1:
    pass  # noqa: E701  (six classes the restricted unpickler refuses, named in its message)


class Unsafe2:
    pass  # noqa: E701


class Unsafe3:
    pass  # noqa: E701


class Unsafe4:
    pass  # noqa: E701


class Unsafe5:
    pass  # noqa: E701


class Unsafe6:
    pass  # noqa: E701


def test_a_refused_pickle_names_the_first_five_objects_it_would_import_in_order(tmp_path, monkeypatch):
    path = save(
        tmp_path / "six.ckpt",
        {"state_dict": {}, "objs": [Unsafe1(), Unsafe2(), Unsafe3(), Unsafe4(), Unsafe5(), Unsafe6()]},
    )
    with pytest.raises(ValueError) as err:
        ck.load_checkpoint_meta(str(path))
    named = ", ".join(f"{__name__}.Unsafe{i}" for i in range(1, 6))
    assert str(err.value) == (
        f"refused to load {path}: unpickling it would import or run code ({named}), which "
        "loopnet's restricted (weights_only) loader does not allow; fix: use a checkpoint "
        "written by `loopnet fit`, and never load files from untrusted sources"
    )
    for unnamed in (lambda p: [], lambda p: 1 / 0):  # none found, or the scan itself fails
        monkeypatch.setattr(torch.serialization, "get_unsafe_globals_in_checkpoint", unnamed)
        with pytest.raises(ValueError, match=r"would import or run code \(unknown objects\), which"):
            ck.load_checkpoint_meta(str(path))


@pytest.mark.parametrize(
    "message, why",
    [
        ("First sentence ends in X. Second one. Third.\nSecond line.", "First sentence ends in X"),
        ("x" * 250 + ". Rest.", "x" * 200),
        ("", ""),
    ],
)
def test_an_unreadable_file_is_named_with_the_first_sentence_of_torchs_reason(tmp_path, monkeypatch, message, why):
    """The reason shown: the first line's first sentence, without its period, at most 200 characters."""
    path = save(tmp_path / "x.ckpt", {"state_dict": {}})

    def fail(*args, **kwargs):
        raise RuntimeError(message)

    monkeypatch.setattr(torch, "load", fail)
    with pytest.raises(ValueError) as err:
        ck.load_checkpoint_meta(str(path))
    assert str(err.value) == (
        f"{path} is not a readable checkpoint, it is corrupt or truncated (RuntimeError: {why}); "
        "fix: pass another one with --ckpt_path, e.g. best-*.ckpt or an earlier copy of last.ckpt"
    )


def test_a_missing_file_is_named_as_unreadable(tmp_path):
    with pytest.raises(
        ValueError, match=r"is not a readable checkpoint, it is corrupt or truncated \(FileNotFoundError"
    ):
        ck.load_checkpoint_meta(str(tmp_path / "missing.ckpt"))


def test_a_folder_given_as_a_checkpoint_names_its_newest_last_of_three(tmp_path):
    folder = tmp_path / "checkpoints"
    for i, name in enumerate(("last.ckpt", "last-v2.ckpt", "last-v1.ckpt")):  # newest: last-v1
        os.utime(save(folder / name, {"state_dict": {}}), (1000 + i, 1000 + i))
    with pytest.raises(ValueError, match=rf"e\.g\. {folder}/last-v1\.ckpt$"):
        ck.check_checkpoint_file(str(folder))


def test_three_ambiguous_versions_suggest_the_newest(tmp_path):
    root = tmp_path / "run"
    for n in (3, 12, 7):
        save(root / f"version_{n}" / "checkpoints" / "last.ckpt", {})
    with pytest.raises(
        ValueError,
        match=r": version_3 \(no summary\), version_7 \(no summary\), version_12 \(no "
        r"summary\); fix: pick one with --trainer\.logger\.init_args\.version N \(e\.g\. 12\)",
    ):
        ck.run_checkpoint(root)


def test_last_checkpoint_of_a_logger_without_a_name_looks_in_its_save_dir(tmp_path):
    ckpt = save(tmp_path / "version_0" / "checkpoints" / "last.ckpt", {})
    for name in ("", None):
        cfg = Namespace(
            trainer=Namespace(logger=Namespace(class_path="x", init_args=Namespace(save_dir=str(tmp_path), name=name)))
        )
        assert ck.last_checkpoint(cfg) == (ckpt, f"{tmp_path}/version_*/checkpoints/last*.ckpt")


def test_a_lock_held_by_a_process_that_wrote_no_pid_names_it_unknown(tmp_path):
    import fcntl

    folder = tmp_path / "v"
    folder.mkdir()
    fd = os.open(folder / ck.LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ValueError, match=rf"^{folder} is in use by another loopnet fit \(pid unknown\)"):
            ck.lock_version(folder)
    finally:
        os.close(fd)


def test_releasing_goes_on_past_a_folder_that_is_not_empty(tmp_path):
    """Every lock is released, and each one's empty made folders removed, also after a folder that holds a
    run's files (kept)."""
    first, second = tmp_path / "a" / "version_0", tmp_path / "b" / "version_0"
    ck.lock_version(first)
    ck.lock_version(second)  # released first: its folder holds a file
    (second / "events.out").write_text("x")
    ck.release_version_locks()
    assert not (first / ck.LOCK_NAME).exists() and not (tmp_path / "a").exists()
    assert (second / "events.out").exists() and not (second / ck.LOCK_NAME).exists()
    ck.lock_version(first)  # free again
    ck.release_version_locks()


def test_the_atomic_checkpoint_io_is_built_on_first_use_and_other_names_are_missing():
    from lightning.fabric.plugins import TorchCheckpointIO

    from loopnet.checkpoints import AtomicCheckpointIO

    assert issubclass(AtomicCheckpointIO, TorchCheckpointIO) and AtomicCheckpointIO.__module__ == "loopnet.checkpoints"
    with pytest.raises(AttributeError) as err:
        ck.NoSuchThing  # noqa: B018
    assert str(err.value) == "module 'loopnet.checkpoints' has no attribute 'NoSuchThing'"


class Keeper:
    """A ModelCheckpoint with the given last and best checkpoint paths."""

    def __new__(cls, last, best):
        from lightning.pytorch.callbacks import ModelCheckpoint

        cb = ModelCheckpoint()
        cb.last_model_path, cb.best_model_path = str(last or ""), str(best or "")
        return cb


@pytest.mark.parametrize(
    "own, kept, newer",
    [
        (5, [(3, None)], True),
        (5, [(3, 4), (None, 2)], True),
        (5, [(5, None)], False),
        (5, [(3, 7)], False),
        (None, [(3, None)], False),
        ("missing", [(3, None)], False),
        ("unreadable", [(3, None)], False),
        (5, [("unreadable", 3)], True),
    ],
)
def test_newer_than_kept_compares_the_global_steps(tmp_path, own, kept, newer):
    """The interruption checkpoint is newer than what the fit keeps when its global_step exceeds every kept
    one's (last and best of each ModelCheckpoint); a missing or unreadable file holds no step."""
    from types import SimpleNamespace

    def ckpt(step):
        if step is None:
            return None
        path = tmp_path / f"{uuid.uuid4().hex}.ckpt"
        if step == "unreadable":
            path.write_bytes(b"not a checkpoint")
        elif step != "missing":
            save(path, {"state_dict": {}, "global_step": step})
        return path

    trainer = SimpleNamespace(checkpoint_callbacks=[object()] + [Keeper(ckpt(a), ckpt(b)) for a, b in kept])
    assert ck.newer_than_kept(None if own is None else str(ckpt(own)), trainer) is newer
