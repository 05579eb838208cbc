"""Certified solver for the (eps, delta) matrix-mechanism strategy problem (seed 002, Appendix 1.1 and 4).

    minimise  trace(G X^{-1})  subject to  diag(X) = 1,  X positive definite,   G = W^T W (n x n),

whose value is the least total squared error ||W A^+||_F^2 of a strategy A with sens2(A) = 1 and
A^T A = X (multiply by P(eps, delta); per-query RMSE = sqrt(value / m)). Every result carries a
certified lower bound from the Lagrangian dual over the diagonal multipliers (`convex_dp_core`):

    OPT >= ||W D^{1/2}||_*^2 / sum(d)   for every d >= 0,   = SVD bound at d = 1 (seed 004).

Two methods (``method=``); "dual" is the default because it reaches the target gap fastest on every
benchmarked row and is the only one that certifies singular G:

- ``"dual"``: projected Newton-CG on the n multipliers (`convex_dp_dual`), started at the SVD-bound
  strategy's multipliers d0 = diag(G^{1/2})^2. An iteration is one eigen-decomposition of the k x k
  matrix V D V^T (k = rank G) plus a few CG products of O(n k^2); the primal point
  X(d) = V^T (V D V^T)^{-1/2} V and the certificate come with every iterate, and the final certificate
  reuses the last eigenbasis (no further decomposition; extra["decompositions"] counts them). On AllRange, Prefix and
  Width32 (n = 128..2048) it needs 1-5 Newton iterations and at most about a dozen CG products for a
  certified gap <= 1e-6 (benchmarks/results/convex_dp.md). It also solves singular G exactly (Width32
  has rank n - 31): the optimal X is then singular (rank k, range(G)), which only a range-restricted
  parametrisation reaches.
- ``"primal"``: the seed's Newton-CG on the tangent space diag(D) = 0 with Armijo/Cholesky line search,
  made convergent (SVD-bound start, forcing sequence, Jacobi-preconditioned CG, certified-gap stopping;
  `convex_dp_primal`). On nonsingular G it converges in 3-8 Newton iterations, but its CG runs on
  n(n-1)/2 unknowns with O(n^3) products (11-114 per solve), which costs 1.7-4.4 times the dual method's
  CPU time at n = 128..2048; on singular G it must regularise and stalls at gaps of 6e-4..7e-3.
  Kept as the seed-faithful reference and an independent cross-check.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dpopt.linalg import unit_diagonal
from dpopt.solvers.convex_dp_core import (
    RANK_TOL,
    check_multipliers,
    check_newton_options,
    dual_bound_from_factor,
    objective_from_factor,
    range_factor,
    undo_unit_scale,
    unit_scale,
    unscaled_callback,
)
from dpopt.solvers.convex_dp_dual import solve_dual
from dpopt.solvers.convex_dp_primal import solve_primal
from dpopt.solvers.result import SolverResult
from dpopt.validation import check_choice, check_gram, check_time_limit

_METHODS = ("dual", "primal")


def _check_start(x0: np.ndarray, G: np.ndarray, V_full: np.ndarray | None, method: str, c: float) -> np.ndarray:
    """Turn x0 into the start the method needs: multipliers d0 for G = G_input / c (dual) or a
    unit-diagonal X0 (primal)."""
    n = G.shape[0]
    x0 = np.asarray(x0, dtype=float)
    if not np.isfinite(x0).all():
        raise ValueError("x0 must contain only finite values (found NaN or inf)")
    if method == "dual" and x0.shape == (n,):
        if (x0 <= 0).any():
            raise ValueError("x0 given as multipliers d0 must be > 0 in every cell")
        return x0 / c
    if x0.shape != (n, n):
        expected = f"({n}, {n}) matrix X0" + (f" or ({n},) multipliers d0" if method == "dual" else "")
        raise ValueError(f"x0 must be an {expected}; got shape {x0.shape}")
    x0 = (x0 + x0.T) / 2.0
    if (np.diag(x0) <= 0).any():
        raise ValueError("x0 must be positive definite; it has a non-positive diagonal entry")
    X0 = unit_diagonal(x0)
    try:
        L = np.linalg.cholesky(X0)
    except np.linalg.LinAlgError:
        raise ValueError("x0 must be positive definite (its Cholesky factorisation failed)") from None
    if method == "primal":
        return X0
    # Multipliers suggested by X0: d = diag(X0^{-1} G X0^{-1}) (exact at the optimum).
    R = np.linalg.solve(L.T, np.linalg.solve(L, V_full.T))
    d0 = np.einsum("ij,ij->i", R, R)
    return np.maximum(d0, 1e-12 * d0.max())


def svdb_multipliers(V: np.ndarray) -> np.ndarray:
    """Starting multipliers d0 = diag(G^{1/2})^2 from the SVD-bound strategy G^{1/2} (seed 004, Thm. 4.2).

    V (k, n) has orthogonal rows with V^T V = G, so diag(G^{1/2})_i = sum_a V_ai^2 / ||V_a||. For diagonal
    G this d0 is the exact optimum (X(d0) = I); in general it starts Newton close to it. Cells outside
    every query get a tiny positive value (their multiplier goes to zero).
    """
    root_diag = np.einsum("ai,a->i", V * V, 1.0 / np.linalg.norm(V, axis=1))
    d0 = root_diag**2
    return np.maximum(d0, 1e-12 * d0.max())


def solve_convex_dp(
    G: np.ndarray,
    *,
    method: str = "dual",
    tol: float = 1e-8,
    max_iter: int | None = None,
    forcing: float = 0.5,
    max_cg: int | None = None,
    x0: np.ndarray | None = None,
    callback: Callable[[dict[str, Any]], bool | None] | None = None,
    time_limit: float | None = None,
    rank_tol: float = RANK_TOL,
    theta: float = 1e-8,
    active_tol: float = 1e-3,
    damping: float = 1.0,
) -> SolverResult:
    """Seed 002 (eps, delta) strategy problem: min trace(G X^{-1}) s.t. diag(X) = 1, with a certificate.

    Parameters
    ----------
    G : ndarray (n, n)
        W^T W: symmetric positive semidefinite, finite, not zero.
    method : "dual" (projected Newton-CG on the multipliers) or "primal" (seed 002 Newton-CG).
    tol : relative duality gap (fun - dual_bound) / fun at which the solver stops with CONVERGED.
    max_iter : Newton iterations (default 100 for "dual", 300 for "primal").
    forcing : largest CG relative residual; the forcing sequence is min(forcing, sqrt(residual)).
    max_cg : CG steps per Newton iteration (default 200 for "dual", 100 for "primal").
    x0 : starting point, an (n, n) positive definite X0 (rescaled to unit diagonal), or for "dual" also
        (n,) positive multipliers d0. Default: from the SVD-bound strategy G^{1/2} (X0 = G^{1/2} rescaled
        to unit diagonal for "primal"; d0 = diag(G^{1/2})^2 for "dual", see `svdb_multipliers`).
    callback : called once per iteration with a dict (nit, fun, dual_bound, gap, and d or X); returning
        True stops the solver (status STALLED, message "stopped by callback").
    time_limit : wall-clock seconds within which the solver stops with TIME_LIMIT: an iteration starts only
        when one as long as the last still ends within it.
    rank_tol : eigenvalues of G below rank_tol * largest are treated as zero.
    theta : "primal" only, regularisation G + theta * mean(diag G) * I applied when G is singular.
    active_tol : "dual" only, relative size below which a multiplier may be frozen at zero.
    damping : "dual" only, Levenberg-Marquardt factor c: Newton systems use H + c ||grad|| diag(H), which
        bounds steps where the dual is degenerate and vanishes at the optimum (superlinear rate kept).

    Returns
    -------
    SolverResult with x = X (n, n) with diag(X) = 1 (in the rare fallback extra["primal_construction"] ==
    "uniform scaling", diag(X) <= 1), fun = trace(G X^{-1}) (pseudo-inverse when X is singular, with
    range(G) in range(X)), dual_bound = certified lower bound on the optimum, gap = relative gap;
    extra["A"] (r, n) is a strategy with A^T A = X, extra["d"] the multipliers of the certificate,
    extra["rank"] = rank of G, extra["history"] per-iteration records.
    """
    check_choice(method, _METHODS, "method")
    dual = method == "dual"
    max_iter = (100 if dual else 300) if max_iter is None else int(max_iter)
    max_cg = (200 if dual else 100) if max_cg is None else int(max_cg)
    check_newton_options(tol, forcing, max_iter, max_cg, damping if dual else 0.0)
    time_limit = check_time_limit(time_limit)
    if not dual and not (np.isfinite(theta) and theta > 0):
        raise ValueError(f"theta must be a positive finite number; got {theta!r}")
    G, c = unit_scale(check_gram(G))
    full = method == "primal" or (x0 is not None and np.ndim(x0) == 2)  # V_full only for these
    V, V_full, _ = range_factor(G, rank_tol=rank_tol, full=full)
    start = None if x0 is None else _check_start(x0, G, V_full, method, c)
    callback = unscaled_callback(callback, c)
    if dual:
        d0 = svdb_multipliers(V) if start is None else start
        del G, V_full  # the dual ascent needs only V
        res = solve_dual(V, tol=tol, max_iter=max_iter, forcing=forcing, max_cg=max_cg, d0=d0,
                         active_tol=active_tol, damping=damping, callback=callback, time_limit=time_limit)
        res.extra["decompositions"]["eigh"] += 1  # G's, in range_factor
        return undo_unit_scale(res, c)
    res = solve_primal(G, V, V_full, tol=tol, max_iter=max_iter, forcing=forcing, max_cg=max_cg,
                       X0=start, theta=theta, callback=callback, time_limit=time_limit)
    return undo_unit_scale(res, c)


def convex_dp_dual_bound(
    G: np.ndarray, d: np.ndarray, *, scaled: bool = True, rank_tol: float = RANK_TOL
) -> float:
    """Lagrangian dual bound of seed 002's problem at multipliers d (derivation in `convex_dp_core`).

    G (n, n) PSD, d (n,) >= 0 not all zero. Returns ||W D^{1/2}||_*^2 / sum(d) (scaled=True, the best
    bound on the ray t * d), or g(d) = 2 ||W D^{1/2}||_* - sum(d) (scaled=False). Either is <= trace(G X^{-1})
    for every positive definite X with diag(X) <= 1. d = 1 gives the SVD bound.
    """
    G, c = unit_scale(check_gram(G))
    d = check_multipliers(d, G.shape[0])
    V, _, _ = range_factor(G, rank_tol=rank_tol)
    return dual_bound_from_factor(V, d, scaled=scaled, scale=c)


def convex_dp_objective(G: np.ndarray, X: np.ndarray) -> float:
    """trace(G X^{-1}) for positive definite X (n, n) by a Cholesky solve (seed 002's objective)."""
    G, c = unit_scale(check_gram(G))
    X = np.asarray(X, dtype=float)
    if X.shape != G.shape:
        raise ValueError(f"X must have the shape of G {G.shape}; got {X.shape}")
    if not np.isfinite(X).all():
        raise ValueError("X must contain only finite values (found NaN or inf)")
    _, V_full, _ = range_factor(G, rank_tol=0.0)
    try:
        return c * objective_from_factor(V_full, (X + X.T) / 2.0)
    except np.linalg.LinAlgError:
        raise ValueError("X must be positive definite (its Cholesky factorisation failed)") from None
