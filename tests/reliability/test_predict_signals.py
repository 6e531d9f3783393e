"""`loopnet predict` stops on SIGTERM, SIGINT and SIGHUP while it generates: between tokens, exit status 0,
the text generated so far printed and saved as a finished prediction's is."""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import pytest
from lightning.pytorch.callbacks import Callback

from .helpers import RUN, TINY, callbacks, finish, finished_run, spawn, wait_for

pytestmark = pytest.mark.slow

PROMPT = "To be"
ENDLESS = "100000000"  # new tokens: days of generation, far past any test's patience
STOP_S = 30  # a stop takes a token and the writes (well under a second here); far more is not a stop


class MarkTokens(Callback):
    """Create the file `path` once the model's loop has run `calls` times in generation (a cached
    generation runs it once for the prompt, then once per token), so that a test signals mid-generation."""

    def __init__(self, path: str, calls: int):
        self.path, self.calls = path, calls

    def on_predict_start(self, trainer, pl_module):
        model, count = pl_module.model, [0]
        loop = model.iter_rounds

        def counted(*args, **kwargs):
            count[0] += 1
            if count[0] == self.calls:
                Path(self.path).touch()
            return loop(*args, **kwargs)

        model.iter_rounds = counted


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[Path, Path]:
    cwd = tmp_path_factory.mktemp("predict")
    finished_run(cwd)
    return cwd, cwd / "runs" / RUN / "version_0" / "checkpoints" / "last.ckpt"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_stops_the_generation_and_keeps_the_text_so_far(checkpoint, tmp_path, signum):
    cwd, ckpt = checkpoint
    marker = tmp_path / "generating"
    calls = 5  # the prompt's, then 3 tokens done and the 4th under way when the signal is sent
    proc = spawn(
        "predict",
        *TINY,
        "--ckpt_path",
        str(ckpt),
        "--model.generate.prompt",
        PROMPT,
        "--model.generate.max_new_tokens",
        ENDLESS,
        *callbacks((MarkTokens, {"path": str(marker), "calls": calls})),
        cwd=cwd,
    )
    wait_for(marker.exists, proc, "the first tokens were generated")
    proc.send_signal(signum)
    try:
        proc.wait(timeout=STOP_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"still generating {STOP_S} s after {signum.name}:\n{finish(proc).err[-3000:]}")
    res = finish(proc)
    assert res.code == 0, res.err[-3000:]
    assert f"loopnet: {signum.name} received; stopping the generation" in res.err
    generated = re.search(r"loopnet: (\d+) tokens generated \(stopped by a signal\)", res.err)
    assert generated and calls - 2 <= int(generated[1]) < int(ENDLESS), res.err[-3000:]
    saved = Path(re.search(r"loopnet: saved the generated text to (\S+)", res.err)[1]).read_text()
    assert saved.startswith(PROMPT) and len(saved.rstrip("\n")) > len(PROMPT)
    assert saved.rstrip("\n") in res.out  # and printed
