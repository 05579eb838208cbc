"""First-order matrix-mechanism solver of seed 000, Appendix B (smoothed max-diagonal + SPG).

Problem (Appendix B, the program after Formula (13)), with G = W^T W (n x n):

    minimise  F(M) = max(diag M) * tr(G M^{-1})  over symmetric positive definite M (n x n).

F is the (eps, delta) matrix-mechanism error of any strategy A with A^T A = M, up to the factor
P(eps, delta): sens2(A)^2 = max diag(M) and ||W A^+||_F^2 = tr(G M^{-1}). F(c M) = F(M) for c > 0,
so its minimum equals min tr(G X^{-1}) s.t. diag(X) <= 1 (seed 002's convex program).

Parameterisation (stated once, used throughout): M itself, restricted to the closed convex set

    C = {M symmetric : tr(M) = n, lambda_min(M) >= floor},

which loses nothing because F is scale-invariant, keeps M positive definite (floor > 0), and makes
the smoothing width mu meaningful (the diagonal averages 1, so max diag M >= 1). The Frobenius
projection onto C is spectral: project the eigenvalues onto {lambda_i >= floor, sum lambda_i = n}.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy.linalg import cho_factor, cho_solve, eigh

from dpopt.solvers.result import CONVERGED, MAX_ITER, STALLED, TIME_LIMIT, SolverResult


def smooth_max(v: np.ndarray, mu: float) -> tuple[float, np.ndarray]:
    """Seed 000, Appendix B, Eq. (14)-(15) in the stable form: log-sum-exp smoothing of max(v).

    f_mu(v) = max(v) + mu log sum_i exp((v_i - max v) / mu), with max(v) <= f_mu(v) <= max(v) + mu
    log n; its gradient is the softmax exp((v_i - max v) / mu) / sum_j exp((v_j - max v) / mu).
    Returns (f_mu(v), gradient (n,)).
    """
    vmax = float(np.max(v))
    e = np.exp((v - vmax) / mu)
    z = float(e.sum())
    return vmax + mu * math.log(z), e / z


def project_trace_floor(X: np.ndarray, trace: float, floor: float) -> np.ndarray:
    """Frobenius projection of sym(X) (n x n) onto {M : tr M = trace, lambda_min(M) >= floor}.

    With sym(X) = V diag(lam) V^T, the projection is V diag(max(lam - tau, floor)) V^T, where tau
    solves sum_i max(lam_i - tau, floor) = trace (exactly, by sorting). Requires trace >= n floor.
    """
    n = X.shape[0]
    lam, V = eigh(0.5 * (X + X.T))
    # sum_i max(lam_i - tau, floor) is continuous and decreasing in tau; find the breakpoint interval.
    y = lam - floor
    target = trace - n * floor
    ys = np.sort(y)[::-1]
    cs = np.cumsum(ys)
    k = np.arange(1, n + 1)
    tau_k = (cs - target) / k
    valid = np.nonzero(ys > tau_k)[0]
    # valid is a non-empty prefix in exact arithmetic (k = 1 always qualifies); rounding can empty it
    # for enormous trial steps, where the limit is all mass on the top eigenvalue.
    j = int(valid.max()) if valid.size else 0
    tau = tau_k[j]
    lam_new = np.maximum(y - tau, 0.0) + floor
    return (V * lam_new) @ V.T


def objective_parts(M: np.ndarray, G: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """tr(G M^{-1}), its gradient -M^{-1} G M^{-1} (n x n) and diag(M), by a Cholesky factor of M."""
    cf = cho_factor(M, lower=True, check_finite=False)
    MinvG = cho_solve(cf, G, check_finite=False)  # M^{-1} G
    t = float(np.trace(MinvG))
    grad_t = -cho_solve(cf, MinvG.T, check_finite=False)  # -M^{-1} G M^{-1} (G symmetric)
    return t, 0.5 * (grad_t + grad_t.T), np.diag(M).copy()


def smoothed_value(M: np.ndarray, G: np.ndarray, mu: float) -> float:
    """F_mu(M) = f_mu(diag M) * tr(G M^{-1}) (seed 000, Appendix B, Eq. (14) applied to diag M)."""
    t, _, d = objective_parts(M, G)
    return smooth_max(d, mu)[0] * t


def unsmoothed(M: np.ndarray, G: np.ndarray) -> float:
    """F(M) = max(diag M) * tr(G M^{-1}) (seed 000, Appendix B, before smoothing)."""
    t, _, d = objective_parts(M, G)
    return float(d.max()) * t


def strategy_from_gram(M: np.ndarray) -> np.ndarray:
    """Seed 000, Appendix B: A = sum_i sqrt(lam_i) v_i v_i^T (symmetric square root of M, n x n),
    scaled so that its largest column L2 norm is 1 (sens2(A) = 1)."""
    lam, V = eigh(0.5 * (M + M.T))
    A = (V * np.sqrt(np.maximum(lam, 0.0))) @ V.T
    return A / math.sqrt(float(np.max(np.sum(A * A, axis=0))))


def _check_G(G: Any) -> np.ndarray:
    if hasattr(G, "gram") and callable(G.gram):
        G = G.gram()
    G = np.asarray(G, dtype=float)
    if G.ndim != 2 or G.shape[0] != G.shape[1] or G.shape[0] == 0:
        raise ValueError(f"G must be a square n x n Gram matrix W^T W; got shape {G.shape}")
    if not np.isfinite(G).all():
        raise ValueError("G must contain only finite values (found NaN or inf)")
    scale = max(1.0, float(np.abs(G).max()))
    if np.abs(G - G.T).max() > 1e-10 * scale:
        raise ValueError("G must be symmetric (G = W^T W)")
    lam_min = float(np.linalg.eigvalsh(0.5 * (G + G.T)).min())
    if lam_min < -1e-9 * scale:
        raise ValueError(f"G must be positive semidefinite; smallest eigenvalue is {lam_min:.3e}")
    if not np.any(G):
        raise ValueError("G must be non-zero")
    return 0.5 * (G + G.T)


def spg(
    M: np.ndarray,
    evaluate: Callable[[np.ndarray], tuple[float, np.ndarray]],
    project: Callable[[np.ndarray], np.ndarray],
    *,
    tol: float,
    max_iter: int,
    memory: int = 10,
    deadline: float | None = None,
    callback: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Non-monotone spectral projected gradient, SPG2 of Birgin, Martinez and Raydan (2000).

    From a feasible M: d = P(M - alpha g) - M with the Barzilai-Borwein step alpha = <s,s>/<s,y>
    (alpha_max = 1e30 when <s,y> <= 0; alpha in [1e-30, 1e30]; alpha_0 = 1/||P(M - g) - M||_inf),
    then lam = 1, 1/2, ... (safeguarded quadratic interpolation within [0.1 lam, 0.9 lam]) until
    f(M + lam d) <= max(last `memory` values of f) + 1e-4 lam <g, d>. The segment stays in the convex
    feasible set. Stops when ||P(M - g) - M||_F <= tol (CONVERGED), at max_iter (MAX_ITER), at the
    deadline (TIME_LIMIT, perf_counter seconds) or when the line search cannot decrease f (STALLED).

    evaluate(M) returns (f, gradient) and may raise numpy.linalg.LinAlgError for an infeasible trial.
    Returns a dict with M, f, g, pg (final projected-gradient norm), nit, nevals, status, message.
    """
    gamma_ls, sigma1, sigma2, a_min, a_max = 1e-4, 0.1, 0.9, 1e-30, 1e30
    f, g = evaluate(M)
    step = project(M - g) - M
    pg = float(np.linalg.norm(step))
    alpha = min(a_max, max(a_min, 1.0 / max(float(np.abs(step).max()), 1e-300)))
    recent = [f]
    nevals = 1
    status, message = MAX_ITER, f"reached max_iter={max_iter}"
    k = 0
    while True:
        if pg <= tol:
            status, message = CONVERGED, f"projected gradient norm {pg:.2e} <= tol={tol:g}"
            break
        if k >= max_iter:
            break
        if deadline is not None and time.perf_counter() > deadline:
            status, message = TIME_LIMIT, "time limit reached"
            break
        k += 1
        d = project(M - alpha * g) - M
        gd = float(np.vdot(g, d))
        if not gd < 0.0:
            status, message = STALLED, "projected step is not a descent direction (rounding level)"
            break
        fmax = max(recent)
        lam = 1.0
        while True:
            Mn = M + lam * d
            try:
                fn, gn = evaluate(Mn)
            except np.linalg.LinAlgError:  # rounding made the trial indefinite: reject it
                fn, gn = math.inf, g
            nevals += 1
            if fn <= fmax + gamma_ls * lam * gd:
                break
            denom = fn - f - lam * gd
            lam_q = -0.5 * lam * lam * gd / denom if np.isfinite(denom) and denom > 0 else -1.0
            lam = lam_q if sigma1 * lam <= lam_q <= sigma2 * lam else 0.5 * lam
            if lam < 1e-20:
                break
        if lam < 1e-20:
            status, message = STALLED, "line search failed to decrease the objective"
            break
        sv, yv = Mn - M, gn - g
        sy = float(np.vdot(sv, yv))
        alpha = a_max if sy <= 0 else min(a_max, max(a_min, float(np.vdot(sv, sv)) / sy))
        M, f, g = Mn, fn, gn
        recent.append(f)
        if len(recent) > memory:
            recent.pop(0)
        pg = float(np.linalg.norm(project(M - g) - M))
        if callback is not None:
            callback({"k": k, "f": f, "pg_norm": pg, "M": M})
    return {"M": M, "f": f, "g": g, "pg": pg, "nit": k, "nevals": nevals,
            "status": status, "message": message}


def solve_appendix_b(
    G: Any,
    *,
    mu: float | None = None,
    mu_start: float = 1e-1,
    max_iter: int = 20000,
    tol: float = 1e-5,
    memory: int = 10,
    floor: float = 1e-10,
    x0: np.ndarray | None = None,
    callback: Callable[[dict[str, Any]], None] | None = None,
    time_limit: float | None = None,
) -> SolverResult:
    """Seed 000, Appendix B: smoothed max-diagonal objective minimised by non-monotone SPG.

    The smoothed objective F_mu(M) = f_mu(diag M) tr(G M^{-1}) (f_mu from Eq. (14), `smooth_max`,
    gradient f_mu * (-M^{-1} G M^{-1}) + tr(G M^{-1}) Diag(softmax), Eq. (15)) is minimised over
    the set C of the module docstring by `spg`. Because a small mu makes F_mu badly conditioned,
    mu is reached by continuation: stages mu_start, mu_start / 10, ... down to mu, each started from
    the previous stage's M (mu_start <= mu gives a single stage). In each stage the objective is
    divided by its value at the stage's start, so tol is scale-free.

    Stopping rule: the last stage (mu) ends with ||P(M - grad) - M||_F <= tol for the normalised
    objective (Birgin et al.'s projected-gradient test, Frobenius norm): CONVERGED. Earlier stages
    use the same test. Otherwise max_iter (total over stages; MAX_ITER), time_limit (TIME_LIMIT),
    or a line search that cannot decrease (STALLED).

    Parameters
    ----------
    G : Gram matrix W^T W (n x n, symmetric PSD) or a workload with .gram().
    mu : final smoothing width; default 1e-3 / log(n) (n >= 2), the paper's mu = eps / log n with
        eps = 1e-3: since max diag M >= 1 on C, f_mu overestimates max diag M by a relative <= 1e-3.
        Measured against the SDP optimum (n = 8..16, full-rank G), the unsmoothed F at the end is
        high by about mu relatively (1e-4 to 3.5e-4 with the default); a smaller mu buys accuracy
        with many more iterations.
    floor : smallest eigenvalue allowed for M (relative to tr M = n; matters when G is singular).
    x0 : starting M (n x n symmetric positive definite); default the identity (noise on data); it is
        rescaled to trace n and projected onto C.
    callback : called after each SPG iteration with a dict (k, f, pg_norm, M, mu).

    Returns
    -------
    SolverResult with x = A (n x n, the symmetric square root of M scaled to max column L2 norm 1),
    fun = the unsmoothed F(M) = max(diag M) tr(G M^{-1}), nit = SPG iterations over all stages,
    ninner = objective evaluations, and extra: M (scaled to max diag 1, so fun = tr(G M^{-1})),
    fun_smoothed, mu, stages (per stage: mu, iterations, status, unsmoothed F), pg_norm.
    """
    t_wall, t_cpu = time.perf_counter(), time.process_time()
    G = _check_G(G)
    n = G.shape[0]
    if mu is None:
        mu = 1e-3 / math.log(n) if n >= 2 else 1e-3
    for name, val in (("mu", mu), ("mu_start", mu_start), ("tol", tol), ("floor", floor)):
        if isinstance(val, bool) or not isinstance(val, int | float) or not (
            np.isfinite(val) and val > 0
        ):
            raise ValueError(f"{name} must be a finite number > 0; got {val!r}")
    if floor >= 1.0:
        raise ValueError(f"floor must be < 1 (M has trace n); got {floor!r}")
    for name, val in (("max_iter", max_iter), ("memory", memory)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ValueError(f"{name} must be a positive integer; got {val!r}")
    if time_limit is not None and not (isinstance(time_limit, int | float) and time_limit > 0):
        raise ValueError(f"time_limit must be None or a number of seconds > 0; got {time_limit!r}")

    if x0 is None:
        M = np.eye(n)
    else:
        M0 = np.asarray(x0, dtype=float)
        if M0.shape != (n, n) or not np.isfinite(M0).all():
            raise ValueError(f"x0 must be a finite {n} x {n} matrix M; got shape {M0.shape}")
        if np.abs(M0 - M0.T).max() > 1e-10 * max(1.0, float(np.abs(M0).max())):
            raise ValueError("x0 must be symmetric")
        if np.linalg.eigvalsh(0.5 * (M0 + M0.T)).min() <= 0:
            raise ValueError("x0 must be positive definite")
        M = M0 * (n / np.trace(M0))
    M = project_trace_floor(M, float(n), floor)

    def project(X: np.ndarray) -> np.ndarray:
        return project_trace_floor(X, float(n), floor)

    stages = []
    m_k = float(mu_start)
    while m_k > mu * (1 + 1e-12):
        stages.append(m_k)
        m_k /= 10.0
    stages.append(float(mu))

    deadline = None if time_limit is None else t_wall + time_limit
    nit = nevals = 0
    out: dict[str, Any] = {}
    stage_log = []
    for mu_k in stages:
        scale = smoothed_value(M, G, mu_k)

        def evaluate(X: np.ndarray, mu_k: float = mu_k, scale: float = scale
                     ) -> tuple[float, np.ndarray]:
            t, gt, d = objective_parts(X, G)
            f, gf = smooth_max(d, mu_k)
            grad = f * gt
            grad[np.diag_indices(n)] += t * gf
            return f * t / scale, grad / scale

        cb = None
        if callback is not None:
            def cb(info: dict[str, Any], mu_k: float = mu_k, scale: float = scale) -> None:
                callback({**info, "f": info["f"] * scale, "mu": mu_k})
        out = spg(M, evaluate, project, tol=tol, max_iter=max_iter - nit, memory=memory,
                  deadline=deadline, callback=cb)
        M = out["M"]
        nit += out["nit"]
        nevals += out["nevals"]
        stage_log.append((mu_k, out["nit"], out["status"], unsmoothed(M, G)))
        if out["status"] in (MAX_ITER, TIME_LIMIT):
            break

    F = unsmoothed(M, G)
    return SolverResult(
        x=strategy_from_gram(M),
        fun=F,
        status=out["status"],
        message=out["message"] + f" (mu={mu_k:g})",
        nit=nit,
        ninner=nevals,
        wall_seconds=time.perf_counter() - t_wall,
        cpu_seconds=time.process_time() - t_cpu,
        extra={
            "M": M / float(np.diag(M).max()),
            "fun_smoothed": smoothed_value(M, G, mu),
            "mu": mu,
            "stages": stage_log,
            "pg_norm": out["pg"],
        },
    )
