"""Mechanisms that select their strategy by optimisation: LRM (seed 000), eigen-design, the (eps, delta)
convex optimum (seed 002) and the Appendix B matrix mechanism (seed 000).

Conventions as in test_mechanisms.py: total expected squared error over the m queries; eps-DP noise has
variance 2 (sens1/eps)^2 per measurement, which is the convention of seed 000's worked example (NOD's
q1 = 2 x_NJ + x_CA + x_WA gets "noise variance 12/eps^2" = 2 * (4 + 1 + 1) / eps^2), so the example's
39/eps^2 compares directly with `expected_error_.total`.
"""

from __future__ import annotations

import inspect
import warnings
from functools import cache

import numpy as np
import pytest
from test_mechanisms import EPS, EPS_DELTA, WORKLOADS, check_fitted, data_vector

from dpopt.error import expected_error
from dpopt.mechanisms import (
    ConvergenceWarning,
    ConvexOptimumMechanism,
    LowRankMechanism,
    MatrixMechanism,
    MechanismError,
    make_mechanism,
)
from dpopt.mechanisms.convergence import solver_status
from dpopt.mechanisms.matrix import factor_gram
from dpopt.privacy import Privacy
from dpopt.solvers.convex_dp import solve_convex_dp
from dpopt.solvers.result import CONVERGED, FAILED, MAX_ITER, SolverResult
from dpopt.strategy import Strategy
from dpopt.workloads import AllRange

# Seed 000, Section 1: cells (NY, NJ, CA, WA); q1 = 2NJ + CA + WA, q2 = NJ + 2WA, q3 = NY + 2CA + 2WA.
W3 = np.array([[0, 2, 1, 1], [0, 1, 0, 2], [1, 0, 2, 2]], dtype=float)
# The strategy printed there: x_NJ, x_WA, q1' = NY/3 + CA, q2' = 2NY/3, and its reconstruction.
L3 = np.array([[0, 1, 0, 0], [0, 0, 0, 1], [1 / 3, 0, 1, 0], [2 / 3, 0, 0, 0]])
B3 = np.array([[2, 1, 1, -0.5], [1, 2, 0, 0], [0, 2, 2, 0.5]])

# Which (mechanism, workload) fits take more than a few seconds here (LRM's ALM on 64-128 full-rank cells).
SLOW_FITS = {("lrm", "allrange64"), ("mm-appendix-b", "*")}


def _is_slow(name: str, wname: str) -> bool:
    return (name, wname) in SLOW_FITS or (name, "*") in SLOW_FITS


def _params(names: list[str]) -> list:
    out = []
    for name in names:
        for wname in WORKLOADS:
            marks = [pytest.mark.slow] if _is_slow(name, wname) else []
            out.append(pytest.param(name, wname, marks=marks, id=f"{name}-{wname}"))
    return out


@cache
def fitted(name: str, wname: str, pure: bool):
    """Fit once per (mechanism, workload, privacy kind); ConvergenceWarnings are reported in fit_info_."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return make_mechanism(name).fit(WORKLOADS[wname], EPS if pure else EPS_DELTA)


# ------------------------------------------------------------------------------------------------
# Seed 000, Section 1 worked example
# ------------------------------------------------------------------------------------------------


def test_lrm_paper_example_printed_strategy_is_39_over_eps2():
    """Like with like: the printed decomposition through the core's error is exactly 39/eps^2, NOD 40/eps^2."""
    eps = 0.25
    np.testing.assert_allclose(B3 @ L3, W3, atol=1e-15)
    assert np.abs(L3).sum(axis=0).max() == pytest.approx(1.0)
    err = expected_error(Strategy(L3, B=B3), W3, Privacy(eps)).total
    assert err * eps**2 == pytest.approx(39.0, rel=1e-12)
    nod = make_mechanism("identity").fit(W3, Privacy(eps)).expected_error_.total
    assert nod * eps**2 == pytest.approx(40.0, rel=1e-12)


def test_lrm_paper_example_finds_at_most_39_over_eps2():
    eps = 0.25
    lrm = LowRankMechanism().fit(W3, Privacy(eps))
    B, L = np.asarray(lrm.strategy_.B), np.asarray(lrm.strategy_.A)
    assert L.shape == (4, 4)  # r = ceil(1.2 * rank(W)) = ceil(3.6)
    assert np.linalg.norm(W3 - B @ L) <= 1e-6 * np.linalg.norm(W3)
    # Lemma 1 computed here from (B, L), independently of the core: 2 ||B||_F^2 Delta(B, L)^2 / eps^2.
    lemma1 = 2 * float(np.sum(B**2)) * float(np.abs(L).sum(axis=0).max()) ** 2 / eps**2
    assert lrm.expected_error_.total == pytest.approx(lemma1, rel=1e-9)
    # A better decomposition than the printed one exists: L38 below, with column L1 norms (3/4, 1, 1, 1)
    # and ||B38||_F^2 = 19, i.e. 38/eps^2. It is the best any of 33 seeded runs (ranks 4-6) found, so
    # it is a target, not a certified optimum. The solver stops a run when ||B||_F^2 changes by at most
    # ftol = 1e-6 relatively per outer iteration, so it must come within that of 38.
    assert lemma1 * eps**2 <= 38.0 * (1 + 1e-6)
    assert lrm.fit_info_.status == "converged"
    assert lemma1 >= lrm.bound_


def test_lrm_paper_example_has_a_38_over_eps2_decomposition():
    """The decomposition behind the 38/eps^2 target above, checked in exact rational arithmetic."""
    from fractions import Fraction as F

    L38 = [[F(-3, 8), 0, -1, 0], [F(1, 4), -1, 0, 0], [F(1, 8), 0, 0, 1]]
    B38 = [[-1, -2, 1], [0, -1, 2], [-2, 0, 2]]
    BL = [[sum(B38[i][k] * L38[k][j] for k in range(3)) for j in range(4)] for i in range(3)]
    assert BL == W3.astype(int).tolist()
    assert max(sum(abs(L38[k][j]) for k in range(3)) for j in range(4)) == 1
    assert 2 * sum(b * b for row in B38 for b in row) == 38
    eps = 0.25
    err = expected_error(Strategy(np.array(L38, dtype=float), B=np.array(B38, dtype=float)), W3, Privacy(eps))
    assert err.total * eps**2 == pytest.approx(38.0, rel=1e-12)


# ------------------------------------------------------------------------------------------------
# LRM parameters, relaxation and bad inputs
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rank", [0, -2, 1.5, True])
def test_lrm_rank_below_one_is_refused(rank):
    with pytest.raises(MechanismError, match=r"^lrm: rank must be a positive integer"):
        LowRankMechanism(rank=rank)


def test_lrm_rank_below_rank_w_needs_gamma():
    with pytest.raises(MechanismError, match=r"^lrm: rank r = 2 is below rank\(W\) = 3"):
        LowRankMechanism(rank=2).fit(W3, EPS)


@pytest.mark.parametrize("bad", [{"gamma": -1.0}, {"gamma": float("nan")}, {"solver": "newton"}, {"tol": 0.0}])
def test_lrm_bad_parameters(bad):
    with pytest.raises(MechanismError, match=r"^lrm: "):
        LowRankMechanism(**bad)


def test_lrm_gram_only_workload_is_refused():
    from dpopt.workloads import AllPredicate

    with pytest.raises(MechanismError, match=r"^lrm: .*Gram matrix"):
        LowRankMechanism().fit(AllPredicate(6), EPS)


def test_lrm_unconverged_strategy_that_misses_w_is_never_used():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        # From a random start only (r = rank W: its 3 rows miss W's row space), one outer iteration misses W.
        with pytest.raises(MechanismError, match="does not support"):
            LowRankMechanism(
                rank=3, max_outer=1, solver_options={"init": "random", "restarts": 0, "repair": False}
            ).fit(W3, EPS)
        # With the default starts the capped solver falls back on an exact one: valid, flagged unconverged.
        lrm = LowRankMechanism(max_outer=1).fit(W3, EPS)
        assert lrm.fit_info_.status.startswith("max_iter: valid") and lrm.strategy_.supports(W3, lrm.support_rtol)


def test_lrm_relaxed_gamma_reports_structural_error():
    w = WORKLOADS["wrelated64x128s13"]
    gamma = 1.0
    lrm = LowRankMechanism(gamma=gamma).fit(w, EPS)
    st = lrm.strategy_
    resid = st.residual(w)
    assert resid <= gamma * (1 + 1e-9)
    x = data_vector(w.n)
    r = w.matrix() @ x - np.asarray(st.B) @ (np.asarray(st.A) @ x)
    assert lrm.structural_error(x) == pytest.approx(float(r @ r), rel=1e-9)
    assert lrm.structural_error(x) <= resid**2 * float(x @ x)  # Theorem 3's Cauchy-Schwarz step
    assert lrm.theorem3_bound(x) >= lrm.expected_error_.total + lrm.structural_error(x)
    assert lrm.fit_info_.extra["bound_of"].startswith("B L")
    check_fitted(lrm, x, seed=5)


def test_lrm_exact_has_no_structural_error_and_gaussian_message():
    lrm = fitted("lrm", "wrelated64x128s13", False)
    x = data_vector(128)
    # Exact up to the solver's relative residual tol = 1e-6 (Theorem 3's bound with that residual).
    assert lrm.structural_error(x) <= (1e-6 * np.linalg.norm(lrm.workload_.matrix())) ** 2 * float(x @ x)
    assert "Gaussian" in lrm.fit_info_.message


# ------------------------------------------------------------------------------------------------
# Matrix mechanism: factors, convergence policy, eps-DP message, Appendix B
# ------------------------------------------------------------------------------------------------


def test_factor_gram_reproduces_x_and_auto_minimises_l1():
    rng = np.random.default_rng(0)
    M = rng.normal(size=(6, 6))
    X = M.T @ M + 0.1 * np.eye(6)
    l1 = {}
    for f in ("cholesky", "sqrt", "eigen"):
        A, used = factor_gram(X, f, EPS)
        assert used == f
        np.testing.assert_allclose(A.T @ A, X, atol=1e-10)
        l1[f] = np.abs(A).sum(axis=0).max()
    A, used = factor_gram(X, "auto", EPS)
    assert np.abs(A).sum(axis=0).max() == pytest.approx(min(l1.values()))
    assert factor_gram(X, "auto", EPS_DELTA)[1] == "cholesky"
    singular = np.outer(np.ones(4), np.ones(4))
    A, used = factor_gram(singular, "cholesky", EPS)
    assert used == "eigen" and A.shape == (1, 4)


def test_solver_status_policy():
    def res(status):
        return SolverResult(x=None, fun=1.0, status=status, message="m", nit=3, wall_seconds=0, cpu_seconds=0)

    assert solver_status(res(CONVERGED), "x", "warn") == ("converged", "m")
    with pytest.warns(ConvergenceWarning, match="not certified optimal"):
        status, _ = solver_status(res(MAX_ITER), "x", "warn")
    assert status.startswith("max_iter")
    with pytest.raises(MechanismError, match="on_unconverged='raise'"):
        solver_status(res(MAX_ITER), "x", "raise")
    with pytest.raises(MechanismError, match="failed"):
        solver_status(res(FAILED), "x", "warn")


def test_iteration_capped_optimum_is_valid_reported_and_not_better():
    w = WORKLOADS["wtau32x128t0.4"]
    with pytest.warns(ConvergenceWarning):
        capped = ConvexOptimumMechanism(solver_options={"max_iter": 0}).fit(w, EPS_DELTA)
    assert capped.fit_info_.status.startswith("max_iter")
    assert capped.strategy_.unsupported_fraction(w) <= 1e-8
    best = fitted("mm-optimal", "wtau32x128t0.4", False)
    assert capped.expected_error_.total >= best.expected_error_.total * (1 - 1e-9)
    with pytest.raises(MechanismError, match="refusing"):
        ConvexOptimumMechanism(solver_options={"max_iter": 0}, on_unconverged="raise").fit(w, EPS_DELTA)


def test_l2_strategies_under_pure_dp_say_so():
    mm = fitted("mm-optimal", "wtau32x128t0.4", True)
    assert "L1 sensitivity" in mm.fit_info_.message and mm.privacy_.noise == "laplace"
    assert mm.expected_error_.sensitivity == pytest.approx(mm.strategy_.sens1)


def test_appendix_b_conic_equals_convex_optimum_on_small_workload():
    """Appendix B's program has the same optimum as seed 002's (scale invariance), so the errors agree."""
    w = AllRange(8)
    ab = MatrixMechanism("appendix-b", solver="cvxpy:clarabel").fit(w, EPS_DELTA)
    opt = ConvexOptimumMechanism().fit(w, EPS_DELTA)
    assert ab.fit_info_.solver == "cvxpy:clarabel"
    assert ab.expected_error_.total == pytest.approx(opt.expected_error_.total, rel=1e-5)


def test_appendix_b_hand_written_solver_reaches_the_optimum_on_small_workload():
    """x of solve_appendix_b is the strategy A (not its Gram): the mechanism must measure A^T A = M."""
    w = AllRange(8)
    ab = make_mechanism("mm-appendix-b").fit(w, EPS_DELTA)
    opt = ConvexOptimumMechanism().fit(w, EPS_DELTA)
    assert ab.fit_info_.solver == "solve_appendix_b"
    # Appendix B's smoothing mu = 1e-3 / log n leaves the objective high by about mu (its docstring).
    assert opt.expected_error_.total <= ab.expected_error_.total <= opt.expected_error_.total * (1 + 1e-3)


def test_cvxpy_and_hand_written_convex_optimum_agree():
    w = AllRange(8)
    cvx = ConvexOptimumMechanism(solver="cvxpy").fit(w, EPS_DELTA)
    hand = ConvexOptimumMechanism(solver="hand").fit(w, EPS_DELTA)
    assert cvx.expected_error_.total == pytest.approx(hand.expected_error_.total, rel=1e-5)


# ------------------------------------------------------------------------------------------------
# Every optimising mechanism on the four workloads: support, Monte Carlo, bound
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,wname", _params(["lrm", "eigen", "mm-optimal", "mm-appendix-b"]))
@pytest.mark.parametrize("pure", [True, False], ids=["eps", "eps-delta"])
def test_optimised_mechanisms_support_montecarlo_bound(name, wname, pure):
    mech = fitted(name, wname, pure)
    check_fitted(mech, data_vector(mech.workload_.n), seed=17)


# ------------------------------------------------------------------------------------------------
# The (eps, delta) convex optimum is never above any other (eps, delta) strategy
# ------------------------------------------------------------------------------------------------

OTHERS = ["laplace", "identity", "hierarchical", "wavelet", "eigen", "om", "lrm", "mm-appendix-b"]


def _others(wname: str) -> list[str]:
    return [o for o in OTHERS if not _is_slow(o, wname)]


# The convex optimum's stopping rule: relative duality gap (fun - dual_bound) / fun <= tol.
CONVEX_TOL = inspect.signature(solve_convex_dp).parameters["tol"].default


def _compare_optimum(wname: str, others: list[str]) -> None:
    opt = fitted("mm-optimal", wname, False)
    w = opt.workload_
    # Default iterations suffice at these sizes (n <= 128, a handful of Newton steps): converged, with a
    # certified gap within the stopping tolerance.
    assert opt.fit_info_.status == "converged", (opt.fit_info_.status, opt.fit_info_.message)
    assert 0 <= opt.fit_info_.gap <= CONVEX_TOL
    P = 2 * np.log(2 / EPS_DELTA.delta) / EPS_DELTA.epsilon**2  # classic Gaussian variance factor
    lower = P * opt.fit_info_.extra["unit_lower_bound"]
    # Rounding between the solver's fun and the error recomputed from the factor A of X: about
    # n kappa(X) u relative (kappa(X) = kappa(A)^2); 10 times that.
    s = np.linalg.svd(np.asarray(opt.strategy_.A), compute_uv=False)
    rounding = 10 * w.n * (s[0] / s[s > 1e-5 * s[0]][-1]) ** 2 * np.finfo(float).eps
    # The certificate: the optimum's error is within the gap of the certified lower bound ...
    assert lower <= opt.expected_error_.total * (1 + rounding)
    assert opt.expected_error_.total <= lower / (1 - CONVEX_TOL) * (1 + rounding)
    # ... and the lower bound holds for every strategy's (eps, delta) error, so none beats the optimum
    # by more than the gap.
    rng = np.random.default_rng(0)
    errors = {o: fitted(o, wname, False).expected_error_.total for o in others}
    for k in range(3):  # random full-rank strategies support every workload
        errors[f"random{k}"] = expected_error(Strategy(rng.normal(size=(w.n, w.n))), w, EPS_DELTA).total
    for name, err in errors.items():
        assert lower <= err * (1 + 1e-9), name
        assert opt.expected_error_.total <= err / (1 - CONVEX_TOL) * (1 + rounding), (name, err)


@pytest.mark.parametrize("wname", list(WORKLOADS))
def test_convex_optimum_never_above_other_strategies(wname):
    _compare_optimum(wname, _others(wname))


@pytest.mark.slow
@pytest.mark.parametrize("wname", [w for w in WORKLOADS if any(_is_slow(o, w) for o in OTHERS)])
def test_convex_optimum_never_above_slow_strategies(wname):
    _compare_optimum(wname, [o for o in OTHERS if _is_slow(o, wname)])


@pytest.mark.parametrize("privacy", [EPS_DELTA, EPS], ids=["eps-delta", "eps"])
def test_eigen_completion_is_never_worse_and_matches_the_solver(privacy):
    # Li and Miklau's completion X + diag(1 - diag X) spends unused sensitivity: never worse under L2, and
    # under eps-DP kept only when it lowers the L1 error.
    w = AllRange(64)
    bare = make_mechanism("eigen", complete=False).fit(w, privacy)
    done = make_mechanism("eigen").fit(w, privacy)
    assert bare.fit_info_.extra["completed"] is False
    assert done.expected_error_.total <= bare.expected_error_.total * (1 + 1e-12)
    if not privacy.is_pure:
        assert done.fit_info_.extra["completed"] is True
        assert done.strategy_.sens2 == pytest.approx(1.0, rel=1e-9)
        # the same number as the solver's own completed objective (P * completed_fun * mean diag G)
        from dpopt.solvers.eigen_design import solve_eigen_design

        G = w.gram()
        scale = float(np.mean(np.diag(G)))
        res = solve_eigen_design(G / scale)
        P = privacy.variance_factor
        assert done.expected_error_.total == pytest.approx(P * scale * res.extra["completed_fun"], rel=1e-6)
        assert done.expected_error_.total < 0.99 * bare.expected_error_.total


def test_completion_is_for_the_eigen_design_only():
    with pytest.raises(ValueError, match="eigen-design strategy only"):
        make_mechanism("mm-optimal", complete=True)
    with pytest.raises(ValueError, match="complete must be"):
        make_mechanism("eigen", complete="yes")
