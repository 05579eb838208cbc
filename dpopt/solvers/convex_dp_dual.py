"""Dual projected Newton-CG for the seed 002 (eps, delta) strategy problem.

Maximises g(d) = 2 ||V D^{1/2}||_* - sum(d) over d >= 0 (derivation in `convex_dp_core`; ascent in
`diag_dual_newton`). With T = V D V^T = U diag(s^2) U^T (k x k, k = rank G) and Z = U^T V (columns z_i):

    phi = sum(s),   x_i = diag(X(d))_i = sum_a z_ia^2 / s_a,   X(d) = V^T T^{-1/2} V = Y^T Y,
    -Hess g = H,    H_ij = sum_ab z_ia z_ja z_ib z_jb / (s_a s_b (s_a + s_b)),

so one iteration is one symmetric eigen-decomposition of T plus a few CG products, each two
(k x n) by (n x k) matrix products. Cells whose multiplier reaches zero (e.g. the end cells of WidthK)
have diag(X) < 1 at the optimum.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.linalg as sla

from dpopt.solvers.convex_dp_core import (
    dual_bound_from_factor,
    objective_from_factor,
)
from dpopt.solvers.diag_dual_newton import DualPoint, PrimalPoint, maximise_dual, pcg
from dpopt.solvers.result import SolverResult

#: T = V D V^T counts as positive definite when its eigenvalues exceed this times its largest one.
_PD_RTOL = 1e3 * np.finfo(float).eps


class ConvexDPDual:
    """The seed 002 dual as a `diag_dual_newton.DualProblem`; V (k, n) with V^T V = G."""

    def __init__(self, V: np.ndarray) -> None:
        self.V = V

    def evaluate(self, d: np.ndarray) -> DualPoint | None:
        """phi, diag X(d) and (s, Z) from an eigen-decomposition of T = V D V^T; None if T is singular."""
        V = self.V
        ev, U = sla.eigh((V * d) @ V.T, driver="evd", check_finite=False)
        if not np.isfinite(ev).all() or ev[0] <= _PD_RTOL * ev[-1]:
            return None
        s = np.sqrt(ev)
        Z = U.T @ V
        x = np.einsum("an,an->n", Z, Z / s[:, None])
        return DualPoint(d=d, phi=float(s.sum()), x=x, data=(s, Z))

    def rescale(self, p: DualPoint, r: float) -> DualPoint:
        s, Z = p.data
        return DualPoint(d=p.d * (r * r), phi=p.phi * r, x=p.x / r, data=(s * r, Z))

    def newton_direction(
        self, p: DualPoint, free: np.ndarray, grad: np.ndarray, eta: float, max_cg: int, damping: float
    ) -> tuple[np.ndarray, int]:
        s, Z = p.data
        kappa = 1.0 / (s[:, None] * s[None, :] * (s[:, None] + s[None, :]))
        Zf = Z[:, free]
        Q = Zf * Zf

        def hess_vec(w: np.ndarray) -> np.ndarray:
            Y = (Zf * w) @ Zf.T
            Y *= kappa
            return np.einsum("an,an->n", Zf, Y @ Zf)

        h_diag = np.einsum("an,an->n", Q, kappa @ Q)
        return pcg(hess_vec, h_diag, grad[free], eta, max_cg, damping)

    def primal(self, p: DualPoint) -> PrimalPoint:
        """Feasible X from X(d) = Y^T Y, Y = diag(s^{-1/2}) Z, m = max diag X(d).

        Unit diagonal: "diagonal rescaling" diag(X)^{-1/2} X(d) diag(X)^{-1/2} when G is nonsingular
        (second-order accurate: the gradient -X^{-1} G X^{-1} = -D is diagonal at the optimum), and
        "range complement" X(d)/m + diag(1 - diag(X(d))/m) when G is singular (rescaling would leave
        range(G)); objective by a Cholesky solve. Fallback "uniform scaling" X(d)/m: diag <= 1, objective
        m * phi exactly. extra["A"] is a factor with A^T A = X.
        """
        s, Z = p.data
        k, n = Z.shape
        Y = Z / np.sqrt(s)[:, None]
        m = float(p.x.max())
        A_uni = Y / np.sqrt(m)
        if k == n:
            A, label = Y / np.sqrt(p.x)[None, :], "diagonal rescaling"
        else:
            A = np.vstack([A_uni, np.diag(np.sqrt(np.clip(1.0 - p.x / m, 0.0, None)))])
            label = "range complement"
        X = A.T @ A
        try:
            fun = objective_from_factor(self.V, X)
        except np.linalg.LinAlgError:
            fun = np.inf
        if np.isfinite(fun) and fun <= m * p.phi * (1.0 + 1e-12):
            return PrimalPoint(X, fun, label, {"A": A})
        return PrimalPoint(A_uni.T @ A_uni, m * p.phi, "uniform scaling", {"A": A_uni})


def solve_dual(
    V: np.ndarray,
    *,
    tol: float,
    max_iter: int,
    forcing: float,
    max_cg: int,
    d0: np.ndarray,
    active_tol: float,
    damping: float,
    callback: Callable[[dict[str, Any]], bool | None] | None,
    time_limit: float | None,
) -> SolverResult:
    """Seed 002 problem by dual projected Newton-CG (module docstring); SolverResult with x = X (n, n).

    V (k, n) range factor with V^T V = G (eigenvalues of G below the rank tolerance are zero in V and
    the objective is taken with V^T V); d0 (n,) positive starting multipliers.
    """
    t_wall, t_cpu = time.perf_counter(), time.process_time()
    out = maximise_dual(ConvexDPDual(V), d0, tol=tol, max_iter=max_iter, forcing=forcing, max_cg=max_cg,
                        active_tol=active_tol, damping=damping, callback=callback, time_limit=time_limit, t_start=t_wall)
    dual = max(dual_bound_from_factor(V, out.d), 0.0)  # recomputed from singular values (accurate)
    extra = {"method": "dual", "d": out.d, "A": out.primal.extra["A"],
             "primal_construction": out.primal.construction, "rank": V.shape[0]}
    return out.result(out.primal.x, out.primal.fun, dual, tol, t_wall, t_cpu, extra)
