"""Tests of the eigen-design weights (dpopt/solvers/eigen_design.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpopt.solvers.convex_dp import solve_convex_dp
from dpopt.solvers.eigen_design import eigen_design_dual_bound, solve_eigen_design
from dpopt.solvers.result import CONVERGED


def allrange_gram(n: int) -> np.ndarray:
    i = np.arange(n)
    return ((np.minimum.outer(i, i) + 1) * (n - np.maximum.outer(i, i))).astype(float)


def prefix_gram(n: int) -> np.ndarray:
    i = np.arange(n)
    return (n - np.maximum.outer(i, i)).astype(float)


def width_gram(n: int, k: int) -> np.ndarray:
    W = np.zeros((n - k + 1, n))
    for s in range(n - k + 1):
        W[s, s : s + k] = 1.0
    return W.T @ W


def family(kind: str, n: int) -> np.ndarray:
    return {"allrange": allrange_gram, "prefix": prefix_gram}[kind](n) if kind != "widthk" else width_gram(n, n // 4)


def svdb(G: np.ndarray) -> float:
    lam = np.clip(np.linalg.eigvalsh(G), 0.0, None)
    return float(np.sqrt(lam).sum() ** 2 / G.shape[0])


@pytest.mark.parametrize("kind", ["allrange", "prefix", "widthk"])
@pytest.mark.parametrize("n", [16, 32, 64])
def test_certified_and_above_convex_optimum(kind: str, n: int) -> None:
    G = family(kind, n)
    res = solve_eigen_design(G)
    assert res.status == CONVERGED, res.message
    assert res.gap <= 1e-6
    lam, P = res.extra["eigenvalues"], res.extra["eigenvectors"]
    u = res.x
    used = u > 0
    # Independent recomputation of the objective and feasibility from the weights.
    np.testing.assert_allclose(np.sum(lam[used] / u[used]), res.fun, rtol=1e-12)
    assert np.all(lam[~used] <= 1e-10 * lam.max())
    col_sens = (P**2) @ u
    assert col_sens.max() <= 1 + 1e-9
    A = res.extra["A"]
    X = A.T @ A
    np.testing.assert_allclose(np.trace(G @ np.linalg.pinv(X, rcond=1e-10, hermitian=True)), res.fun, rtol=1e-6)
    # Restriction of seed 002's problem: never below its optimum, never below the SVD bound.
    convex = solve_convex_dp(G)
    assert res.fun >= convex.fun * (1 - 1e-9)
    assert res.dual_bound >= convex.dual_bound * (1 - 1e-6)
    assert svdb(G) <= res.dual_bound * (1 + 1e-10)
    # Completion (fill each cell's sensitivity) never hurts and stays above the convex optimum.
    assert convex.fun * (1 - 1e-9) <= res.extra["completed_fun"] <= res.fun * (1 + 1e-12)


def test_agrees_with_cvxpy_program() -> None:
    """minimise sum_i lambda_i / u_i s.t. (P o P) u <= 1, solved by Clarabel (exponential/power cones)."""
    cp = pytest.importorskip("cvxpy")
    G = allrange_gram(12)
    lam, P = np.linalg.eigh(G)
    u = cp.Variable(12, pos=True)
    problem = cp.Problem(cp.Minimize(lam @ cp.inv_pos(u)), [(P**2) @ u <= 1])
    problem.solve(solver=cp.CLARABEL)
    assert problem.status == cp.OPTIMAL
    res = solve_eigen_design(G)
    np.testing.assert_allclose(res.fun, problem.value, rtol=1e-5)
    assert res.dual_bound <= problem.value * (1 + 1e-6)


def test_diagonal_gram_gives_identity_weights() -> None:
    g = np.array([3.0, 1.0, 2.0, 5.0])
    res = solve_eigen_design(np.diag(g))
    assert res.success
    np.testing.assert_allclose(res.fun, g.sum(), rtol=1e-9)
    np.testing.assert_allclose(res.x, 1.0, rtol=1e-8)


def test_variable_agnostic_meets_svd_bound() -> None:
    """Seed 004 Table 2: eigen design attains the SVD bound (ratio 1.000) on ALLPREDICATE; n = 8 here."""
    n = 8
    a, b = 2.0 ** (n - 1), 2.0 ** (n - 2)
    G = (a - b) * np.eye(n) + b * np.ones((n, n))
    res = solve_eigen_design(G)
    assert res.success
    np.testing.assert_allclose(res.fun, svdb(G), rtol=1e-8)


def test_scale_invariance() -> None:
    G = allrange_gram(16)
    ref = solve_eigen_design(G)
    for scale in (1e-150, 1e150):
        res = solve_eigen_design(scale * G)
        np.testing.assert_allclose(res.fun / scale, ref.fun, rtol=1e-9)
        np.testing.assert_allclose(res.x, ref.x, rtol=1e-7)
        np.testing.assert_allclose(res.extra["completed_fun"] / scale, ref.extra["completed_fun"], rtol=1e-9)


def test_without_completion() -> None:
    G = prefix_gram(24)
    full, plain = solve_eigen_design(G), solve_eigen_design(G, complete=False)
    np.testing.assert_allclose(plain.fun, full.fun, rtol=1e-12)
    assert plain.extra["completed_fun"] == plain.fun and not plain.extra["completion"].any()
    assert full.extra["completed_fun"] < full.fun  # Prefix leaves budget unused in some cells


def test_dual_bound_at_ones_is_svd_bound() -> None:
    G = width_gram(20, 5)
    np.testing.assert_allclose(eigen_design_dual_bound(G, np.ones(20)), svdb(G), rtol=1e-7)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(2, 10))
def test_dual_bound_below_every_feasible_weighting(seed: int, n: int) -> None:
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(n + 3, n))
    G = W.T @ W
    lam, P = np.linalg.eigh(G)
    u = rng.uniform(0.1, 2.0, size=n)
    u /= ((P**2) @ u).max()  # feasible: every cell's sensitivity <= 1
    y = rng.exponential(size=n) + 1e-3
    assert eigen_design_dual_bound(G, y) <= np.sum(lam / u) * (1 + 1e-9)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, expected",
    [("ALLRANGE(2048)", 1.028), ("ALLRANGE(64, 32)", 1.107)],
)
def test_reproduces_seed004_table2_ratios(name: str, expected: float) -> None:
    """Seed 004 Table 2, eigen-design error / SVDB: 1.028 and 1.107 (with the completion step)."""
    G = allrange_gram(2048) if name == "ALLRANGE(2048)" else np.kron(allrange_gram(64), allrange_gram(32))
    res = solve_eigen_design(G, tol=1e-7)
    assert res.success
    assert round(res.extra["completed_fun"] / svdb(G), 3) == expected


@pytest.mark.parametrize(
    "bad, match",
    [
        (np.ones((2, 3)), "square"),
        (np.array([[1.0, 1.0], [0.0, 1.0]]), "symmetric"),
        (np.full((2, 2), np.inf), "finite"),
        (np.zeros((4, 4)), "zero matrix"),
        (np.diag([1.0, -1.0]), "positive semidefinite"),
    ],
)
def test_invalid_input_raises(bad: np.ndarray, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        solve_eigen_design(bad)


def test_invalid_options_raise() -> None:
    G = prefix_gram(4)
    with pytest.raises(ValueError, match="tol"):
        solve_eigen_design(G, tol=-1.0)
    with pytest.raises(ValueError, match="damping"):
        solve_eigen_design(G, damping=np.nan)
    with pytest.raises(ValueError, match="y must"):
        eigen_design_dual_bound(G, np.zeros(4))
