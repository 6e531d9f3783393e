"""Issue 16, item 7: what a command prints that is not about the user's run."""

from .helpers import TINY, finish, spawn


def test_a_fit_prints_no_advert_and_no_library_deprecations(tmp_path):
    res = finish(spawn("fit", *TINY, "--trainer.max_steps", "1", cwd=tmp_path))
    assert res.code == 0, res.err[-3000:]
    for noise in ("litlogger", "LeafSpec", "deprecated", "JSONARGPARSE_DEPRECATION_WARNINGS"):
        assert noise not in res.err + res.out, noise
    assert "loopnet: summary: " in res.err  # what is about the run stays
