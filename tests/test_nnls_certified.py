"""Certified NNLS (`dpopt.solvers.nnls.solve_nnls`) against CVXPY at small n.

Tolerances: our solver stops at a certified relative gap <= TOL, so its value is within TOL of the optimum and
its dual bound below it. Clarabel's interior point stops at relative gap and feasibility 1e-8 (its defaults),
so its value lies within about 1e-8 of the optimum on either side (a slightly infeasible point may be below
it): CVX_RTOL = 1e-7 leaves 10x room for both.
"""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest

from dpopt.baselines import hierarchical_strategy, wavelet_strategy
from dpopt.solvers.nnls import solve_nnls

TOL = 1e-10
CVX_RTOL = 1e-7


def _cvxpy(A: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    z = cp.Variable(A.shape[1])
    prob = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(cp.multiply(w, A @ z - y))), [z >= 0])
    prob.solve(solver="CLARABEL")
    return float(prob.value)


CASES = [("hierarchical", lambda n: hierarchical_strategy(n, 2).A.toarray()),
         ("wavelet", lambda n: wavelet_strategy(n).A.toarray()),
         ("random", lambda n: np.random.default_rng(n).standard_normal((2 * n, n)))]


@pytest.mark.parametrize("name, make", CASES)
@pytest.mark.parametrize("n", [8, 24])
@pytest.mark.parametrize("weighted", [False, True])
def test_certified_nnls_matches_cvxpy(name, make, n, weighted):
    rng = np.random.default_rng(100 + n)
    A = make(n)
    x = rng.poisson(0.7, n).astype(float)  # sparse counts: many cells end at the bound
    y = A @ x + rng.laplace(0.0, 3.0, A.shape[0])
    w = rng.uniform(0.5, 2.0, A.shape[0]) if weighted else np.ones(A.shape[0])
    res = solve_nnls(A, y, weights=w if weighted else None, tol=TOL)
    assert res.status == "converged" and res.gap <= TOL
    assert (res.x >= 0).all()
    ref = _cvxpy(A, y, w)
    assert res.fun <= ref * (1 + CVX_RTOL)  # ours is within TOL of the optimum, Clarabel's within 1e-8
    assert res.dual_bound <= ref * (1 + CVX_RTOL)  # a certified lower bound is never above the optimum
    assert res.fun - res.dual_bound <= TOL * res.fun
    assert (res.x == 0).any()  # the bound is active: the test exercises the constraint


def test_exact_fit_certifies():
    # y in A's cone: f = 0 at the optimum; the gap is measured against the rounding floor, not 0
    A = np.eye(5)
    res = solve_nnls(A, np.array([3.0, 2.0, 1.0, 0.5, 4.0]))
    assert res.status == "converged" and np.allclose(res.x, [3, 2, 1, 0.5, 4], rtol=0, atol=1e-12)


def test_rank_deficient_has_no_certificate():
    res = solve_nnls(np.ones((3, 2)), np.ones(3))
    assert res.status == "failed" and "full column rank" in res.message
