"""What a command prints that is not about the user's run."""

import pytest

from .helpers import TINY, finish, spawn

pytestmark = pytest.mark.slow


def test_a_fit_prints_no_advert_and_no_library_deprecations(tmp_path):
    res = finish(spawn("fit", *TINY, "--trainer.max_steps", "1", cwd=tmp_path, fresh=True))  # start-up prints too
    assert res.code == 0, res.err[-3000:]
    for noise in ("litlogger", "LeafSpec", "deprecated", "JSONARGPARSE_DEPRECATION_WARNINGS"):
        assert noise not in res.err + res.out, noise
    assert "loopnet: summary: " in res.err  # what is about the run stays


def test_a_resume_does_not_warn_that_its_checkpoint_folder_is_not_empty(tmp_path, recwarn):
    from .helpers import SHORT, finished_run, loopnet

    finished_run(tmp_path)
    res = loopnet("fit", *SHORT, "--trainer.max_steps", "3", "--ckpt_path", "last", cwd=tmp_path)
    assert res.code == 0, res.err[-3000:]
    assert not [w for w in recwarn if "exists and is not empty" in str(w.message)]


def test_checking_a_command_ignores_the_callers_own_arguments(monkeypatch, recwarn):
    """`loopnet sweep` checks each cell's command in-process; LightningCLI warned about sys.argv each time."""
    import sys

    from loopnet.training.dry_run import check_command

    from .helpers import SHORT

    monkeypatch.setattr(sys, "argv", ["loopnet", "sweep", "grid.yaml"])
    assert check_command(["fit", *SHORT]) is None
    assert sys.argv == ["loopnet", "sweep", "grid.yaml"]
    assert not [w for w in recwarn if "args parameter" in str(w.message)]


def test_an_error_line_is_one_write_so_ranks_sharing_stderr_do_not_interleave(monkeypatch):
    """Two ranks wrote `print(line)` to one pipe at once: the text, then the newline, in separate writes,
    so the two lines came out as one (`...traceback)loopnet: error: ...`). A write of at most PIPE_BUF
    bytes to a pipe is atomic: the whole line goes in one."""
    import io
    import sys

    from loopnet.env import error_line, fail

    class Recorder(io.StringIO):
        def __init__(self):
            super().__init__()
            self.writes = []

        def write(self, text):
            self.writes.append(text)
            return super().write(text)

    for call in (
        lambda: error_line("loopnet", "a problem; fix: this"),
        lambda: fail("loopnet", "a problem; fix: this"),
    ):
        monkeypatch.setattr(sys, "stderr", Recorder())
        try:
            call()
        except SystemExit as stop:
            assert stop.code == 2
        assert sys.stderr.writes == ["loopnet: error: a problem; fix: this\n"]


def test_a_trainer_command_flushes_subnormal_floats_before_it_builds_the_trainer(monkeypatch):
    """A collapsed loop's vanishing gradients crossed the subnormal range, where x86 is ~10-100x slower
    (steps of 0.5 s became 8-11 s at d = 256, R = 12). `main` turns flush-to-zero on before the Trainer exists:
    1e-39 (subnormal: below float32's smallest normal, 1.18e-38) times 1 is then 0. LOOPNET_FLUSH_DENORMAL=0
    keeps it (a run from before the change, reproduced to the bit)."""
    import torch

    from loopnet.training import cli

    seen = []
    monkeypatch.setattr(cli, "build", lambda *a, **k: seen.append((torch.tensor([1e-39]) * 1.0).item()))
    assert (torch.tensor([1e-39]) * 1.0).item() > 0  # off in the test process (conftest turns it off after each test)
    try:
        cli.main(["fit", "--trainer.max_steps", "1"], prechecked=True)
        monkeypatch.setenv("LOOPNET_FLUSH_DENORMAL", "0")
        cli.main(["fit", "--trainer.max_steps", "1"], prechecked=True)
    finally:
        torch.set_flush_denormal(False)
    assert seen[0] == 0.0 and seen[1] == pytest.approx(1e-39, rel=1e-3)
