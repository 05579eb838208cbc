"""Certified (eps, delta) strategy for one factor: the dual of the seed 002 convex program, maximised by L-BFGS.

Problem (seed 002; seed 004 Prop. 3.3): minimise trace(G X^+) * max_i X_ii over PSD X whose range contains
that of G = W^T W. Its Lagrangian dual is, for u > 0 (one multiplier per diagonal constraint X_ii <= 1),

    g(u) = min_X trace(G X^{-1}) + sum_i u_i (X_ii - 1) = 2 trace((D^{1/2} G D^{1/2})^{1/2}) - sum_i u_i,

with D = diag(u), attained at X(u) = D^{-1/2} (D^{1/2} G D^{1/2})^{1/2} D^{-1/2}. Writing T(u) for the trace
term, maximising over the scale of u gives the certified lower bound  phi(u) = T(u)^2 / sum_i u_i  for every
u > 0 (weak duality; u = 1 gives the SVD bound). X(u) rescaled to unit maximal diagonal is a feasible
strategy whose error is T(u) * max_i X(u)_ii, so  gap(u) = max_i X_ii * sum_i u_i / T(u) - 1  is certified.
g is concave and its gradient is dg/du_i = X(u)_ii - 1 (envelope theorem), so L-BFGS on t = log u is used.

This module is the fallback used when `dpopt.solvers.convex_dp` cannot be imported, and an independent
cross-check of it; its answer carries its own dual certificate. It is slower than the dual Newton-CG of
`convex_dp` (about 2x on AllRange(256), 100x on the singular WidthK(256, 32), where it needs a
regularisation continuation).
"""

from __future__ import annotations

import time

import numpy as np
from scipy.optimize import minimize

from dpopt.linalg import psd_pinv
from dpopt.solvers.result import CONVERGED, MAX_ITER, STALLED, SolverResult


def _dual_parts(G: np.ndarray, u: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """T(u), diag of S = (D^{1/2} G D^{1/2})^{1/2}, and S itself."""
    r = np.sqrt(u)
    H = G * r[:, None] * r[None, :]
    lam, V = np.linalg.eigh((H + H.T) / 2)
    s = np.sqrt(np.clip(lam, 0.0, None))
    S = (V * s) @ V.T
    return float(s.sum()), np.diag(S).copy(), S


def dual_certificate(G: np.ndarray, u: np.ndarray) -> tuple[float, float, np.ndarray]:
    """(primal error, dual lower bound, X) at multipliers u: X feasible with max diag 1 (seed 002 dual)."""
    u = np.asarray(u, dtype=float)
    T, sdiag, S = _dual_parts(G, u)
    r = 1.0 / np.sqrt(u)
    X = S * r[:, None] * r[None, :]
    dmax = float(np.max(np.diag(X)))
    return T * dmax, T * T / float(u.sum()), X / dmax


def solve_factor_gaussian(
    G: np.ndarray,
    tol: float = 1e-6,
    max_iter: int = 5000,
    u0: np.ndarray | None = None,
) -> SolverResult:
    """Optimal (eps, delta) strategy Gram for one factor, with a certified duality gap (seed 002, dual form).

    G: W^T W (n x n, symmetric PSD). Returns SolverResult with x = X (n x n, max diagonal 1), fun = its
    error trace(G X^+) per unit privacy constant, dual_bound = phi(u), gap = fun / dual_bound - 1; status
    CONVERGED only when gap <= tol.
    """
    G = np.asarray(G, dtype=float)
    if G.ndim != 2 or G.shape[0] != G.shape[1] or G.shape[0] == 0:
        raise ValueError(f"G must be a non-empty square matrix, got shape {G.shape}")
    if not np.all(np.isfinite(G)):
        raise ValueError("G has NaN or infinite entries")
    if tol <= 0 or max_iter < 1:
        raise ValueError(f"need tol > 0 and max_iter >= 1, got {tol}, {max_iter}")
    G = (G + G.T) / 2
    n = G.shape[0]
    scale = float(np.trace(G)) / n
    if scale <= 0:
        raise ValueError("G is zero: the workload asks nothing")
    Gs = G / scale
    t0, c0 = time.perf_counter(), time.process_time()
    lam_min = float(np.linalg.eigvalsh(Gs)[0])
    # A singular G has its dual optimum at the boundary (some u_i -> 0): solve a short continuation of
    # regularised problems G + theta I, and certify every iterate against the true G (the dual bound
    # phi_G(u) holds for any u > 0, and X(u) built from G + theta I is a feasible full-rank strategy).
    thetas = [0.0] if lam_min > 1e-9 else [0.0, 1e-3, 1e-5, 1e-7, 1e-9]
    if u0 is None:
        T1, _, _ = _dual_parts(Gs + thetas[0] * np.eye(n), np.ones(n))
        u0 = np.full(n, (T1 / n) ** 2)
    t = np.log(np.asarray(u0, dtype=float))
    nfev, nit = [0], 0
    best: tuple[float, float, np.ndarray, np.ndarray] | None = None
    message = ""
    for theta in thetas:
        Gt = Gs + theta * np.eye(n) if theta > 0 else Gs

        def f(t: np.ndarray, Gt: np.ndarray = Gt) -> tuple[float, np.ndarray]:
            nfev[0] += 1
            u = np.exp(t)
            T, sdiag, _ = _dual_parts(Gt, u)
            # minimise -g(u); d(-g)/dt_i = -(u_i X_ii - u_i) = u_i - S_ii
            return -(2.0 * T - float(u.sum())), u - sdiag

        res = minimize(
            f,
            t,
            jac=True,
            method="L-BFGS-B",
            options={"maxiter": max_iter, "ftol": 1e-15, "gtol": 1e-12, "maxcor": 30},
        )
        t, nit, message = res.x, nit + int(res.nit), str(res.message)
        u = np.exp(t)
        _, _, X = dual_certificate(Gt, u)
        primal = float(np.einsum("ij,ij->", Gs, psd_pinv(X)[0]))
        dual = _dual_parts(Gs, u)[0] ** 2 / float(u.sum())
        cand = (primal, dual, X, u)
        if best is None:
            best = cand
        else:
            best = (min(best[0], primal), max(best[1], dual), best[2] if best[0] <= primal else X, u)
        if best[0] / best[1] - 1.0 <= tol:
            break
    assert best is not None
    primal, dual, X, u = best
    gap = primal / dual - 1.0
    if gap <= tol:
        status, msg = CONVERGED, f"certified relative gap {gap:.2e} <= {tol:g}"
    elif nit >= max_iter * len(thetas):
        status, msg = MAX_ITER, f"iteration cap {max_iter} reached with gap {gap:.2e}"
    else:
        status, msg = STALLED, f"L-BFGS stopped ({message}) with gap {gap:.2e} > {tol:g}"
    return SolverResult(
        x=X,
        fun=primal * scale,
        status=status,
        message=msg,
        nit=nit,
        wall_seconds=time.perf_counter() - t0,
        cpu_seconds=time.process_time() - c0,
        ninner=nfev[0],
        dual_bound=dual * scale,
        gap=gap,
        extra={"u": u / scale},
    )
