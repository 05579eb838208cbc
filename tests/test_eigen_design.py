"""Tests of the eigen-design weights (dpopt/solvers/eigen_design.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpopt.solvers.convex_dp import solve_convex_dp
from dpopt.solvers.eigen_design import (
    _reflection_eigh,
    eigen_design_dual_bound,
    merge_equal_cells,
    solve_eigen_design,
)
from dpopt.solvers.result import CONVERGED
from dpopt.workloads import AllRange, Prefix, WidthK


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


# -- convergence at scale, the CVXPY model, and the pieces that make the dual non-degenerate ----------------

SCALE_FAMILIES = {"allrange": AllRange, "prefix": Prefix, "width32": lambda n: WidthK(n, 32)}


def check_certified(G: np.ndarray, res, gap: float) -> None:
    """CONVERGED with gap <= `gap`, and the certificate recomputed independently of the solver's numbers."""
    assert res.status == CONVERGED, res.message
    assert -1e-12 <= res.gap <= gap
    lam, P, u, y = res.extra["eigenvalues"], res.extra["eigenvectors"], res.x, res.extra["y"]
    cols = np.random.default_rng(0).choice(G.shape[0], size=min(16, G.shape[0]), replace=False)
    np.testing.assert_allclose(G @ P[:, cols], P[:, cols] * lam[cols], atol=1e-10 * lam.max())
    np.testing.assert_allclose(P[:, cols].T @ P, np.eye(G.shape[0])[cols], atol=1e-12)
    used = u > 0
    assert (P**2 @ u).max() <= 1 + 1e-12  # sens2 <= 1 in every cell
    np.testing.assert_allclose(np.sum(lam[used] / u[used]), res.fun, rtol=1e-12)
    # Lagrangian bound at y (module docstring): (sum_i sqrt(lambda_i (M^T y)_i))^2 / sum(y), M = P o P.
    # Eigenvalues below rank_tol = 1e-12 of the largest are the null space (weight 0, not in the program).
    k = lam > 1e-12 * lam.max()
    bound = np.sqrt(lam[k] * ((P[:, k] ** 2).T @ y)).sum() ** 2 / y.sum()
    np.testing.assert_allclose(bound, res.dual_bound, rtol=1e-9)
    assert svdb(G) <= bound * (1 + 1e-12) and bound <= res.fun * (1 + 1e-12)


@pytest.mark.parametrize("kind", sorted(SCALE_FAMILIES))
@pytest.mark.parametrize("n", [256, 512])
def test_certified_gap_at_scale(kind: str, n: int) -> None:
    G = SCALE_FAMILIES[kind](n).gram()
    check_certified(G, solve_eigen_design(G, tol=1e-8, complete=False), 1e-8)


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(SCALE_FAMILIES))
@pytest.mark.parametrize("n", [1024, 2048, 4096])
def test_certified_gap_at_scale_slow(kind: str, n: int) -> None:
    G = SCALE_FAMILIES[kind](n).gram()
    check_certified(G, solve_eigen_design(G, tol=1e-8, complete=False), 1e-8)


@pytest.mark.slow
def test_allrange_2048_no_longer_stalls() -> None:
    """The degenerate dual (all n cells, merge=False) stopped at gap 1.8e-8 here; merged, it certifies 1e-10."""
    G = AllRange(2048).gram()
    res = solve_eigen_design(G, tol=1e-10, complete=False)
    check_certified(G, res, 1e-10)
    assert res.extra["groups"] == 1024  # one constraint per mirrored pair of cells


@pytest.mark.parametrize("kind", sorted(SCALE_FAMILIES))
@pytest.mark.parametrize("n", [16, 32, 64])
def test_matches_cvxpy_model_clarabel_and_scs(kind: str, n: int) -> None:
    """formulations/eigen_design.py solved by Clarabel and by SCS (both at 1e-9) agree within 1e-5."""
    pytest.importorskip("cvxpy")
    from formulations import eigen_design
    from formulations.solve import solve

    # Width32 needs n > 32; at 16 and 32 widths whose Grams have distinct eigenvalues (width 4 on 16 cells
    # has a double eigenvalue 1, where the eigen-design depends on the basis chosen inside the eigenspace).
    w = SCALE_FAMILIES[kind](n) if (kind != "width32" or n > 32) else WidthK(n, {16: 5, 32: 9}[n])
    res = solve_eigen_design(w.gram(), tol=1e-10)
    assert res.success and res.gap <= 1e-10
    for solver in ("clarabel", "scs"):
        ref = solve(eigen_design.build(w), solver, tol=1e-9)
        assert ref.status == "optimal", (solver, ref.status)
        np.testing.assert_allclose(ref.objective, res.fun, rtol=1e-5, err_msg=solver)
        assert res.dual_bound <= ref.objective * (1 + 1e-5)


@pytest.mark.parametrize("n", [1, 2, 3, 8, 9])
def test_reflection_eigh_is_an_eigen_decomposition_with_exact_pairs(n: int) -> None:
    rng = np.random.default_rng(n)
    W = rng.normal(size=(n + 3, n))
    W = np.vstack([W, W[:, ::-1]])  # J W^T W J = W^T W
    G = W.T @ W
    lam, P = _reflection_eigh(G)
    assert np.all(np.diff(lam) >= 0)
    np.testing.assert_allclose(lam, np.linalg.eigvalsh(G), atol=1e-12 * lam.max())
    np.testing.assert_allclose(P.T @ P, np.eye(n), atol=1e-13)
    np.testing.assert_allclose((P * lam) @ P.T, G, atol=1e-12 * lam.max())
    np.testing.assert_array_equal(P**2, (P**2)[::-1])  # mirrored cells: bit-identical constraint rows
    parity = np.sign(np.round(np.sum(P * P[::-1], axis=0), 12))  # +1 symmetric, -1 antisymmetric
    assert sorted(parity) == [-1.0] * (n // 2) + [1.0] * (n - n // 2)


def test_merge_equal_cells_groups_exact_and_near_duplicates_only() -> None:
    rng = np.random.default_rng(7)
    base = rng.uniform(size=(4, 6))
    M = base[[0, 1, 0, 2, 3, 1, 0]].copy()
    M[6, 2] += 1e-14  # within atol: merged
    M = np.vstack([M, base[3] + 1e-9])  # beyond atol: its own group
    reps, label = merge_equal_cells(M, atol=1e-13)
    np.testing.assert_array_equal(reps, [0, 1, 3, 4, 7])
    np.testing.assert_array_equal(label, [0, 1, 0, 2, 3, 1, 0, 4])


@pytest.mark.parametrize("kind", ["allrange", "prefix", "widthk"])
def test_merging_and_reflection_do_not_change_the_program(kind: str) -> None:
    """Well separated eigenvalues (n = 48): one basis up to signs, so every variant solves the same program."""
    G = family(kind, 48)
    merged, plain = solve_eigen_design(G, tol=1e-10), solve_eigen_design(G, tol=1e-10, merge=False)
    full_eigh = solve_eigen_design(G, tol=1e-10, reflect=False)
    assert merged.success and plain.success and full_eigh.success
    np.testing.assert_allclose(merged.fun, plain.fun, rtol=1e-9)
    np.testing.assert_allclose(full_eigh.fun, merged.fun, rtol=1e-9)
    np.testing.assert_allclose(merged.x, plain.x, rtol=1e-5, atol=1e-8 * merged.x.max())
    assert plain.extra["groups"] == 48 and merged.extra["groups"] == (24 if kind != "prefix" else 48)
