"""The stability boundary as a 50%-trains rate: a logistic fit of "trains" on log10 lr over every seed,
one intercept per group (a group is one (scheme, R)) and one slope shared by all groups,

    logit P(trains | group g, lr η) = a_g + b·log10 η,      log10 η50_g = x_g = −a_g / b,

with 95% profile-likelihood intervals for any linear combination v = Σ w_g·x_g of the groups' log10 50%
rates: one x_g, a ratio x_g − x_h, or the difference of falls [x(A, R₁) − x(A, R₂)] − [x(B, R₁) − x(B, R₂)].
Fixing v is the linear constraint Σ w_g·a_g + v·b = 0 on (a, b), so the profile is a logistic fit in the
constraint's null space.

The fit is Firth's (1993) penalised likelihood ℓ(θ) + ½·log det I(θ), I the Fisher information: it has a
finite maximum when the plain likelihood has none (complete or quasi-complete separation: every seed that
trains at a rate at or below every seed that does not), which a stability boundary sampled by a few seeds
often is; its profile intervals are Heinze & Schemper's (2002). Whether the plain maximum exists is
reported beside it (`separated`), and where it does not, `exact_trend_test` gives the exact conditional
(permutation) test that training falls as the rate grows (Cochran–Armitage's statistic Σ k_j·s_j, its
null distribution given each group's number of training seeds; Mehta & Patel's exact logistic test).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

CHI2_95 = 3.841458820694124  # the 0.95 quantile of χ²(1): the profile interval is {v: 2·(ℓ̂ − ℓ(v)) ≤ this}


@dataclass
class Data:
    """One row per seed run: its group's index, log10 of its rate, whether it trains."""

    groups: list  # the group labels, in index order
    g: np.ndarray
    u: np.ndarray
    y: np.ndarray

    @classmethod
    def from_rows(cls, rows) -> "Data":
        """rows: (group label, learning rate, trains) per seed run."""
        rows = list(rows)
        if not rows:
            raise ValueError("no runs to fit; fix: pass (group, lr, trains) rows")
        groups = list(dict.fromkeys(r[0] for r in rows))
        return cls(
            groups,
            np.array([groups.index(r[0]) for r in rows]),
            np.log10([float(r[1]) for r in rows]),
            np.array([bool(r[2]) for r in rows], dtype=float),
        )

    def design(self) -> np.ndarray:
        """Columns: one indicator per group (its intercept a_g), then log10 η (the common slope b)."""
        x = np.zeros((len(self.y), len(self.groups) + 1))
        x[np.arange(len(self.y)), self.g] = 1.0
        x[:, -1] = self.u
        return x


def _penalised(x: np.ndarray, y: np.ndarray, theta: np.ndarray, firth: bool) -> tuple[float, np.ndarray, np.ndarray]:
    """(ℓ + ½ log det I, its gradient in θ, I) at θ; the gradient is Firth's modified score
    Xᵀ(y − p + h·(½ − p)), h the hat matrix's diagonal."""
    eta = x @ theta
    p = 1 / (1 + np.exp(-eta))
    loglik = float(np.sum(y * eta - np.logaddexp(0, eta)))
    w = p * (1 - p)
    info = x.T @ (w[:, None] * x)
    resid = y - p
    if firth:
        sign, logdet = np.linalg.slogdet(info)
        if sign <= 0:
            return -math.inf, np.zeros_like(theta), info
        loglik += 0.5 * logdet
        h = w * np.einsum("ij,jk,ik->i", x, np.linalg.inv(info), x)
        resid = resid + h * (0.5 - p)
    return loglik, x.T @ resid, info


def _maximise(x, y, basis: np.ndarray, firth: bool, iterations: int = 1000) -> tuple[float, np.ndarray, bool]:
    """max over φ of the (penalised) log-likelihood at θ = basis·φ, by Fisher scoring with step halving.
    Returns (value, θ, converged); unconverged means the plain likelihood's supremum lies at infinity."""
    phi = np.zeros(basis.shape[1])
    value, grad, info = _penalised(x, y, basis @ phi, firth)
    for _ in range(iterations):
        g = basis.T @ grad
        step = np.linalg.lstsq(basis.T @ info @ basis, g, rcond=None)[0]
        for _ in range(40):  # halve the step until the objective does not fall
            new = phi + step
            v, gr, inf = _penalised(x, y, basis @ new, firth)
            if v >= value - 1e-12:
                break
            step = step / 2
        else:  # no ascent left: converged if the score vanishes (float noise at the top), else stuck
            return value, basis @ phi, bool(np.max(np.abs(g)) < 1e-6)
        done = float(np.max(np.abs(basis.T @ gr))) < 1e-7  # the (modified) score vanishes
        phi, value, grad, info = new, v, gr, inf
        if done:
            return value, basis @ phi, True
    return value, basis @ phi, False


def _null_space(c: np.ndarray) -> np.ndarray:
    """An orthonormal basis of {θ: c·θ = 0}."""
    _, _, vt = np.linalg.svd(c[None, :])
    return vt[1:].T


@dataclass
class Fit:
    """The common-slope fit: the groups' log10 50% rates x_g, the slope b, the penalised maximum, and
    whether the plain likelihood is separated (has no finite maximum)."""

    data: Data
    theta: np.ndarray
    value: float
    separated: bool
    firth: bool = True

    @property
    def slope(self) -> float:
        return float(self.theta[-1])

    def x50(self, group) -> float:
        return float(-self.theta[self.data.groups.index(group)] / self.theta[-1])

    def combination(self, weights: dict) -> float:
        """v = Σ w_g·x_g at the fit."""
        return sum(w * self.x50(g) for g, w in weights.items())

    def profile(self, weights: dict, v: float) -> float:
        """The maximum of the (penalised) log-likelihood with Σ w_g·x_g fixed at v."""
        c = np.zeros(len(self.data.groups) + 1)
        for g, w in weights.items():
            c[self.data.groups.index(g)] = w
        c[-1] = v
        return _maximise(self.data.design(), self.data.y, _null_space(c), self.firth)[0]

    def interval(self, weights: dict, span: float = 3.0, tol: float = 1e-4) -> tuple[float | None, float | None]:
        """The 95% profile-likelihood interval of Σ w_g·x_g: where 2·(maximum − profile) = χ²₁(0.95),
        searched up to `span` decades either side; None on a side where the profile does not fall that
        far within the span (the interval is open there)."""
        est = self.combination(weights)
        return profile_interval(est, lambda v: 2 * (self.value - self.profile(weights, v)) - CHI2_95, span, tol)


def profile_interval(est: float, drop, span: float = 3.0, tol: float = 1e-4) -> tuple[float | None, float | None]:
    """The ends around `est` where `drop` (twice the profile's fall from the maximum, minus χ²₁(0.95)) turns
    positive: doubling steps out from est up to `span`, then bisection to `tol`; None on an open side."""
    ends = []
    for side in (-1, 1):
        step, inner, outer = 0.02, est, None
        while abs(step) <= span:
            v = est + side * step
            if drop(v) > 0:
                outer = v
                break
            inner, step = v, step * 2
        if outer is None:
            ends.append(None)
            continue
        while abs(outer - inner) > tol:  # bisection: drop(inner) ≤ 0 < drop(outer)
            mid = (inner + outer) / 2
            inner, outer = (mid, outer) if drop(mid) <= 0 else (inner, mid)
        ends.append((inner + outer) / 2)
    return ends[0], ends[1]


def separated(data: Data) -> bool:
    """Whether the plain likelihood has no finite maximum: some direction d ≠ 0 of (a, b) with x·d ≥ 0 at
    every run that trains and ≤ 0 at every one that does not. With one intercept per group and a common
    slope that is: a group whose runs all train (or all do not), or every group with both outcomes
    (quasi-)separated the same way, each training run at a rate at or below each failing one (b → −∞), or
    at or above (b → +∞)."""
    down = up = True
    for g in range(len(data.groups)):
        u, y = data.u[data.g == g], data.y[data.g == g]
        if y.min() == y.max():
            return True
        down &= bool(u[y == 1].max() <= u[y == 0].min())
        up &= bool(u[y == 1].min() >= u[y == 0].max())
    return down or up


def fit(data: Data, firth: bool = True) -> Fit:
    """The common-slope logistic fit (Firth's by default), with `separated` (the plain maximum-likelihood
    fit has no finite maximum)."""
    x = data.design()
    if len(set(data.y.tolist())) < 2:
        raise ValueError("every run trains (or none does): no boundary to fit; fix: include rates on both sides")
    value, theta, ok = _maximise(x, data.y, np.eye(x.shape[1]), firth)
    if not ok:
        raise ValueError("the fit did not converge; fix: check that every group has runs at two rates")
    return Fit(data, theta, value, separated(data), firth)


def ml_limits(data: Data) -> dict:
    """Where the plain likelihood's supremum puts each group's log10 η50 as the slope runs to −∞ (data
    separated downward, `separated`): (lo, hi), a point (the rate where some seeds train and some do not)
    or an open gap (between the highest rate where every seed trains and the lowest where none does)."""
    out = {}
    for g, label in enumerate(data.groups):
        u, y = data.u[data.g == g], data.y[data.g == g]
        out[label] = (float(u[y == 1].max()), float(u[y == 0].min()))
    return out


# ---------------------------------------------------------------------------------------- exact test
def exact_trend_test(strata: list[list[tuple[int, int, int]]]) -> dict:
    """The exact conditional test that "trains" falls as the rate grows, stratified by group.

    strata: per group, (score, seeds that train, seeds) per rate, the score an integer position on the
    rate ladder (e.g. half-octaves: 2·log2(η/η₀)). The statistic T = Σ over groups and rates of score·k;
    under "no trend" (within each group, P(trains) the same at every rate), given each group's number of
    training seeds, each group's k's are hypergeometric (every choice of which seeds train equally likely),
    so T's null distribution is the convolution over the groups of Σ C(n_j, k_j)-weighted sums. Returns
    {t, p_falls: P(T ≤ t), p_rises: P(T ≥ t)}, exact (counts as Python integers)."""
    total: dict[int, float] = {0: 1.0}
    t_obs = 0
    for stratum in strata:
        dist: dict[tuple[int, int], int] = {(0, 0): 1}  # (successes so far, T so far) -> ways
        successes = sum(k for _, k, _ in stratum)
        for score, k, n in stratum:
            t_obs += score * k
            new: dict[tuple[int, int], int] = {}
            for (s, t), ways in dist.items():
                for j in range(0, min(n, successes - s) + 1):
                    key = (s + j, t + score * j)
                    new[key] = new.get(key, 0) + ways * math.comb(n, j)
            dist = new
        ways_total = sum(w for (s, _), w in dist.items() if s == successes)
        mine = {t: w / ways_total for (s, t), w in dist.items() if s == successes}
        conv: dict[int, float] = {}
        for t1, p1 in total.items():
            for t2, p2 in mine.items():
                conv[t1 + t2] = conv.get(t1 + t2, 0.0) + p1 * p2
        total = conv
    return {
        "t": t_obs,
        "p_falls": sum(p for t, p in total.items() if t <= t_obs),
        "p_rises": sum(p for t, p in total.items() if t >= t_obs),
    }
