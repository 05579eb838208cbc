"""Low-Rank Mechanism decomposition W = B L (seed 000, Sections 4-5): Algorithms 1 and 2.

Problem (Formula (7), or (8) when gamma > 0):

    minimise ||B||_F^2 = tr(B^T B)  s.t.  ||W - B L||_F <= gamma,  ||L[:, j]||_1 <= 1 for all j,

with W (m x n), B (m x r), L (r x n). Under eps-DP with Laplace noise of variance 2 b^2 for scale b
(seed 000, Section 3.1 and Lemma 1), answering W through (B, L) has total squared error
2 / eps^2 * ||B||_F^2 * max_j ||L[:, j]||_1^2.

The problem is not convex, so `solve_lrm` runs Algorithm 1 from several feasible starts (the SVD
start after Lemma 3, the noise-on-data start when the rank allows it, seeded random starts), refines
the best by restarting the penalty schedule, and keeps the best feasible decomposition it has seen.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from scipy.optimize import brentq

from dpopt.linalg import SVD_RANK_RTOL, rank_from_singular_values, svd_start
from dpopt.solvers.l1ball import project_l1_ball_columns
from dpopt.solvers.result import CONVERGED, FAILED, MAX_ITER, STALLED, TIME_LIMIT, SolverResult
from dpopt.validation import (
    as_generator,
    check_finite_matrix,
    check_positive_int,
    check_positive_number,
    check_time_limit,
)


def numerical_rank(W: np.ndarray, rtol: float = SVD_RANK_RTOL) -> int:
    """Number of singular values of W (m x n) above rtol times the largest one."""
    return rank_from_singular_values(np.linalg.svd(W, compute_uv=False), rtol)


def default_rank(W: np.ndarray) -> int:
    """Seed 000, Section 6.1: r = ceil(1.2 * rank(W)) (the paper's recommended default).

    rank(W) counts singular values above 1e-10 times the largest (`numerical_rank`).
    """
    return max(1, math.ceil(1.2 * numerical_rank(W) - 1e-9))


def random_start(W: np.ndarray, r: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Random start: L0 with i.i.d. N(0, 1) entries scaled to max column L1 norm 1, B0 = W L0^+."""
    L0 = rng.normal(size=(r, W.shape[1]))
    L0 /= np.abs(L0).sum(axis=0).max()
    return W @ np.linalg.pinv(L0), L0


def identity_start(W: np.ndarray, r: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Noise-on-data start: the identity strategy restricted to the cells W uses, padded to r rows.

    With S the c columns of W (m x n) that hold a non-zero entry, L0 (r x n) has rows e_j^T for
    j in S (in order) followed by r - c zero rows, and B0 = W[:, S] padded with zero columns, so
    B0 L0 = W exactly, max_j ||L0[:, j]||_1 = 1 and ||B0||_F^2 = ||W||_F^2: the decomposition that
    answers W by noise on data (seed 000, Section 1). It exists only when c <= r; returns None
    otherwise. Returns (B0 (m x r), L0 (r x n)).
    """
    m, n = W.shape
    cols = np.flatnonzero(np.any(W != 0.0, axis=0))
    if cols.size > r:
        return None
    L0 = np.zeros((r, n))
    L0[np.arange(cols.size), cols] = 1.0
    B0 = np.zeros((m, r))
    B0[:, : cols.size] = W[:, cols]
    return B0, L0


def update_B(W: np.ndarray, L: np.ndarray, pi: np.ndarray, beta: float) -> np.ndarray:
    """LRM Eq. (9) (seed 000, Section 5): B = (beta W + pi) L^T (beta L L^T + I)^{-1}, shape (m x r)."""
    r = L.shape[0]
    K = beta * (L @ L.T) + np.eye(r)
    rhs = (beta * W + pi) @ L.T  # m x r
    # K is symmetric positive definite, so solve K B^T = rhs^T instead of forming the inverse.
    return np.linalg.solve(K, rhs.T).T


def nesterov_L(
    Q: np.ndarray,
    C: np.ndarray,
    beta: float,
    L0: np.ndarray,
    *,
    omega0: float = 1.0,
    max_iter: int = 100,
    tol: float = 1e-6,
    chi: float | None = None,
) -> tuple[np.ndarray, float, int]:
    """LRM Algorithm 2 (seed 000, Section 5): Nesterov projected gradient for the L-step, Formula (10).

    Minimises G(L) = beta/2 <L, Q L> - <C, L> over {||L[:, j]||_1 <= 1}, where Q = B^T B (r x r) and
    C = B^T (beta W + pi) (r x n), so grad G = beta Q L - C. The Lipschitz estimate omega starts at
    omega0 and is doubled until G(L_t) <= G(S) + <grad G(S), L_t - S> + omega/2 ||L_t - S||_F^2,
    evaluated as beta <D, Q D> <= omega ||D||_F^2 with D = L_t - S (exact for this quadratic G).

    Stops when ||S - L_t||_F < chi (the paper's test, chi = r n 1e-12 by default), when
    ||L_t - L_{t-1}||_F <= tol * max(1, ||L_t||_F), or after max_iter accelerated steps.

    Returns (L (r x n), final omega, number of accelerated steps taken).
    """
    r, n = L0.shape
    if chi is None:
        chi = r * n * 1e-12

    L_prev = L_cur = L0
    QL_prev = QL_cur = Q @ L0  # Q L is linear in L, so it is carried along instead of recomputed
    d_prev2, d_prev = 0.0, 1.0  # delta^(t-2), delta^(t-1)
    omega = float(omega0)
    steps = 0
    for _ in range(max_iter):
        alpha = (d_prev2 - 1.0) / d_prev
        S = L_cur + alpha * (L_cur - L_prev)
        QS = QL_cur + alpha * (QL_cur - QL_prev)
        gS = beta * QS - C
        while True:
            Lt = project_l1_ball_columns(S - gS / omega)
            D = Lt - S
            nD2 = float(np.vdot(D, D))
            if math.sqrt(nD2) < chi:
                return Lt, omega, steps + 1
            QD = Q @ D
            # G is quadratic, so G(Lt) - G(S) - <grad G(S), D> = beta/2 <D, Q D> exactly; testing
            # that form avoids the cancellation that inflates omega when D is tiny.
            if beta * float(np.vdot(D, QD)) <= omega * nD2:
                break
            omega *= 2.0
        steps += 1
        L_prev, L_cur = L_cur, Lt
        QL_prev, QL_cur = QL_cur, QS + QD
        d_prev2, d_prev = d_prev, 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * d_prev * d_prev))
        if np.linalg.norm(L_cur - L_prev) <= tol * max(1.0, float(np.linalg.norm(L_cur))):
            break
    return L_cur, omega, steps


def reoptimize_B(W: np.ndarray, L: np.ndarray, gamma: float = 0.0) -> np.ndarray:
    """Best B for a fixed L: min ||B||_F^2 s.t. ||W - B L||_F <= gamma (Formula (8) in B alone).

    gamma = 0: the least-squares / minimum-norm solution B = W L^+ (exact when the rows of W lie in
    the row space of L). gamma > 0: the KKT conditions give the ridge form
    B(lam) = lam W L^T (lam L L^T + I)^{-1}; with L = U diag(s) V^T the residual is
    ||W (I - V V^T)||_F^2 + sum_i ||W v_i||^2 / (lam s_i^2 + 1)^2, decreasing in lam, and lam is the
    root of residual(lam) = gamma (B = 0 if ||W||_F <= gamma; B = W L^+ if even that misses gamma).

    Returns B (m x r).
    """
    if gamma <= 0.0:
        return W @ np.linalg.pinv(L)
    if np.linalg.norm(W) <= gamma:
        return np.zeros((W.shape[0], L.shape[0]))
    U, s, Vt = np.linalg.svd(L, full_matrices=False)
    keep = s > SVD_RANK_RTOL * (s[0] if s.size else 0.0)
    U, s, Vt = U[:, keep], s[keep], Vt[keep]
    WV = W @ Vt.T  # m x k
    a = (WV * WV).sum(axis=0)  # ||W v_i||^2
    # ||W (I - V V^T)||_F^2, formed directly: ||W||^2 - sum(a) cancels when gamma << ||W||.
    base = float(np.linalg.norm(W - WV @ Vt) ** 2)
    # Aim a hair inside the ball. The residual recomputed from B carries an absolute rounding error
    # of order eps ||W||_F (W - B L cancels), which relative to a small gamma can exceed any fixed
    # hair: so the returned B's residual is recomputed, and while it misses gamma the aim moves
    # inside by twice the miss (at most RESIDUAL_AIM_STEPS times; then the least-squares B).
    aim = gamma * (1.0 - 1e-8)
    for _ in range(RESIDUAL_AIM_STEPS):
        B = _ridge_B(WV, s, U, base, a, aim)
        if B is None:
            break
        resid = float(np.linalg.norm(W - B @ L))
        if resid <= gamma:
            return B
        aim -= 2.0 * (resid - aim)
    return W @ np.linalg.pinv(L)


#: Corrections of reoptimize_B's aim before it falls back on the least-squares B.
RESIDUAL_AIM_STEPS = 4


def _ridge_B(
    WV: np.ndarray, s: np.ndarray, U: np.ndarray, base: float, a: np.ndarray, aim: float
) -> np.ndarray | None:
    """B(lam) = lam W V diag(s / (lam s^2 + 1)) U^T with predicted residual `aim` (None if out of reach)."""
    if aim <= 0.0 or base >= aim * aim:
        return None
    target = aim * aim

    def excess(log_lam: float) -> float:
        lam = math.exp(log_lam)
        return base + float(np.sum(a / (lam * s * s + 1.0) ** 2)) - target

    lo, hi = -60.0, 60.0
    if excess(hi) > 0.0:  # the aim is within rounding of the least-squares residual
        return None
    log_lam = brentq(excess, lo, hi, xtol=1e-14, rtol=1e-14, maxiter=500)
    lam = math.exp(log_lam)
    return (WV * (lam * s / (lam * s * s + 1.0))) @ U.T


def _check_options(**opts: Any) -> None:
    """Validate solve_lrm's numeric options (positive ints, positive finite floats)."""
    for name in ("max_outer", "max_inner", "max_nesterov", "beta_double_every"):
        check_positive_int(opts[name], name)
    for name in ("tol", "ftol", "beta0", "beta_max"):
        check_positive_number(opts[name], name)
    if not isinstance(opts["repair"], bool):
        raise ValueError(f"repair must be True or False; got {opts['repair']!r}")
    revive = opts["revive"]
    if not (0.0 <= revive < 1.0):
        raise ValueError(f"revive must be in [0, 1); got {revive!r}")
    check_time_limit(opts["time_limit"])


def _make_rng(seed: Any, rng: Any) -> np.random.Generator:
    """One Generator from either seed (int, Generator or None; `as_generator`) or rng (Generator or None)."""
    if seed is not None and rng is not None:
        raise ValueError("give at most one of seed and rng")
    if rng is not None and not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy.random.Generator; got {type(rng).__name__}")
    return as_generator(seed if rng is None else rng)


_START_NAMES = ("svd", "identity", "random")


def _resolve_rank(W: np.ndarray, rank: Any) -> int:
    """The rank option as an int: default ceil(1.2 rank(W)), else a validated positive integer."""
    if rank is None:
        return default_rank(W)
    return check_positive_int(rank, "rank")


def _starts(
    W: np.ndarray, rank: Any, init: Any, restarts: Any, rng: np.random.Generator
) -> list[tuple[str, np.ndarray, np.ndarray, np.random.Generator]]:
    """Named starts (name, B0 (m x r), L0 (r x n), generator of the run) from init and restarts.

    init "auto" means ("svd", "identity"), "identity" left out when W uses more than r cells (an
    explicit "identity" that does not exist is an error); `restarts` random starts follow. Every
    start gets its own child of rng, so adding starts does not change the earlier ones.
    """
    n = W.shape[1]
    if isinstance(restarts, bool) or not isinstance(restarts, int | np.integer) or restarts < 0:
        raise ValueError(f"restarts must be an integer >= 0 (extra random starts); got {restarts!r}")
    given = None
    if isinstance(init, np.ndarray):
        L0 = np.asarray(init, dtype=float)
        if L0.ndim != 2 or L0.shape[1] != n or L0.shape[0] < 1 or not np.isfinite(L0).all():
            raise ValueError(f"init as an array must be a finite L0 of shape (r, {n}); got {L0.shape}")
        if rank is not None and L0.shape[0] != rank:
            raise ValueError(f"init has {L0.shape[0]} rows but rank={rank}")
        given = project_l1_ball_columns(L0)
        r = given.shape[0]
        names = ["given"]
    else:
        r = _resolve_rank(W, rank)
        if isinstance(init, str):
            names = ["svd", "identity"] if init == "auto" else [init]
        elif isinstance(init, list | tuple) and init and all(isinstance(s, str) for s in init):
            names = list(init)
        else:
            names = ["?"]
        if any(s not in _START_NAMES for s in names):
            raise ValueError(
                "init must be 'auto', 'svd', 'identity', 'random', a sequence of those names or an "
                f"(r, n) array; got {init!r}"
            )
    names += ["random"] * int(restarts)
    out = []
    for i, (name, child) in enumerate(zip(names, rng.spawn(len(names)), strict=True)):
        if name == "given":
            assert given is not None
            out.append((name, W @ np.linalg.pinv(given), given, child))
        elif name == "svd":
            out.append((name, *svd_start(W, r, child), child))
        elif name == "random":
            out.append((f"random{i}", *random_start(W, r, child), child))
        else:
            start = identity_start(W, r)
            if start is not None:
                out.append((name, *start, child))
            elif init != "auto":
                cells = int(np.count_nonzero(np.any(W != 0.0, axis=0)))
                raise ValueError(f"init 'identity' needs rank >= the {cells} cells W uses; got rank {r}")
    return out


def revive_dead_rows(L: np.ndarray, weight: float, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """Reseed rows of L (r x n) that the L1 projection has set exactly to zero.

    A zero row of L gets a zero column in the B-step (Eq. (9)) and then a zero gradient in the
    L-step, so without help it can never return and the usable rank shrinks (below rank(W) the
    constraint W = B L becomes unreachable). The reseeded L is (1 - weight) L + weight R, where R is
    N(0, 1) on the dead rows and zero elsewhere with columns scaled to L1 norm 1: a convex combination
    of two feasible matrices, hence feasible. Returns (new L, number of rows reseeded).
    """
    dead = np.abs(L).sum(axis=1) == 0.0
    ndead = int(dead.sum())
    if ndead == 0 or weight == 0.0:
        return L, 0
    R = np.zeros_like(L)
    R[dead] = rng.normal(size=(ndead, L.shape[1]))
    R /= np.abs(R).sum(axis=0)
    return (1.0 - weight) * L + weight * R, ndead


def polish(
    W: np.ndarray, L: np.ndarray, gamma: float, tol: float, exact_slack: float = 1e-3
) -> np.ndarray:
    """Final B for the final L (m x r): exact when affordable, never blown up by a near-singular L.

    gamma > 0: `reoptimize_B(W, L, gamma)`. gamma = 0: B_exact = W L^+ (residual at rounding level
    when the rows of W lie in the row space of L) is kept unless ||B_exact||_F^2 exceeds
    (1 + exact_slack) ||B_tol||_F^2, where B_tol = `reoptimize_B(W, L, tol ||W||_F)` is the cheapest
    B with relative residual <= tol: spending the whole residual budget always saves a little
    (O(tol) relatively), but a near-singular direction of L that W barely uses makes ||W L^+||
    explode, and then B_tol is returned.
    """
    if gamma > 0.0:
        return reoptimize_B(W, L, gamma)
    normW = float(np.linalg.norm(W))
    B_exact = W @ np.linalg.pinv(L)
    B_tol = reoptimize_B(W, L, tol * normW)
    exact_ok = np.linalg.norm(W - B_exact @ L) <= tol * normW
    if exact_ok and np.vdot(B_exact, B_exact) <= (1.0 + exact_slack) * np.vdot(B_tol, B_tol):
        return B_exact
    return B_tol


#: Weights t of the residual's missing row directions tried by `repair_pair` (relative to unit L1 columns).
REPAIR_WEIGHTS = (1e-1, 1e-2, 1e-3, 1e-4)


def repair_pair(
    W: np.ndarray, B: np.ndarray, L: np.ndarray, gamma: float, tol: float
) -> tuple[np.ndarray, np.ndarray] | None:
    """Make a pair that misses the residual test exact by moving L's row space onto W's missing rows.

    A stalled run (Algorithm 1's L-step is first-order, so it crawls along the small singular directions
    of an ill-conditioned W) ends with ||W - B L||_F a little above the bound because the row space of L
    misses a few directions of W's. Candidates, each divided by its largest column L1 norm (so feasible)
    and then given its best B by `polish`:

    (a) the minimum-norm correction L + B^+ (W - B L), after which B L = W when B has full row rank;
    (b) when B (m x r) has a null space N (r - rank B columns, e.g. r = ceil(1.2 rank W) > m), the rows
        N N^T L that B does not use are replaced by t N V_q^T, V_q the q = dim N leading right singular
        vectors of W's part outside the row space of (I - N N^T) L (B L is unchanged, as B N = 0), for
        each t in `REPAIR_WEIGHTS`.

    Returns the feasible candidate (B (m x r), L (r x n)) of least error factor, or None if none passes.
    """
    normW = float(np.linalg.norm(W))
    r = L.shape[0]
    # One factorisation serves B^+ and B's null space. Vt must be the full r x r basis; U is needed
    # only thinly, so the m x m U of a full SVD (8.7 GB for AllRange(256)'s 32,896 queries) is not formed.
    U, sB, Vt = np.linalg.svd(B, full_matrices=B.shape[0] < B.shape[1])
    rank_B = rank_from_singular_values(sB)
    B_pinv = (Vt[:rank_B].T / sB[:rank_B]) @ U[:, :rank_B].T
    candidates = [L + B_pinv @ (W - B @ L)]
    q = min(r - rank_B, min(W.shape))
    if q > 0:
        N = Vt[rank_B:rank_B + q].T  # r x q, B N = 0
        L_used = L - N @ (N.T @ L)
        basis, _ = np.linalg.qr(L_used.T)  # n x r, spans the row space of L_used (and maybe more)
        missing = W - (W @ basis) @ basis.T
        Vq = np.linalg.svd(missing, full_matrices=False)[2][:q]
        candidates += [L_used + N @ (t * Vq) for t in REPAIR_WEIGHTS]
    best, best_factor = None, math.inf
    for Lc in candidates:
        if not np.isfinite(Lc).all():
            continue
        Lc = Lc / max(1.0, float(np.abs(Lc).sum(axis=0).max()))
        Bc = polish(W, Lc, gamma, tol)
        resid, l1, factor = pair_stats(W, Bc, Lc)
        if _feasible(resid, l1, normW, gamma, tol) and factor < best_factor:
            best, best_factor = (Bc, Lc), factor
    return best


def _feasible(resid: float, max_l1: float, normW: float, gamma: float, tol: float) -> bool:
    """The residual test of solve_lrm (and the column constraint to 1e-9)."""
    bound = tol * normW if gamma == 0.0 else gamma
    return resid <= bound * (1.0 + 1e-9) and max_l1 <= 1.0 + 1e-9


def pair_stats(W: np.ndarray, B: np.ndarray, L: np.ndarray) -> tuple[float, float, float]:
    """(||W - B L||_F, max_j ||L[:, j]||_1, error factor ||B||_F^2 max_j ||L[:, j]||_1^2) of a pair (B, L)."""
    l1 = float(np.abs(L).sum(axis=0).max())
    return float(np.linalg.norm(W - B @ L)), l1, float(np.vdot(B, B)) * l1 * l1


def _alm_run(
    W: np.ndarray,
    B: np.ndarray,
    L: np.ndarray,
    gen: np.random.Generator,
    *,
    gamma: float,
    o: dict[str, Any],
    deadline: float | None,
    callback: Callable[[dict[str, Any]], None] | None,
    k_offset: int,
    start: str,
) -> dict[str, Any]:
    """LRM Algorithm 1 (seed 000, Section 5) from one start (B (m x r), L (r x n)); see solve_lrm.

    Returns a dict with B, L (polished), status, message, nit, ninner, beta, revived and the
    per-outer-iteration histories.
    """
    t_wall, t_cpu = time.perf_counter(), time.process_time()
    normW = float(np.linalg.norm(W))
    tol = o["tol"]
    pi = np.zeros_like(W)
    beta = float(o["beta0"])
    omega = 1.0
    fun_hist: list[float] = []
    res_hist: list[float] = []
    beta_hist: list[float] = []
    ninner = 0
    nrevived = 0
    max_outer = o["max_outer"]
    status, message = MAX_ITER, f"reached max_outer={max_outer} outer iterations"
    k = 0
    for k in range(1, max_outer + 1):
        for _ in range(o["max_inner"]):
            B = update_B(W, L, pi, beta)
            # Restart the Lipschitz search a little below the last accepted value (the paper
            # restarts from omega = 1 at every call, which costs ~log2(beta ||B||_2^2) projections).
            L, omega, steps = nesterov_L(
                B.T @ B, B.T @ (beta * W + pi), beta, L,
                omega0=max(1.0, omega / 4.0), max_iter=o["max_nesterov"], tol=tol,
            )
            ninner += steps
        R = W - B @ L
        tau = float(np.linalg.norm(R))
        fun = float(np.vdot(B, B))
        fun_hist.append(fun)
        res_hist.append(tau)
        beta_hist.append(beta)
        if callback is not None:
            callback({"k": k_offset + k, "start": start, "beta": beta, "residual": tau,
                      "rel_residual": tau / normW, "fun": fun, "ninner": ninner, "B": B, "L": L})
        if gamma > 0.0:
            met = tau <= gamma
        else:
            met = tau <= tol * normW and k > 1 and abs(fun - fun_hist[-2]) <= o["ftol"] * fun
        if met:
            status, message = CONVERGED, "residual and objective met the stopping rule"
            break
        if deadline is not None and time.perf_counter() > deadline:
            status, message = TIME_LIMIT, f"time_limit={o['time_limit']} s reached"
            break
        if k % o["beta_double_every"] == 0:
            if 2.0 * beta > o["beta_max"]:
                status, message = STALLED, f"beta would exceed beta_max={o['beta_max']:g}"
                break
            beta *= 2.0
            if tau > tol * normW:
                L, nnew = revive_dead_rows(L, o["revive"], gen)
                nrevived += nnew
        pi = pi + beta * R

    L = project_l1_ball_columns(L)
    B = polish(W, L, gamma, tol)
    resid, max_l1, factor = pair_stats(W, B, L)
    repaired = False
    if o["repair"] and not _feasible(resid, max_l1, normW, gamma, tol):
        fixed = repair_pair(W, B, L, gamma, tol)
        if fixed is not None:
            missed = resid
            B, L = fixed
            resid, max_l1, factor = pair_stats(W, B, L)
            repaired = True
            message += f"; its pair missed the residual test ({missed:.3e}) and was repaired (repair_pair)"
    if status == CONVERGED and not _feasible(resid, max_l1, normW, gamma, tol):
        status = FAILED
        message = f"stopping rule met but the polished pair has residual {resid:.3e}"
    return {"B": B, "L": L, "status": status, "message": message, "nit": k, "ninner": ninner,
            "beta": beta, "revived": nrevived, "repaired": repaired, "resid": resid, "max_l1": max_l1,
            "error_factor": factor,
            "fun_history": fun_hist, "residual_history": res_hist, "beta_history": beta_hist,
            "wall_seconds": time.perf_counter() - t_wall, "cpu_seconds": time.process_time() - t_cpu}


def solve_lrm(
    W: Any,
    *,
    rank: int | None = None,
    gamma: float = 0.0,
    max_outer: int = 1000,
    max_inner: int = 5,
    max_nesterov: int = 5,
    tol: float = 1e-6,
    ftol: float = 1e-6,
    beta0: float = 1.0,
    beta_double_every: int = 10,
    beta_max: float = 1e12,
    revive: float = 1e-2,
    repair: bool = True,
    seed: int | np.random.Generator | None = None,
    rng: np.random.Generator | None = None,
    init: str | Sequence[str] | np.ndarray = "auto",
    restarts: int = 1,
    refine: int = 1,
    refine_rtol: float = 1e-3,
    callback: Callable[[dict[str, Any]], None] | None = None,
    time_limit: float | None = None,
) -> SolverResult:
    """LRM Algorithm 1 (seed 000, Section 5): inexact augmented Lagrangian for W = B L, from several starts.

    Formula (7) is bilinear, so Algorithm 1 only finds a stationary point, and which one depends on
    the start: on WDiscrete(256, 256) with off value 0 the SVD start alone ends 2.7x to 7x above
    noise on data (depending on its random padding rows), although the noise-on-data decomposition
    (`identity_start`) exists at the same rank. So the algorithm is run from each start (init, then
    `restarts` seeded random starts), then up to `refine` more times from the best decomposition so
    far (pi = 0, beta = beta0 again: by the end of a run beta is ~1e6 and the iterate is frozen by
    the penalty, not by optimality), as long as each round lowers the error factor by more than
    refine_rtol relatively. The best decomposition is kept; when every run met its stopping rule
    the (polished) starts compete too, so the result is never worse than the best feasible start.

    One run: pi starts at 0 and beta at beta0 (both as in the paper). Outer iteration k runs
    max_inner alternations of the B-step (Eq. (9), closed form) and the L-step (Algorithm 2, at most
    max_nesterov accelerated steps, warm-started), then computes tau = ||W - B L||_F, doubles beta
    when k is divisible by beta_double_every (the paper's schedule) and updates the multiplier
    pi <- pi + beta (W - B L) with the new beta (Algorithm 1, lines 10-12). At each doubling, if the
    residual test still fails, rows of L that are exactly zero are reseeded (`revive_dead_rows`,
    weight `revive`; 0 switches this off).

    Stopping rule of a run, checked after every outer iteration:
      gamma = 0: tau <= tol ||W||_F and |f_k - f_{k-1}| <= ftol f_k, with f = ||B||_F^2;
      gamma > 0: tau <= gamma (the paper's "tau is sufficiently small").
    Otherwise a run stops at max_outer (MAX_ITER), when beta would exceed beta_max (STALLED) or
    after time_limit seconds counted from the call (TIME_LIMIT; later starts are then skipped).
    On exit L is projected once more (column L1 norms <= 1 up to rounding, ~1e-15) and B is
    re-optimised for it by `polish`. A run is feasible when its polished pair passes the residual
    test (relative residual <= tol for gamma = 0, residual <= gamma (1 + 1e-9) for gamma > 0) and
    max_j ||L[:, j]||_1 <= 1 + 1e-9. With repair=True a pair that fails the residual test is given to
    `repair_pair`, which moves L's unused rows onto W's missing row directions; a run so repaired
    keeps its status (a capped run stays capped) and reports repaired=True.

    Selection and status: if every run met its stopping rule, the feasible runs and feasible starts
    compete on error_factor and status is CONVERGED (FAILED if none is feasible). Otherwise status
    is that of the first run that hit a cap and the feasible runs compete (the starts do not: a
    capped solver reports what it computed); with no feasible run the best feasible start is
    returned (e.g. on an ill-conditioned full-rank W, where every run can stall above gamma while
    the SVD start is exact), and with no feasible start either, the run of least residual.

    Parameters
    ----------
    W : ndarray (m x n) or a workload with .matrix().
    rank : r, the number of rows of L; default ceil(1.2 rank(W)) (seed 000, Section 6.1).
    gamma : relaxation of Formula (8), an absolute bound on ||W - B L||_F (>= 0).
    max_outer : outer-iteration cap of each run.
    max_inner, max_nesterov : B/L alternations per outer iteration and accelerated steps per L-step
        (the paper leaves both open; 5 and 5 are the values of the authors' released code).
    init : "auto" (= ("svd", "identity"), "identity" left out when W uses more than r cells), one
        of "svd" (`svd_start`), "identity" (`identity_start`), "random" (`random_start`), a
        sequence of these names, or an explicit L0 (r x n), projected onto the constraint set, with
        B0 = W L0^+.
    restarts : number of extra random starts after init (0 runs init alone).
    refine, refine_rtol : refinement rounds (0 for none) and the relative gain that earns another.
    repair : make each run's final pair exact with `repair_pair` when it misses the residual test.
    seed, rng : randomness for the starts (the r - rank(W) extra rows of the SVD start, the random
        starts) and for reseeding dead rows, one child generator per start; give at most one.
    callback : called after each outer iteration of every run with a dict (k, counted across runs;
        start, beta, residual, rel_residual, fun, ninner, B, L); its return value is ignored.

    Returns
    -------
    SolverResult with x = (B (m x r), L (r x n)), fun = ||B||_F^2 of the polished B, nit = outer
    iterations and ninner = accelerated steps summed over runs, and extra: residual ||W - B L||_F,
    rel_residual, max_col_l1, error_factor (||B||_F^2 max_j ||L[:, j]||_1^2; the total squared
    error under eps-DP is 2 / eps^2 * error_factor), rank, gamma, start (name of the winning start;
    kept_start True when a start beat every run), refine_rounds, starts (one dict per start and
    refinement round: name, start_factor, run_factor (inf when not feasible), status, nit,
    cpu_seconds, wall_seconds, repaired), final beta, revived_rows and repaired of the winning run, and the
    per-outer-iteration histories fun_history, residual_history, beta_history of all runs in order
    (ALM iterates, before polishing).
    """
    t_wall, t_cpu = time.perf_counter(), time.process_time()
    W = check_finite_matrix(W, "W")
    normW = float(np.linalg.norm(W))
    if normW == 0.0:
        raise ValueError("W must have at least one non-zero entry (the zero workload needs no noise)")
    gamma = float(gamma)
    if not np.isfinite(gamma) or gamma < 0.0:
        raise ValueError(f"gamma must be a finite number >= 0; got {gamma!r}")
    opts = {"max_outer": max_outer, "max_inner": max_inner, "max_nesterov": max_nesterov,
            "beta_double_every": beta_double_every, "tol": tol, "ftol": ftol, "beta0": beta0,
            "beta_max": beta_max, "revive": revive, "time_limit": time_limit, "repair": repair}
    _check_options(**opts)
    if isinstance(refine, bool) or not isinstance(refine, int | np.integer) or refine < 0:
        raise ValueError(f"refine must be an integer >= 0 (refinement rounds); got {refine!r}")
    if isinstance(refine_rtol, bool) or not isinstance(refine_rtol, int | float | np.number) or not (
        np.isfinite(refine_rtol) and refine_rtol >= 0
    ):
        raise ValueError(f"refine_rtol must be a finite number >= 0; got {refine_rtol!r}")
    gen = _make_rng(seed, rng)
    starts = _starts(W, rank, init, restarts, gen)
    r = starts[0][2].shape[0]
    deadline = None if time_limit is None else t_wall + time_limit

    runs: list[dict[str, Any]] = []
    k_offset = 0
    for name, B0, L0, child in starts:
        run = _alm_run(W, B0, L0, child, gamma=gamma, o=opts, deadline=deadline,
                       callback=callback, k_offset=k_offset, start=name)
        run["start"] = name
        runs.append(run)
        k_offset += run["nit"]
        if run["status"] == TIME_LIMIT:
            break

    table = []
    start_pairs = []
    for i, (name, _B0, L0, _child) in enumerate(starts):
        L0 = project_l1_ball_columns(L0)
        B0 = polish(W, L0, gamma, tol)
        resid0, l1, factor0 = pair_stats(W, B0, L0)
        ok0 = _feasible(resid0, l1, normW, gamma, tol)
        if ok0:
            start_pairs.append({"start": name, "B": B0, "L": L0, "resid": resid0, "max_l1": l1,
                                "error_factor": factor0})
        run = runs[i] if i < len(runs) else None
        table.append({"name": name,
                      "start_factor": factor0 if ok0 else math.inf,
                      "run_factor": math.inf if run is None or not _feasible(
                          run["resid"], run["max_l1"], normW, gamma, tol) else run["error_factor"],
                      "status": "skipped" if run is None else run["status"],
                      "repaired": False if run is None else run["repaired"],
                      "nit": 0 if run is None else run["nit"],
                      "cpu_seconds": 0.0 if run is None else run["cpu_seconds"],
                      "wall_seconds": 0.0 if run is None else run["wall_seconds"]})

    finished = len(runs) == len(starts) and all(u["status"] in (CONVERGED, FAILED) for u in runs)
    feasible_runs = [u for u in runs if _feasible(u["resid"], u["max_l1"], normW, gamma, tol)]
    pool = feasible_runs + (start_pairs if finished else [])
    # A capped solver reports what its runs computed; only when none of them is feasible does a
    # feasible start stand in, so that a valid decomposition is returned whenever one was at hand.
    fallback = not pool and not finished and bool(start_pairs)
    if fallback:
        pool = start_pairs
    if pool:
        best = min(pool, key=lambda u: u["error_factor"])
    else:
        best = min(runs, key=lambda u: u["resid"])
    kept_start = any(best is s for s in start_pairs)
    nrefined = 0
    if finished and pool:
        status = CONVERGED
        message = (f"every run met the stopping rule; best decomposition from start "
                   f"'{best['start']}'" + (" (the start itself)" if kept_start else ""))
        # Refinement: Algorithm 1 again from the best L, with pi = 0 and beta = beta0 (a restart
        # of the penalty schedule, which by then has frozen the iterate). Only rounds that meet
        # their stopping rule with a feasible pair may replace the best.
        for j, child in enumerate(gen.spawn(refine)):
            if deadline is not None and time.perf_counter() > deadline:
                message += "; refinement skipped at time_limit"
                break
            run = _alm_run(W, best["B"], best["L"], child, gamma=gamma, o=opts, deadline=deadline,
                           callback=callback, k_offset=k_offset, start=f"{best['start']}+refine")
            run["start"] = f"{best['start']}+refine{j + 1}"
            runs.append(run)
            k_offset += run["nit"]
            nrefined += 1
            ok = run["status"] == CONVERGED and _feasible(run["resid"], run["max_l1"], normW, gamma, tol)
            improved = ok and run["error_factor"] < best["error_factor"]
            table.append({"name": run["start"], "start_factor": best["error_factor"],
                          "run_factor": run["error_factor"] if ok else math.inf,
                          "status": run["status"], "repaired": run["repaired"], "nit": run["nit"],
                          "cpu_seconds": run["cpu_seconds"], "wall_seconds": run["wall_seconds"]})
            if improved:
                gain = 1.0 - run["error_factor"] / best["error_factor"]
                best, kept_start = run, False
                message = f"every run met the stopping rule; best decomposition from '{run['start']}'"
            if not improved or gain <= refine_rtol:
                break
    elif finished:
        status, message = FAILED, best["message"]
    else:
        capped = next(u for u in runs if u["status"] not in (CONVERGED, FAILED))
        status = capped["status"]
        message = f"run from start '{capped['start']}': {capped['message']}"
        if len(runs) < len(starts):
            message += f"; {len(starts) - len(runs)} later start(s) skipped"
        if fallback:
            message += (f"; no run met the residual test, so the best feasible start ('{best['start']}', "
                        "projected and polished) is returned")
        elif pool:
            message += f"; returned: the run from start '{best['start']}'" + (
                " (repaired)" if best.get("repaired") else "")

    B, L = best["B"], best["L"]
    resid, max_l1, factor = pair_stats(W, B, L)
    fun = float(np.vdot(B, B))
    # The run that produced the returned pair (None when a start that never ran is returned).
    src = best if "beta" in best else next((u for u in runs if u["start"] == best["start"]), None)
    return SolverResult.since(
        t_wall, t_cpu, x=(B, L), fun=fun, status=status, message=message, nit=sum(u["nit"] for u in runs),
        ninner=sum(u["ninner"] for u in runs),
        extra={
            "residual": resid,
            "rel_residual": resid / normW,
            "max_col_l1": max_l1,
            "error_factor": factor,
            "rank": r,
            "gamma": gamma,
            "start": best["start"],
            "kept_start": kept_start,
            "refine_rounds": nrefined,
            "starts": table,
            "beta": src["beta"] if src is not None else math.nan,
            "revived_rows": src["revived"] if src is not None else 0,
            "repaired": bool(best.get("repaired", False)),
            "fun_history": np.concatenate([np.asarray(u["fun_history"], float) for u in runs]),
            "residual_history": np.concatenate([np.asarray(u["residual_history"], float) for u in runs]),
            "beta_history": np.concatenate([np.asarray(u["beta_history"], float) for u in runs]),
        },
    )
