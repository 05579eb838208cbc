"""The eps-DP strategy problem over all strategies, past HDMM's p-Identity template (OPT_0).

Under eps-DP the error of a strategy A with least-squares reconstruction is 2/eps^2 sens1(A)^2
trace(G (A^T A)^{-1}), G = W^T W. The problem is not convex and its optimum is unknown; HDMM (McKenna et
al., VLDB 2018, Section 5) searches the p-Identity family A = [I; Theta] D^{-1}, Theta >= 0. Here every
entry of an r x n strategy is free. Write M = P - N with P, N >= 0 and s = 1^T (P + N) >= the column L1
norms of M; then

    A = M D^{-1},  D = diag(s):   sens1(A) <= 1 (= 1 where P and N have disjoint supports), and
    f(P, N) = trace(C (M^T M)^{-1}) >= trace(G (A^T A)^{-1}) sens1(A)^2 ... at sens1 = 1,   C = D G D,

so f is the eps-DP error (per 2/eps^2) of A rescaled to sens1 = 1, or above it; the returned strategy is
rescaled by its true column norms, which only lowers it. p-Identity is the sub-family P = [I; Theta], N = 0.
With Y = (M^T M)^{-1} and K = Y C (so trace(K) = f and diag(C Y) = diag(K)), the gradients are

    df/dP = -2 M Y C Y + 1_r g^T,   df/dN = +2 M Y C Y + 1_r g^T,   g_j = 2 (G D Y)_jj = 2 K_jj / s_j,

two Cholesky solves with M^T M and three products per evaluation, O(r n^2 + n^3). L-BFGS-B keeps P, N >= 0.
The run starts from given strategies (the best p-Identity, identity, hierarchical, wavelet, or any other)
and returns the best point seen, so it is never worse than its best start.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from scipy.linalg import cho_factor, cho_solve

from dpopt.solvers.lbfgs import LbfgsMonitor, deadline_share, lbfgs_status, minimize_lbfgs
from dpopt.solvers.result import TIME_LIMIT, SolverResult
from dpopt.validation import check_gram

# L-BFGS-B's relative decrease test: f changes by less than FTOL f between iterations. The error is
# reported to 4-6 digits and the runs compared at 1e-4, so 1e-10 stops well past what matters.
FTOL = 1e-10


def l1_strategy_loss_and_grad(m: np.ndarray, G: np.ndarray, r: int) -> tuple[float, np.ndarray]:
    """f = trace(D G D (M^T M)^{-1}), M = P - N, D = diag(1^T (P + N)), and its gradient in (P, N) (module docstring).

    m holds P and N (each r x n, >= 0) one after the other; with N = 0 this is the non-negative family.
    """
    n = G.shape[0]
    P, N = m[: r * n].reshape(r, n), m[r * n:].reshape(r, n)
    M = P - N
    s = (P + N).sum(axis=0)
    if not np.all(s > 0):
        return math.inf, np.zeros_like(m)
    C = G * s[:, None] * s[None, :]
    try:
        F = cho_factor(M.T @ M, lower=True, check_finite=False)
    except np.linalg.LinAlgError:
        return math.inf, np.zeros_like(m)
    K = cho_solve(F, C, check_finite=False)  # Y C
    YCY = cho_solve(F, K.T, check_finite=False)  # Y (C Y)
    YCY = (YCY + YCY.T) / 2
    MK = 2.0 * (M @ YCY)
    g = (2.0 * np.diag(K) / s)[None, :]
    return float(np.trace(K)), np.concatenate([(g - MK).ravel(), (g + MK).ravel()])


def l1_strategy_error(M: np.ndarray, G: np.ndarray) -> float:
    """trace(G (A^T A)^{-1}) for A = M D^{-1} (columns of unit L1 norm), by a Cholesky factor of A^T A."""
    A = normalised_strategy(M)
    F = cho_factor(A.T @ A, lower=True)
    return float(np.trace(cho_solve(F, np.asarray(G, dtype=float))))


def normalised_strategy(M: np.ndarray) -> np.ndarray:
    """A = M D^{-1}, D = diag of M's column L1 norms: the columns scaled to unit L1 norm, sens1(A) = 1 (r x n)."""
    M = np.asarray(M, dtype=float)
    if M.ndim != 2 or not np.all(np.isfinite(M)):
        raise ValueError("M must be a finite 2-D matrix")
    s = np.abs(M).sum(axis=0)
    if not np.all(s > 0):
        raise ValueError("every column of M needs a non-zero entry (a cell no row measures has no estimate)")
    return M / s[None, :]


def optimize_l1_strategy(
    G: np.ndarray,
    starts: Sequence[np.ndarray],
    max_iter: int = 5000,
    time_limit: float | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> SolverResult:
    """Least trace(G (A^T A)^{-1}) over strategies with sens1(A) = 1, refined from each start (module docstring).

    G: (n, n) workload Gram. starts: strategies (r_k x n, any signs), each of full column rank, each refined by
    one L-BFGS-B run over all its entries. time_limit: wall seconds for all runs, each start getting an equal
    share of the time left (a run past its share stops with its best iterate). Returns x = the best A found
    (columns of unit L1 norm), fun = its trace(G (A^T A)^{-1}) by `l1_strategy_error`, extra["start_errors"]
    and extra["run_errors"] for every start run (its start's error and the error it reached).
    """
    G = check_gram(G)
    if len(starts) == 0:
        raise ValueError("optimize_l1_strategy needs at least one start")
    n = G.shape[0]
    scale = float(np.trace(G)) / n
    Gs = G / scale
    t0, c0 = time.perf_counter(), time.process_time()
    deadline = None if time_limit is None else t0 + float(time_limit)
    best: tuple[float, np.ndarray, str, int, str] | None = None
    start_errors, run_errors, nit, runs, capped = [], [], 0, 0, False
    for k, S in enumerate(starts):
        S = normalised_strategy(S)
        if S.shape[1] != n:
            raise ValueError(f"start {k} has {S.shape[1]} columns; the Gram has {n}")
        if k > 0 and deadline is not None and time.perf_counter() >= deadline:
            capped = True
            break
        r = S.shape[0]
        x0 = np.concatenate([np.maximum(S, 0.0).ravel(), np.maximum(-S, 0.0).ravel()])
        f0 = l1_strategy_loss_and_grad(x0, Gs, r)[0]
        if not math.isfinite(f0):
            raise ValueError(f"start {k} is not of full column rank")
        # each start gets an equal share of the time left, so a slow first run cannot crowd out the others
        monitor = LbfgsMonitor(x0, deadline_share(deadline, len(starts) - k), progress,
                               f"l1 strategy start {k + 1}/{len(starts)}", nit)
        monitor.best_fun = f0
        res = minimize_lbfgs(l1_strategy_loss_and_grad, x0, monitor, args=(Gs, r), bounds=[(0.0, None)] * x0.size,
                             maxiter=max_iter, ftol=FTOL, gtol=1e-12, maxcor=20)
        runs += 1
        nit += int(res.nit)
        x = np.maximum(res.x, 0.0)
        M = x[: r * n].reshape(r, n) - x[r * n:].reshape(r, n)
        err = l1_strategy_error(M, G)
        start_errors.append(l1_strategy_error(S, G))
        if start_errors[-1] < err:  # never worse than the start (the loss is evaluated in a cheaper form)
            M, err = S, start_errors[-1]
        run_errors.append(err)
        capped = capped or monitor.stopped
        status = lbfgs_status(monitor.stopped, res.success, res.nit, max_iter)
        if best is None or err < best[0]:
            best = (err, M, status, int(res.nit), str(res.message))
    assert best is not None
    err, M, status, best_nit, message = best
    if capped:
        status = TIME_LIMIT
    return SolverResult.since(
        t0, c0, x=normalised_strategy(M), fun=err, status=status,
        message=f"best of {runs} L-BFGS-B runs from {len(starts)} starts: {message}", nit=nit,
        extra={"start_errors": start_errors, "run_errors": run_errors, "runs": runs, "best_run_iterations": best_nit},
    )
