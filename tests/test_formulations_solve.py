"""The solve() entry point: solver by name, tolerance mapping, statuses, dual objective, timings."""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest

from dpopt.strategy import Strategy
from dpopt.workloads import AllRange, Prefix
from formulations import mm_approx, mm_pure
from formulations.solve import (
    FormulationError,
    FormulationResult,
    installed_solvers,
    resolve_solver,
    solve,
    solver_options,
)


def test_unknown_solver_lists_installed_ones():
    with pytest.raises(ValueError) as err:
        solve(mm_approx.build(Prefix(4)), "no-such-solver")
    msg = str(err.value)
    assert "no-such-solver" in msg
    for name in installed_solvers():
        assert name in msg


def test_solver_names_are_case_insensitive():
    assert resolve_solver("Clarabel") == "CLARABEL"
    assert resolve_solver("scs") == "SCS"


def test_tolerance_and_time_limit_are_mapped_per_solver():
    opts, notes = solver_options("clarabel", 1e-7, 30)
    assert opts == {"tol_gap_abs": 1e-7, "tol_gap_rel": 1e-7, "tol_feas": 1e-7, "time_limit": 30.0}
    assert notes == []
    opts, _ = solver_options("scs", 1e-6, 12)
    assert opts["eps_abs"] == opts["eps_rel"] == 1e-6
    assert opts["time_limit_secs"] == 12.0
    assert opts["max_iters"] > 100_000
    with pytest.raises(ValueError, match="tol"):
        solver_options("scs", -1.0, None)
    with pytest.raises(ValueError, match="time_limit"):
        solver_options("scs", 1e-6, 0)


@pytest.mark.parametrize("solver", ["clarabel", "scs"])
def test_result_fields_and_dual_objective(solver):
    W = AllRange(6)
    res = solve(mm_approx.build(W), solver, tol=1e-9)
    assert isinstance(res, FormulationResult)
    assert res.status == "optimal" and not res.inaccurate
    assert res.solver == solver
    assert isinstance(res.strategy, Strategy)
    assert res.iterations is not None and res.iterations > 0
    # timers only: positive whatever the load (perf_counter has ns resolution); no time bound is asserted
    assert res.solve_seconds > 0 and res.solve_cpu_seconds >= 0 and res.build_seconds > 0
    # Both solvers report a dual objective; at optimality it closes the gap.
    assert res.dual_objective is not None
    # relative gap: both stop at tol = 1e-9 (Clarabel on the gap itself, SCS on |p - d| <= eps (1 + |p|));
    # 1e-6 is the most SCS is good for relatively, so a wrongly signed or scaled dual still fails
    assert abs(res.gap) < 1e-6
    # The objective is in the workload's units: it equals trace(G X^{-1}) of the recovered strategy.
    G = W.gram()
    direct = res.strategy.sens2**2 * float(np.trace(G @ res.strategy.gram_pinv()))
    # The strategy comes from the solver's own X; its exact error differs from the reported objective by
    # X's constraint residual (<= tol = 1e-9 relative, times cond(X) ~ 10 at n = 6) and the dense
    # recomputation's n cond eps; 1e-6 covers SCS's attainable accuracy too.
    assert res.objective == pytest.approx(direct, rel=1e-6)
    row = res.summary()
    assert row["model"] == "mm_approx" and row["objective"] == res.objective


def test_bound_only_model_has_no_strategy():
    res = solve(mm_pure.build(Prefix(5)), "clarabel")
    assert res.strategy is None
    assert res.objective > 0


def test_bare_cvxpy_problem_is_accepted():
    x = cp.Variable(2)
    res = solve(cp.Problem(cp.Minimize(cp.sum_squares(x - np.array([1.0, 2.0])) + 3.0)), "clarabel")
    # Clarabel at the default tol 1e-8 (absolute and relative gap, feasibility): objective and dual
    # within ~1e-8 (1 + 3) of 3; compared at 1e-7 and, for the dual, 1e-6 (a sign or offset error is O(1))
    assert res.objective == pytest.approx(3.0, abs=1e-7)
    assert res.strategy is None
    assert res.dual_objective == pytest.approx(3.0, abs=1e-6)


def test_maximisation_dual_has_the_right_sign():
    x = cp.Variable(2)
    prob = cp.Problem(cp.Maximize(cp.sum(x) + 1.0), [cp.norm(x) <= 1])
    res = solve(prob, "clarabel", tol=1e-9)
    # Clarabel at tol 1e-9: value within ~1e-9 relative; 1e-7 (and 1e-6 for the dual's sign check)
    assert res.objective == pytest.approx(1.0 + np.sqrt(2.0), rel=1e-7)
    assert res.dual_objective == pytest.approx(res.objective, rel=1e-6)


def test_infeasible_status_raises_naming_status_and_solver():
    x = cp.Variable()
    prob = cp.Problem(cp.Minimize(x), [x >= 1, x <= 0])
    with pytest.raises(FormulationError) as err:
        solve(prob, "clarabel")
    assert "infeasible" in str(err.value) and "CLARABEL" in str(err.value)
    # accept_inaccurate never turns a status without a solution into a result.
    with pytest.raises(FormulationError):
        solve(prob, "clarabel", accept_inaccurate=True)


def test_iteration_limit_raises_unless_accepted():
    model = mm_approx.build(AllRange(8))
    with pytest.raises(FormulationError) as err:
        solve(model, "scs", tol=1e-10, max_iters=20)
    assert "SCS" in str(err.value) and "accept_inaccurate" in str(err.value)
    # deterministic: 20 SCS iterations never reach 1e-10, whatever the rounding
    res = solve(mm_approx.build(AllRange(8)), "scs", tol=1e-10, max_iters=20, accept_inaccurate=True)
    assert res.inaccurate and res.status != "optimal"
    assert res.iterations == 20


def test_rejects_things_that_are_not_models():
    with pytest.raises(ValueError, match="Model or a cvxpy.Problem"):
        solve(np.eye(3), "clarabel")
