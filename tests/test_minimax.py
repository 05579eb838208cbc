"""Weighted minimax per-query error: the certified solver against the conic model, and fitness for use."""

from __future__ import annotations

import numpy as np
import pytest

from dpopt.solvers.minimax import (
    MatrixRows,
    RangeRows,
    fitness_for_use,
    prolong,
    query_rows,
    solve_minimax,
    transposed_rows,
    untranspose,
)
from dpopt.solvers.result import MAX_ITER
from dpopt.workloads import AllRange, Marginals, Prefix, WidthK, WRange
from formulations import minimax, per_query
from formulations.solve import solve

EPS = np.finfo(float).eps
# The certified gap asked of the solver in these tests.
GAP_TOL = 1e-6
# Conic tolerance: Clarabel and SCS run at 1e-9 (gap and feasibility); the comparison uses the 1e-4
# relative agreement `dpopt crossval` requires of every convex pair, which is far above both the
# solver's certified 1e-6 and the conic solvers' stopping accuracy on these n <= 16 instances.
CONIC_TOL = 1e-9
AGREE_RTOL = 1e-4

FAMILIES = {
    "prefix16": lambda: Prefix(16),
    "allrange16": lambda: AllRange(16),
    "marginals_2x3x2": lambda: Marginals([2, 3, 2], subsets=[(0, 1), (1, 2), (0, 2), (0, 1, 2)]),
    # Rank deficient: WidthK(16, 4) has rank 13 < 16, the 2-way marginals of 2x3x4 rank 18 < 24.
    "widthk_16_4": lambda: WidthK(16, 4),
    "marginals2_2x3x4": lambda: Marginals([2, 3, 4], k=2),
}
RANK_DEFICIENT = ("widthk_16_4", "marginals2_2x3x4")


def _targets(name: str, m: int) -> np.ndarray:
    """Unit targets. Non-uniform ones can leave a query inactive at the optimum with G_{u*} singular,
    where the inner optimum does not fix its variance: with c uniform in [1, 3], 18 of 20 runs (these
    five families, seeds 0-3) reached 1e-6; the 2-3-2 marginals (seed 0) stalled at 8.4e-4 and
    WidthK(16, 4) (seed 0) at 1.4e-6."""
    return np.ones(m)


@pytest.fixture(scope="module")
def solved() -> dict:
    out = {}
    for name, make in FAMILIES.items():
        w = make()
        c = _targets(name, w.m)
        out[name] = (w, c, solve_minimax(w, c, tol=GAP_TOL))
    return out


def _variances(W: np.ndarray, X: np.ndarray) -> np.ndarray:
    """w_i X^{-1} w_i^T by a dense solve, independent of the solver's Cholesky and range forms."""
    return np.einsum("ij,ji->i", W, np.linalg.solve(X, W.T))


def _pinv_variances(W: np.ndarray, X: np.ndarray) -> tuple[np.ndarray, float]:
    """w_i X^+ w_i^T from the k = rank(W) largest eigenpairs of X (independent of the solver's
    row-space basis and QR factors), and the condition number of X on that range."""
    k = np.linalg.matrix_rank(W)
    lam, Q = np.linalg.eigh(X)
    F = Q[:, -k:] / np.sqrt(lam[-k:])
    Y = W @ F
    return np.einsum("ij,ij->i", Y, Y), float(lam[-1] / lam[-k])


@pytest.mark.parametrize("name", list(FAMILIES))
def test_certified_gap_feasible_strategy_and_fun(solved, name):
    w, c, res = solved[name]
    assert res.status == "converged", res.message
    assert res.gap <= GAP_TOL
    assert res.dual_bound <= res.fun
    X = res.x
    # X is divided by max(max diag, 1): each diagonal entry is one division away from <= 1 (a few ulps).
    assert np.diag(X).max() <= 1.0 + 8 * EPS
    np.testing.assert_allclose(X, X.T, rtol=0, atol=0)
    if name in RANK_DEFICIENT:
        # X is singular (rank W); on its range the eigen-solve's relative error is about n * cond * eps
        # with cond the condition number there (eigh backward stable, then one division per direction).
        var, cond = _pinv_variances(w.matrix(), X)
        assert np.max(var / c) == pytest.approx(res.fun, rel=10 * w.n * cond * EPS)
        np.testing.assert_allclose(var, res.extra["variances"], rtol=10 * w.n * cond * EPS)
        return
    # fun is the largest weighted variance of the returned X, recomputed by a dense solve whose
    # relative error is bounded by n * cond(X) * eps (normwise backward stability of LU).
    cond = np.linalg.cond(X)
    var = _variances(w.matrix(), X)
    assert np.max(var / c) == pytest.approx(res.fun, rel=10 * w.n * cond * EPS)
    np.testing.assert_allclose(var, res.extra["variances"], rtol=10 * w.n * cond * EPS)


@pytest.mark.parametrize("solver", ["clarabel", "scs"])
@pytest.mark.parametrize("name", list(FAMILIES))
def test_agrees_with_the_conic_minimax_model(solved, name, solver):
    w, c, res = solved[name]
    ref = solve(minimax.build(w, c), solver, tol=CONIC_TOL)
    assert res.fun == pytest.approx(ref.objective, rel=AGREE_RTOL)
    # The conic optimum cannot beat the certified lower bound (beyond the same agreement tolerance).
    assert ref.objective >= res.dual_bound * (1 - AGREE_RTOL)


def test_fitness_form_is_the_per_query_program():
    """Least max diag(X) under Var_i <= c_i (per_query) equals the minimax value (scaling argument)."""
    w = Prefix(12)
    c = np.full(w.m, 2.5)
    ffu = fitness_for_use(w, c, tol=GAP_TOL)
    ref = solve(per_query.build(w, c), "clarabel", tol=CONIC_TOL)
    assert ffu.value == pytest.approx(ref.objective, rel=AGREE_RTOL)
    assert ffu.scale == pytest.approx(1.0 / ffu.value, rel=2 * EPS)
    # Every target is met with noise variance `scale` (sigma^2) on a sens2 <= 1 strategy: the largest
    # ratio is exactly value * scale = 1 up to the rounding of one product and one quotient.
    ratio = _variances(w.matrix(), ffu.X) * ffu.scale / c
    assert ratio.max() <= 1.0 + 10 * w.n * np.linalg.cond(ffu.X) * EPS


@pytest.mark.parametrize("make", [lambda: AllRange(12), lambda: Prefix(12), lambda: WidthK(12, 5)])
def test_range_form_matches_the_matrix_form(make):
    w = make()
    r = query_rows(w)
    assert isinstance(r, RangeRows)
    M = MatrixRows(w.matrix())
    u = np.random.default_rng(0).uniform(0.1, 1.0, w.m)
    G_range, G_dense = r.gram(u), M.gram(u)
    # Sums of at most m positive terms in two orders: m * eps relative to the largest entry.
    np.testing.assert_allclose(G_range, G_dense, rtol=0, atol=w.m * EPS * np.abs(G_dense).max())
    X = 0.5 * np.eye(w.n) + 0.5 / w.n
    L = np.linalg.cholesky(X)
    vr, vm = r.variances(L), M.variances(L)
    # Boundary differences cancel at most a factor cond(X) * n of the prefix sums' size.
    np.testing.assert_allclose(vr, vm, rtol=10 * w.n**2 * np.linalg.cond(X) * EPS)


@pytest.mark.parametrize("name", RANK_DEFICIENT)
def test_rank_deficient_bounds_stay_ordered(solved, name):
    """Every iterate's certified lower bound stays below every upper bound (the singular optimum's
    variances are evaluated in the row space; through the completed X's Cholesky factor they were
    0.3% off and the lower bound came out above the upper one)."""
    w, c, res = solved[name]
    hist = res.extra["history"]
    assert max(h["lower"] for h in hist) <= min(h["upper"] for h in hist)
    assert res.extra["basis"].shape == (w.n, np.linalg.matrix_rank(w.matrix()))


@pytest.mark.parametrize("make", [lambda: WidthK(16, 9), lambda: WRange(16, 64, seed=0)])
def test_transposed_form_certifies_the_same_optimum(make):
    """Full row rank, at most half as many queries as cells: the transposed form (module docstring) and the problem as
    given bound one optimum, under non-uniform targets too, and the strategy mapped back is feasible
    with the variances it reports."""
    w = make()
    c = np.random.default_rng(0).uniform(1.0, 3.0, w.m)
    t = solve_minimax(w, c, tol=GAP_TOL, time_limit=20)
    d = solve_minimax(w, c, tol=GAP_TOL, time_limit=20, transpose=False)
    assert t.extra["forms"][0] == "transposed" and d.extra["forms"] == ("direct",)
    assert np.diag(t.x).max() <= 1.0 + 8 * EPS
    var, cond = _pinv_variances(w.matrix(), t.x)  # as in the rank-deficient case above
    rtol = 10 * w.n * cond * EPS
    assert rtol < 1e-8  # small enough for the checks below to fail on a wrong mapping
    np.testing.assert_allclose(var, t.extra["variances"], rtol=rtol)
    assert np.max(var / c) == pytest.approx(t.fun, rel=rtol)
    # Each lower bound is certified, each upper bound the recomputed value of a feasible strategy.
    assert max(t.dual_bound, d.dual_bound) <= min(t.fun, d.fun) * (1 + rtol)


def test_transposed_form_falls_back_to_the_problem_as_given():
    """When the transposed form stops short of tol, the problem as given is solved as well and the result keeps
    each form's better bound. The fallback exists for stalls (WRange(16, 64) seed 2 with targets in [1, 3] stalled
    at 3.1e-4 until the scaled binding test of `minimax_newton._binding`); max_iter = 3 stops both forms short here
    without depending on where a stall happens."""
    w = WRange(16, 64, seed=2)
    c = np.random.default_rng(2).uniform(1.0, 3.0, w.m)
    opts = {"tol": GAP_TOL, "time_limit": 60, "max_iter": 3}
    res = solve_minimax(w, c, **opts)
    given = solve_minimax(w, c, transpose=False, **opts)
    Wt = transposed_rows(query_rows(w), c)
    alone = untranspose(solve_minimax(Wt.T, transpose=False, **opts), Wt, c, 0.0, 0.0)
    assert alone.status == MAX_ITER and alone.gap > GAP_TOL and res.extra["forms"] == ("transposed", "direct")
    assert res.fun == min(alone.fun, given.fun) and res.dual_bound == max(alone.dual_bound, given.dual_bound)
    assert res.dual_bound <= res.fun and res.gap == pytest.approx(1.0 - res.dual_bound / res.fun, rel=1e-12)
    assert solve_minimax(WRange(16, 64, seed=0), tol=GAP_TOL).extra["forms"] == ("transposed",)  # unit targets
    assert solve_minimax(WidthK(16, 4), tol=GAP_TOL).extra["forms"] == ("direct",)  # m = 13 > n / 2


def test_marginals_use_the_matrix_form_and_inputs_are_validated():
    w = Marginals([2, 3, 2], k=2)
    assert isinstance(query_rows(w), MatrixRows)
    with pytest.raises(ValueError):
        solve_minimax(w, -np.ones(w.m))
    with pytest.raises(ValueError):
        solve_minimax(w, np.ones(w.m + 1))


@pytest.fixture
def work_clock(monkeypatch) -> list[float]:
    """time.perf_counter as a clock that advances only by the work done: every inner solve and every joint point
    costs 10 s. No real time is measured."""
    import time

    import dpopt.solvers.minimax as mm
    import dpopt.solvers.minimax_newton as mn

    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])

    def costly(fn):
        def run(*args, **kwargs):
            out = fn(*args, **kwargs)
            clock[0] += 10.0
            return out
        return run

    monkeypatch.setattr(mm, "solve_convex_dp", costly(mm.solve_convex_dp))
    monkeypatch.setattr(mm, "JointPoint", costly(mm.JointPoint))
    monkeypatch.setattr(mn, "JointPoint", costly(mn.JointPoint))
    return clock


@pytest.mark.parametrize(("limit", "newton"), [(45.0, False), (145.0, True)])
def test_no_unit_of_work_starts_that_would_end_past_the_time_limit(work_clock, limit, newton):
    """The solve stops with TIME_LIMIT at or before its limit: a unit starts only when its last cost still fits
    (before, a 45 s solve started its fifth inner solve at 40 s and ended at 50 s). At 145 s it gets to the
    Newton ascents and their trials."""
    # tol below round-off: the solve can only stop by its time limit
    r = solve_minimax(Prefix(16), tol=1e-15, time_limit=limit, transpose=False)
    assert r.status == "time_limit"
    assert work_clock[0] <= limit and r.extra["inner_solves"] >= 2 and (r.extra["newton_trials"] > 0) == newton


def test_prolong_carries_the_interior_by_position_and_the_ends_by_distance():
    """A profile flat inside with features near either end (within edge n_from / n_to = 4.6 entries: the seam,
    entry `edge`, is interpolated from the coarse interior) keeps them at the same distances from the ends of the
    larger domain and stays flat between them; the length grows by the cells added."""
    v = np.ones(40)
    v[:4], v[-4:] = np.linspace(0.1, 0.7, 4), np.linspace(2.0, 1.4, 4)
    w = prolong(v, 70, 40, 8, 0.5)
    assert w.size == 70
    # Interpolating between equal neighbours returns them exactly and the seam scales are then exactly 1, so each
    # entry is v's own or 1.0 up to a couple of roundings: 4 eps.
    np.testing.assert_allclose(w[:8], v[:8], rtol=4 * EPS)
    np.testing.assert_allclose(w[-8:], v[-8:], rtol=4 * EPS)
    np.testing.assert_allclose(w[8:-8], 1.0, rtol=4 * EPS)


def test_widthk_grid_sequencing_starts_near_the_same_optimum():
    """WidthK(256, 8) starts from WidthK(128, 8)'s minimax weights prolonged: it certifies the optimum the solve
    from uniform weights certifies (both upper bounds within tol of it), and its first lower bound is at least ten
    times closer to that optimum (measured: the start's ascent certified 1.1e-7 with no inner solve; from uniform
    weights the first lower bound is 6.6e-3 below the optimum)."""
    w = WidthK(256, 8)
    seq, cold = solve_minimax(w, tol=GAP_TOL), solve_minimax(w, tol=GAP_TOL, coarse=False)
    assert seq.success and cold.success and cold.extra["coarse"] is None
    assert seq.extra["coarse"].success and seq.extra["coarse"].x.shape == (128, 128)
    assert abs(seq.fun - cold.fun) <= GAP_TOL * max(seq.fun, cold.fun)
    best = max(seq.dual_bound, cold.dual_bound)
    first = [r.extra["history"][0]["lower"] for r in (seq, cold)]
    assert best - first[0] <= 0.1 * (best - first[1])


def test_grid_sequencing_gives_the_coarse_level_half_the_time_limit(work_clock):
    """WidthK(256, 8) at a tol below round-off: the coarse level stops by its half of the limit, the whole solve by
    the limit."""
    r = solve_minimax(WidthK(256, 8), tol=1e-15, time_limit=145.0)
    assert r.status == r.extra["coarse"].status == "time_limit"
    assert r.extra["coarse"].wall_seconds <= 72.5 and work_clock[0] <= 145.0
