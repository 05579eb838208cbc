"""The result types: `SolverResult`, what every hand-written solver returns (modelled on
scipy.optimize.OptimizeResult), and `Selection`, what every strategy selection returns."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from dpopt.error import ErrorReport
    from dpopt.privacy import Privacy
    from dpopt.strategy import Strategy

# Status codes shared by all solvers.
CONVERGED = "converged"
MAX_ITER = "max_iter"
TIME_LIMIT = "time_limit"
STALLED = "stalled"
# A solver handed a budget already spent gets this many seconds instead (they accept only > 0): it
# stops at its first deadline check, with its start (a valid strategy for every solver here) or one
# step from it.
MIN_SOLVER_SECONDS = 1e-9
FAILED = "failed"


@dataclass
class SolverResult:
    """Outcome of a hand-written solver.

    x: the primal solution (matrix or vector, solver-specific; documented by each solver).
    fun: objective value at x.
    status: one of CONVERGED, MAX_ITER, TIME_LIMIT, STALLED, FAILED.
    message: human-readable reason for stopping.
    nit: outer iterations; ninner: inner iterations (CG steps, projected-gradient steps), if any.
    wall_seconds / cpu_seconds: time spent in the solver.
    dual_bound: a certified lower bound on the optimum (None if the solver has no certificate).
    gap: relative duality gap (fun - dual_bound) / |fun| when dual_bound is known.
    extra: solver-specific diagnostics (history, residuals, ...).
    """

    x: Any
    fun: float
    status: str
    message: str
    nit: int
    wall_seconds: float
    cpu_seconds: float
    ninner: int = 0
    dual_bound: float | None = None
    gap: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def since(cls, t_wall: float, t_cpu: float, **fields: Any) -> SolverResult:
        """A result whose wall and CPU seconds run from the time.perf_counter / time.process_time readings given."""
        return cls(wall_seconds=time.perf_counter() - t_wall, cpu_seconds=time.process_time() - t_cpu, **fields)

    @property
    def success(self) -> bool:
        """True only when the solver met its stopping rule (never at an iteration or time cap)."""
        return self.status == CONVERGED

    def gram(self, n: int, what: str) -> np.ndarray:
        """Strategy Gram X (n x n) from x as `what`: "gram" X, "strategy" rows A (X = A^T A) or eigen-design
        "weights" u (X = P diag(u) P^T, P = extra["eigenvectors"]); ValueError for any other x."""
        x = np.asarray(self.x, dtype=float)
        if not np.all(np.isfinite(x)):
            raise ValueError("solver returned non-finite values")
        if what == "gram" and x.shape == (n, n):
            return (x + x.T) / 2
        if what == "strategy" and x.ndim == 2 and x.shape[1] == n:
            return x.T @ x
        if what == "weights" and x.shape == (n,) and "eigenvectors" in self.extra:
            P = np.asarray(self.extra["eigenvectors"], dtype=float)
            return (P * np.clip(x, 0.0, None)) @ P.T
        raise ValueError(f"solver returned x of shape {x.shape}; expected {what} for {n} cells")

    def summary(self) -> dict[str, Any]:
        """Scalar fields as a flat dict (for DataFrames and JSON)."""
        return {
            "fun": float(self.fun),
            "status": self.status,
            "message": self.message,
            "nit": int(self.nit),
            "ninner": int(self.ninner),
            "wall_seconds": float(self.wall_seconds),
            "cpu_seconds": float(self.cpu_seconds),
            "dual_bound": None if self.dual_bound is None else float(self.dual_bound),
            "gap": None if self.gap is None else float(self.gap),
        }


def relative_gap(primal: float, dual: float) -> float:
    """Relative duality gap (primal - dual) / max(|primal|, tiny)."""
    return float((primal - dual) / max(abs(primal), np.finfo(float).tiny))


def lap_timer() -> Callable[[], float]:
    """lap() gives the wall seconds since its previous call (0 at the first): the last iteration's length, added
    to the elapsed time so that stop_rule stops before an iteration as long as it would end past the limit."""
    marks: list[float] = []

    def lap() -> float:
        marks[:] = marks[-1:] + [time.perf_counter()]  # the previous call's time and this one's
        return marks[1] - marks[0] if len(marks) == 2 else 0.0

    return lap


def stop_rule(
    callback_stop: bool, gap: float, tol: float, nit: int, max_iter: int, elapsed: float,
    time_limit: float | None,
) -> tuple[str, str] | None:
    """The certified iterative solvers' stopping rule: callback, certified gap, iteration cap, time limit.

    Returns the (status, message) to stop with, in that order of precedence, or None to go on.
    """
    if callback_stop:
        return STALLED, "stopped by callback"
    if gap <= tol:
        return CONVERGED, f"certified relative gap {gap:.2e} <= tol {tol:.1e}"
    if nit == max_iter:
        return MAX_ITER, f"reached max_iter = {max_iter}"
    if time_limit is not None and elapsed > time_limit:
        return TIME_LIMIT, f"time limit {time_limit:g} s reached"
    return None


@dataclass
class Selection:
    """A selected strategy and how it was found: a mechanism's `_select`, and HDMM's `dpopt.hdmm.select_strategy`.

    error: the strategy's exact error when the selection computed it, under `privacy` (so a fit need not
    compute it again); bound / bound_kind: a certified lower bound on every strategy's error under the same
    privacy, when the selection has one; wall_seconds / cpu_seconds: the selection's own time.
    """

    strategy: Strategy
    solver: str = "closed-form"
    status: str = "optimal"
    iterations: int = 0
    gap: float | None = None
    message: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    error: ErrorReport | None = field(default=None, repr=False)
    privacy: Privacy | None = field(default=None, repr=False)
    bound: float | None = None
    bound_kind: str = ""
    wall_seconds: float = 0.0
    cpu_seconds: float = 0.0
