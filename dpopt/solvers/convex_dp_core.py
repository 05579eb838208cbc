"""Shared mathematics of the (eps, delta) strategy problem of seed 002 (Appendix 1.1).

The problem (P = 1; multiply by P(eps, delta) for total error):

    minimise  f(X) = trace(G X^+)   over X PSD with range(G) in range(X),   subject to  diag(X) <= 1,

where G = W^T W (n x n). A strategy A with A^T A = X has sens2(A) <= 1 and total squared error
||W A^+||_F^2 = f(X). For positive definite X this is trace(G X^{-1}); the constraint is met with equality
at an optimum wherever its multiplier is positive (f decreases as X grows).

Lagrangian dual (the certificate). Let V (k x n) be any factor with V^T V = G and d >= 0, D = diag(d).
For feasible X, f(X) >= f(X) + sum_i d_i (X_ii - 1) = trace(V X^+ V^T) + trace(D X) - sum(d). With
P = (X^+)^{1/2} V^T and Q = X^{1/2} D^{1/2}, P^T Q = V D^{1/2} (range condition), and
||P^T Q||_* <= ||P||_F ||Q||_F <= (||P||_F^2 + ||Q||_F^2) / 2, hence

    f(X) >= g(d) = 2 ||V D^{1/2}||_* - sum(d) = 2 trace((D^{1/2} G D^{1/2})^{1/2}) - sum(d),

with equality for X(d) = V^T (V D V^T)^{-1/2} V, which solves X D X = G. Since g(t d) = 2 sqrt(t) phi - t s
(phi = ||V D^{1/2}||_*, s = sum(d)) is maximised at sqrt(t) = phi / s, every d >= 0 certifies

    OPT >= phi(d)^2 / sum(d).                                               (scaled dual bound)

At d = 1 this is Li & Miklau's SVD bound (seed 004, Def. 4.1 / Prop. 4.3): the SVD bound is the dual
function at uniform multipliers, and maximising over d closes the gap (strong duality: 0.5 I is strictly
feasible). The gradient of g is diag(X(d)) - 1, so the optimal X(d*) has unit diagonal, and
f(X(d)) = phi(d) exactly (proof: X(d)^+ = V^+ (V D V^T)^{1/2} (V^T)^+ for V of full row rank).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.linalg as sla
import scipy.sparse.linalg as spla

from dpopt.solvers.result import CONVERGED, STALLED, SolverResult
from dpopt.validation import check_psd

#: Eigenvalues of G below RANK_TOL * max eigenvalue are treated as zero (G singular).
RANK_TOL = 1e-12


def range_factor(
    G: np.ndarray, *, rank_tol: float = RANK_TOL, psd_rtol: float = 1e-8, full: bool = True
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """Factor G = V^T V restricted to the range of G.

    Returns (V, V_full, lam): V has shape (k, n) with orthogonal rows, k = numerical rank of G
    (eigenvalues above rank_tol * max eigenvalue); V_full (n, n) keeps every eigen-direction (round-off
    negatives clipped to 0), so V_full^T V_full = G to working accuracy (None when full=False, which
    saves an n x n array); lam (n,) are the eigenvalues of G in ascending order.
    Raises ValueError if G has an eigenvalue below -psd_rtol * max eigenvalue (not PSD).
    """
    lam, Q = np.linalg.eigh(G)
    top = float(lam[-1])
    if top <= 0.0:
        raise ValueError("G must be positive semidefinite with a positive eigenvalue; its largest eigenvalue is <= 0")
    check_psd(lam, "G", psd_rtol, top)
    keep = lam > rank_tol * top
    if full:
        V_full = (Q * np.sqrt(np.clip(lam, 0.0, None))).T
        return np.ascontiguousarray(V_full[keep]), V_full, lam
    V = np.ascontiguousarray(Q[:, keep].T)
    del Q
    V *= np.sqrt(lam[keep])[:, None]
    return V, None, lam


def check_newton_options(tol: float, forcing: float, max_iter: int, max_cg: int, damping: float) -> None:
    """Refuse tol not finite and > 0, forcing outside (0, 1), max_iter < 0, max_cg < 1, damping not finite >= 0."""
    if not (np.isfinite(tol) and tol > 0):
        raise ValueError(f"tol must be a positive finite number; got {tol!r}")
    if not (0 < forcing < 1):
        raise ValueError(f"forcing must lie in (0, 1); got {forcing!r}")
    if max_iter < 0 or max_cg < 1:
        raise ValueError(f"max_iter must be >= 0 and max_cg >= 1; got {max_iter}, {max_cg}")
    if not (np.isfinite(damping) and damping >= 0):
        raise ValueError(f"damping must be a finite number >= 0; got {damping!r}")


def check_multipliers(d: np.ndarray, n: int) -> np.ndarray:
    """Validate dual multipliers d (n,), d >= 0 finite and not all zero; return them as float64."""
    d = np.asarray(d, dtype=float)
    if d.shape != (n,):
        raise ValueError(f"multipliers d must have shape ({n},) to match G; got {d.shape}")
    if not np.isfinite(d).all():
        raise ValueError("multipliers d must be finite (found NaN or inf)")
    if (d < 0).any():
        raise ValueError(f"multipliers d must be >= 0; smallest is {d.min():.3e}")
    if not (d > 0).any():
        raise ValueError("multipliers d must not all be zero")
    return d


def scaled_nuclear_norm(V: np.ndarray, d: np.ndarray) -> float:
    """phi(d) = ||V D^{1/2}||_* by singular values (accurate for small ones, unlike sqrt(eig))."""
    return float(sla.svdvals(V * np.sqrt(d), check_finite=False).sum())


def dual_bound_from_factor(V: np.ndarray, d: np.ndarray, *, scaled: bool = True, scale: float = 1.0) -> float:
    """Lagrangian dual of the seed 002 problem at multipliers d (derivation in this module's docstring).

    V (k, n) with V^T V = G / scale; d (n,) >= 0. Returns phi^2 / sum(d) if scaled (the best bound on the
    ray t * d), else g(d) = 2 phi - sum(d), phi = ||G^{1/2} D^{1/2}||_*. Both are lower bounds on
    min trace(G X^{-1}) s.t. diag(X) <= 1. d is normalised by its largest entry first (no overflow).
    """
    d_max = float(d.max())
    phi = scaled_nuclear_norm(V, d / d_max)  # = ||(G / scale)^{1/2} (D / d_max)^{1/2}||_*
    if scaled:
        return scale * phi * phi / float((d / d_max).sum())
    return 2.0 * np.sqrt(scale * d_max) * phi - float(d.sum())


#: First shift tried, as a multiple of the Lanczos estimate of -lambda_min(W W^T - I) (a Ritz value, so
#: never above the true one; tol 1e-2); each failed Cholesky test doubles the shift.
_SHIFT_SAFETY = 1.25
#: Largest shift tried before `nuclear_norm_lower_bound` gives up (the bound would lose > 0.5e-3).
_SHIFT_MAX = 1e-3
#: Up to this k the estimate of lambda_min(F) is a dense eigenvalue solve (Lanczos needs k > 1).
_DENSE_ESTIMATE_MAX = 256


def _proves_psd(F: np.ndarray, tau: float) -> bool:
    """True when the Cholesky factorisation of F + tau I (F symmetric k x k) succeeds: then F + tau I + E
    is PSD with |E| <= gamma_{k+1} |R^T| |R| (Demmel), a term `nuclear_norm_lower_bound` covers by its margin."""
    A = F.copy()
    A[np.diag_indices_from(A)] += tau
    _, info = sla.lapack.dpotrf(A, lower=1, overwrite_a=1, clean=0)
    return info == 0


def nuclear_norm_lower_bound(Z: np.ndarray, d: np.ndarray) -> float | None:
    """Lower bound on ||Z D^{1/2}||_* from nearly orthogonal rows (Ostrowski: s_i(diag(r) W) >= r_i s_min(W)).

    Z (k, n) = U^T V for the eigenvectors U of V D V^T, so N = Z D^{1/2} has orthogonal rows up to
    round-off: N = diag(r) W with r the row norms and W W^T = I + F, F small. By Ostrowski's theorem
    sigma_i(N)^2 = lambda_i(diag(r) W W^T diag(r)) >= lambda_min(W W^T) r_(i)^2, hence

        ||N||_* >= sqrt(1 - tau - mu) * sum(r)   whenever  F + tau I is positive semidefinite,

    proven by a Cholesky factorisation (`_proves_psd`) at tau = 1.25 x a Lanczos estimate of -lambda_min(F),
    then 2 tau, 4 tau, ... up to _SHIFT_MAX. mu = 2 k max(k, n) eps covers the rounding of F = fl(W W^T) - I
    (|dF| <= gamma_n entrywise, so ||dF||_2 <= k gamma_n), of the Cholesky test, and ||U||_2 - 1 (a
    computed eigenbasis is orthogonal to O(k eps)); the remaining rounding (of Z and of r) is an absolute
    O(k eps ||N||) per singular value, the order of a backward-stable SVD's. Costs one k x n by n x k
    product and a Cholesky, against an SVD (bidiagonalisation) of N. Returns None when no shift passes.
    """
    return orthogonal_rows_nuclear_lower_bound(Z * np.sqrt(d))


def orthogonal_rows_nuclear_lower_bound(N: np.ndarray) -> float | None:
    """Lower bound on ||N||_* for N (k, n) whose rows are orthogonal up to round-off (`nuclear_norm_lower_bound`'s
    bound and margins; N is overwritten). Returns None when no shift passes."""
    k, n = N.shape
    r = np.sqrt(np.einsum("an,an->a", N, N))
    if not (r > 0).all():
        return None
    N /= r[:, None]
    F = N @ N.T
    del N
    F[np.diag_indices_from(F)] -= 1.0
    mu = 2.0 * k * max(k, n) * np.finfo(float).eps
    try:
        if k <= _DENSE_ESTIMATE_MAX:
            est = float(sla.eigvalsh(F, subset_by_index=(0, 0), check_finite=False)[0])
        else:
            est = float(spla.eigsh(F, k=1, which="SA", tol=1e-2, return_eigenvectors=False)[0])
    except (spla.ArpackNoConvergence, spla.ArpackError, np.linalg.LinAlgError):
        est = -float(np.abs(F).sum(axis=1).max())  # Gershgorin
    tau = max(_SHIFT_SAFETY * max(-est, 0.0), mu)
    while tau <= _SHIFT_MAX:
        if _proves_psd(F, tau):
            return float(np.sqrt(max(1.0 - tau - mu, 0.0)) * r.sum())
        tau *= 2.0
    return None


#: Rows of V per triangular solve in `objective_from_factor` (caps its temporary at this many x n).
OBJECTIVE_BLOCK = 512


def objective_from_factor(V: np.ndarray, X: np.ndarray) -> float:
    """f(X) = trace(G X^{-1}) = ||L^{-1} V^T||_F^2 with X = L L^T (Cholesky; no explicit inverse).

    V (k, n) with V^T V = G; X (n, n) positive definite. The triangular solves take OBJECTIVE_BLOCK rows
    of V at a time, so the temporary is at most OBJECTIVE_BLOCK x n. Raises numpy/scipy LinAlgError if X
    is not numerically positive definite.
    """
    L = sla.cholesky(X, lower=True, check_finite=False)
    total = 0.0
    for a in range(0, V.shape[0], OBJECTIVE_BLOCK):
        Y = sla.solve_triangular(L, V[a : a + OBJECTIVE_BLOCK].T, lower=True, check_finite=False)
        total += float(np.einsum("ij,ij->", Y, Y))
    return total


def certified_status(status: str, message: str, gap: float, tol: float) -> tuple[str, str]:
    """Final status from the recomputed certificate: CONVERGED exactly when gap <= tol."""
    if gap <= tol and status != CONVERGED:
        return CONVERGED, f"certified relative gap {gap:.2e} <= tol {tol:.1e} ({message})"
    if gap > tol and status == CONVERGED:
        return STALLED, f"estimated gap met tol but the recomputed certificate gives {gap:.2e} > tol {tol:.1e}"
    return status, message


def unit_scale(G: np.ndarray) -> tuple[np.ndarray, float]:
    """(G / c, c) with c = max|G|: solvers work on a unit-scale G (no overflow at 1e200, no underflow)."""
    c = float(np.max(np.abs(G)))
    return G / c, c


def undo_unit_scale(res: SolverResult, c: float) -> SolverResult:
    """Map a result for G / c back to G: values and multipliers scale by c, X and weights do not."""
    res.fun *= c
    if res.dual_bound is not None:
        res.dual_bound *= c
    extra = res.extra
    for key in ("d", "y", "eigenvalues"):
        if extra.get(key) is not None:
            extra[key] = extra[key] * c
    for key in ("regularised_fun", "completed_fun"):
        if key in extra:
            extra[key] *= c
    if "regularisation" in extra:
        extra["regularisation"]["added"] *= c
    for record in extra.get("history", []):
        for key in ("primal", "dual", "fun"):
            if key in record:
                record[key] *= c
    return res


def unscaled_callback(
    callback: Callable[[dict[str, Any]], bool | None] | None, c: float
) -> Callable[[dict[str, Any]], bool | None] | None:
    """Wrap a user callback so it sees values for G, not G / c."""
    if callback is None:
        return None

    def wrapped(info: dict[str, Any]) -> bool | None:
        info = dict(info)
        for key in ("fun", "dual_bound", "d"):
            if key in info:
                info[key] = info[key] * c
        return callback(info)

    return wrapped
