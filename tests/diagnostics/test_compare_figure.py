"""`loopnet compare`: the legend fits the figure whatever the runs' folder names, and a step a run did
not log is said to be drawn at its nearest logged step."""

import subprocess
import sys

from loopnet.diagnostics.compare import compare_figure, read_visits
from tests.diagnostics.test_compare import write_run
from tests.reliability.helpers import env


def test_long_labels_stay_inside_the_figure(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    write_run(a, 0)
    write_run(b, 1)
    long = "deeploop_carry_k2_r6_d128_h4_ctx128/version_0"  # a default label: the run's folder names
    fig = compare_figure(
        [(long, *read_visits(a)), (long.replace("deeploop", "deepnorm"), *read_visits(b))], steps=[0, 10, 20]
    )
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (legend,) = fig.legends
    box, page = legend.get_window_extent(renderer), fig.bbox
    assert page.x0 <= box.x0 and box.x1 <= page.x1 and box.y1 <= page.y1, (box, page)
    top_of_panels = max(ax.get_tightbbox(renderer).y1 for ax in fig.axes)
    assert top_of_panels <= box.y0, (top_of_panels, box)  # the legend covers no panel


def test_a_step_not_logged_is_said_to_be_drawn_at_the_nearest(tmp_path):
    a, b = tmp_path / "A" / "version_0", tmp_path / "B" / "version_0"
    write_run(a, 0)
    write_run(b, 1)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "loopnet",
            "compare",
            str(a),
            str(b),
            "--steps",
            "9",
            "20",
            "--out",
            str(tmp_path / "c.png"),
        ],
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (
        "A/version_0: steps 10, 20 (logged: 0..20, 3 steps; not logged, drawn at the nearest: 9 -> 10)"
        in proc.stdout.splitlines()
    ), proc.stdout
