"""Certified non-negative (weighted) least squares: min_{x >= 0} 1/2 ||D (A x - y)||^2 (seed 003's NNLS inference).

With M = A^T D^2 A (positive definite: A has full column rank), b = A^T D^2 y and c = 1/2 ||D y||^2 the
problem is the bound-constrained quadratic f(x) = 1/2 x^T M x - b^T x + c over x >= 0. Its Lagrangian dual
at multipliers l >= 0 is

    g(l) = c - 1/2 (b + l)^T M^{-1} (b + l),

a lower bound on the optimum for every l >= 0 (weak duality); at the optimum x*, l* = M x* - b makes it
tight (KKT: l* >= 0, x*^T l* = 0). Each iterate x is certified with l = max(M x - b, 0): the relative gap
(f(x) - g(l)) / f(x) bounds how far f(x) is above the optimum. With u = M^{-1} (b + l) the gap is
1/2 (x - u)^T M (x - u) + x^T l, a sum of two non-negative terms computed without cancellation.

The iterates are Lawson and Hanson's active-set method on the normal equations (Bro and de Jong 1997's
FNNLS), started from the cells where the least-squares estimate is positive: the optimum on the passive set
P (a solve with M's block on P), stepped back toward the last iterate and P shrunk until it is positive on P;
then the cell outside P with the most negative gradient joins P. It ends in finitely many steps at the
optimum; the certificate decides when to stop.
"""

from __future__ import annotations

import time

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp

from dpopt.solvers.result import FAILED, SolverResult, stop_rule

# The gap is relative to f(x), floored at EPS f(0): an exact fit (A square, or y in A's cone) has f at the
# rounding level of f(0)'s terms, and a gap below that is as good as zero.
EPS = float(np.finfo(float).eps)




def nnls_normal_equations(A: np.ndarray | sp.spmatrix, y: np.ndarray,
                          weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, float]:
    """(M, b, c) = (A^T D^2 A, A^T D^2 y, 1/2 ||D y||^2) of the weighted NNLS problem, D = diag(weights)."""
    y = np.asarray(y, dtype=float).ravel()
    w2 = np.ones_like(y) if weights is None else np.asarray(weights, dtype=float).ravel() ** 2
    if w2.shape != y.shape or not np.all(np.isfinite(w2)) or (w2 <= 0).any():
        raise ValueError(f"weights must be {y.size} finite positive numbers")
    if sp.issparse(A):
        A = sp.csr_matrix(A)
        DA = sp.diags(w2) @ A
        M = np.asarray((A.T @ DA).toarray())
    else:
        A = np.asarray(A, dtype=float)
        M = A.T @ (w2[:, None] * A)
    b = np.asarray(A.T @ (w2 * y)).ravel()
    return (M + M.T) / 2, b, 0.5 * float(np.dot(w2 * y, y))


def nnls_gap(M: np.ndarray, M_chol: tuple[np.ndarray, bool], b: np.ndarray, x: np.ndarray,
             lam: np.ndarray) -> float:
    """The duality gap of seed 003's NNLS inference: f(x) - g(l) for x >= 0 and l >= 0, g(l) = c - 1/2 (b + l)^T
    M^{-1} (b + l) the Lagrangian dual (module docstring), without cancellation: 1/2 (x - u)^T M (x - u) + x^T l
    with u = M^{-1} (b + l)."""
    lam = np.maximum(lam, 0.0)
    d = x - sla.cho_solve(M_chol, b + lam)
    return float(0.5 * d @ (M @ d) + x @ lam)


def solve_nnls(
    A: np.ndarray | sp.spmatrix,
    y: np.ndarray,
    weights: np.ndarray | None = None,
    *,
    tol: float = 1e-10,
    max_iter: int = 200,
    time_limit: float | None = None,
) -> SolverResult:
    """min_{x >= 0} 1/2 ||D (A x - y)||^2 by Lawson and Hanson's active set on the normal equations with a
    certified duality gap (seed 003's NNLS inference), D = diag(weights) (default I). A (r x k) needs full
    column rank.

    Returns a SolverResult: x (k,) >= 0, fun f(x) (from the residual), dual_bound g(l) at l = max(M x - b, 0)
    on the cells held at zero (0 on the others), gap the relative gap (f - g) / max(f, EPS f(0)) (`nnls_gap`),
    status CONVERGED once gap <= tol; extra["kkt"] holds max |min(x, grad)| / max|b|.
    """
    t0, c0 = time.perf_counter(), time.process_time()
    M, b, c = nnls_normal_equations(A, y, weights)
    try:
        chol = sla.cho_factor(M, lower=False)
    except sla.LinAlgError:
        return SolverResult.since(t0, c0, x=np.zeros(b.size), fun=c, status=FAILED, nit=0,
                                  message="A has no full column rank (A^T D^2 A is singular); no certificate")
    x, passive = np.zeros(b.size), sla.cho_solve(chol, b) > 0  # warm start: where least squares is positive

    yv = np.asarray(y, dtype=float).ravel()
    wv = np.ones_like(yv) if weights is None else np.asarray(weights, dtype=float).ravel()

    def f(z: np.ndarray) -> float:  # from the residual itself, accurate also where the fit is exact
        return float(0.5 * np.sum((wv * (np.asarray(A @ z).ravel() - yv)) ** 2))

    def solve_on(P: np.ndarray) -> np.ndarray:
        out = np.zeros(b.size)
        if P.any():
            out[P] = sla.solve(M[np.ix_(P, P)], b[P], assume_a="pos")
        return out

    nit, stop = 0, None
    while True:
        # inner loop (Lawson and Hanson): the unconstrained optimum on the passive set, stepping back toward x
        # and releasing the cells that reach zero until it is positive there
        z = solve_on(passive)
        while passive.any() and (z[passive] <= 0).any():
            neg = passive & (z <= 0)
            alpha = float(np.min(x[neg] / (x[neg] - z[neg]))) if (x[neg] > 0).any() else 0.0
            x = np.maximum(x + alpha * (z - x), 0.0)
            passive &= ~(neg & (x <= 0))
            passive &= x > 0 if alpha > 0 else ~neg
            z = solve_on(passive)
        x = z
        nit += 1
        grad = M @ x - b
        fx = f(x)
        # multipliers only on the cells held at zero (on P the exact gradient is 0; its rounding is no multiplier)
        gap_abs = nnls_gap(M, chol, b, x, np.where(passive, 0.0, grad))
        dual = fx - gap_abs
        gap = gap_abs / max(fx, EPS * c, np.finfo(float).tiny)
        stop = stop_rule(False, gap, tol, nit, max_iter, time.perf_counter() - t0, time_limit)
        if stop is not None:
            break
        # outer step: the active cell whose gradient most wants to grow joins the passive set
        w = np.where(passive, -np.inf, -grad)
        j = int(np.argmax(w))
        if not w[j] > 0:
            stop = ("stalled", f"no active cell with a negative gradient, gap {gap:.2e} above tol {tol:.1e}")
            break
        passive[j] = True
    kkt = float(np.max(np.abs(np.minimum(x, M @ x - b)))) / max(float(np.max(np.abs(b))), np.finfo(float).tiny)
    return SolverResult.since(t0, c0, x=x, fun=fx, status=stop[0], message=stop[1], nit=nit,
                              dual_bound=dual, gap=gap, extra={"kkt": kkt})
