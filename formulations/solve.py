"""One entry point that solves any model with any installed conic solver, chosen by name.

`solve(model, "clarabel" | "scs" | any name in cvxpy.installed_solvers(), tol=..., time_limit=...)`
maps the generic tolerance and time limit to the solver's own options, runs CVXPY's documented
low-level path (get_problem_data -> solve_via_data -> unpack_results, so the solver's raw output,
and with it the dual objective, is available), and returns a FormulationResult. A status other than
"optimal" raises FormulationError naming the status and the solver; with accept_inaccurate=True a
status that still carries a solution (optimal_inaccurate, user_limit) is returned marked inaccurate.
Statuses without a solution (infeasible, unbounded, solver error) always raise.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import cvxpy as cp
from cvxpy.error import SolverError

from dpopt.strategy import Strategy
from dpopt.validation import check_positive_number, check_time_limit
from formulations.model import Model

# SCS stops at this many iterations unless told otherwise (its own default, 1e5, is too few for the
# tight tolerances the cross-solver tests use).
SCS_MAX_ITERS = 200_000
DEFAULT_TOL = 1e-8

_WITH_SOLUTION = (cp.OPTIMAL_INACCURATE, cp.USER_LIMIT)


class FormulationError(RuntimeError):
    """A model could not be solved to the requested accuracy (status and solver named)."""


@dataclass
class FormulationResult:
    """Outcome of solving one model with one solver.

    objective / dual_objective: in the workload's units (model.scale * the solver's values); the dual
        objective is None when the solver does not report one (Clarabel and SCS do).
    status: CVXPY's status string; inaccurate: True when a non-optimal status was accepted on request.
    solve_seconds / solve_cpu_seconds: wall and CPU time of compile + solver call + unpacking;
    compile_seconds: CVXPY's canonicalisation; solver_seconds: the time the solver itself reports;
    build_seconds: building the model (before solve). iterations: the solver's iteration count.
    options: the solver options actually passed; notes: what could not be mapped for this solver.
    """

    model: str
    solver: str
    status: str
    objective: float
    strategy: Strategy | None
    dual_objective: float | None
    iterations: int | None
    solve_seconds: float
    solve_cpu_seconds: float
    compile_seconds: float
    solver_seconds: float | None
    build_seconds: float
    inaccurate: bool = False
    options: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def gap(self) -> float | None:
        """Relative duality gap (objective - dual_objective) / |objective|, when the dual is known."""
        if self.dual_objective is None or not math.isfinite(self.objective):
            return None
        return (self.objective - self.dual_objective) / max(abs(self.objective), 1e-300)

    def summary(self) -> dict[str, Any]:
        """Scalar fields as a flat dict (for DataFrames and CSV)."""
        return {
            "model": self.model,
            "solver": self.solver,
            "status": self.status,
            "inaccurate": self.inaccurate,
            "objective": self.objective,
            "dual_objective": self.dual_objective,
            "gap": self.gap,
            "iterations": self.iterations,
            "build_seconds": self.build_seconds,
            "compile_seconds": self.compile_seconds,
            "solver_seconds": self.solver_seconds,
            "solve_seconds": self.solve_seconds,
            "solve_cpu_seconds": self.solve_cpu_seconds,
        }


def installed_solvers() -> list[str]:
    """Names of the solvers CVXPY can call here, lower case (e.g. ['clarabel', 'scs', ...])."""
    return [s.lower() for s in cp.installed_solvers()]


def resolve_solver(solver: str) -> str:
    """CVXPY's name for `solver` (case-insensitive); raises ValueError listing the installed ones."""
    if not isinstance(solver, str):
        raise ValueError(f"solver must be a name such as 'clarabel' or 'scs', got {solver!r}")
    name = solver.strip().upper()
    if name not in cp.installed_solvers():
        raise ValueError(
            f"solver {solver!r} is not installed; installed solvers: {', '.join(installed_solvers())}"
        )
    return name


def solver_options(solver: str, tol: float, time_limit: float | None) -> tuple[dict[str, Any], list[str]]:
    """The generic tolerance and time limit in the solver's own option names.

    Clarabel: tol_gap_abs = tol_gap_rel = tol_feas = tol, time_limit (seconds).
    SCS: eps_abs = eps_rel = tol, max_iters = SCS_MAX_ITERS, time_limit_secs.
    OSQP: eps_abs = eps_rel = tol, time_limit.
    Other solvers run with their defaults; the returned notes say so.
    """
    name = resolve_solver(solver)
    check_positive_number(tol, "tol")
    check_time_limit(time_limit)
    opts: dict[str, Any] = {}
    notes: list[str] = []
    if name == "CLARABEL":
        opts.update(tol_gap_abs=tol, tol_gap_rel=tol, tol_feas=tol)
        if time_limit is not None:
            opts["time_limit"] = float(time_limit)
    elif name == "SCS":
        opts.update(eps_abs=tol, eps_rel=tol, max_iters=SCS_MAX_ITERS)
        if time_limit is not None:
            opts["time_limit_secs"] = float(time_limit)
    elif name == "OSQP":
        opts.update(eps_abs=tol, eps_rel=tol)
        if time_limit is not None:
            opts["time_limit"] = float(time_limit)
    else:
        notes.append(f"tolerance and time limit are not mapped for {name}; its defaults were used")
    return opts, notes


def _raw_objectives(solver: str, raw: Any) -> tuple[float | None, float | None]:
    """(primal, dual) objective of the solver's own (canonicalised) problem, when it reports both."""
    try:
        if solver == "CLARABEL":
            return float(raw.obj_val), float(raw.obj_val_dual)
        if solver == "SCS":
            return float(raw["info"]["pobj"]), float(raw["info"]["dobj"])
    except (AttributeError, KeyError, TypeError, ValueError):
        pass
    return None, None


def _dual_objective(problem: cp.Problem, solver: str, raw: Any) -> float | None:
    """The solver's dual objective in the units of problem.value (same offset and sign as the primal)."""
    pobj, dobj = _raw_objectives(solver, raw)
    value = problem.value
    if pobj is None or dobj is None or value is None or not math.isfinite(value):
        return None
    sign = -1.0 if isinstance(problem.objective, cp.Maximize) else 1.0
    offset = sign * value - pobj
    return sign * (dobj + offset)


def solve(
    problem_or_model: Model | cp.Problem,
    solver: str = "clarabel",
    *,
    tol: float = DEFAULT_TOL,
    time_limit: float | None = None,
    accept_inaccurate: bool = False,
    verbose: bool = False,
    **opts: Any,
) -> FormulationResult:
    """Solve a model (or a bare cvxpy.Problem) with the named solver; see the module docstring.

    opts are passed to the solver unchanged and override the mapped tolerance options.
    """
    if isinstance(problem_or_model, Model):
        model = problem_or_model
    elif isinstance(problem_or_model, cp.Problem):
        model = Model(name="problem", problem=problem_or_model, variables=problem_or_model.var_dict)
    else:
        raise ValueError(
            f"expected a formulations Model or a cvxpy.Problem, got {type(problem_or_model).__name__}"
        )
    name = resolve_solver(solver)
    options, notes = solver_options(name, tol, time_limit)
    options.update(opts)
    problem = model.problem

    wall0, cpu0 = time.perf_counter(), time.process_time()
    try:
        data, chain, inverse_data = problem.get_problem_data(name, solver_opts=dict(options))
        compile_seconds = time.perf_counter() - wall0
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Solution may be inaccurate")
            raw = chain.solve_via_data(problem, data, False, verbose, dict(options))
            problem.unpack_results(raw, chain, inverse_data)
    except SolverError as exc:
        raise FormulationError(f"solver {name} failed on model {model.name}: {exc}") from exc
    solve_seconds = time.perf_counter() - wall0
    solve_cpu_seconds = time.process_time() - cpu0

    status = problem.status
    inaccurate = False
    if status != cp.OPTIMAL:
        if accept_inaccurate and status in _WITH_SOLUTION and problem.value is not None:
            inaccurate = True
        else:
            hint = (
                " (pass accept_inaccurate=True to keep this solution, marked inaccurate)"
                if status in _WITH_SOLUTION
                else ""
            )
            raise FormulationError(
                f"model {model.name}: solver {name} returned status {status!r}, not 'optimal'{hint}"
            )
    stats = problem.solver_stats
    solver_seconds = None
    if stats is not None and stats.solve_time is not None:
        solver_seconds = float(stats.solve_time) + float(stats.setup_time or 0.0)
    dual = _dual_objective(problem, name, raw)
    strategy = None
    if model.recover is not None:
        try:
            strategy = model.recover(model)
        except ValueError as exc:
            raise FormulationError(
                f"model {model.name}: the {status} solution from {name} does not give a strategy: {exc}"
            ) from exc
    return FormulationResult(
        model=model.name,
        solver=name.lower(),
        status=status,
        objective=model.scale * float(problem.value),
        strategy=strategy,
        dual_objective=None if dual is None else model.scale * dual,
        iterations=None if stats is None or stats.num_iters is None else int(stats.num_iters),
        solve_seconds=solve_seconds,
        solve_cpu_seconds=solve_cpu_seconds,
        compile_seconds=compile_seconds,
        solver_seconds=solver_seconds,
        build_seconds=model.build_seconds,
        inaccurate=inaccurate,
        options=options,
        notes=notes,
    )
