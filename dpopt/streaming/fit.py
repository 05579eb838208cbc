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

#: Largest n for which a family keeps its dense C (issue 38: `--out` writes C.npy up to this n).
KEEP_C_STEPS = 8192
#: L-BFGS-B stopping rule of the family optimisers: relative decrease of the log loss below FTOL (a loss change
#: of about 1e-11 relative) or a projected gradient below GTOL.
FTOL, GTOL = 1e-12, 1e-9


def deadline_of(time_limit: float | None) -> float | None:
    """A perf_counter deadline for a time limit in seconds (None: no limit)."""
    limit = check_time_limit(time_limit)
    return None if limit is None else time.perf_counter() + limit


def run_lbfgs(fun: Callable[[np.ndarray], tuple[float, np.ndarray]], x0: np.ndarray, *, deadline: float | None,
              callback: Callable[[dict[str, Any]], None] | None, stage: str, max_iter: int = 2000,
              bounds: Any = None, offset: int = 0) -> tuple[np.ndarray, str, int]:
    """L-BFGS-B on fun from x0 until FTOL/GTOL, max_iter or the deadline: (best x, status, iterations)."""
    if deadline is not None and time.perf_counter() >= deadline:
        return np.asarray(x0, dtype=float), "time_limit", 0
    monitor = LbfgsMonitor(x0, deadline, callback, stage, offset)
    res = minimize_lbfgs(fun, np.asarray(x0, dtype=float), monitor, bounds=bounds, maxiter=max_iter, ftol=FTOL,
                         gtol=GTOL, maxcor=20)
    x = np.asarray(res.x, dtype=float)
    if not math.isfinite(float(res.fun)):
        x = np.asarray(x0, dtype=float)
    return x, lbfgs_status(monitor.stopped, bool(res.success), int(res.nit), max_iter), int(res.nit)


def factorization(family: str, p: Participation, objective: str, C: np.ndarray | None, params: dict[str, Any],
                  losses: tuple[float, float, float], status: str, t0: float,
                  extra: dict[str, Any] | None = None) -> Factorization:
    """The Factorization of a family's result: losses (mean, max, sens2), no lower bound (not certified)."""
    mean_loss, max_loss, sens2 = losses
    return Factorization(family=family, n=p.n, epochs=p.epochs, objective=objective,
                         C=C if C is None or p.n <= KEEP_C_STEPS else None, params=params, sensitivity=float(sens2),
                         mean_loss=float(mean_loss), max_loss=float(max_loss), lower_bound=None, gap=None,
                         status=status, fit_seconds=time.perf_counter() - t0, extra=dict(extra or {}))
