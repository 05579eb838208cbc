"""p-Identity strategies for eps-DP (HDMM, McKenna et al. VLDB 2018, Section 5, OPT_0), written from the paper.

A = [I; Theta] D^{-1} with Theta (p x n) >= 0 and D = diag(1 + 1^T Theta): every column of A has L1 norm
exactly 1, so sens1(A) = 1 and the eps-DP error is 2/eps^2 * trace(G (A^T A)^{-1}), G = W^T W.

With M = I + Theta^T Theta, s = 1 + Theta^T 1, C = D G D and R = (I_p + Theta Theta^T)^{-1} (Woodbury:
M^{-1} = I - Theta^T R Theta, and Theta M^{-1} = R Theta):
  loss  f = trace(C M^{-1}) = trace(C) - <R Theta, Theta C>
  grad  df/dTheta = -2 Theta M^{-1} C M^{-1} + 1_p g^T,  g_k = 2 (G D M^{-1})_kk,
all in O(p n^2) time and O(n^2 + p n) memory per evaluation.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy.linalg import cho_factor, cho_solve

from dpopt.solvers.lbfgs import LbfgsMonitor, deadline_share, lbfgs_status, minimize_lbfgs
from dpopt.solvers.result import SolverResult
from dpopt.validation import as_generator, check_gram, check_positive_int


def pidentity_matrix(Theta: np.ndarray) -> np.ndarray:
    """A = [I; Theta] D^{-1} ((n + p) x n), columns of unit L1 norm (HDMM Section 5)."""
    Theta = np.asarray(Theta, dtype=float)
    if Theta.ndim != 2 or np.any(Theta < 0) or not np.all(np.isfinite(Theta)):
        raise ValueError("Theta must be a finite non-negative p x n matrix")
    s = 1.0 + Theta.sum(axis=0)
    return np.vstack([np.eye(Theta.shape[1]), Theta]) / s[None, :]


def pidentity_loss_and_grad(theta: np.ndarray, G: np.ndarray, p: int) -> tuple[float, np.ndarray]:
    """trace(G (A^T A)^{-1}) for the p-Identity strategy with parameters theta (p*n,) and its gradient."""
    n = G.shape[0]
    Th = theta.reshape(p, n)
    s = 1.0 + Th.sum(axis=0)
    C = G * s[:, None] * s[None, :]
    R = np.linalg.inv(np.eye(p) + Th @ Th.T)
    RTh = R @ Th
    ThC = Th @ C
    loss = float(np.trace(C) - np.einsum("ij,ij->", RTh, ThC))
    Y = R @ ThC  # R Theta C = Theta M^{-1} C
    ThK = Y - (Y @ Th.T) @ RTh  # Theta M^{-1} C M^{-1}
    Z = (G * s[None, :]) @ Th.T  # G D Theta^T (n x p)
    g = 2.0 * (np.diag(G) * s - np.einsum("kq,qk->k", Z, RTh))
    grad = -2.0 * ThK + g[None, :]
    return loss, grad.ravel()


def pidentity_error(Theta: np.ndarray, G: np.ndarray) -> float:
    """trace(G (A^T A)^{-1}) for A = pidentity_matrix(Theta), by Cholesky of A^T A (HDMM Section 5).

    The Woodbury loss above subtracts two terms of size trace(D G D) and solves with I + Theta
    Theta^T, whose condition grows with Theta^2: its relative error reaches 1e-8 at n = 256, p = 16.
    A^T A = D^{-1} (I + Theta^T Theta) D^{-1} is well conditioned (columns of unit L1 norm, the
    identity block bounds its smallest eigenvalue away from 0), so this is accurate to
    O(n cond(A^T A) eps_mach) relative; O(n^3), used once per result, not per iteration.
    """
    A = pidentity_matrix(Theta)
    G = np.asarray(G, dtype=float)
    factor = cho_factor(A.T @ A, lower=True)
    return float(np.trace(cho_solve(factor, G)))


def optimize_pidentity(
    G: np.ndarray,
    p: int,
    restarts: int = 4,
    seed: int | np.random.Generator | None = 0,
    max_iter: int = 20_000,
    ftol: float = 1e-10,
    deadline: float | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> SolverResult:
    """HDMM OPT_0: best p-Identity strategy for Gram G (n x n) over `restarts` seeded L-BFGS-B runs.

    max_iter, ftol: L-BFGS-B iterations per restart and its relative-decrease test. Measured at p = 16, two
    restarts: with ftol 1e-10 AllRange(256) converges in 21,524 iterations in all and Prefix(256) in 8,244; at
    ftol 1e-12 AllRange stalls in its line search after 28,825 and gains only 5.5e-6 relative (Prefix 1.1e-5),
    far below the 1e-3 spread between restarts. A time budget bounds larger domains.
    Returns SolverResult with x = Theta (p x n), fun = trace(G (A^T A)^{-1}) (sens1 = 1, evaluated by
    `pidentity_error`), status CONVERGED when the best run met L-BFGS-B's tolerance;
    extra["losses"] lists every restart's final loss as the optimiser saw it (Woodbury form).

    deadline: a `time.perf_counter()` value, shared equally among the restarts left. A run past its share
    stops at its next iteration with its best iterate so far; restarts past the deadline are skipped (the
    first run always makes one iteration, so there is a Theta to return; every Theta >= 0 is a valid
    strategy); the status is then TIME_LIMIT.
    progress: called after each L-BFGS-B iteration with {"iteration", "stage"}.
    """
    G = check_gram(G)
    check_positive_int(p, "p")
    if restarts < 1:
        raise ValueError(f"restarts must be >= 1, got {restarts}")
    n = G.shape[0]
    rng = as_generator(seed)
    scale = float(np.trace(G)) / n
    Gs = G / scale
    t0, c0 = time.perf_counter(), time.process_time()
    best: tuple[float, np.ndarray, bool, int, str] | None = None  # (loss, x, success, nit, message)
    losses, nit, runs, capped = [], 0, 0, False
    for k in range(restarts):
        if k > 0 and deadline is not None and time.perf_counter() >= deadline:
            capped = True
            break
        x0 = rng.random(p * n)
        # each restart gets an equal share of the time left: the spread between restarts (1e-3 relative) is
        # far larger than what a long tail of iterations gains (1e-5), so no restart may crowd out the rest
        monitor = LbfgsMonitor(x0, deadline_share(deadline, restarts - k), progress,
                               f"p-identity restart {k + 1}/{restarts}", nit)
        res = minimize_lbfgs(pidentity_loss_and_grad, x0, monitor, args=(Gs, p), bounds=[(0.0, None)] * (p * n),
                             maxiter=max_iter, ftol=ftol, gtol=1e-10)
        runs += 1
        fun, x = float(res.fun), np.maximum(res.x, 0.0)
        losses.append(fun * scale)
        nit += int(res.nit)
        capped = capped or monitor.stopped
        message = "stopped at the time limit" if monitor.stopped else str(res.message)
        if best is None or fun < best[0]:
            best = (fun, x, bool(res.success) and not monitor.stopped, int(res.nit), message)
    assert best is not None
    _, x, success, best_nit, best_message = best
    status = lbfgs_status(capped, success, best_nit, max_iter)
    note = f"best of {runs} L-BFGS-B restarts" + (f" ({restarts - runs} skipped at the time limit)"
                                                  if runs < restarts else "")
    if capped and runs == restarts:
        note += " (time limit reached)"
    return SolverResult.since(t0, c0, x=x.reshape(p, n), fun=pidentity_error(x.reshape(p, n), G), status=status,
                              message=f"{note}: {best_message}", nit=nit,
                              extra={"losses": losses, "restarts_run": runs})
