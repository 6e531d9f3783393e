"""scripts/tensorboard_screenshot.py against a live TensorBoard on 127.0.0.1 with headless Chromium (the
README's picture): skipped where no Chromium is installed (apt-get install chromium)."""

import shutil
import sys

import pytest
from PIL import Image
from torch.utils.tensorboard import SummaryWriter

from loopnet.diagnostics.profile import profile_pngs, write_png
from loopnet.diagnostics.tags import visit_quantities, visit_tag
from loopnet.model import visit_order
from tests.reliability.helpers import ROOT, env
from tests.helpers import run_command

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not any(shutil.which(c) for c in ("chromium", "chromium-headless-shell")),
        reason="no Chromium (apt-get install chromium)",
    ),
]


def test_screenshot_of_a_logdir(tmp_path):
    visits = visit_order(2, 2)
    writer = SummaryWriter(str(tmp_path / "runs" / "a"))
    scalars = {visit_tag(q, v): 0.1 * (i + 1) for i, v in enumerate(visits) for q in visit_quantities(v)}
    for tag, png in profile_pngs(scalars, visits).items():
        write_png(writer, tag, png, 0)
    writer.close()
    out = tmp_path / "shot.png"
    proc = run_command(
        [
            sys.executable,
            str(ROOT / "scripts/tensorboard_screenshot.py"),
            "--logdir",
            str(tmp_path / "runs"),
            "--out",
            str(out),
            "--size",
            "1024",
            "800",
        ],
        env=env(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    image = Image.open(out)
    assert image.size == (1024, 800)
    # A rendered page (TensorBoard's orange bar, white cards, the plot's lines), not a blank one.
    assert len(image.convert("RGB").getcolors(maxcolors=1 << 16) or []) >= 16
