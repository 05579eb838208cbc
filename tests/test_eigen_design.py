"""Tests of the eigen-design weights (dpopt/solvers/eigen_design.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_workloads import allrange_gram, prefix_gram, width_gram
from reference_workloads import range_family_gram as family

from dpopt.solvers.convex_dp import solve_convex_dp
from dpopt.solvers.eigen_design import (
    _reflection_eigh,
    eigen_design_dual_bound,
    merge_equal_cells,
    solve_eigen_design,
)
from dpopt.solvers.result import CONVERGED
from dpopt.workloads import AllRange, Prefix, WidthK

EPS = np.finfo(float).eps


def svdb(G: np.ndarray) -> float:
    """(1/n)(sum sqrt(lambda_i))^2, eigenvalues within the eigensolver's backward error of 0 taken as 0.

    eigvalsh returns each eigenvalue to ~ n eps ||G||; a null eigenvalue computed as 1e-16 ||G|| would
    add sqrt(1e-16 ||G||) = 1e-8 sqrt(||G||), a relative error of order 1e-9 in the bound. Below
    n eps ||G|| they are indistinguishable from 0 and dropped; the rest (>= 3e-4 ||G|| on the families
    here) then carry a relative error of ~ n eps ||G|| / lambda_min <= 1e-10.
    """
    lam = np.linalg.eigvalsh(G)
    lam = np.where(lam > G.shape[0] * EPS * lam.max(), lam, 0.0)
    return float(np.sqrt(lam).sum() ** 2 / G.shape[0])


def assert_weights_close(a: np.ndarray, b: np.ndarray, lam: np.ndarray, fun: float, gap: float) -> float:
    """Weights of two solves of the same program, each certified to relative gap <= `gap`.

    For feasible u the Lagrangian at the optimal multipliers lower-bounds f, and its growth away from the
    optimum is sum_i (lambda_i / u_i) delta_i^2 in relative changes delta_i = du_i / u_i (Hessian
    2 lambda_i / u_i^3, linear constraints). So gap * f >= (lambda_i / u_i) delta_i^2 for each i, and
    two such solves differ by at most 2 sqrt(gap * f * u_i / lambda_i) relatively (plus round-off).
    Returns the largest such bound.
    """
    used = a > 0
    np.testing.assert_array_equal(used, b > 0)
    bound = 2.0 * np.sqrt(gap * fun * a[used] / lam[used]) + 1e-12
    assert np.all(np.abs(b[used] / a[used] - 1.0) <= bound)
    return float(bound.max())


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
    # Independent recomputation of the objective and feasibility from the weights: sums of n positive
    # terms in another order, relative round-off <= n eps_mach (1.4e-14 at n = 64).
    np.testing.assert_allclose(np.sum(lam[used] / u[used]), res.fun, rtol=1e-12)
    assert np.all(lam[~used] <= 1e-10 * lam.max())  # only the null space (rank_tol 1e-12) goes unused
    col_sens = (P**2) @ u
    assert col_sens.max() <= 1 + 1e-9
    A = res.extra["A"]
    X = A.T @ A
    # X = P diag(u) P^T, so on its range cond(X) = max u / min used u (<= 42 on these families): the
    # pseudo-inverse route agrees to ~ n * cond * eps_mach <= 64 * 42 * 2.2e-16 = 6e-13, compared at
    # 1e-10. rcond = 1e-10 separates the range (eigenvalues >= min u) from null directions (~ n eps).
    kappa = u[used].max() / u[used].min()
    assert kappa < 1e3
    np.testing.assert_allclose(np.trace(G @ np.linalg.pinv(X, rcond=1e-10, hermitian=True)), res.fun,
                               rtol=1e-10)
    # Restriction of seed 002's problem: never below its optimum (>= convex.fun (1 - convex.gap), its
    # certificate), never below the SVD bound. Each side carries n eps round-off (< 1e-13).
    convex = solve_convex_dp(G)
    assert convex.success
    assert res.fun >= convex.fun * (1 - convex.gap - 1e-13)
    # the eigen-design dual bound is within its gap (<= 1e-6) of its optimum, which is >= the convex one
    assert res.dual_bound >= convex.dual_bound * (1 - 1e-6)
    assert svdb(G) <= res.dual_bound * (1 + 1e-10)  # svdb's own error (see svdb); margins here 8-37%
    # Completion (fill each cell's sensitivity) never hurts (completed_fun = min(completed, fun), exactly)
    # and stays above the convex optimum.
    assert convex.fun * (1 - convex.gap - 1e-13) <= res.extra["completed_fun"] <= res.fun


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
    # Clarabel's default stopping (gap and feasibility 1e-8) and our certified gap (tol 1e-8): the values
    # agree to ~2e-8 relative; 1e-7. The dual bound is below the optimum, so below Clarabel's value up
    # to Clarabel's own 1e-8.
    np.testing.assert_allclose(res.fun, problem.value, rtol=1e-7)
    assert res.dual_bound <= problem.value * (1 + 1e-8)


def test_diagonal_gram_gives_identity_weights() -> None:
    g = np.array([3.0, 1.0, 2.0, 5.0])
    res = solve_eigen_design(np.diag(g))
    assert res.success
    # The optimum is u = 1, fun = sum(g). The certificate bounds fun - opt by gap * fun; and since
    # g_i / u_i >= g_i + g_i (1 - u_i) for u_i <= 1, it bounds each 1 - u_i by gap * fun / g_i.
    gap = max(res.gap, 0.0) + 1e-14  # plus the round-off of a 4-term sum
    np.testing.assert_allclose(res.fun, g.sum(), rtol=gap)
    np.testing.assert_allclose(res.x, 1.0, rtol=0, atol=gap * res.fun / g.min())


def test_variable_agnostic_meets_svd_bound() -> None:
    """Seed 004 Table 2: eigen design attains the SVD bound (ratio 1.000) on ALLPREDICATE; n = 8 here."""
    n = 8
    a, b = 2.0 ** (n - 1), 2.0 ** (n - 2)
    G = (a - b) * np.eye(n) + b * np.ones((n, n))
    res = solve_eigen_design(G)
    assert res.success
    # the optimum is the SVD bound; fun is above it by at most its certified gap (plus n eps round-off)
    np.testing.assert_allclose(res.fun, svdb(G), rtol=max(res.gap, 0.0) + 1e-13)


def test_scale_invariance() -> None:
    # The solver divides by max|G|, so the scaled problems differ from the unscaled one by an ulp or two
    # per entry: each is then certified within its own gap of the same optimum (values), and the weights
    # within the bound d of assert_weights_close. Weights within relative d move X = A^T A + diag(c)
    # within (1 +- 2d) X in the Loewner order, so the completed value trace(G X^-1) moves by <= 2d, plus
    # its dense solve's round-off (n cond eps ~ 16 * 11 * 2.2e-16 = 4e-14).
    G = allrange_gram(16)
    ref = solve_eigen_design(G)
    for scale in (1e-150, 1e150):
        res = solve_eigen_design(scale * G)
        gap = max(res.gap, 0.0) + max(ref.gap, 0.0) + 1e-13
        np.testing.assert_allclose(res.fun / scale, ref.fun, rtol=gap)
        d = assert_weights_close(ref.x, res.x, ref.extra["eigenvalues"], ref.fun, gap)
        np.testing.assert_allclose(res.extra["completed_fun"] / scale, ref.extra["completed_fun"],
                                   rtol=2 * d + 1e-12)


def test_without_completion() -> None:
    G = prefix_gram(24)
    full, plain = solve_eigen_design(G), solve_eigen_design(G, complete=False)
    assert plain.fun == full.fun  # the same solve: completion is evaluated afterwards
    assert plain.extra["completed_fun"] == plain.fun and not plain.extra["completion"].any()
    assert full.extra["completed_fun"] < full.fun  # Prefix leaves budget unused in some cells


def test_dual_bound_at_ones_is_svd_bound() -> None:
    G = width_gram(20, 5)
    # rank 16: svdb drops the 4 null eigenvalues (see svdb); the nonzero ones are >= 6.8e-3 ||G||, so the
    # two eigen-decompositions agree to ~ n eps / 6.8e-3 ~ 1e-12 relative.
    np.testing.assert_allclose(eigen_design_dual_bound(G, np.ones(20)), svdb(G), rtol=1e-10)


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
    # weak duality, up to two eigen-decompositions' round-off (n eps cond(G) relative)
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
    # Round-off of sums over n terms, of eigen residuals and of orthogonality is ~ n eps_mach (at most 9e-13
    # at n = 4096): `rnd` is twice that, and never below 1e-12.
    n = G.shape[0]
    rnd = max(1e-12, 2 * n * EPS)
    assert res.status == CONVERGED, res.message
    assert -rnd <= res.gap <= gap
    lam, P, u, y = res.extra["eigenvalues"], res.extra["eigenvectors"], res.x, res.extra["y"]
    cols = np.random.default_rng(0).choice(n, size=min(16, n), replace=False)
    # eigen residual of a backward-stable eigensolver: ~ n eps ||G||, at most 9e-13 ||G||
    np.testing.assert_allclose(G @ P[:, cols], P[:, cols] * lam[cols], atol=1e-10 * lam.max())
    np.testing.assert_allclose(P[:, cols].T @ P, np.eye(n)[cols], atol=rnd)
    used = u > 0
    assert (P**2 @ u).max() <= 1 + rnd  # sens2 <= 1 in every cell
    np.testing.assert_allclose(np.sum(lam[used] / u[used]), res.fun, rtol=rnd)
    # Lagrangian bound at y (module docstring): (sum_i sqrt(lambda_i (M^T y)_i))^2 / sum(y), M = P o P.
    # Eigenvalues below rank_tol = 1e-12 of the largest are the null space (weight 0, not in the program).
    k = lam > 1e-12 * lam.max()
    bound = np.sqrt(lam[k] * ((P[:, k] ** 2).T @ y)).sum() ** 2 / y.sum()
    # the same formula over all cells instead of merged groups: n-term sums, well inside 1e-9
    np.testing.assert_allclose(bound, res.dual_bound, rtol=1e-9)
    # svdb from a fresh eigvalsh is good to ~ n eps sqrt(lambda_max / lambda_min) / 2 <= 5e-8 relative up
    # to n = 4096 (the small eigenvalues of AllRange); the bound exceeds it by 8% or more on these families
    assert svdb(G) <= bound * (1 + 1e-6) and bound <= res.fun * (1 + rnd)


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
        # SCS at eps 1e-9 is good to ~1e-6 relative at best (first-order, stopping on residuals scaled by
        # the data); Clarabel to its 1e-9 gap; ours to 1e-10. 1e-5 is ten times SCS's attainable accuracy.
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
    # Two eigensolvers at n <= 9: eigenvalues and residuals to ~ n eps ||G|| (2e-15 ||G||), orthogonality
    # to ~ n eps (2e-15); compared at about 50-500 times that.
    np.testing.assert_allclose(lam, np.linalg.eigvalsh(G), atol=1e-12 * lam.max())
    np.testing.assert_allclose(P.T @ P, np.eye(n), atol=1e-13)
    np.testing.assert_allclose((P * lam) @ P.T, G, atol=1e-12 * lam.max())
    np.testing.assert_array_equal(P**2, (P**2)[::-1])  # mirrored cells: bit-identical constraint rows
    # p . Jp = +-||p||^2 = +-1 up to n eps: the sign is far from any rounding boundary
    parity = np.sign(np.round(np.sum(P * P[::-1], axis=0), 12))  # +1 symmetric, -1 antisymmetric
    assert sorted(parity) == [-1.0] * (n // 2) + [1.0] * (n - n // 2)


def test_merge_equal_cells_groups_exact_and_near_duplicates_only() -> None:
    rng = np.random.default_rng(7)
    base = rng.uniform(size=(4, 6))
    M = base[[0, 1, 0, 2, 3, 1, 0]].copy()
    M[6, 2] += 1e-14  # within atol: merged (the added 1e-14 is exact to ~ ulp(1) = 2e-16, far from 1e-13)
    M = np.vstack([M, base[3] + 1e-9])  # beyond atol: its own group
    reps, label = merge_equal_cells(M, atol=1e-13)
    np.testing.assert_array_equal(reps, [0, 1, 3, 4, 7])
    np.testing.assert_array_equal(label, [0, 1, 0, 2, 3, 1, 0, 4])


@pytest.mark.parametrize("kind", ["allrange", "prefix", "widthk"])
def test_merging_and_reflection_do_not_change_the_program(kind: str) -> None:
    """Separated eigenvalues (n = 48): one basis up to signs, so every variant solves the same program.

    Width 9, not n / 4 = 12: WidthK(48, 12)'s Gram has a repeated nonzero eigenvalue, where the program
    depends on the basis LAPACK picks inside that eigenspace (so on the BLAS kernel). Width 9 has the
    largest smallest relative eigengap among widths 2..24 with several null directions (8.7e-5).
    """
    G = family(kind, 48) if kind != "widthk" else width_gram(48, 9)
    merged, plain = solve_eigen_design(G, tol=1e-10), solve_eigen_design(G, tol=1e-10, merge=False)
    full_eigh = solve_eigen_design(G, tol=1e-10, reflect=False)
    assert merged.success and plain.success and full_eigh.success
    # Same basis (merged vs plain): both certified within 1e-10 of one optimum, plus n eps round-off.
    np.testing.assert_allclose(merged.fun, plain.fun, rtol=2e-10 + 1e-13)
    # Two eigen-decompositions (reflection vs one full eigh): by Davis-Kahan their eigenvectors differ by
    # ~ n eps ||G|| / (smallest eigengap), to which the program's value is sensitive at first order.
    lam = np.linalg.eigvalsh(G)
    nonzero = lam[lam > G.shape[0] * EPS * lam.max()]
    basis_err = G.shape[0] * EPS * lam.max() / np.diff(nonzero).min()
    np.testing.assert_allclose(full_eigh.fun, merged.fun, rtol=2e-10 + 10 * basis_err)
    assert_weights_close(merged.x, plain.x, merged.extra["eigenvalues"], merged.fun, 2e-10)
    assert plain.extra["groups"] == 48 and merged.extra["groups"] == (24 if kind != "prefix" else 48)
