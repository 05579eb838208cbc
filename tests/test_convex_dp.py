"""Tests of the certified seed 002 (eps, delta) strategy solver (dpopt/solvers/convex_dp*.py)."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from conftest import require_shared
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_workloads import allrange_gram, allrange_matrix, prefix_gram, width_matrix
from reference_workloads import range_family_gram as family

from dpopt.solvers.convex_dp import (
    convex_dp_dual_bound,
    convex_dp_objective,
    solve_convex_dp,
    svdb_multipliers,
)
from dpopt.solvers.convex_dp_core import nuclear_norm_lower_bound, range_factor
from dpopt.solvers.result import CONVERGED, MAX_ITER, STALLED

# ---- independent workload constructions (closed forms and explicit matrices) ----------------------


def svdb(G: np.ndarray) -> float:
    """SVD bound (seed 004, Prop. 4.3) from the singular values of a Cholesky-free square root."""
    lam = np.clip(np.linalg.eigvalsh(G), 0.0, None)
    return float(np.sqrt(lam).sum() ** 2 / G.shape[0])


def pinv_objective(G: np.ndarray, X: np.ndarray) -> float:
    """trace(G X^+) by an eigen-decomposition pseudo-inverse (independent of the solver's Cholesky)."""
    return float(np.trace(G @ np.linalg.pinv(X, rcond=1e-10, hermitian=True)))


# ---- convergence and sandwich on the families -------------------------------------------------------


@pytest.mark.parametrize("kind", ["allrange", "prefix", "widthk"])
@pytest.mark.parametrize("n", [16, 32, 64])
def test_certified_gap_and_sandwich(kind: str, n: int) -> None:
    G = family(kind, n)
    res = solve_convex_dp(G, tol=1e-8)
    assert res.status == CONVERGED, res.message
    assert res.gap <= 1e-6
    assert res.dual_bound <= res.fun * (1 + 1e-12)
    # SVD bound (P = 1) <= optimum <= identity strategy's value trace(G).
    assert svdb(G) <= res.dual_bound * (1 + 1e-10)
    assert res.fun <= np.trace(G)
    X = res.x
    np.testing.assert_allclose(np.diag(X), 1.0, atol=1e-9)
    np.testing.assert_allclose(X, X.T, atol=1e-12)
    assert np.linalg.eigvalsh(X).min() > -1e-10
    np.testing.assert_allclose(pinv_objective(G, X), res.fun, rtol=1e-6)
    A = res.extra["A"]
    np.testing.assert_allclose(A.T @ A, X, atol=1e-9)
    if kind == "widthk":
        assert res.extra["rank"] == n - n // 4 + 1


def test_strategy_error_matches_objective_on_explicit_workload() -> None:
    """||W A^+||_F^2 with sens2(A) = 1 equals fun, computed from the explicit AllRange(12) rows."""
    W = allrange_matrix(12)
    res = solve_convex_dp(W.T @ W)
    A = res.extra["A"]
    assert np.sqrt((A * A).sum(axis=0)).max() <= 1 + 1e-9
    B = W @ np.linalg.pinv(A)
    np.testing.assert_allclose(B @ A, W, atol=1e-8)
    np.testing.assert_allclose((B * B).sum(), res.fun, rtol=1e-8)


# ---- closed-form optima -----------------------------------------------------------------------------


def test_diagonal_gram_optimum_is_identity() -> None:
    """(X^{-1})_ii >= 1 / X_ii = 1, so for diagonal G the optimum is trace(G) at X = I, d = diag(G)."""
    g = np.array([1.0, 4.0, 9.0, 0.25, 2.0])
    res = solve_convex_dp(np.diag(g))
    assert res.success
    np.testing.assert_allclose(res.fun, g.sum(), rtol=1e-10)
    np.testing.assert_allclose(res.x, np.eye(5), atol=1e-8)
    np.testing.assert_allclose(convex_dp_dual_bound(np.diag(g), g), g.sum(), rtol=1e-12)


def test_total_query_rank_one() -> None:
    """Total(n): G = 1 1^T; one query [1..1] with sensitivity 1 has error 1, the SVD bound is 1."""
    n = 10
    res = solve_convex_dp(np.ones((n, n)))
    assert res.success and res.gap <= 1e-8
    np.testing.assert_allclose(res.fun, 1.0, rtol=1e-8)
    assert res.extra["rank"] == 1


@pytest.mark.parametrize("n", [4, 6, 8])
def test_allpredicate_meets_svd_bound(n: int) -> None:
    """Seed 004 Thm 5.3 / Cor 5.4: variable-agnostic G = (a-b) I + b 1 1^T has optimum SVDB =
    (sqrt(a + (n-1) b) + (n-1) sqrt(a-b))^2 / n; for ALLPREDICATE(n), a = 2^(n-1), b = 2^(n-2)."""
    a, b = 2.0 ** (n - 1), 2.0 ** (n - 2)
    G = (a - b) * np.eye(n) + b * np.ones((n, n))
    expected = (np.sqrt(a + (n - 1) * b) + (n - 1) * np.sqrt(a - b)) ** 2 / n
    if n in (4, 8):  # Cor. 5.4 closed form for n = 2^k
        np.testing.assert_allclose(expected, 2.0 ** (n - 2) / n * (n - 1 + np.sqrt(n + 1)) ** 2, rtol=1e-12)
    res = solve_convex_dp(G)
    assert res.success
    np.testing.assert_allclose(res.fun, expected, rtol=1e-8)
    np.testing.assert_allclose(res.dual_bound, expected, rtol=1e-8)


# ---- the certificate --------------------------------------------------------------------------------


def test_dual_bound_at_ones_is_svd_bound() -> None:
    G = prefix_gram(20)
    np.testing.assert_allclose(convex_dp_dual_bound(G, np.ones(20)), svdb(G), rtol=1e-12)


def test_dual_function_is_the_lagrangian_minimum() -> None:
    """g(d) = min_X trace(G X^{-1}) + trace(D X) - sum(d), attained at X(d) solving X D X = G."""
    rng = np.random.default_rng(3)
    W = rng.normal(size=(9, 7))
    G = W.T @ W
    d = rng.uniform(0.2, 3.0, size=7)
    Dh = np.diag(np.sqrt(d))
    lam, Q = np.linalg.eigh(Dh @ G @ Dh)
    root = (Q * np.sqrt(lam)) @ Q.T
    Xd = np.linalg.inv(Dh) @ root @ np.linalg.inv(Dh)
    np.testing.assert_allclose(Xd @ np.diag(d) @ Xd, G, rtol=1e-9, atol=1e-9)

    def lagrangian(X: np.ndarray) -> float:
        return float(np.trace(G @ np.linalg.inv(X)) + d @ np.diag(X) - d.sum())

    g = convex_dp_dual_bound(G, d, scaled=False)
    np.testing.assert_allclose(lagrangian(Xd), g, rtol=1e-10)
    for _ in range(20):
        E = rng.normal(size=(7, 7)) * 1e-2
        assert lagrangian(Xd + E @ E.T) >= g - 1e-9 * abs(g)
    # Best scaling of the ray: phi^2 / sum(d) >= g(t d) for every t.
    scaled = convex_dp_dual_bound(G, d)
    for t in (0.1, 0.5, 2.0, 10.0):
        assert convex_dp_dual_bound(G, t * d, scaled=False) <= scaled * (1 + 1e-12)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(2, 9), m=st.integers(1, 12))
def test_dual_bound_below_every_feasible_objective(seed: int, n: int, m: int) -> None:
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(m, n)) * rng.uniform(0.1, 10.0)
    G = W.T @ W
    d = rng.exponential(size=n) * (rng.uniform(size=n) > 0.2)
    if not (d > 0).any():
        d[0] = 1.0
    R = rng.normal(size=(n + 2, n))
    X = R.T @ R
    X /= np.sqrt(np.outer(np.diag(X), np.diag(X)))  # unit diagonal: feasible
    X *= rng.uniform(0.3, 1.0)  # diag(X) <= 1: still feasible
    f = convex_dp_objective(G, X)
    assert convex_dp_dual_bound(G, d, scaled=False) <= convex_dp_dual_bound(G, d) * (1 + 1e-12) + 1e-12
    assert convex_dp_dual_bound(G, d) <= f * (1 + 1e-9)


@pytest.mark.parametrize("noise", [0.0, 1e-10, 1e-6, 1e-3])
def test_eigenbasis_bound_never_exceeds_the_nuclear_norm(noise: float) -> None:
    """nuclear_norm_lower_bound(Z, d) <= ||Z D^{1/2}||_* for Z = U^T V (orthogonal rows up to round-off) and
    for rows made non-orthogonal by `noise` (it then loses about the noise, or gives up with None)."""
    rng = np.random.default_rng(3)
    k, n = 40, 50
    V = rng.standard_normal((k, n))
    d = rng.uniform(0.1, 1.0, n)
    _, U = np.linalg.eigh((V * d) @ V.T)
    Z = U.T @ V + noise * rng.standard_normal((k, n))
    exact = float(np.linalg.svd(Z * np.sqrt(d), compute_uv=False).sum())
    bound = nuclear_norm_lower_bound(Z, d)
    # The SVD's own backward error: an absolute k * n * eps * ||Z D^{1/2}||_2 per singular value.
    rounding = k * k * n * np.finfo(float).eps
    if bound is not None:
        assert bound <= exact * (1 + rounding)
    if noise == 0.0:
        # Loss: (tau + mu) / 2 with tau <= 2.5 |lambda_min(W W^T - I)| ~ k n eps cond(T) and mu = 2 k n eps.
        cond = np.linalg.cond((V * d) @ V.T)
        assert bound is not None and bound >= exact * (1 - 10 * k * n * cond * np.finfo(float).eps)


def test_solver_certificate_agrees_with_the_svd_bound() -> None:
    """The eigenbasis certificate never exceeds the SVD value of the same bound, and when it is switched off
    the SVD fallback certifies the same gap (one SVD counted)."""
    G = prefix_gram(64)
    res = solve_convex_dp(G, tol=1e-8)
    svd_bound = convex_dp_dual_bound(G, res.extra["d"])
    rounding = 64**3 * np.finfo(float).eps  # k * n * eps per singular value, summed over k (as above)
    assert res.extra["certificate"] == "eigenbasis row orthogonality"
    assert res.dual_bound <= svd_bound * (1 + rounding)
    assert res.extra["decompositions"] == {"eigh": res.extra["decompositions"]["eigh"], "svd": 0}
    # Every evaluated point is one eigen-decomposition, plus G's: at least one per iteration and the start.
    assert res.extra["decompositions"]["eigh"] >= res.nit + 2


def test_svd_fallback_when_the_eigenbasis_bound_gives_up(monkeypatch: pytest.MonkeyPatch) -> None:
    import dpopt.solvers.convex_dp_dual as dual_module

    monkeypatch.setattr(dual_module, "nuclear_norm_lower_bound", lambda Z, d: None)
    G = prefix_gram(32)
    res = solve_convex_dp(G, tol=1e-8)
    assert res.success and res.extra["certificate"] == "singular values"
    assert res.extra["decompositions"]["svd"] == 1
    np.testing.assert_allclose(res.dual_bound, convex_dp_dual_bound(G, res.extra["d"]), rtol=1e-12)


def test_ill_conditioned_points_are_evaluated_by_singular_values() -> None:
    """V = Q orthogonal: X(d) = D^{-1/2}, phi = sum sqrt(d). With d down to 1e-14 (T = Q D Q^T past _PD_RTOL),
    eigh knows T's smallest eigenvalue only to eps / 1e-14 = 2% relative; the SVD of Q D^{1/2} gives sqrt(d)
    to n eps / 1e-7 = 1e-8 relative, so x = 1 / sqrt(d) to that times the basis' error: 1e-6 allows 100x."""
    from dpopt.solvers.convex_dp_dual import _PD_RTOL, ConvexDPDual

    n = 6
    Q, _ = np.linalg.qr(np.random.default_rng(0).standard_normal((n, n)))
    d = np.logspace(0, -14, n)
    assert d.min() < _PD_RTOL * d.max()  # beyond the eigenvalue test: the SVD path is the one checked
    problem = ConvexDPDual(Q.T.copy())
    p = problem.evaluate(d)
    assert p is not None and problem.n_svd == 1
    np.testing.assert_allclose(p.x, 1.0 / np.sqrt(d), rtol=1e-6)
    # phi = sum(s) >= s_max = 1 and each s is within about n eps of exact: relative error ~ n^2 eps = 8e-15.
    np.testing.assert_allclose(p.phi, np.sqrt(d).sum(), rtol=1e-12)
    d[-1] = 0.0  # exactly singular: rejected without an SVD
    assert problem.evaluate(d) is None and problem.n_svd == 1


def test_ill_conditioned_nonsingular_gram_converges() -> None:
    """G = Q diag(lam) Q^T with cond 1e10 (n = 64): the optimum's T = (D^{1/2} X D^{1/2})^2 passes the
    eigenvalue test's 1 / _PD_RTOL = 4.5e12, where rejecting every such point stalled the ascent at a 0.2 gap."""
    n = 64
    Q, _ = np.linalg.qr(np.random.default_rng(0).standard_normal((n, n)))
    G = (Q * np.logspace(0, -10, n)) @ Q.T
    res = solve_convex_dp(G, tol=1e-8)
    assert res.status == CONVERGED and res.gap <= 1e-8
    assert res.extra["decompositions"]["svd"] > 1  # T's spectrum was read from singular values


@pytest.mark.parametrize("kind", ["allrange", "prefix", "widthk"])
def test_float32_hessian_products_take_the_float64_path(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """CG in float32 changes only the Newton directions (relative error ~ k * 6e-8 against CG residuals of
    at least 1e-3 here): the same Newton steps to a certified gap, values agreeing to the tolerance."""
    import dpopt.solvers.convex_dp_dual as dual_module

    G = family(kind, 64)
    single = solve_convex_dp(G, tol=1e-8)
    monkeypatch.setattr(dual_module, "CG_DTYPE", np.float64)
    double = solve_convex_dp(G, tol=1e-8)
    assert single.success and double.success
    assert single.nit == double.nit
    np.testing.assert_allclose(single.fun, double.fun, rtol=1e-8)


def test_each_primal_point_is_built_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ascent builds a primal candidate at most once per iteration (never again for the returned one)."""
    import dpopt.solvers.convex_dp_dual as dual_module

    calls = []
    build = dual_module.ConvexDPDual.primal
    monkeypatch.setattr(dual_module.ConvexDPDual, "primal", lambda self, p: calls.append(p) or build(self, p))
    res = solve_convex_dp(prefix_gram(64), tol=1e-8)
    assert res.success
    assert len(calls) <= res.nit + 1
    assert len({id(p) for p in calls}) == len(calls)


# ---- agreement with independent computations --------------------------------------------------------


@pytest.mark.parametrize("n", [8, 12])
def test_agrees_with_cvxpy_sdp(n: int) -> None:
    """Seed 002 SDP: minimise trace(Y) s.t. [[X, V^T], [V, Y]] PSD, diag(X) <= 1 (Clarabel)."""
    cp = pytest.importorskip("cvxpy")
    G = family("widthk" if n == 12 else "prefix", n)
    V, _, _ = range_factor(G)
    k = V.shape[0]
    M = cp.Variable((n + k, n + k), PSD=True)
    X, Y = M[:n, :n], M[n:, n:]
    problem = cp.Problem(cp.Minimize(cp.trace(Y)), [M[n:, :n] == V, cp.diag(X) <= 1])
    problem.solve(solver=cp.CLARABEL)
    assert problem.status == cp.OPTIMAL
    res = solve_convex_dp(G)
    np.testing.assert_allclose(res.fun, problem.value, rtol=1e-5)
    assert res.dual_bound <= problem.value * (1 + 1e-6)


@pytest.mark.parametrize("kind", ["allrange", "prefix"])
def test_primal_newton_agrees_with_dual(kind: str) -> None:
    G = family(kind, 32)
    primal = solve_convex_dp(G, method="primal")
    dual = solve_convex_dp(G)
    assert primal.success and dual.success, (primal.message, dual.message)
    assert primal.gap <= 1e-6
    np.testing.assert_allclose(primal.fun, dual.fun, rtol=1e-7)
    np.testing.assert_allclose(np.diag(primal.x), 1.0, atol=1e-12)
    np.testing.assert_allclose(convex_dp_objective(G, primal.x), primal.fun, rtol=1e-10)


def test_primal_on_singular_gram_reports_regularisation() -> None:
    W = width_matrix(24, 6)
    res = solve_convex_dp(W.T @ W, method="primal", max_iter=30)
    reg = res.extra["regularisation"]
    assert reg["theta"] == 1e-8 and "singular" in reg["reason"]
    assert res.dual_bound <= res.fun
    assert res.extra["regularised_fun"] >= res.fun


def test_matches_published_table_at_n128() -> None:
    """RMSE = sqrt(fun / m) is <= HDMM's YuanConvex and >= its SVDB column at n = 128."""
    with require_shared("reference/hdmm-oned.csv").open() as fh:
        rows = {(int(r["domain"]), r["workload"]): r for r in csv.DictReader(fh)}
    n = 128
    cases = {"all-range": (allrange_gram(n), n * (n + 1) // 2), "prefix": (prefix_gram(n), n)}
    W = width_matrix(n, 32)
    cases["width32"] = (W.T @ W, n - 31)
    for name, (G, m) in cases.items():
        res = solve_convex_dp(G)
        assert res.success
        row = rows[(n, name)]
        # rtol 1e-7: sqrt of WidthK's round-off null eigenvalues (~1e-14) shifts the sum slightly.
        np.testing.assert_allclose(np.sqrt(svdb(G) / m), float(row["SVDB"]), rtol=1e-7)
        assert np.sqrt(res.fun / m) <= float(row["YuanConvex"])
        assert np.sqrt(res.dual_bound / m) >= float(row["SVDB"])


# ---- options ------------------------------------------------------------------------------------------


def test_starting_points_and_limits() -> None:
    G = allrange_gram(24)
    ref = solve_convex_dp(G)
    from_x = solve_convex_dp(G, x0=np.eye(24) * 3.0)
    from_d = solve_convex_dp(G, x0=svdb_multipliers(range_factor(G)[0]) * 7.0)
    for res in (from_x, from_d):
        assert res.success
        np.testing.assert_allclose(res.fun, ref.fun, rtol=1e-7)
    capped = solve_convex_dp(prefix_gram(24), max_iter=0)
    assert capped.status == MAX_ITER and capped.nit == 0
    assert capped.dual_bound <= capped.fun
    # A callback returning True stops the solver with STALLED (documented), after that iteration. The
    # returned point is still a feasible strategy (unit diagonal; its objective recomputed here) and is
    # bracketed by the certificates: no lower than the optimum's bound, its own bound no higher.
    Gp = prefix_gram(24)
    full = solve_convex_dp(Gp)
    stopped = solve_convex_dp(Gp, callback=lambda info: info["nit"] >= 1)
    assert stopped.status == STALLED and stopped.nit == 1 and "stopped by callback" in stopped.message
    X = stopped.x
    np.testing.assert_allclose(np.diag(X), 1.0, rtol=0, atol=1e-12)
    # trace(G X^-1) for a 24 x 24 positive definite X: relative rounding ~ n kappa(X) u; 10 times that.
    fun = float(np.trace(np.linalg.solve(X, Gp)))
    assert stopped.fun == pytest.approx(fun, rel=10 * 24 * np.linalg.cond(X) * np.finfo(float).eps)
    assert stopped.fun >= full.dual_bound and stopped.dual_bound <= full.fun
    seen = []
    solve_convex_dp(G, callback=lambda info: seen.append(info["gap"]))
    assert seen and seen[-1] <= 1e-8


@pytest.mark.parametrize("scale", [1e-150, 1e150])
def test_scale_invariance(scale: float) -> None:
    """Values scale with G, X does not; no overflow or underflow at extreme scales."""
    G = prefix_gram(16)
    ref = solve_convex_dp(G)
    res = solve_convex_dp(scale * G)
    assert res.success
    np.testing.assert_allclose(res.fun / scale, ref.fun, rtol=1e-9)
    np.testing.assert_allclose(res.dual_bound / scale, ref.dual_bound, rtol=1e-9)
    np.testing.assert_allclose(res.x, ref.x, atol=1e-8)
    np.testing.assert_allclose(res.extra["d"] / scale, ref.extra["d"], rtol=1e-6)
    np.testing.assert_allclose(convex_dp_dual_bound(scale * G, np.ones(16)) / scale, svdb(G), rtol=1e-10)
    np.testing.assert_allclose(convex_dp_objective(scale * G, np.eye(16)) / scale, np.trace(G), rtol=1e-12)


@pytest.mark.parametrize(
    "bad, match",
    [
        (np.ones((3, 4)), "square"),
        (np.array([[1.0, 2.0], [0.0, 1.0]]), "symmetric"),
        (np.array([[1.0, np.nan], [np.nan, 1.0]]), "finite"),
        (np.zeros((3, 3)), "zero matrix"),
        (-np.eye(3), "positive semidefinite"),
        (np.zeros((0, 0)), "non-empty"),
    ],
)
def test_invalid_gram_raises(bad: np.ndarray, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        solve_convex_dp(bad)
    with pytest.raises(ValueError, match=match):
        convex_dp_dual_bound(bad, np.ones(max(bad.shape[-1], 1)))


def test_invalid_options_raise() -> None:
    G = prefix_gram(5)
    with pytest.raises(ValueError, match="method"):
        solve_convex_dp(G, method="newton")
    with pytest.raises(ValueError, match="tol"):
        solve_convex_dp(G, tol=0.0)
    with pytest.raises(ValueError, match="x0"):
        solve_convex_dp(G, x0=np.ones(4))
    with pytest.raises(ValueError, match="positive definite"):
        solve_convex_dp(G, x0=np.ones((5, 5)))
    with pytest.raises(ValueError, match=">= 0"):
        convex_dp_dual_bound(G, -np.ones(5))
    with pytest.raises(ValueError, match="shape"):
        convex_dp_dual_bound(G, np.ones(4))


def test_no_iteration_starts_that_would_end_past_the_time_limit(monkeypatch):
    """On a clock that advances only by the work done (10 s per Newton direction, one per iteration), a 45 s
    limit stops with TIME_LIMIT at 40 s: an iteration starts only when one as long as the last still ends
    within the limit (before, the fifth began at 40 s and the solve ended at 50 s). No real time is measured."""
    import time

    import dpopt.solvers.convex_dp_dual as cdd
    from dpopt.workloads import WRange

    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    direction = cdd.ConvexDPDual.newton_direction

    def costly(self, *args, **kwargs):
        clock[0] += 10.0
        return direction(self, *args, **kwargs)

    monkeypatch.setattr(cdd.ConvexDPDual, "newton_direction", costly)
    # tol below round-off: the solve can only stop by its time limit
    res = solve_convex_dp(WRange(16, 64, seed=1).gram(), tol=1e-16, time_limit=45.0)
    assert res.status == "time_limit" and clock[0] <= 45.0 and res.nit >= 3
