"""Optimal strategies for weighted marginal workloads: ResidualPlanner's closed form ((eps, delta)) and the
HDMM marginal template optimised by L-BFGS-B (eps-DP).

(eps, delta): ResidualPlanner (Xiao, He, Zhang, Kifer, NeurIPS 2023) measures every residual subset A
with its own variance and optimises the variances in closed form. In dpopt's terms: with W^T W = sum_A c_A Q_A
and a strategy Gram X = sum_A x_A Q_A, error = sum_A c_A r_A / x_A and sens2^2 = max diag X =
sum_A x_A r_A / N. Minimising under sum_A x_A r_A = N (Lagrange / Cauchy-Schwarz) gives
x_A = N sqrt(c_A) / sum_B r_B sqrt(c_B) and error (sum_A r_A sqrt(c_A))^2 / N, which is exactly SVDB(W), the
Li-Miklau lower bound for every strategy (seed 004 Thm. 4.2): the strategy is optimal with a zero certified
gap (seed 004 Thm. 5.5 says the bound is tight for data cubes; this is the explicit optimum).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dpopt.linalg import attrs_of, superset_incidence
from dpopt.marginal_strategy import MarginalMatrix
from dpopt.solvers.lbfgs import LbfgsMonitor, lbfgs_status, minimize_lbfgs
from dpopt.solvers.result import SolverResult
from dpopt.strategy import Strategy
from dpopt.validation import as_generator
from dpopt.workloads import Marginals


def residual_planner(workload: Marginals) -> tuple[Strategy, float]:
    """ResidualPlanner's optimal (eps, delta) strategy for weighted marginals (Xiao et al. 2023), closed form.

    Returns (strategy with sens2 = 1, its unit error trace(W^T W X^+) = SVDB(W)).
    """
    if not isinstance(workload, Marginals):
        raise ValueError(f"residual_planner needs a Marginals, got {type(workload).__name__}")
    c, r = workload.scaled_eigenvalues, workload.multiplicities
    live = (c > 0) & (r > 0)
    s = float(np.dot(r[live], np.sqrt(c[live])))
    # x_A / N = sqrt(c_A / N) / s with s = sum_B r_B sqrt(c_B / N); then sum_A r_A x_A / N = 1.
    x = np.sqrt(c[live]) / s
    subsets = [a for a, keep in zip(map(attrs_of, workload.closure), live, strict=True) if keep]
    strat = Strategy(MarginalMatrix(workload.domain_sizes, "residual", subsets, x), name="residual-planner")
    return strat, s * s


def candidate_marginals(workload: Marginals, candidates: str | Sequence[Sequence[int]]) -> list[int]:
    """Bitmasks of the marginals the eps-DP template may measure.

    "closure": every subset of a workload marginal (the default; tables no larger than the workload's);
    "workload": the workload marginals themselves; or an explicit list of attribute subsets.
    """
    if isinstance(candidates, str):
        if candidates == "closure":
            return list(workload.closure)
        if candidates == "workload":
            return list(workload.masks)
        raise ValueError(f"candidates must be 'closure', 'workload' or a list of subsets, got {candidates!r}")
    masks = sorted({sum(1 << int(a) for a in s) for s in candidates})
    if not masks:
        raise ValueError("candidates must name at least one subset")
    return masks


def marginal_baselines(workload: Marginals) -> dict[str, Strategy]:
    """The eps-DP baselines in the marginal template: the full table (noise on every cell) and the workload's own
    marginals (noise on each, weighted as in the workload), both with least-squares answers."""
    sizes = workload.domain_sizes
    every = [tuple(range(len(sizes)))]
    own = [attrs_of(S) for S in workload.masks]
    return {
        "full table": Strategy(MarginalMatrix(sizes, "marginals", every, [1.0]), name="full table"),
        "workload marginals": Strategy(MarginalMatrix(sizes, "marginals", own, workload.weights),
                                       name="workload marginals"),
    }


def laplace_marginal_error(strategy: Strategy, workload: Marginals) -> float:
    """sens1^2 trace(W^T W X^+) of a marginal-template strategy: its eps-DP error up to 2/eps^2."""
    return strategy.unit_error(workload) * strategy.sens1**2


def optimize_marginals_laplace(
    workload: Marginals,
    candidates: str | Sequence[Sequence[int]] = "closure",
    restarts: int = 3,
    seed: int | np.random.Generator | None = 0,
    max_iter: int = 5000,
    deadline: float | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[Strategy, SolverResult]:
    """HDMM OPT_M for eps-DP: weights theta_T > 0 on candidate marginals minimising
    (sum_T theta_T)^2 * sum_A c_A r_A / x_A,  x_A = sum_{T superset of A} theta_T^2 N_{-T}  (sens1 = sum theta)
    (computed with c_A / N and x_A / N = sum_T theta_T^2 / N_T).

    Optimised over t = log theta with L-BFGS (the loss is scale invariant, and the bound-constrained form
    stalls on Adult where the log form does not). The first start measures every workload marginal equally
    (other candidates at 1% weight), further starts are uniform random from `seed`. Returns the best strategy
    and its SolverResult (fun = unit error with sens1 normalised to 1).

    deadline: a `time.perf_counter()` value. A run past it stops at its next iteration with its best
    iterate, later starts are skipped, and the status is TIME_LIMIT (the first start always makes one
    iteration; every theta > 0 is a valid strategy, and the baselines are still compared).
    progress: called after each L-BFGS iteration with {"iteration", "stage"}.
    """
    if not isinstance(workload, Marginals):
        raise ValueError(f"need a Marginals, got {type(workload).__name__}")
    if restarts < 1:
        raise ValueError(f"restarts must be >= 1, got {restarts}")
    sizes = workload.domain_sizes
    rng = as_generator(seed)
    cols = candidate_marginals(workload, candidates)
    c, r = workload.scaled_eigenvalues, workload.multiplicities
    live = (c > 0) & (r > 0)
    K = superset_incidence(sizes, list(workload.closure), cols).tocsr()[live]
    cr = (c * r)[live]
    if np.any(np.asarray(K.sum(axis=1)).ravel() <= 0):
        raise ValueError("the candidate marginals do not cover every residual the workload needs")
    wl = set(workload.masks)
    base = np.array([1.0 if T in wl else 1e-2 for T in cols])

    def raw(theta: np.ndarray) -> tuple[float, np.ndarray]:
        x = K @ (theta * theta)
        e = float(np.sum(cr / x))
        s = float(theta.sum())
        return s * s * e, 2.0 * s * e + s * s * 2.0 * theta * (K.T @ (-cr / x**2))

    f0 = raw(base)[0]

    def loss_grad(t: np.ndarray) -> tuple[float, np.ndarray]:
        theta = np.exp(t - t.max())
        f, g = raw(theta)
        return f / f0, g * theta / f0

    starts = [np.log(base)] + [np.log(rng.random(len(cols)) + 1e-3) for _ in range(restarts - 1)]
    t0, c0 = time.perf_counter(), time.process_time()
    best, nit, losses, runs, capped = None, 0, [], 0, False
    for k, x0 in enumerate(starts):
        if k > 0 and deadline is not None and time.perf_counter() >= deadline:
            capped = True
            break
        monitor = LbfgsMonitor(x0, deadline, progress, f"marginal template start {k + 1}/{len(starts)}", nit)
        res = minimize_lbfgs(loss_grad, x0, monitor, maxiter=max_iter, ftol=1e-15, gtol=1e-12)
        runs += 1
        if monitor.stopped:
            capped, res.success, res.message = True, False, "stopped at the time limit"
        nit += int(res.nit)
        losses.append(float(res.fun) * f0)
        if best is None or res.fun < best.fun:
            best = res
    assert best is not None
    theta = np.exp(best.x - best.x.max())
    theta = theta / theta.sum()
    subsets = [attrs_of(T) for T in cols]
    strat = Strategy(MarginalMatrix(sizes, "marginals", subsets, theta), name="hdmm-marginals")
    status = lbfgs_status(capped, best.success, best.nit, max_iter)
    skipped = f" ({len(starts) - runs} skipped at the time limit)" if runs < len(starts) else ""
    message = f"best of {runs} L-BFGS starts{skipped}: {best.message}"
    cands = {"optimised": strat, **marginal_baselines(workload)}
    errors = {k: laplace_marginal_error(st, workload) for k, st in cands.items()}
    kept = min(errors, key=lambda k: (errors[k], k != "optimised"))
    if kept != "optimised":
        strat = cands[kept]
        message += (f"; baseline {kept!r} kept (eps-DP unit error {errors[kept]:.6g} < the template's "
                    f"{errors['optimised']:.6g})")
    result = SolverResult.since(
        t0, c0, x=theta, fun=errors[kept], status=status, message=message, nit=nit,
        extra={"losses": losses, "candidates": len(cols), "uniform_start_loss": f0,
               "baseline_errors": errors, "kept": kept},
    )
    return strat, result
