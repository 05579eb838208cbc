"""The family "optimal": the certified least loss over every factorization, for any number of epochs.

The mean loss sens^2 ||A C^{-1}||_F^2 / n is least at the optimum of `dpopt.solvers.participation_dual`
(k = 1: seed 002's problem through `solve_convex_dp`); the max loss sens^2 max_t ||(A C^{-1})_t||^2 at the
optimum of `dpopt.solvers.participation_max` (k = 1: `dpopt.solvers.minimax.solve_minimax` on A with unit
targets). Both solvers return a strategy Gram X with a certified sensitivity <= 1 and a lower bound over every
factorization (Denisov et al., NeurIPS 2022; Choquette-Choo et al., ICML 2023). This module turns X into the
causal factor C (`dpopt.streaming.causal`), recomputes the losses and the sensitivity from C alone
(`dpopt.streaming.base.dense_losses`, the plain-numpy reference), and reports the solver's bound: mean loss
lower_bound = dual bound / n, max loss lower_bound = dual bound; gap = (loss - lower_bound) / loss on the chosen
objective.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from dpopt.solvers.participation_dual import solve_participation
from dpopt.solvers.participation_max import solve_participation_max
from dpopt.solvers.result import relative_gap
from dpopt.streaming.base import Factorization, dense_losses, prepare
from dpopt.streaming.causal import causal_factor
from dpopt.streaming.participation import Participation
from dpopt.workloads import Workload

#: Largest n solved: the dual keeps about a dozen dense n x n float64 arrays (G's factor, T, its eigenvectors, the
#: eigenbases of the current, best and trial points); measured peak at n = 4096 in benchmarks/results/.
MAX_OPTIMAL_STEPS = 8192


def optimise(
    A: Workload | np.ndarray,
    participation: Participation,
    *,
    objective: str = "mean",
    time_limit: float | None = None,
    callback: Callable[[dict[str, Any]], bool | None] | None = None,
    tol: float = 1e-8,
    **solver_options: Any,
) -> Factorization:
    """The certified optimum over every factorization of A under `participation` (module docstring).

    tol: the solver's relative gap on its own objective (tr(G X^{-1}) or the largest variance); solver_options go
    to `solve_participation` (mean) or `solve_participation_max` (max). The returned Factorization's losses and
    sensitivity are recomputed from its C; status is the solver's (converged when the certified gap met tol).
    """
    t0 = time.perf_counter()
    W, p = prepare(A, participation, objective)
    n = p.n
    if n > MAX_OPTIMAL_STEPS:
        raise ValueError(f"the optimal family solves a dense n x n problem, n <= {MAX_OPTIMAL_STEPS} "
                         f"(about {12 * 8 * n * n / 1e9:.0f} GB at n = {n}); got n = {n}")
    M = W.matrix()
    patterns = p.patterns()
    stage = f"optimal ({objective} loss, certified dual Newton)"

    def report(info: dict[str, Any]) -> bool | None:  # the family callbacks' keys: stage, iteration, gap
        return None if callback is None else callback({**info, "stage": stage, "iteration": info.get("nit")})

    if objective == "mean":
        res = solve_participation(M.T @ M, patterns, tol=tol, time_limit=time_limit, callback=report, **solver_options)
        lower = float(res.dual_bound) / n
    else:
        res = solve_participation_max(M, patterns, tol=tol, time_limit=time_limit, callback=report, **solver_options)
        lower = float(res.dual_bound)
    C = causal_factor(res.x)
    mean_loss, max_loss, sens2 = (float(v) for v in dense_losses(M, C, p))
    loss = mean_loss if objective == "mean" else max_loss
    # the loss recomputed from C may fall below the bound by its own rounding (about n cond(X) eps) when the solver's
    # gap is smaller than that: the gap is then reported as 0, never negative
    return Factorization(
        family="optimal", n=n, epochs=p.epochs, objective=objective, C=C, params={"tol": tol},
        sensitivity=sens2, mean_loss=mean_loss, max_loss=max_loss, lower_bound=lower,
        gap=max(relative_gap(loss, lower), 0.0), status=res.status, fit_seconds=time.perf_counter() - t0,
        extra={"solver": res.summary(), "solver_sensitivity": res.extra.get("sensitivity"),
               "solver_fun": float(res.fun)},
    )
