"""Joint-dual Newton steps of the minimax solver: derivatives against finite differences, the Jacobi
scaling, and the certified optimum reached with and without them."""

from __future__ import annotations

import time

import numpy as np
import pytest

from dpopt.solvers.diag_dual_newton import pcg
from dpopt.solvers.minimax import query_rows, solve_minimax
from dpopt.solvers.minimax_newton import (
    JointPoint,
    _binding,
    newton_ascent,
    newton_direction,
    newton_step,
)
from dpopt.workloads import AllRange, Prefix, WidthK, WRange

EPS = np.finfo(float).eps
# Central differences with step H (relative to each weight): truncation error about H^2 times the
# third derivative's scale, round-off about cond * EPS / H in the gradient (cond: the spread of the
# eigenvalues s^2 of L^T A L, which sets how accurately an eigen-decomposition gives the gradient).
H = 1e-5


def _point(workload, rng: np.random.Generator) -> JointPoint:
    rows = query_rows(workload)
    lam, Q = np.linalg.eigh(rows.gram(np.ones(rows.m)))
    keep = lam > 1e-10 * lam[-1]
    U = None if keep.all() else Q[:, keep]
    u = rng.uniform(0.5, 1.5, rows.m)
    d = rng.uniform(0.5, 1.5, rows.n)
    return JointPoint(rows, rng.uniform(1.0, 2.0, rows.m), U, u / u.sum(), d / d.sum())


@pytest.mark.parametrize("workload", [Prefix(16), AllRange(8), WidthK(16, 4), WRange(6, 12, seed=1)],
                         ids=["prefix", "allrange", "widthk_rank_deficient", "wrange_rank_deficient"])
def test_gradient_and_hessian_products_match_finite_differences(workload) -> None:
    rng = np.random.default_rng(0)
    p = _point(workload, rng)
    cond = float((p.s.max() / p.s.min()) ** 2)
    # Euler's identity for a function 1/2-homogeneous in u and in d: u . dpsi/du = d . dpsi/dd = psi / 2.
    assert p.u @ p.gu == pytest.approx(p.psi, rel=100 * cond * EPS)
    assert p.d @ p.gd == pytest.approx(p.psi, rel=100 * cond * EPS)
    du, dd = rng.standard_normal(p.u.size) * p.u, rng.standard_normal(p.d.size) * p.d
    plus = JointPoint(p.rows, p.c, p.U, p.u + H * du, p.d + H * dd)
    minus = JointPoint(p.rows, p.c, p.U, p.u - H * du, p.d - H * dd)
    rtol = 100 * (H * H + cond * EPS / H)
    assert (plus.psi - minus.psi) / (2 * H) == pytest.approx(0.5 * (p.gu @ du + p.gd @ dd), rel=rtol)
    dgu, dgd = p.hess_vec(du, dd)
    np.testing.assert_allclose(dgu, (plus.gu - minus.gu) / (2 * H), rtol=rtol, atol=rtol * np.abs(dgu).max())
    np.testing.assert_allclose(dgd, (plus.gd - minus.gd) / (2 * H), rtol=rtol, atol=rtol * np.abs(dgd).max())
    # The Hessian of a concave function: symmetric and negative semidefinite.
    du2, dd2 = rng.standard_normal(p.u.size) * p.u, rng.standard_normal(p.d.size) * p.d
    a, b = p.hess_vec(du2, dd2)
    scale = np.abs(dgu).max() * np.abs(du2).sum() + np.abs(dgd).max() * np.abs(dd2).sum()
    assert du @ a + dd @ b == pytest.approx(du2 @ dgu + dd2 @ dgd, abs=100 * cond * EPS * scale)
    assert du @ dgu + dd @ dgd <= 100 * cond * EPS * scale


@pytest.mark.parametrize("workload", [Prefix(16), AllRange(8), WidthK(16, 4), WRange(6, 12, seed=1)],
                         ids=["prefix", "allrange", "widthk_rank_deficient", "wrange_rank_deficient"])
def test_single_precision_hessian_products_agree_to_their_error_bound(workload) -> None:
    rng = np.random.default_rng(3)
    p = _point(workload, rng)
    du, dd = rng.standard_normal(p.u.size) * p.u, rng.standard_normal(p.d.size) * p.d
    exact_u, exact_d = p.hess_vec(du, dd)
    single_u, single_d = p.hess_vec(du, dd, np.float32)
    assert single_u.dtype == single_d.dtype == np.float64
    # A float32 product with inner dimension k errs by at most k * u32 times the product of the factors'
    # magnitudes (Higham, Accuracy and Stability, eq. 3.13); the chained products and the division by
    # s_a s_b (s_a + s_b) amplify it by at most cond = (s_max / s_min)^2; 10 covers the handful chained.
    k = p.s.size
    cond = float((p.s.max() / p.s.min()) ** 2)
    rtol = 10 * k * np.finfo(np.float32).eps * cond
    assert rtol < 0.1  # the bound says something at these sizes
    np.testing.assert_allclose(single_u, exact_u, rtol=0, atol=rtol * np.abs(exact_u).max())
    np.testing.assert_allclose(single_d, exact_d, rtol=0, atol=rtol * np.abs(exact_d).max())
    # And not merely the double-precision product again: the single-precision path was taken.
    assert not (np.array_equal(single_u, exact_u) and np.array_equal(single_d, exact_d))


def test_jacobi_scaling_bounds_the_exact_diagonal() -> None:
    p = _point(AllRange(8), np.random.default_rng(1))
    hu, hd = p.hess_diag()
    exact_u = np.array([-p.hess_vec(e, np.zeros(p.d.size))[0][i] for i, e in enumerate(np.eye(p.u.size))])
    exact_d = np.array([-p.hess_vec(np.zeros(p.u.size), e)[1][j] for j, e in enumerate(np.eye(p.d.size))])
    cond = float((p.s.max() / p.s.min()) ** 2)
    np.testing.assert_allclose(hd, exact_d, rtol=100 * cond * EPS)
    # AM-GM: 1 / (s_a + s_b) <= 1 / (2 sqrt(s_a s_b)), so the scaling is never below the exact diagonal.
    assert (hu >= exact_u * (1 - 100 * cond * EPS)).all()


def test_a_small_weight_is_held_only_when_the_scaled_step_takes_it_to_zero() -> None:
    # Weights 3 and 4 are below BINDING_RTOL (1e-2) times the largest and below the projected-gradient
    # residual (weight 2's, 0.025), with gradients below the weighted mean lam = 1.007245.
    v = np.array([0.5, 0.3, 0.1915, 0.0045, 0.004])
    g = np.array([1.0, 1.0, 1.05, 0.5, 0.98])
    lam = float(v @ g)
    flat = np.ones(5)  # (lam - g) / h exceeds both small weights: both are held
    assert _binding(v, g, flat).tolist() == [False, False, False, True, True]
    # Curvature 10 times the one at which the scaled step v + (g - lam) / h just reaches zero for weight 4:
    # the step only takes it to 0.9 v, so it stays free (weight 3's deficit of 0.51 still zeroes it).
    steep = flat.copy()
    steep[4] = 10.0 * (lam - g[4]) / v[4]
    assert _binding(v, g, steep).tolist() == [False, False, False, True, False]


def test_newton_direction_keeps_both_simplices_and_ascends() -> None:
    p = _point(Prefix(12), np.random.default_rng(2))
    du, dd, held = newton_direction(p, eta=1e-8, max_cg=200, damping=0.0)
    # Moves within the simplices: the weights' sums do not change (held weights go to zero).
    assert abs(du.sum()) <= 1e3 * EPS * np.abs(du).sum()
    assert abs(dd.sum()) <= 1e3 * EPS * np.abs(dd).sum()
    assert not held.any()  # at a random interior point no weight is near zero
    # An ascent direction for psi.
    assert p.gu @ du + p.gd @ dd > 0


@pytest.mark.parametrize("workload", [AllRange(16), Prefix(16), WidthK(16, 4)], ids=["allrange", "prefix", "widthk"])
def test_newton_and_exponentiated_gradient_certify_the_same_optimum(workload) -> None:
    tol = 1e-6
    newton = solve_minimax(workload, tol=tol)
    ascent = solve_minimax(workload, tol=tol, newton_gap=0.0)
    assert newton.status == ascent.status == "converged"
    assert newton.extra["newton_trials"] > 0 and ascent.extra["newton_trials"] == 0
    # Both intervals [lower, upper] are certified and contain the optimum, so they overlap.
    assert newton.dual_bound <= ascent.fun and ascent.dual_bound <= newton.fun
    # Quadratic against first-order convergence: measured 8 / 7 / 7 inner solves against 2057 / 22 / 21,
    # so "no more" leaves a margin of about three on every case.
    assert newton.extra["inner_solves"] <= ascent.extra["inner_solves"]


@pytest.mark.parametrize("workload", [Prefix(16), WidthK(16, 4)], ids=["prefix", "widthk_rank_deficient"])
def test_newton_ascent_raises_psi_to_a_certified_lower_bound(workload) -> None:
    p = _point(workload, np.random.default_rng(3))
    # Target 1e-7: psi rises by about the square of the gap, so a step is seen to rise (in double precision)
    # only while the gap is above about sqrt(EPS) = 1.5e-8.
    q, _, trials = newton_ascent(p, 1e-7, 50, 100, 1e-4, 1e2, 0.1)
    assert trials > 0 and q.psi > p.psi
    # The point's own interval [psi^2, max gd max gu] holds the optimum: psi^2 is a dual value (below the
    # certified upper bound) and max gd max gu the value of a feasible strategy (above the certified lower
    # one). Slack: the solver's relative gap 1e-9 plus round-off of eigenvalue-based values, 100 cond EPS.
    best = solve_minimax(workload, p.c, tol=1e-9)
    cond = float((q.s.max() / q.s.min()) ** 2)
    slack = 1e-9 + 100 * cond * EPS
    assert q.psi**2 <= best.fun * (1 + slack)
    assert q.psi**2 / (1 - q.gap) >= best.dual_bound * (1 - slack)
    # Newton converges to the joint optimum: the point's gap is below the target asked.
    assert q.gap <= 1e-7


def test_cg_starts_no_product_after_its_deadline() -> None:
    calls = []

    def hess(v: np.ndarray) -> np.ndarray:
        calls.append(1)
        return np.arange(1.0, 6.0) * v

    x, steps = pcg(hess, np.ones(5), np.ones(5), 1e-12, 50, deadline=time.perf_counter() - 1.0)
    # One step always runs (a direction is returned); none after the deadline, which has passed.
    assert steps == len(calls) == 1 and np.ones(5) @ x > 0
    _, steps = pcg(hess, np.ones(5), np.ones(5), 1e-12, 50)
    assert steps > 1


def test_newton_step_tries_no_point_after_its_deadline() -> None:
    p = _point(Prefix(16), np.random.default_rng(0))
    judged: list[float] = []

    def judge(u: np.ndarray, d: np.ndarray) -> bool:
        judged.append(float(u.sum()))
        return False  # no ascent: each of the three step lengths is tried

    verdict, _, trials = newton_step(p, 0.1, 100, 1e-4, 1e2, 0.1, judge)
    assert verdict is None and trials == len(judged) == 3
    judged.clear()
    verdict, _, trials = newton_step(p, 0.1, 100, 1e-4, 1e2, 0.1, judge, deadline=time.perf_counter() - 1.0)
    assert verdict is None and trials == len(judged) == 0
