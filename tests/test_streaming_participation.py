"""Participation, the certified multi-participation sensitivity, and the MomentumPrefix workload."""

from __future__ import annotations

import numpy as np
import pytest

from dpopt.streaming import participation as part
from dpopt.streaming.base import RECORD_KEYS, Factorization, dense_losses
from dpopt.streaming.participation import (
    Participation,
    block_sensitivity,
    block_sensitivity_lower,
    participation_sensitivity,
    sensitivity_lower,
)
from dpopt.workloads import MomentumPrefix, Prefix, cooldown_schedule
from tests.streaming_brute import CVXPY_RTOL, brute_sensitivity, check_upper_bound, sdp_value


def test_participation_patterns_partition_the_steps():
    p = Participation(12, 3)
    assert p.separation == 4
    idx = p.patterns()
    assert idx.shape == (4, 3)
    assert sorted(idx.ravel().tolist()) == list(range(12))
    assert idx[1].tolist() == [1, 5, 9]


@pytest.mark.parametrize(("n", "k", "msg"), [(10, 3, "must divide"), (10, 0, "epochs"), (0, 1, "n")])
def test_participation_refuses_bad_sizes(n, k, msg):
    with pytest.raises(ValueError, match=msg):
        Participation(n, k)


@pytest.mark.parametrize("scheme", ["b-min-sep", "random-batches"])
def test_other_schemes_are_refused_by_name(scheme):
    with pytest.raises(ValueError, match=f"{scheme}.*not certified"):
        Participation(12, 3, scheme=scheme)


def _mixed_sign_X(n: int, rng: np.random.Generator) -> np.ndarray:
    C = np.tril(rng.standard_normal((n, n)))
    np.fill_diagonal(C, np.abs(np.diag(C)) + 1.0)
    return C.T @ C


@pytest.mark.parametrize("k", [2, 3, 4, 6])
def test_sensitivity_matches_the_sdp_over_every_pattern(k):
    """Mixed-sign X: the barrier method's certified y against one CVXPY solve per pattern, and the Gamma bound below.

    Upper - lower <= 1e-7 relative: the barrier stops at gap k / t <= SDP_RTOL = 1e-9 of the objective, and the
    certification shift adds a few Cholesky margins (about k^2 u times the block's scale)."""
    rng = np.random.default_rng(k)
    n = 4 * k
    X = _mixed_sign_X(n, rng)
    p = Participation(n, k)
    up, low = participation_sensitivity(X, p), sensitivity_lower(X, p)
    brute = brute_sensitivity(X, p)
    assert low <= up
    assert up - low <= 1e-7 * up
    assert abs(up - brute) <= CVXPY_RTOL * brute
    check_upper_bound(X, p, up, rng)


def test_nonnegative_blocks_use_the_all_ones_gamma_exactly():
    n, k = 12, 3
    C = np.tril(np.ones((n, n)))
    X = C.T @ C
    p = Participation(n, k)
    want = max(X[np.ix_(r, r)].sum() for r in p.patterns())
    assert participation_sensitivity(X, p) == pytest.approx(want, rel=4 * k * k * part.UNIT_ROUNDOFF)
    assert sensitivity_lower(X, p) == pytest.approx(want, rel=4 * k * k * part.UNIT_ROUNDOFF)
    assert abs(sdp_value(X[np.ix_(p.patterns()[0], p.patterns()[0])]) - want) <= CVXPY_RTOL * want


def test_single_participation_is_the_largest_diagonal():
    rng = np.random.default_rng(5)
    X = _mixed_sign_X(9, rng)
    assert participation_sensitivity(X, Participation(9, 1)) == np.max(np.diag(X))


def test_certified_y_is_psd_in_exact_arithmetic_on_a_singular_block():
    """A rank-one block sign-flipped: the optimum makes Diag(y) - X singular, where the Cholesky margin matters."""
    v = np.array([1.0, -2.0, 3.0])
    X = np.outer(v, v)[None]
    up = block_sensitivity(X)
    assert up >= np.abs(v).sum() ** 2  # Gamma = s s^T with s = sign(v) gives (sum |v|)^2, the optimum
    assert up <= np.abs(v).sum() ** 2 * (1 + 1e-7)
    assert block_sensitivity_lower(X) <= up


def test_a_wrong_sensitivity_is_caught(monkeypatch):
    """Broken on purpose: the single-participation value (max diagonal) under k = 4 must fail the brute-force check."""
    rng = np.random.default_rng(0)
    n, k = 8, 4
    X = _mixed_sign_X(n, rng)
    p = Participation(n, k)
    monkeypatch.setattr(part, "block_sensitivity", lambda Xs: float(np.diagonal(Xs, axis1=1, axis2=2).max()))
    wrong = part.participation_sensitivity(X, p)
    with pytest.raises(AssertionError, match="below"):
        check_upper_bound(X, p, wrong, rng)


def test_dense_losses_and_record_keys():
    n, k = 8, 2
    A = Prefix(n)
    C = np.eye(n)
    mean, mx, sens2 = dense_losses(A, C, Participation(n, k))
    assert sens2 == pytest.approx(k, rel=1e-15)  # X_pi = I: <I, Gamma> = trace Gamma <= k
    assert mean == pytest.approx(k * n * (n + 1) / 2 / n)
    assert mx == pytest.approx(k * n)
    f = Factorization("sqrt", n, k, "mean", C, {}, sens2, mean, mx)
    assert tuple(f.record()) == RECORD_KEYS


def test_momentum_prefix_is_momentum_sgd():
    """A x reproduces the heavy-ball iterates: m_t = beta m_(t-1) + g_t, theta_t = theta_(t-1) + eta_t m_t."""
    n, beta = 9, 0.9
    eta = cooldown_schedule(n)
    g = np.random.default_rng(2).standard_normal(n)
    m, theta, out = 0.0, 0.0, []
    for t in range(n):
        m = beta * m + g[t]
        theta += eta[t] * m
        out.append(theta)
    A = MomentumPrefix(n, beta, eta).matrix()
    assert np.allclose(A @ g, out, rtol=1e-13, atol=1e-13 * np.abs(out).max())
    assert MomentumPrefix(n, beta, eta).toeplitz_column() is None


def test_momentum_prefix_constant_rate_is_toeplitz_and_beta_zero_is_prefix():
    n = 7
    W = MomentumPrefix(n, 0.5, np.full(n, 0.3))
    a = W.toeplitz_column()
    M = W.matrix()
    t, j = np.tril_indices(n)
    assert np.allclose(M[t, j], a[t - j], rtol=1e-14)
    assert np.array_equal(MomentumPrefix(n).matrix(), Prefix(n).matrix())
    with pytest.raises(ValueError, match="momentum"):
        MomentumPrefix(n, 1.0)


def test_cooldown_schedule_is_the_papers():
    """Choquette-Choo et al. 2023: the last n // 4 rates fall linearly from 1 to 0.05."""
    eta = cooldown_schedule(16)
    assert np.all(eta[:12] == 1.0)
    assert eta[12] == 1.0 and eta[-1] == pytest.approx(0.05)
    assert np.allclose(np.diff(eta[12:]), (0.05 - 1.0) / 3)
