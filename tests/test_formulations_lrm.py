"""LRM as alternating CVXPY models (seed 000, Formulas (7)-(10)): each block against an independent computation."""

from __future__ import annotations

import numpy as np
import pytest

from dpopt.bounds import svd_bound
from dpopt.linalg import svd_start
from dpopt.solvers.l1ball import project_l1_ball_columns
from dpopt.solvers.lrm import reoptimize_B
from dpopt.workloads import WRange, WRelated
from formulations import lrm, mm_pure
from formulations.solve import solve

# into_l1_ball divides each column by its L1 norm: re-summed, the norm is 1 up to r rounding errors
# (r <= 20 entries: <= 20 * 2.2e-16 = 4.4e-15), so "<= 1" is checked as <= 1 + 1e-14.
L1_ROUNDING = 1e-14


def _random_problem(seed: int = 0, m: int = 10, n: int = 7, r: int = 5):
    rng = np.random.default_rng(seed)
    W = rng.integers(0, 2, size=(m, n)).astype(float)
    L = project_l1_ball_columns(rng.normal(size=(r, n)))
    pi = rng.normal(size=(m, n))
    return rng, W, L, pi


def test_b_step_equals_closed_form_eq9():
    _, W, L, pi = _random_problem()
    beta = 3.0
    model = lrm.build_b_step(W, L.shape[0])
    model.data["T"].value = np.sqrt(beta) * (W + pi / beta)
    model.data["Ls"].value = np.sqrt(beta) * L
    res = solve(model, "clarabel", tol=1e-10)
    # Seed 000, Eq. (9): B = (beta W L^T + pi L^T)(beta L L^T + I)^{-1}.
    closed = (beta * W + pi) @ L.T @ np.linalg.inv(beta * L @ L.T + np.eye(L.shape[0]))
    T, Ls = model.data["T"].value, model.data["Ls"].value
    h_star = 0.5 * float(np.sum(closed * closed)) + 0.5 * float(np.sum((T - closed @ Ls) ** 2))
    # Clarabel at 1e-10 (relative gap) on this objective: value within 1e-10 (1 + h*) of h*; and h is
    # 1-strongly convex in B, so ||B - B*||_F^2 <= 2 (h(B) - h*) bounds the point by the value's error.
    assert res.objective == pytest.approx(h_star, rel=1e-9, abs=1e-9)
    np.testing.assert_allclose(model.value("B"), closed, rtol=0, atol=np.sqrt(2e-10 * (1 + h_star)))


@pytest.mark.parametrize("solver", ["clarabel", "scs"])
def test_l_step_is_a_fixed_point_of_projected_gradient(solver):
    rng, W, _, pi = _random_problem(1)
    beta, r = 2.0, 5
    B = rng.normal(size=(W.shape[0], r))
    model = lrm.build_l_step(W, r)
    T = np.sqrt(beta) * (W + pi / beta)
    model.data["C"].value = T
    model.data["B"].value = np.sqrt(beta) * B
    res = solve(model, solver, tol=1e-10)
    L = model.value("L")
    assert np.abs(L).sum(axis=0).max() <= 1 + 1e-7  # the conic solvers' feasibility at 1e-10, with margin
    # Optimality of Formula (10): L = Proj(L - eta grad) with the column-wise L1-ball projection
    # (dpopt.solvers.l1ball, an implementation independent of the conic solvers).
    Bs = np.sqrt(beta) * B
    grad = Bs.T @ (Bs @ L - T)
    eta = 1.0 / np.linalg.norm(Bs, 2) ** 2
    moved = project_l1_ball_columns(L - eta * grad)
    # For an eta-smooth objective the gradient mapping obeys ||L - Proj(L - eta grad)||^2 <= 2 eta (f(L) - f*),
    # and f(L) - f* <= acc (1 + f): acc = 1e-10 for Clarabel (its relative gap); SCS at eps 1e-10 is good
    # to ~1e-7 at best. Plus the 1e-7 by which L may leave the ball.
    acc = {"clarabel": 1e-10, "scs": 1e-7}[solver]
    bound = np.sqrt(2 * eta * acc * (1 + abs(res.objective))) + 1e-7
    assert np.linalg.norm(moved - L) <= bound


def test_l_step_solvers_agree():
    rng, W, _, pi = _random_problem(2)
    B = rng.normal(size=(W.shape[0], 5))
    values = []
    for solver, tol in (("clarabel", 1e-9), ("scs", 1e-9)):
        model = lrm.build_l_step(W, 5)
        model.data["C"].value = W + pi
        model.data["B"].value = B
        values.append(solve(model, solver, tol=tol).objective)
    # SCS at 1e-9 is good to ~1e-6 relative at best, Clarabel to 1e-9: 1e-5
    assert values[0] == pytest.approx(values[1], rel=1e-5)


@pytest.mark.parametrize("gamma", [0.3, 1.0])
def test_b_refit_matches_the_ridge_closed_form(gamma):
    _, W, L, _ = _random_problem(3, r=8)
    model = lrm.build_b_refit(W, L, gamma)
    res = solve(model, "clarabel", tol=1e-9)
    B = model.value("B")
    # Clarabel's feasibility tolerance 1e-9 is relative to the data (||W|| ~ 5): ~2e-8 of gamma = 0.3
    assert np.linalg.norm(W - B @ L) <= gamma * (1 + 1e-7)
    ref = reoptimize_B(W, L, gamma)  # root-finding on the KKT ridge path, no conic solver
    # reoptimize_B aims 1e-8 inside gamma, raising ||B||^2 by the elasticity (gamma / f)|df/dgamma|
    # (0.2 and 0.8 for these gammas) times 1e-8; Clarabel adds its 1e-9: 1e-7.
    assert res.objective == pytest.approx(float(np.sum(ref * ref)), rel=1e-7)


def test_svd_start_is_feasible_and_exact():
    W = WRelated(12, 9, 3, seed=4).matrix()
    B0, L0 = svd_start(W, 4, np.random.default_rng(0))
    assert L0.shape == (4, 9) and B0.shape == (12, 4)
    assert np.abs(L0).sum(axis=0).max() <= 1 + L1_ROUNDING
    # an SVD reconstruction: ~ n eps ||W||_2 <= 9 * 2.2e-16 * sqrt(m n) max|W| ~ 2e-14 max|W|
    np.testing.assert_allclose(B0 @ L0, W, rtol=0, atol=1e-12 * np.abs(W).max())


def test_fit_reaches_gamma_and_improves_on_its_start():
    w = WRange(12, 8, seed=2)
    W = w.matrix()
    gamma = 0.1 * float(np.linalg.norm(W))
    res = lrm.fit(w, gamma=gamma, solver="clarabel", max_outer=120)
    B, L = res.x
    assert res.status == "converged", res.message
    # the B-refit meets gamma to Clarabel's feasibility tolerance (default 1e-8, relative to the data)
    assert res.extra["residual"] <= gamma * (1 + 1e-6)
    assert res.extra["max_col_l1"] <= 1 + L1_ROUNDING
    assert res.extra["strategy"].supports(W)
    # Every decomposition with W = B L and unit L1 columns is a feasible eps-DP strategy, so
    # ||B||_F^2 of the start is at least the relaxation's bound; the fit must beat its own start.
    B0, L0 = svd_start(W, res.extra["rank"], np.random.default_rng(0))
    assert res.fun < float(np.sum(B0 * B0))  # 6% of it here
    bound = solve(mm_pure.build(w), "clarabel").objective
    assert float(np.sum(B0 * B0)) >= bound  # 26x above here; Clarabel's 1e-8 is immaterial
    hist = res.extra["history"]
    assert len(hist["fun"]) == res.nit and hist["residual"][-1] <= gamma


@pytest.mark.slow
def test_fit_exact_decomposition_is_above_the_eps_dp_bound():
    w = WRange(12, 8, seed=2)
    res = lrm.fit(w, gamma=0.0, solver="clarabel", rtol=1e-6, max_outer=400)
    assert res.status == "converged", res.message
    bound = solve(mm_pure.build(w), "clarabel").objective
    # the fit's residual (rtol 1e-6) and Clarabel's default 1e-8 on the bound: 1e-6
    assert res.fun >= bound * (1 - 1e-6)


def _l_objective(C, B, L):
    R = C - B @ L
    return 0.5 * float(np.sum(R * R))


def test_l_step_gap_bounds_the_suboptimality():
    rng, W, _, pi = _random_problem(4)
    beta, r = 8.0, 5
    B = rng.normal(size=(W.shape[0], r))
    C = W + pi / beta
    model = lrm.build_l_step(W, r)
    model.data["C"].value, model.data["B"].value = C, B
    solve(model, "clarabel", tol=1e-10)
    L_star = lrm.into_l1_ball(model.value("L"))
    best = _l_objective(C, B, L_star)
    assert lrm.l_step_gap(C, B, L_star) <= 1e-6  # Clarabel at 1e-10 on an objective of order 10
    for _ in range(5):
        L = project_l1_ball_columns(L_star + 0.1 * rng.normal(size=L_star.shape))
        excess = _l_objective(C, B, L) - best
        gap = lrm.l_step_gap(C, B, L)
        # weak duality; both sides are differences of O(10) objectives: round-off ~1e-14, far below 1e-9
        assert excess > 1e-6 and gap >= excess * (1 - 1e-9)
        # beta converts the bound to units of the augmented Lagrangian (the same sums, scaled: a few ulps)
        assert lrm.l_step_gap(C, B, L, beta) == pytest.approx(beta * gap, rel=1e-12)


def test_b_step_gap_bounds_the_suboptimality_against_eq9():
    rng, W, L, pi = _random_problem(5)
    beta = 4.0
    T, Ls = np.sqrt(beta) * (W + pi / beta), np.sqrt(beta) * L
    closed = (beta * W + pi) @ L.T @ np.linalg.inv(beta * L @ L.T + np.eye(L.shape[0]))  # Eq. (9)

    def h(B):
        return 0.5 * float(np.sum(B * B)) + 0.5 * float(np.sum((T - B @ Ls) ** 2))

    # at the closed form the gradient is round-off, ~1e-14; the gap is quadratic in it (~1e-28)
    assert lrm.b_step_gap(T, Ls, closed) <= 1e-20
    B = closed + 0.05 * rng.normal(size=closed.shape)
    assert lrm.b_step_gap(T, Ls, B) >= h(B) - h(closed) > 0


def test_refit_lower_bound_certifies_the_ridge_refit():
    _, W, L, _ = _random_problem(3, r=8)
    gamma = 0.3
    ref = reoptimize_B(W, L, gamma)  # root-finding on the KKT ridge path, no conic solver
    opt = float(np.sum(ref * ref))
    for solver in ("clarabel", "scs"):
        model = lrm.build_b_refit(W, L, gamma)
        solve(model, solver, tol=1e-9)
        bound = lrm.refit_lower_bound(W, L, gamma, model.value("B"))
        # ref is feasible (aimed 1e-8 inside gamma), so opt >= the optimum >= bound, up to round-off
        assert bound <= opt * (1 + 1e-9)
        # tight to the candidate's accuracy: SCS at 1e-9 ~1e-6 at best, plus opt's 1e-8 aim
        assert bound >= opt * (1 - 1e-5)
    # a poor candidate gives a valid but loose bound
    assert lrm.refit_lower_bound(W, L, gamma, 0.5 * ref) <= opt


@pytest.mark.parametrize("solver", ["clarabel", "scs"])
def test_l_step_scale_leaves_the_minimiser_unchanged(solver):
    rng, W, _, pi = _random_problem(6)
    beta, r = 2.0**12, 5
    B = rng.normal(size=(W.shape[0], r))
    C = W + pi / beta
    model = lrm.build_l_step(W, r)
    values = []
    for s in (1.0, np.sqrt(beta)):
        model.data["C"].value, model.data["B"].value = s * C, s * B
        solve(model, solver, tol=1e-9)
        values.append(_l_objective(C, B, lrm.into_l1_ball(model.value("L"))))
    # two solves at 1e-9 of the same minimiser: Clarabel's relative gap 1e-9; SCS ~1e-6 at best
    assert values[0] == pytest.approx(values[1], rel=1e-5 if solver == "scs" else 1e-7)


def test_fit_under_scs_matches_the_hand_written_solver():
    from dpopt.solvers.lrm import solve_lrm

    W = WRelated(6, 10, 2, seed=0).matrix()  # crossval's quick instance wrelated:6x10:s=2:seed=0
    res = lrm.fit(W, r=3, gamma=0.0, solver="scs")
    assert res.status == "converged", res.message
    assert res.extra["l_step_scale"] == "unit"
    assert res.extra["refit_gap"] <= lrm.REFIT_GAP_RTOL
    assert res.extra["max_col_l1"] <= 1.0 + L1_ROUNDING
    B, L = res.x
    # the fit stops at a relative residual of rtol = 1e-6 (1.0000007e-6 here: SCS's refit meets it to its
    # own tolerance), checked at 1e-5
    assert np.linalg.norm(W - B @ L) <= 1e-5 * np.linalg.norm(W)
    hand = solve_lrm(W, rank=3, gamma=0.0, seed=0)
    Bh, Lh = hand.x
    f_hand = float(np.sum(Bh * Bh)) * float(np.abs(Lh).sum(axis=0).max()) ** 2
    # Both stop on relative changes and residuals of 1e-6 at the same stationary point: 1e-4 is 100x that.
    assert res.fun == pytest.approx(f_hand, rel=1e-4)


def test_fit_rejects_an_unknown_l_step_scale():
    with pytest.raises(ValueError, match="l_step_scale"):
        lrm.fit(WRange(6, 4, seed=0), l_step_scale="beta")


@pytest.mark.slow
def test_fit_under_scs_solves_the_crossval_instance_that_failed():
    # wrange:16x32:seed=5 under SCS: the L-step at the sqrt(beta) scale returned optimal_inaccurate
    # (over 200000 iterations at beta = 2^16); on the unit scale every block solves.
    w = WRange(16, 32, seed=5)
    W = w.matrix()
    res = lrm.fit(W, r=20, gamma=0.0, solver="scs", seed=0)
    assert res.status == "converged", res.message
    assert res.extra["l_step_scale"] == "unit"
    assert res.extra["refit_gap"] <= lrm.REFIT_GAP_RTOL
    B, L = res.x
    assert np.abs(L).sum(axis=0).max() <= 1.0 + L1_ROUNDING
    assert np.linalg.norm(W - B @ L) <= 1e-5 * np.linalg.norm(W)
    # ||L_j||_2 <= ||L_j||_1 <= 1, so ||B||^2 is at least the SVD bound of the (eps, delta) strategies
    # (seed 004 Thm. 4.2) up to the refit's residual; the hand-written solver reaches 149.519 here
    assert res.fun >= svd_bound(W) * (1 - 1e-4)
    assert res.fun <= 1.5 * 149.519
