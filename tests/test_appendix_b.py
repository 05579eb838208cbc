"""Tests for seed 000 Appendix B: smoothed max-diagonal matrix-mechanism solver with SPG."""

from __future__ import annotations

import math

import numpy as np
import pytest
from reference_workloads import allrange_matrix as all_range
from reference_workloads import prefix_matrix as prefix

from dpopt.solvers.appendix_b import (
    RangeSpace,
    objective_parts,
    project_trace_floor,
    smooth_max,
    solve_appendix_b,
    unsmoothed,
)
from dpopt.solvers.result import CONVERGED, MAX_ITER, STALLED
from dpopt.workloads import WidthK

cp = pytest.importorskip("cvxpy")


def sdp_optimum(G: np.ndarray) -> float:
    """min tr(Y) s.t. [[X, V^T], [V, Y]] PSD, diag(X) <= 1, V^T V = G (seed 002's SDP), Clarabel."""
    n = G.shape[0]
    lam, U = np.linalg.eigh(G)
    V = (U * np.sqrt(np.maximum(lam, 0.0))).T
    X = cp.Variable((n, n), symmetric=True)
    Y = cp.Variable((n, n), symmetric=True)
    prob = cp.Problem(cp.Minimize(cp.trace(Y)), [cp.bmat([[X, V.T], [V, Y]]) >> 0, cp.diag(X) <= 1])
    prob.solve(solver=cp.CLARABEL)
    return float(prob.value)


def test_smooth_max_bounds_gradient_and_stability():
    rng = np.random.default_rng(0)
    v = rng.normal(size=7)
    mu = 0.3
    f, g = smooth_max(v, mu)
    # |v| < 3: the stable form max + mu log(sum) is within a few ulps (4e-16 each) of exact: 1e-15
    assert v.max() <= f <= v.max() + mu * math.log(7) + 1e-15
    naive = mu * math.log(np.exp(v / mu).sum())  # Eq. (14) as written
    # exp(v / mu) with |v / mu| < 10 and a 7-term sum: relative error ~ 10 eps_mach per step, ~1e-14
    assert f == pytest.approx(naive, rel=1e-13)
    h = 1e-6
    fd = np.array([(smooth_max(v + h * e, mu)[0] - smooth_max(v - h * e, mu)[0]) / (2 * h)
                   for e in np.eye(7)])
    # central differences: truncation h^2 |f^(3)| / 6 ~ 1e-12 / mu^2 ~ 1e-11, rounding eps |f| / h ~ 5e-10
    np.testing.assert_allclose(g, fd, atol=1e-8)
    assert g.sum() == pytest.approx(1.0, rel=1e-14)  # softmax weights normalised by their 7-term sum
    # Large entries and tiny mu: the stable form neither overflows nor loses the max (ulp(1e6) = 1.2e-16 rel).
    f, g = smooth_max(np.array([1e6, 1e6 - 1.0, 3.0]), 1e-4)
    assert f == pytest.approx(1e6, rel=1e-15) and np.isfinite(g).all()


def test_trace_floor_projection_against_cvxpy():
    rng = np.random.default_rng(1)
    n = 5
    X = rng.normal(size=(n, n)) * 2.0
    floor = 0.05
    P = project_trace_floor(X, float(n), floor)
    # P is rebuilt from an eigendecomposition of X (||X|| ~ 10): its trace and eigenvalues carry
    # ~ n eps ||X|| ~ 1e-14 of round-off; 1e-12
    assert np.trace(P) == pytest.approx(n, rel=1e-12)
    assert np.linalg.eigvalsh(P).min() >= floor - 1e-12
    Z = cp.Variable((n, n), symmetric=True)
    prob = cp.Problem(
        cp.Minimize(cp.sum_squares(Z - 0.5 * (X + X.T))),
        [cp.trace(Z) == n, Z - floor * np.eye(n) >> 0],
    )
    prob.solve(solver=cp.CLARABEL)
    # Clarabel's defaults (gap and feasibility 1e-8) give its value to ~1e-8 (1 + f); the objective is
    # 2-strongly convex, so ||Z - P||_F^2 <= f(Z) - f(P) is bounded by that too (our P is the exact
    # projection up to 1e-14).
    f_P = float(np.sum((P - 0.5 * (X + X.T)) ** 2))
    assert abs(f_P - prob.value) <= 1e-7 * (1 + prob.value)
    np.testing.assert_allclose(P, Z.value, rtol=0, atol=np.sqrt(1e-7 * (1 + prob.value)))
    np.testing.assert_allclose(project_trace_floor(P, float(n), floor), P, atol=1e-12)


def test_trace_term_gradient_matches_finite_differences():
    rng = np.random.default_rng(2)
    n = 4
    W = rng.normal(size=(6, n))
    G = W.T @ W
    A = rng.normal(size=(n, n))
    M = A.T @ A + np.eye(n)
    t, grad, d = objective_parts(M, G)
    # M = A^T A + I at n = 4 (cond well below 1e3): two dense solves agree to n cond eps < 1e-12
    assert t == pytest.approx(np.trace(G @ np.linalg.inv(M)), rel=1e-12)
    np.testing.assert_array_equal(d, np.diag(M))
    E = rng.normal(size=(n, n))
    E = E + E.T
    h = 1e-6
    fd = (objective_parts(M + h * E, G)[0] - objective_parts(M - h * E, G)[0]) / (2 * h)
    # central difference with h = 1e-6: truncation O(h^2) ~ 1e-12, rounding eps t / h ~ 1e-10 relative
    assert np.vdot(grad, E) == pytest.approx(fd, rel=1e-6)


@pytest.mark.parametrize(
    "name, W",
    [
        ("prefix8", prefix(8)),
        ("random12x10", np.random.default_rng(0).normal(size=(12, 10))),
        ("allrange16", all_range(16)),
    ],
)
def test_matches_sdp_within_certified_gap(name, W):
    G = W.T @ W
    opt = sdp_optimum(G)
    res = solve_appendix_b(G, gap_tol=1e-5)
    assert res.status == CONVERGED, res.message
    # Any positive definite M gives a feasible strategy, so F(M) can never beat the optimum, and the
    # dual bound can never exceed it; opt is Clarabel's, within its default relative gap 1e-8: 1e-7.
    assert res.fun >= opt * (1 - 1e-7)
    assert res.dual_bound <= opt * (1 + 1e-7)
    assert res.gap <= 1e-5
    # The certificate is a proof: the distance to Clarabel's optimum is within it.
    assert (res.fun - opt) / opt <= 1e-5 + 1e-7


def test_returned_strategy_reproduces_fun():
    W = prefix(8)
    G = W.T @ W
    res = solve_appendix_b(G)
    A = res.x
    # A is normalised by its largest column norm: n = 8 squares re-summed, n eps
    sens2_sq = float(np.max(np.sum(A * A, axis=0)))
    assert sens2_sq == pytest.approx(1.0, rel=1e-14)
    # cond(A) ~ 3.3 (cond(M) ~ 11): W A^+ A = W and the error factor to ~ n cond(M) eps ~ 2e-14
    B = W @ np.linalg.pinv(A)
    np.testing.assert_allclose(B @ A, W, rtol=0, atol=1e-12)
    # (eps, delta) matrix-mechanism error factor: sens2(A)^2 ||W A^+||_F^2.
    assert sens2_sq * float(np.sum(B * B)) == pytest.approx(res.fun, rel=1e-12)
    M = res.extra["M"]
    assert np.diag(M).max() == pytest.approx(1.0, rel=1e-15)  # M / max(diag M): one rounding
    assert unsmoothed(M, G) == pytest.approx(res.fun, rel=1e-12)
    # f_mu >= max, and F is scale-invariant, so the smoothed value bounds fun from above.
    assert res.extra["fun_smoothed"] >= res.fun * (1 - 1e-12)


def test_identity_workload_keeps_identity():
    # W = I: min tr(X^{-1}) s.t. diag X <= 1 is attained at X = I with value n.
    res = solve_appendix_b(np.eye(6))
    assert res.status == CONVERGED
    # the certificate: 6 <= fun <= 6 (1 + gap), up to a few ulps of round-off
    assert 6.0 * (1 - 1e-14) <= res.fun <= 6.0 * (1 + max(res.gap, 0.0) + 1e-14)


@pytest.mark.parametrize(
    "name, W",
    [
        ("random3x8", np.random.default_rng(3).normal(size=(3, 8))),  # rank 3 < n = 8
        ("width16k3", WidthK(16, 3).matrix()),  # 14 queries on 16 cells: rank 14
    ],
)
def test_singular_gram_reaches_the_optimum(name, W):
    """Singular W^T W: the optimum is approached only by singular M; the solver works on range(G)."""
    G = W.T @ W
    opt = sdp_optimum(G)
    res = solve_appendix_b(G, gap_tol=1e-5)
    assert res.status == CONVERGED, res.message
    # Both W have full row rank (3 Gaussian rows; 14 shifted windows), so rank(G) = m < n. Not
    # matrix_rank(G): its threshold (n eps s_max) is the same order as G's round-off null eigenvalues.
    assert res.extra["rank"] == W.shape[0] < G.shape[0]
    assert res.fun >= opt * (1 - 1e-7) and res.dual_bound <= opt * (1 + 1e-7)
    assert (res.fun - opt) / opt <= 1e-5 + 1e-7
    # The strategy answers W exactly (range(G) inside range(A^T A)) at the reported error.
    # A has rank m: its nonzero singular values are >= 0.5 of the largest here, its null ones round-off
    # (<= n eps): rcond = 1e-10 separates them, and then W A^+ A = W to ~ n cond eps ~ 1e-14.
    A = res.x
    B = W @ np.linalg.pinv(A, rcond=1e-10)
    np.testing.assert_allclose(B @ A, W, rtol=0, atol=1e-12)
    sens2_sq = float(np.max(np.sum(A * A, axis=0)))
    assert sens2_sq * float(np.sum(B * B)) == pytest.approx(res.fun, rel=1e-12)


def test_range_space_gradient_matches_finite_differences():
    """Eq. (14)-(15) on M = U K U^T: the gradient in K of f_mu(diag M) tr(G M^+)."""
    rng = np.random.default_rng(4)
    W = rng.normal(size=(3, 6))
    G = W.T @ W
    sp = RangeSpace(G, 1e-12)
    # G's 3 null eigenvalues come out at ~ n eps ||G|| ~ 1e-15 ||G||, far below the 1e-12 cut
    assert sp.k == 3 and sp.U.shape == (6, 3)
    np.testing.assert_allclose(sp.V.T @ sp.V, G, atol=1e-10)  # eigen backward error ~ n eps ||G|| ~ 1e-14
    A = rng.normal(size=(3, 3))
    K = A @ A.T + np.eye(3)
    mu = 0.2
    f, grad = sp.value_and_gradient(K, mu)
    M = sp.U @ K @ sp.U.T
    # K = A A^T + I (3 x 3, cond < 1e3): dense routes agree to n cond eps < 1e-12
    assert f == pytest.approx(smooth_max(np.diag(M), mu)[0] * np.trace(G @ np.linalg.pinv(M)), rel=1e-10)
    E = rng.normal(size=(3, 3))
    E = E + E.T
    h = 1e-6
    fd = (sp.value_and_gradient(K + h * E, mu)[0] - sp.value_and_gradient(K - h * E, mu)[0]) / (2 * h)
    assert np.vdot(grad, E) == pytest.approx(fd, rel=1e-6)
    # The certificate's lower bound at uniform multipliers is the SVD bound (seed 004, Def. 4.1).
    # mu = 1e6: the softmax weights are uniform up to (max diag M - min diag M) / mu ~ 1e-5 relative
    F, LB, d = sp.certificate(K, 1e6)
    np.testing.assert_allclose(d, np.full(6, 1 / 6), rtol=1e-4)
    svdb = np.sum(np.sqrt(np.maximum(np.linalg.eigvalsh(G), 0))) ** 2 / 6
    assert LB == pytest.approx(svdb, rel=1e-4)  # the same 1e-5 (the null eigenvalues add ~1e-8)
    assert F == pytest.approx(np.diag(M).max() * np.trace(G @ np.linalg.pinv(M)), rel=1e-10)


def test_default_gap_is_certified_and_true():
    """The default certificate (gap_tol 1e-4) holds against Clarabel, on a nonsingular Gram."""
    G = all_range(12).T @ all_range(12)
    opt = sdp_optimum(G)
    res = solve_appendix_b(G)
    assert res.status == CONVERGED and res.gap <= 1e-4
    assert res.dual_bound <= opt * (1 + 1e-7) <= res.fun * (1 + 1e-7) <= opt * (1 + 1e-4 + 1e-7)


def test_width_too_large_for_gap_is_not_convergence():
    """mu bounds how close the smoothed minimiser can come: a gap it cannot certify is STALLED."""
    G = prefix(8).T @ prefix(8)
    # the smoothing bias mu log n ~ 0.02 keeps the gap orders of magnitude above 1e-8: not a rounding call
    res = solve_appendix_b(G, mu=1e-2, mu_start=1e-2, gap_tol=1e-8)
    assert res.status == STALLED and not res.success
    assert res.gap > 1e-8 and "mu=0.01" in res.message


def test_iteration_cap_is_not_convergence():
    res = solve_appendix_b(prefix(8).T @ prefix(8), max_iter=3)
    assert res.status == MAX_ITER and not res.success and res.nit == 3


def test_x0_and_callback():
    W = prefix(6)
    G = W.T @ W
    seen = []
    lam, U = np.linalg.eigh(G)
    M0 = (U * np.sqrt(lam)) @ U.T  # eigen-design-like start G^{1/2}
    res = solve_appendix_b(G, x0=M0, callback=lambda info: seen.append(info["k"]))
    assert res.status == CONVERGED
    assert len(seen) == res.nit
    assert res.fun <= unsmoothed(M0, G)


@pytest.mark.parametrize(
    "G, kwargs, match",
    [
        (np.ones((2, 3)), {}, "square"),
        (np.array([[1.0, 2.0], [0.0, 1.0]]), {}, "symmetric"),
        (np.array([[1.0, 2.0], [2.0, 1.0]]), {}, "semidefinite"),
        (np.array([[np.nan, 0.0], [0.0, 1.0]]), {}, "finite"),
        (np.zeros((3, 3)), {}, "non-zero"),
        (np.eye(3), {"mu": 0.0}, "mu"),
        (np.eye(3), {"max_iter": 0}, "max_iter"),
        (np.eye(3), {"gap_tol": 0.0}, "gap_tol"),
        (np.eye(3), {"gap_tol": 1.5}, "gap_tol"),
        (np.eye(3), {"check_every": 0}, "check_every"),
        (np.eye(3), {"x0": np.eye(2)}, "x0"),
        (np.eye(3), {"x0": -np.eye(3)}, "positive definite"),
    ],
)
def test_invalid_input(G, kwargs, match):
    with pytest.raises(ValueError, match=match):
        solve_appendix_b(G, **kwargs)


def test_rank_one_gram_has_the_closed_form_optimum():
    """G = v v^T: min max(diag X) v^T X^+ v is max_i v_i^2, at X = v v^T (the dual bound at d = e_i)."""
    v = np.random.default_rng(5).normal(size=6)
    res = solve_appendix_b(np.outer(v, v), gap_tol=1e-8)
    assert res.status == CONVERGED and res.extra["rank"] == 1
    # On a rank-one range every M = k u u^T gives the same F = max(v^2) exactly, so fun is that up to
    # round-off; the dual bound is certified within gap_tol = 1e-8 of it.
    assert res.fun == pytest.approx(float(np.max(v * v)), rel=1e-12)
    assert res.dual_bound == pytest.approx(float(np.max(v * v)), rel=1e-8)
