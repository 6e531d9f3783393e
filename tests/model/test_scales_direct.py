"""loopnet.model.scales called directly (LoopConfig checks its fields first, so its own refusals are
reached only here): the run-folder label of a scheme, and each refusal with its message."""

import pytest

from loopnet.model.scales import residual_scales, scheme_label


def test_scheme_label():
    assert scheme_label("scaled", 0.4) == "p0.4" and scheme_label("scaled", 0.375) == "p0.375"
    assert scheme_label("scaled", None) == "scaled"
    assert scheme_label("deeploop", None) == "deeploop" and scheme_label("deeploop", 0.5) == "deeploop"


def test_residual_scales_at_the_smallest_depth():
    assert residual_scales("deeploop", 1) == pytest.approx((2 ** 0.5, 8 ** -0.5))
    assert residual_scales("deepnorm", 1, p=0.25) == pytest.approx((2 ** 0.25, 8 ** -0.25))
    assert residual_scales("scaled", 1, p=1e-9) == pytest.approx((1.0, 1.0), abs=1e-8)


@pytest.mark.parametrize("args,message", [
    (("nope", 4), "residual='nope' is not a known scheme; choose one of preln, postln, deepnorm, deeploop, scaled"),
    (("deeploop", 0), "unrolled depth N must be >= 1, got 0"),
    (("scaled", 4), "residual='scaled' needs an exponent p > 0 (e.g. p: 0.4), got p=None"),
    (("scaled", 4, 0.0), "residual='scaled' needs an exponent p > 0 (e.g. p: 0.4), got p=0.0"),
    (("deeploop", 4, 0.3), "residual='deeploop' fixes p=0.5; use residual='scaled' with p=0.3"),
])
def test_refusals_name_the_problem(args, message):
    with pytest.raises(ValueError) as err:
        residual_scales(*args)
    assert str(err.value) == message
