"""The L-BFGS-B callback the first-order strategy optimisers share (p-Identity, marginal template)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy.optimize import OptimizeResult, minimize

from dpopt.solvers.result import CONVERGED, MAX_ITER, STALLED, TIME_LIMIT


class LbfgsMonitor:
    """An L-BFGS-B callback: keeps the best iterate, reports progress, and stops the run at a deadline.

    scipy calls it with the OptimizeResult of each iteration (new-style callback, parameter named
    `intermediate_result`); raising StopIteration ends minimize() with the current iterate.
    deadline: a `time.perf_counter()` value or None; offset: iterations of earlier runs (for progress); progress
    gets {"iteration", "stage", "loss"}, loss being the best value so far times `scale` (the optimiser's units back
    in the caller's). flat = (k, rtol): the run also ends, `flat` set, once its best value fell by less than rtol
    of itself over its last k iterations (a test over k steps, where L-BFGS-B's ftol looks at one).
    """

    def __init__(self, x0: np.ndarray, deadline: float | None, progress: Callable[[dict[str, Any]], None] | None,
                 stage: str, offset: int = 0, scale: float = 1.0, flat: tuple[int, float] | None = None) -> None:
        self.best_fun, self.best_x = math.inf, np.asarray(x0, dtype=float)
        self.deadline, self.progress, self.stage, self.offset = deadline, progress, stage, offset
        self.scale, self.window = scale, flat
        self.iterations, self.stopped, self.flat = 0, False, False
        self.bests: list[float] = []

    def __call__(self, intermediate_result: Any) -> None:
        self.iterations += 1
        if intermediate_result.fun < self.best_fun:
            self.best_fun, self.best_x = float(intermediate_result.fun), np.array(intermediate_result.x)
        if self.progress is not None:
            self.progress({"iteration": self.offset + self.iterations, "stage": self.stage,
                           "loss": self.best_fun * self.scale})
        if self.deadline is not None and time.perf_counter() >= self.deadline:
            self.stopped = True
            raise StopIteration
        if self.window is not None:
            k, rtol = self.window
            self.bests.append(self.best_fun)
            if len(self.bests) > k and self.bests[-k - 1] - self.best_fun <= rtol * abs(self.best_fun):
                self.flat = True
                raise StopIteration


def minimize_lbfgs(fun: Callable[..., tuple[float, np.ndarray]], x0: np.ndarray, monitor: LbfgsMonitor, *,
                   args: tuple[Any, ...] = (), bounds: Any = None, **options: Any) -> OptimizeResult:
    """scipy's L-BFGS-B on fun (value and gradient) from x0 with `monitor` as callback; res.fun and res.x
    become the monitor's best iterate where that is lower or the final value is not finite."""
    res = minimize(fun, x0, args=args, jac=True, method="L-BFGS-B", bounds=bounds, callback=monitor,
                   options=options)
    if monitor.best_fun < res.fun or not math.isfinite(res.fun):
        res.fun, res.x = monitor.best_fun, monitor.best_x
    return res


def lbfgs_status(stopped: bool, success: bool, nit: int, max_iter: int) -> str:
    """TIME_LIMIT for a run stopped at its deadline, else CONVERGED when L-BFGS-B met its tolerance,
    MAX_ITER at the iteration cap and STALLED otherwise."""
    if stopped:
        return TIME_LIMIT
    if success:
        return CONVERGED
    return MAX_ITER if nit >= max_iter else STALLED


def deadline_share(deadline: float | None, runs_left: int) -> float | None:
    """The deadline of the next of `runs_left` runs that share the time left before `deadline` equally."""
    if deadline is None:
        return None
    now = time.perf_counter()
    return now + (deadline - now) / runs_left
