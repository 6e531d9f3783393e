"""Issue 16, item 7: every command paid 6-9 s of start-up, even `--help`; `datasets` (with pandas,
~0.8 s of it) is imported only where documents are read."""

import subprocess
import sys

from tests.reliability.helpers import env


def test_the_cli_starts_without_importing_datasets():
    code = "import sys, loopnet.training.cli; print(sorted({'datasets', 'pandas'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], env=env(), capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
