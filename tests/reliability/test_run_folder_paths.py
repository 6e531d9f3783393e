"""Run folders stay under the logger's save_dir: a name, version or sub_dir that is absolute or climbs out with
`..` is refused in one line (problem and fix) before anything is written."""

import os

import pytest

from loopnet.files import check_run_folder

from .helpers import SHORT, loopnet


@pytest.mark.parametrize(
    "name,version,sub_dir",
    [
        ("../../x", None, None),
        ("/tmp/elsewhere", None, None),
        ("a/../../x", 0, None),
        ("run", "../../../x", None),
        ("run", "/abs", None),
        ("run", 3, "../../../../x"),
        ("..", None, None),
    ],
)
def test_a_folder_outside_save_dir_is_refused(tmp_path, name, version, sub_dir):
    with pytest.raises(ValueError) as info:
        check_run_folder(str(tmp_path / "runs"), name, version, sub_dir)
    msg = str(info.value)
    assert "\n" not in msg and "puts the run folder outside its save_dir" in msg and "fix:" in msg
    bad = next(v for v in (name, version, sub_dir) if isinstance(v, str) and (v.startswith("/") or ".." in v))
    assert repr(bad) in msg


@pytest.mark.parametrize(
    "name,version,sub_dir",
    [
        ("deeploop_r6", None, None),
        ("deeploop_r6", 3, None),
        ("deeploop_r6", "version_2", None),
        ("cell_a", "", None),
        ("study/a", None, None),
        ("", None, None),
        (None, None, None),
        ("a..b", "v..1", "x..y"),
        ("run", 0, "eval"),
    ],
)
def test_folders_inside_save_dir_pass(tmp_path, name, version, sub_dir):
    check_run_folder(str(tmp_path / "runs"), name, version, sub_dir)


@pytest.mark.parametrize("option,value", [("name", "../../x"), ("name", "ABS"), ("version", "../../../x")])
def test_the_cli_refuses_before_writing_anything(tmp_path, option, value):
    cwd = tmp_path / "a" / "b" / "c"
    cwd.mkdir(parents=True)
    if value == "ABS":
        value = str(tmp_path / "abs")
    res = loopnet("fit", *SHORT, f"--trainer.logger.init_args.{option}", value, cwd=cwd)
    assert res.code == 2, res.err[-2000:]
    assert res.last_err_line.startswith(
        f"loopnet: error: --trainer.logger.init_args.{option} {value!r} puts the run "
        f"folder outside its save_dir {cwd / 'runs'}; fix:"
    )
    written = sorted(os.path.relpath(os.path.join(r, f), tmp_path) for r, _, fs in os.walk(tmp_path) for f in fs)
    assert written == [] and sorted(os.listdir(tmp_path)) == ["a"] and os.listdir(cwd) == []
