"""Primal Newton-CG for the seed 002 (eps, delta) strategy problem (seed 002, Section 4, `ConvexDP`).

Minimises f(X) = trace(G X^{-1}) over positive definite X with diag(X) = 1 by Newton steps restricted to
the tangent space {D symmetric, diag(D) = 0}, found by conjugate gradients, with an Armijo line search whose
trial points must pass a Cholesky factorisation (positive definiteness), as in the seed's Matlab code.
Changes from the seed, each to make it converge on every workload:

- start from the SVD-bound strategy (X0 = G^{1/2} rescaled to unit diagonal) instead of the identity;
- inexact Newton: CG runs to a relative residual eta_k = min(forcing, sqrt(||grad_k|| / ||grad_0||))
  (a superlinear forcing sequence) instead of a fixed 5 steps, with a Jacobi preconditioner on the
  entries of D (H[E_ij] has diagonal Xinv_jj K_ii + Xinv_ii K_jj + 2 Xinv_ij K_ij);
- stop on the certified relative duality gap (dual bound at d = diag(X^{-1} G X^{-1}), best scaling; see
  `convex_dp_core`) instead of a small relative decrease, which can stop far from the optimum;
- objective and gradient from Cholesky solves: f = ||L^{-1} V^T||_F^2, K = X^{-1} G X^{-1} = R R^T with
  R = L^{-T} L^{-1} V^T, never an explicit inverse of X for them.

The regularisation G + theta * mean(diag(G)) * I of the seed is applied only when G is singular (then the
infimum over positive definite X is approached at a singular X and Newton slows down); the solver then
minimises the regularised objective, reports the true trace(G X^{-1}) as `fun`, the regularised value in
`extra["regularised_fun"]`, and certifies against the true G, so the gap shows the cost of regularising.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.linalg as sla

from dpopt.linalg import svdb_strategy_gram
from dpopt.solvers.convex_dp_core import certified_status, dual_bound_from_factor
from dpopt.solvers.diag_dual_newton import pcg
from dpopt.solvers.result import MAX_ITER, STALLED, SolverResult, lap_timer, relative_gap, stop_rule

_ARMIJO = 1e-4
_MAX_BACKTRACK = 50


def _cheap_dual(V: np.ndarray, d: np.ndarray) -> float:
    """phi(d)^2 / sum(d) from eigenvalues of V D V^T (k x k); used inside the loop."""
    ev = np.linalg.eigvalsh((V * d) @ V.T)
    phi = float(np.sqrt(np.clip(ev, 0.0, None)).sum())
    return phi * phi / float(d.sum())


class _Model:
    """f, K = X^{-1} G X^{-1} and X^{-1} at a positive definite X from one Cholesky factorisation."""

    def __init__(self, X: np.ndarray, L: np.ndarray, V: np.ndarray) -> None:
        self.X, self.L = X, L
        Y = sla.solve_triangular(L, V.T, lower=True, check_finite=False)
        self.f = float(np.einsum("ij,ij->", Y, Y))
        self._Y = Y

    def finish(self) -> None:
        """Second half (only for accepted points): K and X^{-1}."""
        R = sla.solve_triangular(self.L, self._Y, lower=True, trans="T", check_finite=False)
        self.K = R @ R.T
        inv, info = sla.lapack.dpotri(self.L, lower=1)
        if info != 0:
            raise np.linalg.LinAlgError(f"dpotri failed with info = {info}")
        inv = np.tril(inv)
        self.Xinv = inv + inv.T - np.diag(np.diag(inv))


def _try_point(X: np.ndarray, V: np.ndarray) -> _Model | None:
    try:
        L = sla.cholesky(X, lower=True, check_finite=False)
    except (np.linalg.LinAlgError, sla.LinAlgError):
        return None
    model = _Model(X, L, V)
    return model if np.isfinite(model.f) else None


def _tangent_pcg(model: _Model, rhs: np.ndarray, eta: float, max_cg: int) -> tuple[np.ndarray, int]:
    """Solve H[D] = rhs on {diag(D) = 0}, H[D] = Xinv D K + K D Xinv, by Jacobi-preconditioned CG."""
    K, Xinv = model.K, model.Xinv
    kd, xd = np.diag(K), np.diag(Xinv)
    precond = np.outer(kd, xd) + np.outer(xd, kd) + 2.0 * Xinv * K

    def hess(D: np.ndarray) -> np.ndarray:
        P = (Xinv @ D) @ K
        return _off_diagonal(P + P.T)

    return pcg(hess, precond, rhs, eta, max_cg, project=_off_diagonal)


def _off_diagonal(D: np.ndarray) -> np.ndarray:
    """D with its diagonal set to zero (in place): the projection onto the tangent space diag(D) = 0."""
    np.fill_diagonal(D, 0.0)
    return D


def solve_primal(
    G: np.ndarray,
    V: np.ndarray,
    V_full: np.ndarray,
    *,
    tol: float,
    max_iter: int,
    forcing: float,
    max_cg: int,
    X0: np.ndarray | None,
    theta: float,
    callback: Callable[[dict[str, Any]], bool | None] | None,
    time_limit: float | None,
) -> SolverResult:
    """Seed 002 Newton-CG with the changes listed in the module docstring.

    G (n, n) PSD; V (k, n) range factor and V_full (n, n) full factor of G (V^T V = V_full^T V_full = G);
    X0 (n, n) positive definite with unit diagonal, or None for the SVD-bound start. Returns SolverResult
    with x = X (n, n, unit diagonal).
    """
    t_wall, t_cpu = time.perf_counter(), time.process_time()
    n = G.shape[0]
    singular = V.shape[0] < n
    extra: dict[str, Any] = {"method": "primal", "rank": V.shape[0]}
    if singular:
        mu = theta * float(np.mean(np.diag(G)))
        G_eff = G + mu * np.eye(n)
        V_eff = sla.cholesky(G_eff, lower=False, check_finite=False)  # V_eff^T V_eff = G_eff
        extra["regularisation"] = {
            "theta": theta,
            "added": mu,
            "reason": f"G is singular (rank {V.shape[0]} < n = {n}); minimising trace((G + theta mean(diag G) I) X^-1)",
        }
    else:
        G_eff, V_eff = G, V_full
    model = _try_point(svdb_strategy_gram(G_eff, unit=True) if X0 is None else X0, V_eff)
    if model is None:
        raise ValueError("the starting point X0 is not positive definite")
    model.finish()

    best_dual, best_d = 0.0, None
    history: list[dict[str, float]] = []
    ninner, status, message, nit = 0, MAX_ITER, f"reached max_iter = {max_iter}", 0
    grad0 = None
    lap = lap_timer()
    for nit in range(max_iter + 1):
        last = lap()  # the length of the last iteration
        if singular:
            R = sla.solve_triangular(model.L, V.T, lower=True, check_finite=False)
            f_true = float(np.einsum("ij,ij->", R, R))
            R = sla.solve_triangular(model.L, R, lower=True, trans="T", check_finite=False)
            d = np.einsum("ij,ij->i", R, R)
        else:
            f_true, d = model.f, np.diag(model.K).copy()
        dual = _cheap_dual(V, np.maximum(d, 0.0))
        if dual > best_dual:
            best_dual, best_d = dual, d
        gap = relative_gap(f_true, best_dual)
        history.append({"nit": nit, "fun": f_true, "dual": best_dual, "gap": gap, "ninner": ninner})
        report = {"nit": nit, "X": model.X, "fun": f_true, "dual_bound": best_dual, "gap": gap}
        stop = stop_rule(callback is not None and bool(callback(report)), gap, tol, nit, max_iter,
                         time.perf_counter() - t_wall + last, time_limit)  # the next iteration must fit too
        if stop is not None:
            status, message = stop
            break
        rhs = model.K.copy()  # minus the gradient, projected on diag(D) = 0
        np.fill_diagonal(rhs, 0.0)
        g_norm = float(np.linalg.norm(rhs))
        grad0 = g_norm if grad0 is None else grad0
        eta = min(forcing, np.sqrt(g_norm / max(grad0, np.finfo(float).tiny)))
        D, used = _tangent_pcg(model, rhs, eta, max_cg)
        ninner += used
        slope = -float(np.vdot(rhs, D))  # <grad f, D> < 0
        alpha, trial = 1.0, None
        for _ in range(_MAX_BACKTRACK):
            X_new = model.X + alpha * D
            np.fill_diagonal(X_new, 1.0)
            trial = _try_point(X_new, V_eff)
            if trial is not None and trial.f <= model.f + _ARMIJO * alpha * slope:
                break
            trial = None
            alpha *= 0.5
        if trial is None:
            status, message = STALLED, f"line search failed at gap {gap:.2e}"
            break
        history[-1]["alpha"] = alpha
        trial.finish()
        model = trial

    if singular:
        R = sla.solve_triangular(model.L, V.T, lower=True, check_finite=False)
        fun = float(np.einsum("ij,ij->", R, R))
        extra["regularised_fun"] = model.f
    else:
        fun = model.f
    dual = dual_bound_from_factor(V, np.maximum(best_d, 0.0)) if best_d is not None else 0.0
    gap = relative_gap(fun, dual)
    status, message = certified_status(status, message, gap, tol)
    extra.update({"d": best_d, "A": model.L.T.copy(), "history": history})
    return SolverResult.since(t_wall, t_cpu, x=model.X, fun=fun, status=status, message=message, nit=nit,
                              ninner=ninner, dual_bound=dual, gap=gap, extra=extra)
