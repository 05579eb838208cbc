"""What every streaming family's optimiser shares: the timed L-BFGS run and the assembled Factorization."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from dpopt.solvers.lbfgs import LbfgsMonitor, lbfgs_status, minimize_lbfgs
from dpopt.streaming.base import Factorization
from dpopt.streaming.participation import Participation
from dpopt.validation import check_time_limit

#: Largest n for which a family keeps its dense C (`--out` writes C.npy up to this n).
KEEP_C_STEPS = 8192
#: L-BFGS-B stopping rule of the family optimisers: relative decrease of the log loss below FTOL (a loss change
#: of about 1e-11 relative) or a projected gradient below GTOL.
FTOL, GTOL = 1e-12, 1e-9
#: Restarts of L-BFGS-B after an early relative-reduction stop, the projected gradient (of the log loss) below
#: which a run counts as converged without one, and the least relative gain of the loss that earns another restart
#: (about 1e-9 of the log loss: far below any difference the tables show, far above float64 noise in it).
MAX_RESTARTS, RESTART_GRADIENT, RESTART_GAIN = 10, 1e-5, 1e-9


def deadline_of(time_limit: float | None) -> float | None:
    """A perf_counter deadline for a time limit in seconds (None: no limit)."""
    limit = check_time_limit(time_limit)
    return None if limit is None else time.perf_counter() + limit


def _projected_gradient(x: np.ndarray, g: np.ndarray, bounds: Any) -> float:
    """max |g_i| over the coordinates free to move (a lower bound of 0 holding x_i = 0 with g_i > 0 is not)."""
    g = np.asarray(g, dtype=float).copy()
    if bounds is not None:
        lo = np.array([b[0] if b[0] is not None else -np.inf for b in bounds])
        g[(x <= lo) & (g > 0)] = 0.0
    return float(np.abs(g).max()) if g.size else 0.0


def run_lbfgs(fun: Callable[[np.ndarray], tuple[float, np.ndarray]], x0: np.ndarray, *, deadline: float | None,
              callback: Callable[[dict[str, Any]], None] | None, stage: str, max_iter: int = 2000,
              bounds: Any = None, offset: int = 0) -> tuple[np.ndarray, str, int]:
    """L-BFGS-B on fun from x0 until FTOL/GTOL, max_iter or the deadline: (best x, status, iterations).

    L-BFGS-B can stop on its relative-reduction test after a poorly scaled line search while the gradient is still
    large (seen on BLT parameters near theta = 1); it is then restarted from its point (a fresh Hessian model) up to
    MAX_RESTARTS times, while each run lowers the value by more than RESTART_GAIN (relative). The status is converged
    when the projected gradient is at most RESTART_GRADIENT or a restart gains less than that, else stalled.
    """
    if deadline is not None and time.perf_counter() >= deadline:
        return np.asarray(x0, dtype=float), "time_limit", 0
    x = np.asarray(x0, dtype=float)
    f_prev, nit_all, status = math.inf, 0, "converged"
    for _ in range(MAX_RESTARTS + 1):
        monitor = LbfgsMonitor(x, deadline, callback, stage, offset + nit_all)
        res = minimize_lbfgs(fun, x, monitor, bounds=bounds, maxiter=max(max_iter - nit_all, 1), ftol=FTOL,
                             gtol=GTOL, maxcor=20)
        nit_all += int(res.nit)
        if math.isfinite(float(res.fun)) and float(res.fun) <= f_prev:
            x = np.asarray(res.x, dtype=float)
        status = lbfgs_status(monitor.stopped, bool(res.success), nit_all, max_iter)
        if status != "converged":
            break
        gain = f_prev - float(res.fun)
        f_prev = min(f_prev, float(res.fun))
        if _projected_gradient(x, fun(x)[1], bounds) <= RESTART_GRADIENT:
            break
        if gain <= RESTART_GAIN * max(abs(f_prev), 1.0):
            break
    else:
        status = "stalled"
    return x, status, nit_all


def factorization(family: str, p: Participation, objective: str, C: np.ndarray | None, params: dict[str, Any],
                  losses: tuple[float, float, float], status: str, t0: float,
                  extra: dict[str, Any] | None = None) -> Factorization:
    """The Factorization of a family's result: losses (mean, max, sens2), no lower bound (not certified)."""
    mean_loss, max_loss, sens2 = losses
    return Factorization(family=family, n=p.n, epochs=p.epochs, objective=objective,
                         C=C if C is None or p.n <= KEEP_C_STEPS else None, params=params, sensitivity=float(sens2),
                         mean_loss=float(mean_loss), max_loss=float(max_loss), lower_bound=None, gap=None,
                         status=status, fit_seconds=time.perf_counter() - t0, extra=dict(extra or {}))
