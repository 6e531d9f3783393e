"""loopnet.model.scales called directly (LoopConfig checks its fields first, so its own refusals are
reached only here): the run-folder label of a scheme, and each refusal with its message."""

import math

import pytest

from loopnet.model.scales import branch_scale, parse_scheme, residual_scales, scheme_label


def test_scheme_label():
    assert scheme_label("scaled", 0.4) == "p0.4" and scheme_label("scaled", 0.375) == "p0.375"
    assert scheme_label("scaled", None) == "scaled"
    assert scheme_label("deeploop", None) == "deeploop" and scheme_label("deeploop", 0.5) == "deeploop"


def test_residual_scales_at_the_smallest_depth():
    assert residual_scales("deeploop", 1) == pytest.approx((2**0.5, 8**-0.5))
    assert residual_scales("deepnorm", 1, p=0.25) == pytest.approx((2**0.25, 8**-0.25))
    assert residual_scales("scaled", 1, p=1e-9) == pytest.approx((1.0, 1.0), abs=1e-8)


@pytest.mark.parametrize(
    "args,message",
    [
        (("nope", 4), "residual='nope' is not a known scheme; choose one of preln, postln, deepnorm, deeploop, scaled"),
        (("deeploop", 0), "unrolled depth N must be >= 1, got 0"),
        (("scaled", 4), "residual='scaled' needs an exponent p > 0 (e.g. p: 0.4), got p=None"),
        (("scaled", 4, 0.0), "residual='scaled' needs an exponent p > 0 (e.g. p: 0.4), got p=0.0"),
        (("deeploop", 4, 0.3), "residual='deeploop' fixes p=0.5; use residual='scaled' with p=0.3"),
    ],
)
def test_refusals_name_the_problem(args, message):
    with pytest.raises(ValueError) as err:
        residual_scales(*args)
    assert str(err.value) == message


def test_parse_scheme_inverts_scheme_label():
    for residual in ("preln", "postln", "deepnorm", "deeploop"):
        assert parse_scheme(scheme_label(residual, None)) == (residual, None)
    for p in (0.375, 0.4, 0.5, 1.0, 2.5, 12.0):
        assert parse_scheme(scheme_label("scaled", p)) == ("scaled", p)


@pytest.mark.parametrize("label", ["scaled", "p0", "p-0.5", "pfoo", "p", "q0.5", "deepnet", ""])
def test_parse_scheme_refuses_a_name_of_no_scheme_naming_the_choices(label):
    with pytest.raises(ValueError) as err:
        parse_scheme(label)
    assert str(err.value) == (
        f"{label!r} names no residual scheme; use preln, postln, deepnorm, deeploop or p<exponent> such as p0.375"
    )


def test_branch_scale_formulas_and_default_lambda():
    assert branch_scale("one", 2, 3) == 1.0
    assert branch_scale("sqrt_depth", 2, 3) == 1 / math.sqrt(6) == branch_scale("sqrt_depth", 2, 3, 1.0)
    assert branch_scale("wang", 2, 3) == 1 / (3 * math.sqrt(2)) == branch_scale("wang", 2, 3, lam=1.0)
    assert branch_scale("wang", 2, 3, lam=0.5) == 0.5 / (3 * math.sqrt(2))


@pytest.mark.parametrize(
    "args, message",
    [
        (("sqrt", 2, 3), "branch_scale='sqrt' is not a known rule; choose one of one, sqrt_depth, wang"),
        (("wang", 0, 3), "K and R must be >= 1, got K=0, R=3"),
        (("wang", 2, 0), "K and R must be >= 1, got K=2, R=0"),
        (("wang", 2, 3, 0.0), "branch_lambda must be > 0, got 0.0; fix: give a positive λ, e.g. 1.0"),
        (
            ("one", 2, 3, 2.0),
            "branch_scale='one' is ε = 1 and takes no λ, got branch_lambda=2.0; "
            "fix: branch_lambda: 1.0, or branch_scale: sqrt_depth or wang",
        ),
    ],
)
def test_branch_scale_refuses_bad_arguments_naming_them(args, message):
    with pytest.raises(ValueError) as err:
        branch_scale(*args)
    assert str(err.value) == message
