"""`python -m experiments.archive`: a sweep folder laid out as `loopnet sweep` leaves it (a completed, a diverged, a
stopped and a never-started cell, checkpoints, event files, the lock folder) packs to exactly the sweep's files and
the finished cells' text files, owned by root; an archive that exists is kept unless --replace; a folder that is not
a sweep's is refused before anything is written."""

import json
import tarfile

import pytest

from experiments import archive


def sweep_folder(root):
    sweep = root / "gamma_x"
    (sweep / ".locks").mkdir(parents=True)
    (sweep / ".locks" / "a.lock").write_text("")
    for name in ("sweep.json", "sweep.yaml", "sweep_log.jsonl"):
        (sweep / name).write_text("{}\n")
    for cell, status in (("a-s1", "completed"), ("b-s1", "diverged"), ("c-s1", "stopped"), ("d-s1", None)):
        (sweep / cell / "checkpoints").mkdir(parents=True)
        (sweep / cell / "checkpoints" / "last.ckpt").write_bytes(b"\0" * 64)
        (sweep / cell / "events.out.tfevents.1.vm.1.0").write_bytes(b"\0" * 8)
        (sweep / cell / "cell.json").write_text("{}")
        if status:
            (sweep / cell / "summary.json").write_text(json.dumps({"status": status}))
    return sweep


def test_only_the_finished_cells_text_goes_in_owned_by_root(tmp_path):
    sweep = sweep_folder(tmp_path)
    out = tmp_path / "docs" / "x_runs.tar.gz"
    archive.main([str(sweep), str(out)])
    with tarfile.open(out) as tar:
        members = tar.getmembers()
    assert sorted(m.name for m in members if m.isfile()) == [
        "gamma_x/a-s1/cell.json",
        "gamma_x/a-s1/summary.json",
        "gamma_x/b-s1/cell.json",
        "gamma_x/b-s1/summary.json",
        "gamma_x/sweep.json",
        "gamma_x/sweep.yaml",
        "gamma_x/sweep_log.jsonl",
    ]
    assert {(m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, "root", "root")}
    assert not list(out.parent.glob(".*.part"))


def test_the_command_says_what_it_packed(tmp_path, capsys):
    sweep = sweep_folder(tmp_path)
    archive.main([str(sweep), str(tmp_path / "x.tar.gz")])
    said = capsys.readouterr().out
    assert f"2 finished cell(s) of {sweep}; 2 unfinished left out" in said


def test_an_archive_that_exists_is_kept_unless_replace(tmp_path, capsys):
    sweep = sweep_folder(tmp_path)
    out = tmp_path / "x.tar.gz"
    out.write_bytes(b"the archive committed before")
    with pytest.raises(SystemExit) as err:
        archive.main([str(sweep), str(out)])
    assert err.value.code != 0 and out.read_bytes() == b"the archive committed before"
    assert "exists; fix: pass --replace" in capsys.readouterr().err
    archive.main([str(sweep), str(out), "--replace"])
    with tarfile.open(out) as tar:
        assert "gamma_x/a-s1/summary.json" in tar.getnames()


@pytest.mark.parametrize("case", ["not a sweep", "not .tar.gz"])
def test_bad_input_is_refused_before_anything_is_written(tmp_path, capsys, case):
    sweep = sweep_folder(tmp_path)
    if case == "not a sweep":
        (sweep / "sweep.json").unlink()
        out, want = tmp_path / "x.tar.gz", "holds no sweep.json, so it is not a sweep's run folder; fix:"
    else:
        out, want = tmp_path / "x.zip", "fix: name it <something>.tar.gz"
    with pytest.raises(SystemExit):
        archive.main([str(sweep), str(out)])
    assert want in capsys.readouterr().err and not out.exists() and not list(tmp_path.glob(".*.part"))
