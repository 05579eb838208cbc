"""Eigen-design weights (seed 003, "Eigen-design"; Li & Miklau, PVLDB 5(6), 2012) with a certificate.

The strategy rows are the eigenvectors v_i of G = W^T W (eigenvalues lambda_i > 0) scaled by c_i, and the
squared weights u_i = c_i^2 solve the convex program

    minimise  sum_i lambda_i / u_i   subject to  sum_i u_i v_i[j]^2 <= 1 for every cell j,   u >= 0,

i.e. the (eps, delta) problem of seed 002 restricted to X = P diag(u) P^T (P = [v_1 .. v_k]): the total
squared error is trace(G X^+) = sum_i lambda_i / u_i and sens2^2 = max_j X_jj. Eigenvectors with
lambda_i = 0 get weight 0 (they answer nothing the workload asks).

Dual (derived like `convex_dp_core`): with M = P o P (n x k, M_ji = v_i[j]^2) and multipliers y >= 0,
minimising the Lagrangian over u gives u_i = sqrt(lambda_i / (M^T y)_i) and

    g(y) = 2 psi(y) - sum(y),   psi(y) = sum_i sqrt(lambda_i (M^T y)_i),   OPT_eigen >= psi(y)^2 / sum(y),

with psi homogeneous of degree 1/2, grad g = M u - 1 and -Hess g = (1/2) M diag(sqrt(lambda) c^{-3/2}) M^T
(c = M^T y). So the weights come from the same projected Newton-CG ascent as the seed 002 dual
(`diag_dual_newton`), with O(n k) Hessian-vector products: after the eigen-decomposition of G
(O(n^3), done once) an iteration costs a few matrix-vector products with M, which scales to n = 4096.
At y = 1 the bound is the SVD bound and u = sqrt(lambda) (the SVD-bound strategy). Since the problem is
a restriction of seed 002's, its optimum is >= the seed 002 optimum.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.linalg as sla

from dpopt.solvers.convex_dp_core import (
    RANK_TOL,
    certified_status,
    check_gram,
    objective_from_factor,
    undo_unit_scale,
    unit_scale,
    unscaled_callback,
)
from dpopt.solvers.diag_dual_newton import DualPoint, PrimalPoint, maximise_dual, pcg
from dpopt.solvers.result import SolverResult, relative_gap

__all__ = ["solve_eigen_design", "eigen_design_dual_bound", "complete_strategy"]


class EigenDesignDual:
    """The eigen-design dual as a `diag_dual_newton.DualProblem`; lam (k,) > 0, M (n, k) = P o P."""

    def __init__(self, lam: np.ndarray, M: np.ndarray) -> None:
        self.lam, self.M = lam, M
        self.M2 = M * M

    def evaluate(self, y: np.ndarray) -> DualPoint | None:
        c = self.M.T @ y
        if not np.isfinite(c).all() or c.min() <= 1e-13 * c.max():
            return None  # an eigenvector with no weight on the support of y: psi not differentiable
        u = np.sqrt(self.lam / c)
        return DualPoint(d=y, phi=float(np.sqrt(self.lam * c).sum()), x=self.M @ u, data=(c, u))

    def rescale(self, p: DualPoint, r: float) -> DualPoint:
        c, u = p.data
        return DualPoint(d=p.d * (r * r), phi=p.phi * r, x=p.x / r, data=(c * (r * r), u / r))

    def newton_direction(
        self, p: DualPoint, free: np.ndarray, grad: np.ndarray, eta: float, max_cg: int, damping: float
    ) -> tuple[np.ndarray, int]:
        c, _ = p.data
        w = 0.5 * np.sqrt(self.lam) * c**-1.5
        Mf = self.M[free]

        def hess_vec(v: np.ndarray) -> np.ndarray:
            return Mf @ (w * (Mf.T @ v))

        return pcg(hess_vec, self.M2[free] @ w, grad[free], eta, max_cg, damping)

    def primal(self, p: DualPoint) -> PrimalPoint:
        """Weights u / m, m = max_j (M u)_j: feasible, objective m * psi exactly."""
        _, u = p.data
        m = float(p.x.max())
        return PrimalPoint(u / m, m * p.phi, "uniform scaling")


def _eigen_factor(G: np.ndarray, rank_tol: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Eigenvalues (n,) ascending, eigenvectors (n, n), and the mask of eigenvalues > rank_tol * max."""
    lam, P = sla.eigh(G, driver="evd", check_finite=False)
    if lam[-1] <= 0.0:
        raise ValueError("G must be positive semidefinite with a positive eigenvalue")
    if lam[0] < -1e-8 * lam[-1]:
        raise ValueError(
            f"G must be positive semidefinite (W^T W); smallest eigenvalue {lam[0]:.3e} < -1e-8 * largest"
        )
    return lam, P, lam > rank_tol * lam[-1]


def complete_strategy(A: np.ndarray, V: np.ndarray) -> tuple[np.ndarray, float]:
    """Spend each cell's unused sensitivity: X = A^T A + diag(1 - diag(A^T A)) (Li & Miklau's completion).

    A (r, n) with max column norm <= 1; V (k, n) with V^T V = G. Returns (c, fun): c (n,) >= 0 the added
    diagonal (the strategy [A; diag(sqrt(c))] has sens2 = 1 in every cell) and fun = trace(G X^{-1}),
    which is <= trace(G (A^T A)^+). With the completion, AllRange(2048) and AllRange(64, 32) reproduce
    the eigen-design ratios 1.028 and 1.107 of seed 004's Table 2. If X is numerically singular, c = 0 and
    fun = inf.
    """
    X = A.T @ A
    c = np.clip(1.0 - np.diag(X), 0.0, None)
    X[np.diag_indices_from(X)] += c
    try:
        return c, objective_from_factor(V, X)
    except np.linalg.LinAlgError:
        return np.zeros_like(c), float("inf")


def eigen_design_dual_bound(G: np.ndarray, y: np.ndarray, *, rank_tol: float = RANK_TOL) -> float:
    """Lower bound psi(y)^2 / sum(y) on the eigen-design optimum at cell multipliers y >= 0 (n,).

    psi(y) = sum_i sqrt(lambda_i (M^T y)_i), M = P o P (module docstring). y = 1 gives the SVD bound.
    """
    G, c = unit_scale(check_gram(G))
    y = np.asarray(y, dtype=float)
    if y.shape != (G.shape[0],) or not np.isfinite(y).all() or (y < 0).any() or not (y > 0).any():
        raise ValueError(f"y must be a finite ({G.shape[0]},) vector >= 0, not all zero")
    lam, P, keep = _eigen_factor(G, rank_tol)
    y = y / y.max()
    psi = float(np.sqrt(lam[keep] * ((P[:, keep] ** 2).T @ y)).sum())
    return c * psi * psi / float(y.sum())


def solve_eigen_design(
    G: np.ndarray,
    *,
    tol: float = 1e-8,
    max_iter: int = 200,
    forcing: float = 0.5,
    max_cg: int = 500,
    callback: Callable[[dict[str, Any]], bool | None] | None = None,
    time_limit: float | None = None,
    rank_tol: float = RANK_TOL,
    active_tol: float = 1e-3,
    damping: float = 1.0,
    complete: bool = True,
) -> SolverResult:
    """Eigen-design weights (seed 003; Li & Miklau 2012) by dual projected Newton-CG, with a certificate.

    Parameters
    ----------
    G : ndarray (n, n), W^T W (symmetric PSD, finite, not zero).
    tol : relative duality gap at which the solver stops with CONVERGED.
    max_iter, forcing, max_cg, active_tol, damping : Newton iterations, largest CG relative residual, CG
        steps per iteration, relative size below which a multiplier may be frozen at zero, and the
        Levenberg-Marquardt factor c (systems H + c ||grad|| diag(H); the dual is often degenerate here).
    callback : called per iteration with a dict (nit, d, fun, dual_bound, gap); True stops the solver.
    time_limit : wall-clock seconds (the eigen-decomposition of G counts).
    rank_tol : eigenvalues below rank_tol * largest are treated as zero (weight 0).
    complete : also evaluate `complete_strategy` (one O(n^3) Cholesky solve; about a fifth of the time at
        n = 4096); if False, extra["completion"] is zeros and extra["completed_fun"] equals fun.

    Returns
    -------
    SolverResult with x = u (n,), the squared row weights aligned with the ascending eigenvalues of G
    (0 on its null space), fun = sum_i lambda_i / u_i (P = 1 total squared error, sens2 = 1),
    dual_bound = certified lower bound on the eigen-design optimum, gap; extra["eigenvalues"] (n,),
    extra["eigenvectors"] (n, n) columns v_i, extra["A"] (k, n) strategy rows sqrt(u_i) v_i^T,
    extra["completion"] (n,) and extra["completed_fun"]: the error after `complete_strategy` (strategy
    [A; diag(sqrt(completion))], no longer an eigen-design but never worse), extra["y"] the cell
    multipliers of the certificate, extra["history"].
    """
    t_wall, t_cpu = time.perf_counter(), time.process_time()
    if not (np.isfinite(tol) and tol > 0):
        raise ValueError(f"tol must be a positive finite number; got {tol!r}")
    if not (0 < forcing < 1):
        raise ValueError(f"forcing must lie in (0, 1); got {forcing!r}")
    if max_iter < 0 or max_cg < 1:
        raise ValueError(f"max_iter must be >= 0 and max_cg >= 1; got {max_iter}, {max_cg}")
    if not (np.isfinite(damping) and damping >= 0):
        raise ValueError(f"damping must be a finite number >= 0; got {damping!r}")
    G, c = unit_scale(check_gram(G))
    n = G.shape[0]
    lam, P, keep = _eigen_factor(G, rank_tol)
    problem = EigenDesignDual(lam[keep], P[:, keep] ** 2)
    out = maximise_dual(problem, np.ones(n), tol=tol, max_iter=max_iter, forcing=forcing, max_cg=max_cg,
                        active_tol=active_tol, damping=damping, callback=unscaled_callback(callback, c), time_limit=time_limit, t_start=t_wall)
    u = np.zeros(n)
    u[keep] = out.primal.x
    fun = float(np.sum(lam[keep] / out.primal.x))
    dual = out.dual
    gap = relative_gap(fun, dual)
    status, message = certified_status(out.status, out.message, gap, tol)
    A = np.sqrt(u[keep])[:, None] * P[:, keep].T
    completion, completed_fun = np.zeros(n), fun
    if complete:
        completion, completed_fun = complete_strategy(A, np.sqrt(lam[keep])[:, None] * P[:, keep].T)
    res = SolverResult(
        x=u,
        fun=fun,
        status=status,
        message=message,
        nit=out.nit,
        ninner=out.ninner,
        wall_seconds=time.perf_counter() - t_wall,
        cpu_seconds=time.process_time() - t_cpu,
        dual_bound=dual,
        gap=gap,
        extra={
            "eigenvalues": lam,
            "eigenvectors": P,
            "A": A,
            "completion": completion,
            "completed_fun": min(completed_fun, fun),
            "y": out.d,
            "rank": int(keep.sum()),
            "history": out.history,
        },
    )
    return undo_unit_scale(res, c)
