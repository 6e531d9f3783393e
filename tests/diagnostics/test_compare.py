"""`loopnet compare RUN_A RUN_B --steps ...` overlays two runs' depth profiles at chosen
steps, from their event files (EventAccumulator), without Lightning; bad input gets one line with the fix."""

import subprocess
import sys

import pytest
from torch.utils.tensorboard import SummaryWriter

from loopnet.diagnostics.compare import compare_figure, event_dir, read_visits
from loopnet.diagnostics.profile import PROFILE_QUANTITIES
from loopnet.diagnostics.tags import visit_quantities, visit_tag
from loopnet.model import visit_order
from tests.reliability.helpers import env

STEPS = (0, 10, 20)


def value(run: int, step: int, q: str, i: int) -> float:
    """A distinct, positive value for every (run, step, quantity, visit index)."""
    return (1 + run) * 10.0 ** (PROFILE_QUANTITIES.index(q) if q in PROFILE_QUANTITIES else 0) * (1 + step + i / 100)


def write_run(folder, run: int, n_blocks: int = 2, n_rounds: int = 3) -> None:
    writer = SummaryWriter(str(folder))
    for step in STEPS:
        for i, v in enumerate(visit_order(n_blocks, n_rounds), start=1):
            for q in visit_quantities(v):
                writer.add_scalar(visit_tag(q, v), value(run, step, q, i), step)
        writer.add_scalar("train/loss", 5.0, step)
    writer.close()


@pytest.fixture
def two_runs(tmp_path):
    a, b = tmp_path / "deeploop" / "version_0", tmp_path / "deepnorm" / "version_0"
    write_run(a, 0)
    write_run(b, 1)
    return a, b


def test_each_panel_holds_each_run_at_each_step(two_runs):
    a, b = two_runs
    runs = [("A", *read_visits(a)), ("B", *read_visits(b))]
    fig = compare_figure(runs, steps=[9, 20])  # 9 is not logged: its nearest, 10
    visits = visit_order(2, 3)
    assert len(fig.axes) == len(PROFILE_QUANTITIES)
    for ax, q in zip(fig.axes, PROFILE_QUANTITIES):
        lines = [line for line in ax.lines if line.get_label().startswith(("A", "B"))]
        assert [line.get_label() for line in lines] == ["A  step 10", "A  step 20", "B  step 10", "B  step 20"]
        for line, (run, step) in zip(lines, [(0, 10), (0, 20), (1, 10), (1, 20)]):
            at = [i for i, v in enumerate(visits, start=1) if q in visit_quantities(v)]
            assert list(line.get_xdata()) == at
            assert list(line.get_ydata()) == pytest.approx([value(run, step, q, i) for i in at]), (q, run, step)
    assert [ax.get_title() for ax in fig.axes] == [
        "gradient: ‖∂L/∂x‖",
        "gradient: ‖g_r,j‖",
        "residual stream RMS",
        "attention: max q·k/√d",
        "attention: mean log Z",
        "branch / skip ‖f‖/‖αx‖",
    ]


def test_command_writes_the_png_without_lightning(two_runs, tmp_path):
    a, b = two_runs
    out = tmp_path / "compare.png"
    code = (
        "import sys\nfrom loopnet.commands import main\nmain(sys.argv[1:])\n"
        "print(sorted({'lightning'} & set(sys.modules)))"
    )
    # The name folder of a run with a single version is accepted for the version folder.
    proc = subprocess.run(
        [sys.executable, "-c", code, "compare", str(a.parent), str(b), "--steps", "0", "20", "--out", str(out)],
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert out.read_bytes().startswith(b"\x89PNG")
    assert "deeploop/version_0: steps 0, 20" in proc.stdout and proc.stdout.strip().endswith("[]")


@pytest.mark.parametrize("case", ["missing", "empty", "several", "no_visits", "one_run", "bad_out"])
def test_bad_input_gets_one_line_with_the_fix(two_runs, tmp_path, case):
    a, b = two_runs
    out = tmp_path / "c.png"
    runs = {
        "missing": [str(tmp_path / "nope"), str(b)],
        "empty": [str(tmp_path / "empty"), str(b)],
        "several": [str(tmp_path), str(b)],
        "no_visits": [str(tmp_path / "loss_only"), str(b)],
        "one_run": [str(a)],
        "bad_out": [str(a), str(b)],
    }[case]
    (tmp_path / "empty").mkdir()
    writer = SummaryWriter(str(tmp_path / "loss_only"))
    writer.add_scalar("train/loss", 1.0, 0)
    writer.close()
    args = ["compare", *runs, "--out", str(tmp_path / "no" / "c.png") if case == "bad_out" else str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "loopnet", *args], env=env(), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("loopnet compare: error: ") and "; fix: " in line
    assert not out.exists()


def test_event_dir_finds_the_one_version(two_runs):
    a, _ = two_runs
    assert event_dir(str(a.parent)) == a and event_dir(str(a)) == a


def test_depth_views_have_few_distinct_y_labels():
    """At TensorBoard's ~270 px card the profile was illegible (a legend of long names, minor
    log ticks labelled "6×10⁻²"). Each view now has 2-5 y labels, all different, with short text."""
    from loopnet.diagnostics.profile import VIEWS, depth_profile, view_figure

    visits = visit_order(2, 6)
    for spread in (1.05, 3.0, 1e4):  # within a few percent, within a decade, over four decades
        scalars = {
            visit_tag(q, v): 0.01 * spread ** (i / len(visits))
            for i, v in enumerate(visits)
            for q in visit_quantities(v)
        }
        profile = depth_profile(scalars, visits)
        for view in VIEWS:
            fig = view_figure(view, profile, visits)
            fig.canvas.draw()
            (ax,) = fig.axes
            labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
            assert 2 <= len(labels) <= 5 and len(set(labels)) == len(labels), (view, spread, labels)
            assert max(map(len, labels)) <= 7 and not ax.get_yticklabels(minor=True), (view, spread, labels)
            assert len(ax.get_xticklabels()) <= 5
            assert fig.canvas.get_width_height() == (360, 240)
