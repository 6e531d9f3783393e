"""The 50%-trains rate: the common-slope (Firth) logistic fit with profile intervals, checked on synthetic
seeds drawn from known 50% rates, and the exact trend test against hand-counted and hypergeometric values."""

import math
import random

import pytest

from loopnet.study import boundary

LADDER = [2e-3 * 2 ** (i / 2) for i in range(11)]  # ×√2 from 2e-3 to 6.4e-2
TRUE = {("deepnorm", 2): 1.6e-2, ("deepnorm", 12): 1.0e-2, ("deeploop", 2): 2.2e-2, ("deeploop", 12): 2.0e-2}
SLOPE = -8.0  # per decade: P(trains) goes 0.83 -> 0.17 across ±0.2 decades of η50
FALLS = {("deepnorm", 2): 1, ("deepnorm", 12): -1, ("deeploop", 2): -1, ("deeploop", 12): 1}


def _draw(rng, seeds):
    rows = []
    for g, eta50 in TRUE.items():
        for lr in LADDER:
            p = 1 / (1 + math.exp(-SLOPE * (math.log10(lr) - math.log10(eta50))))
            rows += [(g, lr, rng.random() < p) for _ in range(seeds)]
    return boundary.Data.from_rows(rows)


def _truth(weights):
    return sum(w * math.log10(TRUE[g]) for g, w in weights.items())


def test_the_fit_recovers_known_50_percent_rates_within_their_intervals():
    fit = boundary.fit(_draw(random.Random(7), seeds=40))
    assert not fit.separated
    for g, eta50 in TRUE.items():
        lo, hi = fit.interval({g: 1})
        assert lo < math.log10(eta50) < hi and hi - lo < 0.15  # 40 seeds a rate: a narrow interval
        assert lo < fit.x50(g) < hi
    lo, hi = fit.interval(FALLS)
    assert lo < _truth(FALLS) < hi
    assert fit.combination(FALLS) == pytest.approx(sum(w * fit.x50(g) for g, w in FALLS.items()))


def test_the_profile_interval_is_where_the_deviance_crosses_chi2():
    fit = boundary.fit(_draw(random.Random(3), seeds=6))
    lo, hi = fit.interval({("deeploop", 2): 1})
    for end in (lo, hi):
        assert 2 * (fit.value - fit.profile({("deeploop", 2): 1}, end)) == pytest.approx(boundary.CHI2_95, abs=2e-3)
    # at the estimate the constraint binds nothing: the profile is the maximum
    assert fit.profile({("deeploop", 2): 1}, fit.x50(("deeploop", 2))) == pytest.approx(fit.value, abs=1e-8)


def test_intervals_cover_at_a_sane_rate_with_three_seeds():
    """3 seeds a rate, as the map: the difference of falls' 95% interval covers the truth in at least
    0.95 − 3 binomial standard deviations of the draws (60 draws: sd 0.028, so ≥ 0.87)."""
    rng, hits, n = random.Random(2026), 0, 60
    for _ in range(n):
        fit = boundary.fit(_draw(rng, seeds=3))
        lo, hi = fit.interval(FALLS)
        hits += (lo is None or lo < _truth(FALLS)) and (hi is None or _truth(FALLS) < hi)
    assert hits / n >= 0.95 - 3 * math.sqrt(0.95 * 0.05 / n)


def test_separated_data_are_flagged_and_still_get_a_finite_penalised_fit():
    # every seed trains at and below 4e-3 and none above: the plain likelihood has no maximum
    rows = [("g", lr, lr <= 4e-3) for lr in (2e-3, 4e-3, 8e-3, 1.6e-2) for _ in range(3)]
    fit = boundary.fit(boundary.Data.from_rows(rows))
    assert fit.separated and math.isfinite(fit.slope) and fit.slope < 0
    # the data are symmetric under u -> 2c - u with trains <-> not (c the gap's centre), and so is Firth's
    # penalised likelihood: its maximum puts η50 at the centre
    assert 10 ** fit.x50("g") == pytest.approx(math.sqrt(4e-3 * 8e-3), rel=1e-6)
    with pytest.raises(ValueError, match="no boundary"):
        boundary.fit(boundary.Data.from_rows([("g", 1e-3, True), ("g", 2e-3, True)]))


def test_exact_trend_test_by_hand_and_as_fishers_test():
    # 2 seeds at each of two rates, 2 train, both at the lower rate: of the C(4, 2) = 6 equally likely
    # placements one has T = 0
    out = boundary.exact_trend_test([[(0, 2, 2), (1, 0, 2)]])
    assert out["t"] == 0 and out["p_falls"] == pytest.approx(1 / 6) and out["p_rises"] == pytest.approx(1.0)
    # two rates is Fisher's exact test: 4 of 5 against 0 of 15 -> P = C(5,4)·C(15,0) / C(20,4) = 5 / 4845
    out = boundary.exact_trend_test([[(0, 0, 15), (1, 4, 5)]])
    assert out["p_rises"] == pytest.approx(5 / 4845)
    # strata convolve: two identical strata, each T ∈ {0 (1/6), 1 (4/6), 2 (1/6)}; observed 0 + 0
    out = boundary.exact_trend_test([[(0, 2, 2), (1, 0, 2)]] * 2)
    assert out["p_falls"] == pytest.approx(1 / 36)


def _penalised_loglik(data, theta):
    """ℓ + ½·log det I written out on its own (rows, not the module's matrices)."""
    import numpy as np

    x = data.design()
    eta = x @ theta
    p = 1 / (1 + np.exp(-eta))
    ll = sum(y * e - math.log1p(math.exp(e)) if e < 30 else y * e - e for y, e in zip(data.y, eta))
    info = sum(pi * (1 - pi) * np.outer(row, row) for pi, row in zip(p, x))
    return ll + 0.5 * math.log(np.linalg.det(info))


def test_the_firth_fit_and_a_profile_point_against_a_general_optimiser():
    optimize = pytest.importorskip("scipy.optimize")
    import numpy as np

    data = _draw(random.Random(11), seeds=3)
    fit = boundary.fit(data)
    best = optimize.minimize(lambda t: -_penalised_loglik(data, t), fit.theta + 0.3, method="BFGS")
    assert -best.fun == pytest.approx(fit.value, abs=1e-5)
    assert best.x[-1] == pytest.approx(fit.slope, rel=1e-3)
    # the profile at v = the fit's difference of falls + 0.1: maximise subject to Σ w_g·a_g + v·b = 0
    v = fit.combination(FALLS) + 0.1
    c = np.zeros(len(data.groups) + 1)
    for g, w in FALLS.items():
        c[data.groups.index(g)] = w
    c[-1] = v
    con = optimize.minimize(
        lambda t: -_penalised_loglik(data, t),
        fit.theta,
        method="SLSQP",
        constraints=[{"type": "eq", "fun": lambda t: c @ t}],
        options={"ftol": 1e-12, "maxiter": 500},
    )
    assert -con.fun == pytest.approx(fit.profile(FALLS, v), abs=1e-4)
