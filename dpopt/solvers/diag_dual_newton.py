"""Projected Newton-CG for duals of "minimise f(X) subject to diag(X) <= 1" with a homogeneous dual.

Both the (eps, delta) strategy problem of seed 002 and the eigen-design weights of seed 003 have a
Lagrangian dual over n cell multipliers d >= 0 of the form

    g(d) = 2 phi(d) - sum(d),   phi concave and homogeneous of degree 1/2,   grad g = x(d) - 1,

where x(d) is the diagonal of the primal point X(d) minimising the Lagrangian (so f(X(d)) = phi(d)).
Homogeneity gives two facts used here: on the ray t * d, g is largest at sqrt(t) = phi / sum(d), after
which sum(d) = phi is the dual bound; and X(d) / max_i x_i is feasible with value phi * max_i x_i, so
the relative gap of the rescaled iterate is 1 - 1 / max_i x_i.

The ascent is Bertsekas' projected Newton method (SIAM J. Control Optim. 20(2), 1982): multipliers
that are within an epsilon of zero while g increases towards zero are set to zero, Newton-CG (with a
forcing sequence) runs on the others, and a projected Armijo arc search keeps d >= 0. Near the optimum
g is flat to round-off (its gap is the square of the primal gap), so a step that keeps g within
round-off and halves the projected gradient is also accepted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from dpopt.solvers.convex_dp_core import certified_status
from dpopt.solvers.result import MAX_ITER, STALLED, SolverResult, lap_timer, relative_gap, stop_rule

_ARMIJO = 1e-4
_MAX_BACKTRACK = 30
#: Relative round-off level of g(d) below which g cannot rank two points.
_G_NOISE = 1e-12


@dataclass
class DualPoint:
    """A dual iterate: multipliers d (n,), phi(d), x = diag X(d) (n,), and problem data for Newton."""

    d: np.ndarray
    phi: float
    x: np.ndarray
    data: Any = None

    @property
    def g(self) -> float:
        return 2.0 * self.phi - float(self.d.sum())

    def projected_grad_norm(self) -> float:
        """Max-norm of grad g = x - 1, zeroed where d = 0 and g increases towards zero."""
        grad = self.x - 1.0
        return float(np.abs(np.where((self.d <= 0.0) & (grad < 0.0), 0.0, grad)).max())


@dataclass
class PrimalPoint:
    """A feasible primal point: x (solver-specific), its objective fun, and how it was built."""

    x: Any
    fun: float
    construction: str
    extra: dict[str, Any] = field(default_factory=dict)


class DualProblem(Protocol):
    """What the ascent needs from a problem (see the module docstring)."""

    def evaluate(self, d: np.ndarray) -> DualPoint | None:
        """Dual data at d >= 0; None where phi is not differentiable (reject the point)."""

    def rescale(self, p: DualPoint, r: float) -> DualPoint:
        """The point at r^2 * d (phi scales by r, x by 1 / r)."""

    def newton_direction(
        self, p: DualPoint, free: np.ndarray, grad: np.ndarray, eta: float, max_cg: int, damping: float
    ) -> tuple[np.ndarray, int]:
        """Solve (H_FF + damping diag(H_FF)) p_F = grad_F, H = -Hess g, to relative residual eta."""

    def primal(self, p: DualPoint) -> PrimalPoint:
        """Best feasible primal point built from X(d) at a rescaled iterate."""


def pcg(
    hess_vec: Callable[[np.ndarray], np.ndarray],
    h_diag: np.ndarray,
    b: np.ndarray,
    eta: float,
    max_cg: int,
    damping: float = 0.0,
    project: Callable[[np.ndarray], np.ndarray] | None = None,
    deadline: float | None = None,
    inverse: Callable[[np.ndarray], np.ndarray] | None = None,
) -> tuple[np.ndarray, int]:
    """Jacobi-preconditioned CG for (H + damping diag(H)) x = b, H PSD, to ||r|| <= eta ||b||.

    Vectors may be arrays of any shape (inner products are np.vdot). project, if given, maps each
    preconditioned residual onto a subspace that b and the products H v lie in: CG then solves on it.
    deadline (a time.perf_counter() value): no product is started after it; CG returns its iterate (every
    CG iterate is an ascent direction). Falls back to b / diag(H) (projected) if CG makes no progress.
    inverse, if given, applies a positive definite preconditioner M^{-1} in place of the division by diag(H)
    (h_diag is then only the damping's scale).
    """
    # Relative floor: a coordinate with no curvature (a cell outside range(G)) must not make r / h_diag overflow.
    h_diag = np.maximum(h_diag, max(np.finfo(float).eps * float(h_diag.max()), np.finfo(float).tiny))
    if damping > 0.0:
        plain = hess_vec
        shift = damping * h_diag

        def hess_vec(v: np.ndarray) -> np.ndarray:
            return plain(v) + shift * v

        h_diag = h_diag + shift

    def precondition(v: np.ndarray) -> np.ndarray:
        w = v / h_diag if inverse is None else inverse(v)
        return w if project is None else project(w)

    b_norm = float(np.linalg.norm(b))
    x = np.zeros_like(b)
    r = b.copy()
    z = precondition(r)
    q = z.copy()
    rz = float(np.vdot(r, z))
    steps = 0
    for _ in range(max_cg):
        if deadline is not None and steps and time.perf_counter() > deadline:
            break
        Hq = hess_vec(q)
        steps += 1
        curv = float(np.vdot(q, Hq))
        if curv <= 0.0:  # round-off only: H is positive semidefinite
            break
        a = rz / curv
        x += a * q
        r -= a * Hq
        if np.linalg.norm(r) <= eta * b_norm:
            break
        z = precondition(r)
        rz_new = float(np.vdot(r, z))
        q = z + (rz_new / rz) * q
        rz = rz_new
    if not steps or float(np.vdot(b, x)) <= 0.0:
        x = precondition(b)
    return x, steps


@dataclass
class AscentOutcome:
    """What `maximise_dual` found: best multipliers and bound, best primal point, and run data."""

    d: np.ndarray
    dual: float
    primal: PrimalPoint
    status: str
    message: str
    nit: int
    ninner: int
    history: list[dict[str, float]]
    dual_point: DualPoint | None = None  # the rescaled iterate whose phi is `dual` (for a final certificate)

    def result(self, x: Any, fun: float, dual: float, tol: float, t_wall: float, t_cpu: float,
               extra: dict[str, Any]) -> SolverResult:
        """The SolverResult of this ascent with primal value fun and recomputed dual bound: gap, certified
        status, timings from the perf_counter / process_time readings t_wall, t_cpu, and the history."""
        gap = relative_gap(fun, dual)
        status, message = certified_status(self.status, self.message, gap, tol)
        return SolverResult.since(t_wall, t_cpu, x=x, fun=fun, status=status, message=message, nit=self.nit,
                                  ninner=self.ninner, dual_bound=dual, gap=gap, extra={**extra, "history": self.history})


def maximise_dual(
    problem: DualProblem,
    d0: np.ndarray,
    *,
    tol: float,
    max_iter: int,
    forcing: float,
    max_cg: int,
    active_tol: float,
    damping: float,
    callback: Callable[[dict[str, Any]], bool | None] | None,
    time_limit: float | None,
    t_start: float,
) -> AscentOutcome:
    """Projected Newton-CG ascent on g (module docstring), stopping at relative gap <= tol."""
    point = problem.evaluate(d0)
    if point is None:
        point = problem.evaluate(np.ones_like(d0))
        if point is None:
            raise ValueError("the dual function is not differentiable at the start nor at d = 1")
    best_dual, best_dual_point = 0.0, point
    best_primal, best_point, best_cand, best_point_cand = np.inf, point, None, None
    check_below = 10.0 * np.sqrt(tol)  # near the end, also build the problem's better primal points
    history: list[dict[str, float]] = []
    ninner, status, message, nit = 0, MAX_ITER, f"reached max_iter = {max_iter}", 0
    lap = lap_timer()
    for nit in range(max_iter + 1):
        last = lap()  # the length of the last iteration
        point = problem.rescale(point, point.phi / float(point.d.sum()))
        phi, m = point.phi, float(point.x.max())
        if phi > best_dual:  # after rescaling, the dual bound phi^2 / sum(d) equals phi
            best_dual, best_dual_point = phi, point
        if m * phi < best_primal:
            best_primal, best_point, best_point_cand = m * phi, point, None
        if relative_gap(m * phi, best_dual) <= check_below:
            cand = problem.primal(point)
            if point is best_point:
                best_point_cand = cand
            if cand.fun < best_primal:
                best_primal, best_cand = cand.fun, cand
        gap = relative_gap(best_primal, best_dual)
        history.append({"nit": nit, "primal": best_primal, "dual": best_dual, "gap": gap, "ninner": ninner})
        report = {"nit": nit, "d": point.d, "fun": best_primal, "dual_bound": best_dual, "gap": gap}
        # an iteration (a Newton direction and its line search: eigendecompositions) starts only when one
        # lasting as long as the last still ends within the time limit
        stop = stop_rule(callback is not None and bool(callback(report)), gap, tol, nit, max_iter,
                         time.perf_counter() - t_start + last, time_limit)
        if stop is not None:
            status, message = stop
            break
        grad = point.x - 1.0
        pg_norm = point.projected_grad_norm()
        active = (point.d <= min(active_tol, pg_norm) * float(point.d.max())) & (grad < 0.0)
        free = ~active
        eta = min(forcing, np.sqrt(pg_norm))  # superlinear forcing sequence (grad is dimensionless)
        step = np.zeros_like(point.d)
        if free.any():
            step[free], used = problem.newton_direction(point, free, grad, eta, max_cg, damping * pg_norm)
            ninner += used
        step[active] = -point.d[active]
        alpha, trial = 1.0, None
        for _ in range(_MAX_BACKTRACK):
            d_new = np.maximum(point.d + alpha * step, 0.0)
            trial = problem.evaluate(d_new)
            if trial is not None:
                if trial.g >= point.g + _ARMIJO * float(grad @ (d_new - point.d)):
                    break
                if trial.g >= point.g - _G_NOISE * abs(point.g) and problem.rescale(
                    trial, trial.phi / float(trial.d.sum())
                ).projected_grad_norm() <= 0.5 * pg_norm:
                    break
            trial = None
            alpha *= 0.5
        if trial is None:
            status, message = STALLED, f"line search failed at gap {gap:.2e} (numerical floor)"
            break
        history[-1]["alpha"] = alpha
        point = trial
    return AscentOutcome(best_dual_point.d, best_dual, _final_primal(problem, best_point, best_point_cand, best_cand),
                         status, message, nit, ninner, history, best_dual_point)


def _final_primal(problem: DualProblem, best_point: DualPoint, built: PrimalPoint | None,
                  best_cand: PrimalPoint | None) -> PrimalPoint:
    """Best primal point of the ascent without rebuilding one already built: the best candidate, or the one
    at the point with the least uniform-scaling value m * phi (`built` if it was made there)."""
    rescaled_value = float(best_point.x.max()) * best_point.phi
    if best_cand is not None and best_cand.fun <= rescaled_value:
        return best_cand
    primal = built if built is not None else problem.primal(best_point)
    if best_cand is not None and best_cand.fun < primal.fun:
        primal = best_cand
    return primal
