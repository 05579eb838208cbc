"""First-order matrix-mechanism solver of seed 000, Appendix B (smoothed max-diagonal + SPG).

Problem (Appendix B, the program after Formula (13)), with G = W^T W (n x n):

    minimise  F(M) = max(diag M) * tr(G M^{-1})  over symmetric positive definite M (n x n).

F is the (eps, delta) matrix-mechanism error of any strategy A with A^T A = M, up to the factor
P(eps, delta): sens2(A)^2 = max diag(M) and ||W A^+||_F^2 = tr(G M^{-1}). F(c M) = F(M) for c > 0,
so its minimum equals min tr(G X^{-1}) s.t. diag(X) <= 1 (seed 002's convex program).

Singular G. When W^T W has a null space (WidthK, WRange or WRelated with m < n, ...), the infimum
over positive definite M is approached only as M becomes singular on null(G): seed 002's optimum
X(d) = V^T (V D V^T)^{-1/2} V (`dpopt.solvers.convex_dp_core`) has range(X) = range(G). Iterating
on full-rank M then drives eigenvalues of M to the floor while tr(G M^{-1}) and its gradient
-M^{-1} G M^{-1} are evaluated through a factor of condition number 1 / floor, and the line search
stalls at rounding level well above the optimum (0.4% at WidthK(16, 3), 0.7% at WidthK(48, 8)).
So the solver works on range(G) explicitly: with U (n x k) an orthonormal basis of range(G)
(eigenvalues of G above rank_tol * max), M = U K U^T, tr(G M^+) = tr(G_k K^{-1}) with
G_k = U^T G U (k x k, positive definite), and diag(M)_i = u_i^T K u_i (u_i the rows of U). Any
strategy with range(G) in range(A^T A) answers W exactly, so nothing is lost; for nonsingular G,
U = I and this is Appendix B's method on M itself.

Parameterisation (stated once, used throughout): K (k x k) in the closed convex set

    C_k = {K symmetric : tr(K) = n, lambda_min(K) >= floor},

which loses nothing because F is scale-invariant, keeps K positive definite (floor > 0), and makes
the smoothing width mu meaningful (tr M = tr K = n: the diagonal of M averages 1, so
max diag M >= 1). The Frobenius projection onto C_k is spectral: project the eigenvalues onto
{lambda_i >= floor, sum lambda_i = n}.

Stopping rule: a certificate, not the smoothed problem's optimality. For any multipliers d >= 0,
phi(d)^2 / sum(d) with phi(d) = ||G^{1/2} D^{1/2}||_* bounds seed 002's optimum from below (the
Lagrangian dual, `convex_dp_core.dual_bound_from_factor`), and at a stationary point of the
smoothed problem the softmax weights of diag M (the gradient of f_mu, Eq. (15)) are those
multipliers up to scale. The solver stops, CONVERGED, when the relative gap between F (unsmoothed)
and that bound is <= gap_tol, so the reported accuracy is a proven one; mu decreases by
continuation (warm starts) only as far as the certificate needs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy.linalg import cho_factor, cho_solve, eigh

from dpopt.solvers.convex_dp_core import RANK_TOL, dual_bound_from_factor
from dpopt.solvers.result import (
    CONVERGED,
    MAX_ITER,
    STALLED,
    TIME_LIMIT,
    SolverResult,
    relative_gap,
)
from dpopt.validation import check_gram, check_positive_int, check_positive_number, check_time_limit

#: spg status when the caller's stopping test (not the projected-gradient test) ended the run.
STOPPED = "stopped"


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
    scaled so that its largest column L2 norm is 1 (sens2(A) = 1).

    Eigenvalues within the eigensolver's backward error of zero (n eps max(lam)) are zero: a singular M
    (the optimum on a singular Gram) would otherwise give A spurious singular values sqrt(n eps) ~ 1e-8
    of its largest, which a pseudo-inverse of A then amplifies."""
    lam, V = eigh(0.5 * (M + M.T))
    lam = np.where(lam > M.shape[0] * np.finfo(float).eps * lam.max(), lam, 0.0)
    A = (V * np.sqrt(lam)) @ V.T
    return A / math.sqrt(float(np.max(np.sum(A * A, axis=0))))



class RangeSpace:
    """Appendix B's objective on range(G): M = U K U^T with U (n x k) orthonormal, K (k x k).

    U spans the eigenvectors of G (n x n, symmetric PSD) with eigenvalues above rank_tol * max;
    U = I (k = n) when G is nonsingular, so the objective is then Appendix B's on M itself.
    V (k x n), V^T V = G on range(G), is the factor used by the dual bound.
    """

    def __init__(self, G: np.ndarray, rank_tol: float) -> None:
        n = G.shape[0]
        lam, Q = eigh(G)
        keep = lam > rank_tol * float(lam[-1])
        self.n, self.k = n, int(keep.sum())
        self.V = np.sqrt(lam[keep])[:, None] * Q[:, keep].T
        if self.k == n:
            self.U: np.ndarray | None = None
            self.Gk = G
        else:
            self.U = np.ascontiguousarray(Q[:, keep])
            self.Gk = np.diag(lam[keep])

    def compress(self, M: np.ndarray) -> np.ndarray:
        """K = U^T M U (k x k) for M (n x n)."""
        return M if self.U is None else self.U.T @ M @ self.U

    def expand(self, K: np.ndarray) -> np.ndarray:
        """M = U K U^T (n x n, rank k) for K (k x k)."""
        return K if self.U is None else (self.U @ K) @ self.U.T

    def parts(self, K: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        """tr(G M^+) = tr(G_k K^{-1}), its gradient in K (k x k) and diag(M) (n,); see objective_parts."""
        t, grad_t, diag_k = objective_parts(K, self.Gk)
        d = diag_k if self.U is None else np.einsum("ia,ab,ib->i", self.U, K, self.U)
        return t, grad_t, d

    def value_and_gradient(self, K: np.ndarray, mu: float) -> tuple[float, np.ndarray]:
        """Seed 000, Appendix B, Eq. (14)-(15): F_mu = f_mu(diag M) tr(G M^+) and its gradient in K.

        d/dK f_mu(diag(U K U^T)) = U^T Diag(softmax) U; d/dK tr(G_k K^{-1}) = -K^{-1} G_k K^{-1}.
        """
        t, grad_t, d = self.parts(K)
        f, w = smooth_max(d, mu)
        grad = f * grad_t
        if self.U is None:
            grad[np.diag_indices(self.k)] += t * w
        else:
            grad += t * ((self.U.T * w) @ self.U)
        return f * t, grad

    def smoothed(self, K: np.ndarray, mu: float) -> float:
        """F_mu(M) = f_mu(diag M) tr(G M^+) for M = U K U^T."""
        t, _, d = self.parts(K)
        return smooth_max(d, mu)[0] * t

    def unsmoothed(self, K: np.ndarray) -> float:
        """F(M) = max(diag M) tr(G M^+) for M = U K U^T."""
        t, _, d = self.parts(K)
        return float(d.max()) * t

    def certificate(self, K: np.ndarray, mu: float) -> tuple[float, float, np.ndarray]:
        """(F(M), LB, d): seed 002's dual bound LB = phi(d)^2 / sum(d) <= optimum at d = softmax(diag M / mu).

        See `dpopt.solvers.convex_dp_core` for the bound; d (n,) are the multipliers, normalised to sum 1.
        """
        t, _, dm = self.parts(K)
        w = smooth_max(dm, mu)[1]
        return float(dm.max()) * t, dual_bound_from_factor(self.V, w), w

def _check_G(G: Any) -> np.ndarray:
    """G (or a workload's .gram()) checked by `check_gram`, positive semidefinite to round-off included."""
    if hasattr(G, "gram") and callable(G.gram):
        G = G.gram()
    return check_gram(G, psd_rtol=1e-9)


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
    stop: Callable[[np.ndarray], bool] | None = None,
    check_every: int = 10,
) -> dict[str, Any]:
    """Non-monotone spectral projected gradient, SPG2 of Birgin, Martinez and Raydan (2000).

    From a feasible M: d = P(M - alpha g) - M with the Barzilai-Borwein step alpha = <s,s>/<s,y>
    (alpha_max = 1e30 when <s,y> <= 0; alpha in [1e-30, 1e30]; alpha_0 = 1/||P(M - g) - M||_inf),
    then lam = 1, 1/2, ... (safeguarded quadratic interpolation within [0.1 lam, 0.9 lam]) until
    f(M + lam d) <= max(last `memory` values of f) + 1e-4 lam <g, d>. The segment stays in the convex
    feasible set. Stops when ||P(M - g) - M||_F <= tol (CONVERGED), at max_iter (MAX_ITER), at the
    deadline (TIME_LIMIT, perf_counter seconds), when the line search cannot decrease f (STALLED), or
    when stop(M) returns True, asked every `check_every` iterations (status STOPPED: the caller's
    own test, e.g. a certificate, was met).

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
        if stop is not None and k % check_every == 0 and stop(M):
            status, message = STOPPED, f"stopping test met at iteration {k}"
            break
    return {"M": M, "f": f, "g": g, "pg": pg, "nit": k, "nevals": nevals,
            "status": status, "message": message}


def solve_appendix_b(
    G: Any,
    *,
    mu: float | None = None,
    mu_start: float = 1e-1,
    max_iter: int = 20000,
    tol: float = 1e-5,
    gap_tol: float = 1e-4,
    check_every: int = 10,
    memory: int = 10,
    floor: float = 1e-10,
    rank_tol: float = RANK_TOL,
    x0: np.ndarray | None = None,
    callback: Callable[[dict[str, Any]], None] | None = None,
    time_limit: float | None = None,
) -> SolverResult:
    """Seed 000, Appendix B: smoothed max-diagonal objective minimised by non-monotone SPG.

    The smoothed objective F_mu(M) = f_mu(diag M) tr(G M^+) (f_mu from Eq. (14), `smooth_max`,
    gradient Eq. (15)) is minimised by `spg` over M = U K U^T, K in the set C_k of the module
    docstring (U: orthonormal basis of range(G), n x k; U = I when G is nonsingular). mu is reached
    by continuation: stages mu_start, mu_start / 10, ... down to mu, each started from the previous
    stage's K; in each stage the objective is divided by its value at the stage's start.

    Stopping rule (CONVERGED): the certified relative gap (F(M) - LB) / F(M) <= gap_tol, where F is
    the unsmoothed objective and LB the dual bound of seed 002's program at the multipliers
    d = softmax(diag M / mu_k) (`dpopt.solvers.convex_dp_core.dual_bound_from_factor`; any d >= 0
    gives a valid lower bound on the optimum). It is tested every `check_every` SPG iterations and at
    the end of every stage. A stage (not the last) ends when the gap is below the next stage's
    smoothing bias bound mu_{k+1} log n (the next stage could not promise better), or when
    ||P(K - grad) - K||_F <= tol for the normalised objective (Birgin et al.'s projected-gradient
    test); a stage that polishes to tol costs more iterations but warm-starts the next one far
    better than one cut short when its value stops improving (measured). Otherwise: max_iter (total
    SPG iterations over the stages; MAX_ITER), time_limit (TIME_LIMIT), or STALLED when the last
    stage (mu) ends without the certificate (mu too wide for gap_tol, or a line search at rounding
    level).

    Parameters
    ----------
    G : Gram matrix W^T W (n x n, symmetric PSD) or a workload with .gram().
    mu : smallest smoothing width (last stage); default gap_tol / (2 log n) (gap_tol / 2 for n = 1),
        the paper's mu = eps / log n with eps = gap_tol / 2: an exact minimiser of F_mu has F within
        a relative mu log n of the optimum (max diag M >= 1 on C_k, f_mu <= max + mu log n), so the
        certificate is reachable. Measured, F at a stage's minimiser is 0.2 mu to 1 mu above the
        optimum (relative), so the continuation usually stops one stage before mu.
    gap_tol : relative duality gap that certifies convergence (default 1e-4; crossval asks 1e-5).
    tol : projected-gradient tolerance that ends a stage (normalised objective).
    check_every : SPG iterations between two certificate evaluations (one SVD of a k x n matrix).
    floor : smallest eigenvalue allowed for K (relative to tr K = n).
    rank_tol : eigenvalues of G below rank_tol * its largest are treated as zero (null(G)).
    x0 : starting M (n x n symmetric positive definite); default the identity (noise on data); it is
        compressed to K = U^T x0 U, rescaled to trace n and projected onto C_k.
    callback : called after each SPG iteration with a dict (k, the stage's iteration; nit, over all
        stages; f, pg_norm, M, mu; gap, the best certified relative gap so far, checked every
        `check_every` iterations).

    Returns
    -------
    SolverResult with x = A (n x n, the symmetric square root of M scaled to max column L2 norm 1;
    rank k), fun = the unsmoothed F(M) = max(diag M) tr(G M^+) of the best iterate checked,
    dual_bound = LB, gap = (fun - LB) / fun, nit = SPG iterations over all stages, ninner = objective
    evaluations, and extra: M (scaled to max diag 1, so fun = tr(G M^+); singular when G is),
    d (the multipliers of the certificate), rank k, fun_smoothed (at mu of the last stage run),
    mu, stages (per stage: mu, iterations, SPG status, unsmoothed F, gap), pg_norm.
    """
    t_wall, t_cpu = time.perf_counter(), time.process_time()
    G = _check_G(G)
    n = G.shape[0]
    for name, val in (("gap_tol", gap_tol), ("rank_tol", rank_tol)):
        if isinstance(val, bool) or not isinstance(val, int | float) or not (
            np.isfinite(val) and 0 < val < 1
        ):
            raise ValueError(f"{name} must be a number in (0, 1); got {val!r}")
    if mu is None:
        mu = gap_tol / (2.0 * math.log(n)) if n >= 2 else gap_tol / 2.0
    for name, val in (("mu", mu), ("mu_start", mu_start), ("tol", tol), ("floor", floor)):
        check_positive_number(val, name)
    if floor >= 1.0:
        raise ValueError(f"floor must be < 1 (M has trace n); got {floor!r}")
    for name, val in (("max_iter", max_iter), ("memory", memory), ("check_every", check_every)):
        check_positive_int(val, name)
    check_time_limit(time_limit)

    sp = RangeSpace(G, rank_tol)
    if x0 is None:
        K = np.eye(sp.k)
    else:
        M0 = np.asarray(x0, dtype=float)
        if M0.shape != (n, n) or not np.isfinite(M0).all():
            raise ValueError(f"x0 must be a finite {n} x {n} matrix M; got shape {M0.shape}")
        if np.abs(M0 - M0.T).max() > 1e-10 * max(1.0, float(np.abs(M0).max())):
            raise ValueError("x0 must be symmetric")
        if np.linalg.eigvalsh(0.5 * (M0 + M0.T)).min() <= 0:
            raise ValueError("x0 must be positive definite")
        K = sp.compress(0.5 * (M0 + M0.T))
    K = project_trace_floor(K * (n / np.trace(K)), float(n), floor)

    def project(X: np.ndarray) -> np.ndarray:
        return project_trace_floor(X, float(n), floor)

    stages = []
    m_k = float(mu_start)
    while m_k > mu * (1 + 1e-12):
        stages.append(m_k)
        m_k /= 10.0
    stages.append(float(mu))
    log_n = math.log(n) if n >= 2 else 1.0

    best: dict[str, Any] = {"F": math.inf, "LB": -math.inf}

    def certify(K: np.ndarray, mu_k: float) -> float:
        """Update the best iterate and bound; return the certified relative gap."""
        F, LB, d = sp.certificate(K, mu_k)
        if F < best["F"]:
            best.update(F=F, K=K, mu=mu_k)
        if LB > best["LB"]:
            best.update(LB=LB, d=d)
        return relative_gap(best["F"], best["LB"])

    deadline = None if time_limit is None else t_wall + time_limit
    nit = nevals = 0
    out: dict[str, Any] = {"status": CONVERGED, "message": "", "pg": 0.0}
    stage_log = []
    gap = certify(K, stages[0])
    for j, mu_k in enumerate(stages):
        if gap <= gap_tol:
            break
        scale = sp.smoothed(K, mu_k)

        def evaluate(X: np.ndarray, mu_k: float = mu_k, scale: float = scale
                     ) -> tuple[float, np.ndarray]:
            f, grad = sp.value_and_gradient(X, mu_k)
            return f / scale, grad / scale

        # A stage is done once its iterate is certified to the next stage's smoothing bias bound.
        stage_target = gap_tol if j + 1 == len(stages) else max(gap_tol, stages[j + 1] * log_n)

        def stop(X: np.ndarray, mu_k: float = mu_k, target: float = stage_target) -> bool:
            return certify(X, mu_k) <= target

        cb = None
        if callback is not None:
            def cb(info: dict[str, Any], mu_k: float = mu_k, scale: float = scale, done: int = nit) -> None:
                callback({**info, "f": info["f"] * scale, "M": sp.expand(info["M"]), "mu": mu_k,
                          "nit": done + info["k"], "gap": relative_gap(best["F"], best["LB"])})
        out = spg(K, evaluate, project, tol=tol, max_iter=max_iter - nit, memory=memory,
                  deadline=deadline, callback=cb, stop=stop, check_every=check_every)
        K = out["M"]
        nit += out["nit"]
        nevals += out["nevals"]
        gap = certify(K, mu_k)
        stage_log.append((mu_k, out["nit"], out["status"], sp.unsmoothed(K), gap))
        if out["status"] in (MAX_ITER, TIME_LIMIT):
            break

    if gap <= gap_tol:
        status = CONVERGED
        message = (f"certified relative gap {gap:.2e} <= gap_tol={gap_tol:g} "
                   f"(mu={best['mu']:g}, dual bound of seed 002's program)")
    elif out["status"] in (MAX_ITER, TIME_LIMIT):
        status, message = out["status"], f"{out['message']}; certified relative gap {gap:.2e}"
    else:
        status = STALLED
        message = (f"smallest smoothing width mu={stages[-1]:g} reached with certified relative gap "
                   f"{gap:.2e} > gap_tol={gap_tol:g} (last stage: {out['message']})")
    M = sp.expand(best["K"])
    return SolverResult.since(
        t_wall, t_cpu, x=strategy_from_gram(M), fun=best["F"], status=status, message=message, nit=nit,
        ninner=nevals, dual_bound=best["LB"], gap=gap,
        extra={
            "M": M / float(np.diag(M).max()),
            "d": best["d"],
            "rank": sp.k,
            "fun_smoothed": sp.smoothed(best["K"], best["mu"]),
            "mu": mu,
            "stages": stage_log,
            "pg_norm": out["pg"],
        },
    )
