"""Exact expected error against Monte Carlo, per-query variances, the relaxed-strategy bias term."""

from __future__ import annotations

import numpy as np
import pytest

from dpopt.baselines import (
    hierarchical_strategy,
    identity_strategy,
    wavelet_strategy,
    workload_strategy,
)
from dpopt.error import expected_error, monte_carlo_error
from dpopt.kron_strategy import KronMatrix
from dpopt.marginal_strategy import MarginalMatrix
from dpopt.privacy import Privacy
from dpopt.strategy import Strategy, StrategyError
from dpopt.union_strategy import UnionKronMatrix
from dpopt.workloads import AllRange, Identity, Kron, Marginals, Prefix, Stack, Total, WRange

# Monte Carlo tolerance: the analytic value must lie within 4 standard errors of the mean over 2000 draws.
Z_TOL = 4.0
# Two dense routes to the same well-conditioned quantity (Cholesky trace vs pseudo-inverse rows, sums
# of m <= 528 positive terms): cond(A^T A) <= 63 for these strategies at n = 32, so n * cond * eps_mach
# ~ 32 * 63 * 2.2e-16 ~ 5e-13; 1e-10 leaves a wide margin and still catches any formula error.
DENSE_RTOL = 1e-10
# The same few float operations in another order (a product of three factors, a sqrt of a quotient):
# each result is within a few ulps (a few 1e-16 relative) of the exact value.
ULPS_RTOL = 1e-14


@pytest.mark.parametrize("privacy", [Privacy(1.0), Privacy(0.5, 1e-6), Privacy(2.0, 1e-4, "analytic")])
@pytest.mark.parametrize("make", [identity_strategy, hierarchical_strategy, wavelet_strategy])
def test_analytic_matches_monte_carlo(privacy, make):
    n = 32
    w = AllRange(n)
    s = make(n)
    x = np.random.default_rng(5).integers(0, 100, size=n).astype(float)
    exact = expected_error(s, w, privacy)
    mc = monte_carlo_error(s, w, privacy, x, np.random.default_rng(11), trials=2000)
    assert abs(mc.total_mean[0] - exact.total) <= Z_TOL * mc.total_se[0]
    assert exact.per_query.sum() == pytest.approx(exact.total, rel=DENSE_RTOL)
    assert exact.rmse == pytest.approx(np.sqrt(exact.total / w.m), rel=ULPS_RTOL)


def _structured_cases():
    kron = KronMatrix([hierarchical_strategy(6), wavelet_strategy(4)])
    union = UnionKronMatrix([kron, KronMatrix([np.eye(6), np.ones((1, 4))])], [1.0, 0.5], assignment=[0, 1])
    marg = MarginalMatrix([2, 3, 4], "marginals", [(1, 2), (0, 1), (0,)], [1.0, 0.7, 0.4])
    return [
        (kron, Kron([AllRange(6), Prefix(4)])),
        (union, Stack([Kron([AllRange(6), Prefix(4)]), Kron([Identity(6), Total(4)])], weights=[1.0, 3.0])),
        (marg, Marginals([2, 3, 4], subsets=[(1, 2), (0,)], weights=[1.0, 2.0])),
    ]


@pytest.mark.parametrize("privacy", [Privacy(1.0), Privacy(0.5, 1e-6)])
@pytest.mark.parametrize("case", _structured_cases(), ids=["kron", "union", "marginal"])
def test_structured_strategies_match_monte_carlo(case, privacy):
    """Sampled answers through A's factors (`Strategy.answers` on a batch) have the analytic total error."""
    A, w = case
    s = Strategy(A)
    x = np.random.default_rng(5).integers(0, 50, size=w.n).astype(float)
    mc = monte_carlo_error(s, w, privacy, x, np.random.default_rng(11), trials=2000)
    assert abs(mc.total_mean[0] - expected_error(s, w, privacy).total) <= Z_TOL * mc.total_se[0]
    # a batch is answered row by row exactly as one measurement vector is
    y = s.measure(x, privacy, np.random.default_rng(3)) + np.zeros((2, 1))
    np.testing.assert_array_equal(s.answers(y, w)[1], s.answers(y[1], w))


def test_noise_on_queries_monte_carlo():
    w = WRange(20, 16, seed=3)
    p = Privacy(1.0)
    s = workload_strategy(w)
    exact = expected_error(s, w, p)
    x = np.arange(16.0)
    mc = monte_carlo_error(s, w, p, x, np.random.default_rng(0), trials=2000)
    assert abs(mc.total_mean[0] - exact.total) <= Z_TOL * mc.total_se[0]
    # B = I: ||B||_F^2 = m exactly, so the total is the product 2 * m * sens^2 in another order.
    assert exact.total == pytest.approx(2 * w.m * s.sens1**2, rel=ULPS_RTOL)


def test_identity_error_closed_form():
    n = 10
    w = Prefix(n)
    e = expected_error(identity_strategy(n), w, Privacy(1.0))
    # A = I (Cholesky factor I): trace(G) up to the order of one sum of n = 10 integers, exact in floats.
    assert e.total == pytest.approx(2 * np.trace(w.gram()), rel=ULPS_RTOL)
    assert e.noise == "laplace" and "variance 2 b^2" in e.convention


def test_relaxed_strategy_reports_bias_separately():
    w = Prefix(4)
    W = w.matrix()
    A = np.eye(4)
    B = W.copy()
    B[3, 3] = 0.9  # W - B A has one entry 0.1
    s = Strategy(A, B=B, gamma=0.2)
    x = np.array([1.0, 2.0, 3.0, 4.0])
    e = expected_error(s, w, Privacy(1.0), x=x)
    # The residual W x - B A x = 10 - 9.6 is a cancellation: its absolute error is ~ ulp(10) ~ 2e-15,
    # relative to 0.4 ~ 5e-15, ~ 1e-14 once squared (0.1 and 0.9 are not exact in binary); so 1e-13.
    assert e.bias_sq == pytest.approx((0.1 * 4.0) ** 2, rel=1e-13)
    assert e.total == pytest.approx(2 * np.sum(B**2), rel=ULPS_RTOL)
    mc = monte_carlo_error(s, w, Privacy(1.0), x, np.random.default_rng(0), trials=4000)
    assert abs(mc.total_mean[0] - (e.total + e.bias_sq)) <= Z_TOL * mc.total_se[0]


def test_unsupported_workload_raises_before_any_noise():
    with pytest.raises(StrategyError, match="does not support"):
        expected_error(Strategy(np.ones((1, 5))), AllRange(5), Privacy(1.0))
    with pytest.raises(StrategyError):
        monte_carlo_error(Strategy(np.ones((1, 5))), AllRange(5), Privacy(1.0), np.ones(5),
                          np.random.default_rng(0))
    # A = W = 1 x 5 ones, sensitivity 1: trace(G (A^T A)^+) with a rank-one Gram of all ones; its
    # pseudo-inverse has relative error ~ n * n * eps_mach ~ 6e-15 (n = 5, norm 5), so 1e-13.
    assert expected_error(Strategy(np.ones((1, 5))), Total(5), Privacy(1.0)).total == pytest.approx(
        2.0, rel=1e-13)


def test_shape_mismatch_and_bad_data():
    s = identity_strategy(4)
    with pytest.raises(StrategyError, match="covers 4 cells"):
        expected_error(s, AllRange(5), Privacy(1.0))
    with pytest.raises(ValueError, match="length 3"):
        expected_error(s, AllRange(4), Privacy(1.0), x=np.ones(3))
    with pytest.raises(ValueError, match="NaN"):
        expected_error(s, AllRange(4), Privacy(1.0), x=np.array([1, np.nan, 1, 1]))
    with pytest.raises(ValueError, match="Privacy"):
        expected_error(s, AllRange(4), 1.0)
