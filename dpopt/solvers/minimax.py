"""Certified weighted minimax per-query error on the (eps, delta) sum solver, and fitness for use.

    minimise  s(X) = max_i Var_i(X) / c_i,   Var_i(X) = w_i X^+ w_i^T,   over X PSD with diag(X) <= 1,

the least worst-case (target-weighted) query variance of a strategy A with A^T A = X and sens2(A) <= 1
(multiply by the privacy variance factor P(eps, delta)). The conic reference is `formulations.minimax`.

Duality. max_i a_i = max over u in the simplex of sum_i u_i a_i, so by the minimax theorem (the
objective is convex in X, linear in u, the simplex compact)

    OPT = max_{u in simplex} F(u),   F(u) = min_{diag X <= 1} trace(G_u X^+),   G_u = W^T diag(u / c) W,

and F(u) is the (eps, delta) sum problem of `convex_dp` on the Gram G_u. F is concave (a minimum of
functions linear in u) and 1-homogeneous, with supergradient g_i = Var_i(X*(u)) / c_i at the inner
optimum X*(u), so F(u) = u . g. Every outer iterate therefore gives two certified numbers:

- LOWER: the inner solver's dual bound at u, a lower bound on F(u) <= OPT whatever u is;
- UPPER: s(X) of any feasible X (diag X <= 1), here the inner primal point.

Outer method. While the gap is above `newton_gap` (1%): exponentiated-gradient ascent on u,

    u <- u * exp(p (g / (u . g) - 1)),  renormalised,

with an adaptive step p (x1.5 after a step that raises the inner dual bound, halved and retried
otherwise), each inner solve warm-started from the previous multipliers d. Its lower bound converges
fast (second order in u - u*) but the upper bound of X*(u) only at first order: AllRange(16) takes 2057
inner solves to a 1e-6 gap, 8 with the Newton steps below. Below 1%: projected Newton-CG on the joint
dual psi(u, d) (`minimax_newton.newton_ascent`), each step tried at one joint point (a Cholesky and an
eigendecomposition, no inner sum solve) and taken when psi rises, until the point's own gap is below
tol / 10; its end is certified without an inner solve (`certify`: the sum dual bound at (u, d) from one
eigendecomposition and one SVD, and the variances of the point's strategy), and by one inner solve at its u
when that does not reach tol (an exponentiated-gradient step when it does not ascend). Grid sequencing
(`coarse_start`) starts WidthK at its coarse optimum and ascends from there before any inner solve. If such
an inner solve moves neither bound (WRange(16, 64): X*(u) at the joint optimum's u completes the row space
badly), the solver goes back to where the ascents began and takes one Newton
step per outer iteration, each trial step judged by an inner solve. Measured (single runs, one BLAS
thread, CPU s, tol 1e-4): trying each Newton step by an inner solve left Width32(1024) at a 3.8e-3 gap
after 900 s, joint points converge in 239 s (Width32(512): 10 s against 24 s); starting Newton at 10% or
at once took AllRange(512) 49 or 60 s against 18 s from 1%. Non-uniform
targets can leave queries inactive at the optimum with G_{u*} singular, where X*(u) does not determine
their variance: Prefix(12) with c in [1, 3] (seed 1) reaches a 3.5e-6 gap in 20 s.

Variances in the row space. For a singular Gram (rank-deficient W: WidthK, WRange with m < n,
marginals without the full table) the sum optimum is singular (rank k = rank W, range = W's row
space), and `convex_dp` returns the positive definite "range complement" X(d)/m + diag(1 - diag X(d)/m)
with cond ~ 1e14: measured, variances through its Cholesky factor were off by 0.3% (and by 4e-6
through a QR of its factor A), so the "upper" bound fell below the certified lower one. The solver
therefore uses the inner solver's uniformly scaled factor A_uni = Y / sqrt(m) (the first k rows of
extra["A"]: range(G) exactly, diag <= 1) and an orthonormal basis U (n x k) of W's row space
(eigenvectors of W^T C^{-1} W above `_ROW_SPACE_RTOL`): with B = A_uni U (k x k), X = U B^T B U^T and
Var_i = w_i X^+ w_i^T = ||v_i R^{-1}||^2, v_i = w_i U, R the triangular factor of a QR decomposition of
B. R is conditioned like X restricted to the row space (moderate), not like the completed X. For W of full
column rank U = I and B = A (the inner solver's "diagonal rescaling", diag(X) = 1).

Transposed form (`transposed_rows`, `untranspose`). When W has full row rank and at most half as many
queries as cells (WRange(m, n) with m <= n / 2), restricting X to W's row space loses nothing, so X = W^T Sigma^{-1} W with
Sigma = W X^+ W^T (the answers' covariance, m x m) and X_jj = w^j Sigma^{-1} w^j^T over the columns w^j
of W. As s(X) is unchanged by scaling Sigma, the minimax value is the least max_j (Wt^T S^{-1} Wt)_jj over
diag(S) <= 1 with Wt = C^{-1/2} W and S = C^{-1/2} Sigma C^{-1/2} scaled: this problem on the workload
Wt^T (n queries over m cells, unit targets, full column rank). Its joint dual is psi with u and d
exchanged (D_d^{1/2} W^T D_{u/c} W D_d^{1/2} and D_u^{1/2} Wt D_d Wt^T D_u^{1/2} have the same nonzero
eigenvalues), so its certified bounds are this problem's. Its inner Grams are m x m instead of n x n,
singular only when the active cells do not span R^m, where here G_u loses rank with any inactive query.
Measured (benchmarks/results/minimax.md, one BLAS thread, medians of 3): WRange(256, 1024) in 1.94 CPU s
against 9.30 as given (side by side, `bench_minimax --direct`); WRange(512, 2048) converged at 6.4e-5 in 48 s,
where the problem as given stopped at its budget at 4.4e-3 after 408 s (single run). A W of lower row rank is
solved as given: WRange(1024, 4096) (seed 0) has rank 1023.

Range workloads (AllRange, Prefix, WidthK, WRange and any 0/1 workload of contiguous rows) are held
as pairs of boundaries: query [a, b] is e_{b+1} - e_a on the n + 1 prefix boundaries, so G_u is two
reversed cumulative sums of an (n+1) x (n+1) weighted Laplacian and all m variances come from
Q = B X^+ B^T in O(m + n^2) after one triangular factorisation: AllRange(1024) (524,800 queries) never
materialises W.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp

from dpopt.privacy import DEFAULT_CALIBRATION, epsilon_for_sigma
from dpopt.solvers.convex_dp import solve_convex_dp
from dpopt.solvers.convex_dp_core import dual_bound_from_factor, range_factor
from dpopt.solvers.minimax_newton import JointPoint, newton_ascent, newton_step
from dpopt.solvers.result import (
    CONVERGED,
    MAX_ITER,
    STALLED,
    SolverResult,
    relative_gap,
    stop_rule,
)
from dpopt.validation import check_number, check_positive_number, check_time_limit
from dpopt.workloads import AllRange, Prefix, WidthK, Workload, range_rows

#: A step is accepted when the inner dual bound does not fall by more than this relative amount (the
#: bound is computed from singular values to about this accuracy). Measured: a slack of the inner gap
#: (accepting any fall the inexact inner solves could explain) took Prefix(256) 57 outer iterations
#: against 29.
_ASCENT_RTOL = 1e-13
#: Inner sum solves are asked for a relative gap of _INNER_GAP_FACTOR * gap^2 (gap: the outer relative
#: gap), between `inner_tol` and _INNER_TOL_MAX. The supergradient g comes from the inner primal point,
#: whose error is first order in the multipliers' error, i.e. about the square root of the inner gap
#: (the inner dual is smooth at its optimum): 0.01 gap^2 keeps g within about 0.1 gap of exact, below
#: what the outer step must resolve. Measured (one BLAS thread, single runs): Prefix(1024) to a 1e-4 gap
#: in 51-65 CPU s against 80 s at a fixed 1e-12, Width32(512) in 37 s against no convergence in 60 s; the
#: outer iteration counts at n <= 256 and tol 1e-6 were unchanged.
_INNER_GAP_FACTOR = 0.01
_INNER_TOL_MAX = 1e-8
#: The exponentiated-gradient step is taken in log space with its exponent capped here (a step never
#: multiplies a weight by more than e^700, and an infinite variance stays finite in the update).
_MAX_EXPONENT = 700.0
#: Below this step the weights move by less than 1e-12 relative per iteration: the supergradient is no
#: ascent direction there (F is not differentiable at u; seen on WRange(16, 64), which stalled with the
#: step near 1e-15 for thousands of iterations at a 5.3e-4 gap), and the solver stops STALLED.
_MIN_STEP = 1e-12
#: Row-space cut: an eigenvalue of W^T C^{-1} W counts as nonzero above this times the largest. eigh is
#: backward stable, so a zero eigenvalue comes out at most about n * eps * lam_max in size (2.3e-13 at
#: n = 1024); the cut is above the inner solver's RANK_TOL (1e-12), so both see the same rank for u
#: near uniform.
_ROW_SPACE_RTOL = 1e-10
#: Newton on the joint dual: Newton steps between certifying inner solves, CG steps per direction, and the
#: initial Levenberg-Marquardt damping (x10 after a rejected direction, /3 after an accepted one).
_NEWTON_MAX_STEPS = 20
_NEWTON_MAX_CG = 100
_NEWTON_DAMPING = 1e-4
_NEWTON_DAMPING_MAX = 1e2
_NEWTON_FLOOR = 0.1
#: The transposed form is used when it shrinks the inner Grams to m <= this fraction of n (8x cheaper
#: eigendecompositions). Measured at tol 1e-4, one BLAS thread, on a shared machine: Width32(1024) (m = n - 31)
#: transposed converges in 338 CPU s (one run); as given in 71 s (benchmarks/results/minimax.md, median of 3).
_TRANSPOSE_MAX_RATIO = 0.5
#: Grid sequencing (`coarse_start`) for WidthK(n, k) with n >= _COARSE_WIDTHS * k. Measured (one BLAS thread, single
#: runs): Width32(1024) to 1e-6 in 15.6 CPU s from Width32(512)'s weights (3.6 s) against 43.6 s from uniform ones;
#: Width32(2048) to 1e-4 in 205 s from Width32(1024)'s, against 465 to 948 s. With the ascents' ends certified
#: directly (`certify`), Width32(4096) to 1.2e-6 in 2173 s, where 8322 s from uniform weights reached 2.7e-4
#: (benchmarks/results/minimax.md).
_COARSE_WIDTHS = 32


class MatrixRows:
    """Queries given by a dense matrix W (m x n)."""

    def __init__(self, W: np.ndarray) -> None:
        self.W = np.asarray(W, dtype=float)
        self.m, self.n = self.W.shape

    def gram(self, weights: np.ndarray) -> np.ndarray:
        """W^T diag(weights) W."""
        return self.W.T @ (self.W * weights[:, None])

    def variances(self, F: np.ndarray) -> np.ndarray:
        """w_i F F^T w_i^T, where F F^T = X^+."""
        Y = self.W @ F
        return np.einsum("ij,ij->i", Y, Y)

    def forms(self, S: np.ndarray) -> np.ndarray:
        """w_i S w_i^T for a symmetric S (n x n)."""
        return np.einsum("ij,ij->i", self.W @ S, self.W)

    def project(self, P: np.ndarray) -> np.ndarray:
        """W P (m x k)."""
        return self.W @ P


class RangeRows:
    """Range queries [starts[q], ends[q]] over n cells, held as boundary pairs (module docstring)."""

    def __init__(self, n: int, starts: np.ndarray, ends: np.ndarray) -> None:
        self.n = int(n)
        self.lo = np.asarray(starts, dtype=np.int64)
        self.hi = np.asarray(ends, dtype=np.int64) + 1
        if self.lo.shape != self.hi.shape or (self.lo < 0).any() or (self.hi > self.n).any() or (
            self.hi <= self.lo
        ).any():
            raise ValueError("ranges must satisfy 0 <= start <= end < n")
        self.m = self.lo.size

    def gram(self, weights: np.ndarray) -> np.ndarray:
        """W^T diag(weights) W = B^T Lap B, Lap the weighted Laplacian of the boundary pairs."""
        N = self.n + 1
        w = np.asarray(weights, dtype=float)
        lap = np.bincount(self.lo * N + self.hi, weights=w, minlength=N * N)
        lap = -(lap + np.bincount(self.hi * N + self.lo, weights=w, minlength=N * N)).reshape(N, N)
        lap[np.diag_indices(N)] += np.bincount(self.lo, weights=w, minlength=N) + np.bincount(
            self.hi, weights=w, minlength=N
        )
        # G[i, k] = sum_{j > i, l > k} Lap[j, l]: reversed cumulative sums over boundaries 1..n.
        G = lap[1:, 1:][::-1, ::-1].cumsum(axis=0).cumsum(axis=1)[::-1, ::-1]
        return (G + G.T) / 2.0

    def variances(self, F: np.ndarray) -> np.ndarray:
        """w_i F F^T w_i^T, where F F^T = X^+."""
        return self.forms(F @ F.T)

    def project(self, P: np.ndarray) -> np.ndarray:
        """W P (m x k): differences of the prefix sums of P's rows at each range's boundaries."""
        C = np.zeros((self.n + 1, P.shape[1]))
        np.cumsum(P, axis=0, out=C[1:])
        return C[self.hi] - C[self.lo]

    def forms(self, S: np.ndarray) -> np.ndarray:
        """w_i S w_i^T from Q = B S B^T (B: boundaries), Q[hi, hi] + Q[lo, lo] - 2 Q[lo, hi]."""
        Q = np.zeros((self.n + 1, self.n + 1))
        Q[1:, 1:] = S.cumsum(axis=0).cumsum(axis=1)
        dq = np.diag(Q)
        return dq[self.hi] + dq[self.lo] - 2.0 * Q[self.lo, self.hi]


def query_rows(workload: Workload | np.ndarray) -> MatrixRows | RangeRows:
    """The queries of a workload (or of a matrix W) in the cheapest form the solver knows."""
    if isinstance(workload, AllRange):
        n = workload.n
        i, j = np.triu_indices(n)
        return RangeRows(n, i, j)
    if isinstance(workload, Prefix):
        n = workload.n
        return RangeRows(n, np.zeros(n, dtype=np.int64), np.arange(n))
    S = workload.sparse() if isinstance(workload, Workload) else sp.csr_matrix(np.asarray(workload, dtype=float))
    S = sp.csr_matrix(S)
    S.sum_duplicates()
    S.eliminate_zeros()
    counts = np.diff(S.indptr)
    if counts.min() > 0 and np.all(S.data == 1.0):
        S.sort_indices()
        first = S.indices[S.indptr[:-1]]
        last = S.indices[S.indptr[1:] - 1]
        if np.array_equal(last - first + 1, counts):
            return RangeRows(S.shape[1], first, last)
    return MatrixRows(S.toarray())


def factor_variances(rows: MatrixRows | RangeRows, R: np.ndarray, U: np.ndarray | None = None) -> np.ndarray:
    """w_i X^+ w_i^T for X = U R^T R U^T (R (k, k) upper triangular; U (n, k) orthonormal, None = I).

    X^+ = F F^T with F = U R^{-1}; inf for every query when R has a zero or non-finite entry on its
    diagonal (X singular on the row space).
    """
    if not np.isfinite(R).all() or np.abs(np.diag(R)).min() <= 0.0:
        return np.full(rows.m, np.inf)
    F = sla.solve_triangular(R, np.eye(R.shape[0]), lower=False, check_finite=False)
    return rows.variances(F if U is None else U @ F)


def _triangular_factor(A: np.ndarray) -> np.ndarray:
    """R (k, k) upper triangular with R^T R = A^T A (A (r, k); zero rows appended when r < k)."""
    k = A.shape[1]
    if A.shape[0] < k:
        A = np.vstack([A, np.zeros((k - A.shape[0], k))])
    return sla.qr(A, mode="r", check_finite=False)[0][:k]


def _unit_diag(R: np.ndarray, U: np.ndarray | None) -> np.ndarray:
    """R scaled so that diag(U R^T R U^T) <= 1 (divided by sqrt of the largest entry when it exceeds 1)."""
    F = R if U is None else R @ U.T
    top = float(np.einsum("ij,ij->j", F, F).max())
    return R / math.sqrt(top) if top > 1.0 else R


def row_space_basis(rows: MatrixRows | RangeRows, c: np.ndarray) -> np.ndarray | None:
    """U (n, k) orthonormal: eigenvectors of W^T C^{-1} W above _ROW_SPACE_RTOL when W is rank deficient, else None."""
    lam, Q = np.linalg.eigh(rows.gram(1.0 / c))
    keep = lam > _ROW_SPACE_RTOL * lam[-1]
    return None if keep.all() else Q[:, keep]


def strategy_factor(res: SolverResult, U: np.ndarray | None) -> np.ndarray:
    """R (k, k) of a `solve_convex_dp` strategy in the basis U (module docstring), with diag(U R^T R U^T) <= 1."""
    A = np.asarray(res.extra["A"], dtype=float)
    if U is not None:
        A = A[: int(res.extra["rank"])] @ U  # the uniformly scaled part, range(G) (module docstring)
    return _unit_diag(_triangular_factor(A), U)


def solve_minimax(
    workload: Workload | np.ndarray,
    targets: np.ndarray | float = 1.0,
    *,
    tol: float = 1e-6,
    max_iter: int = 5000,
    time_limit: float | None = None,
    inner_tol: float | None = None,
    step: float = 1.0,
    newton_gap: float = 0.01,
    callback: Callable[[dict[str, Any]], bool | None] | None = None,
    transpose: bool = True,
    coarse: bool = True,
) -> SolverResult:
    """Least max_i w_i X^+ w_i^T / c_i subject to diag(X) <= 1, with a certified gap (module docstring).

    workload: a dpopt Workload (range families are never materialised) or the query matrix W (m x n).
    targets: c (m,) > 0 or one number (c = 1: the plain minimax variance).
    tol: relative gap (upper - lower) / upper at which the solver stops with CONVERGED.
    max_iter / time_limit: outer iterations / wall seconds (statuses MAX_ITER / TIME_LIMIT); no inner solve
        or joint point starts that would end past time_limit at its last measured cost.
    inner_tol: the tightest relative gap asked of an inner sum solve (default 1e-12); the gap asked
        follows the outer gap (`_INNER_GAP_FACTOR`): a fixed 1e-8 slowed Prefix(16) from 15 to 687
        iterations, a fixed 1e-12 spends most inner Newton steps below the round-off floor.
    step: initial exponentiated-gradient step p; newton_gap: the gap below which Newton steps are tried
        (0 turns them off).
    callback: called per iteration with n (cells of the level solved), nit, fun (upper), dual_bound (lower), gap,
        u, d; True stops.
    transpose: solve W of full row rank with at most half as many queries as cells in the transposed form
        (module docstring); False always solves the problem as given.
    coarse: start WidthK(n, k), n >= 32 k, with equal targets from the solution of WidthK(n // 2, k) (`coarse_start`,
        given half the time limit; the callback sees its iterations too); False starts from uniform weights.

    Returns a SolverResult: x = X (n, n) with diag(X) <= 1, fun = its max_i Var_i / c_i (the upper
    bound), dual_bound = the best certified lower bound, gap = relative gap. extra: "u" (query weights
    of the best lower bound), "variances" (Var_i(X), unweighted), "d" (the cell multipliers of that bound), "R"
    and "basis" (X = U R^T R U^T with U = basis, None for I; the variances are computed from R),
    "inner_solves", "newton_trials" (points tried by Newton steps: joint points, or inner solves once
    single steps take over), "history", "forms": ("direct",), ("transposed",) or, when the transposed
    form stopped short of tol in time, ("transposed", "direct") with the bounds of both (the counts and
    histories added up). In the transposed form "u" and "d" are the transposed problem's "d" and "u". "coarse"
    is the coarse level's result, or None.
    """
    t_wall, t_cpu = time.perf_counter(), time.process_time()
    tol, step = check_positive_number(tol, "tol"), check_positive_number(step, "step")
    time_limit = check_time_limit(time_limit)
    if not (math.isfinite(check_number(newton_gap, "newton_gap")) and newton_gap >= 0):
        raise ValueError(f"newton_gap must be a finite number >= 0; got {newton_gap!r}")
    rows = query_rows(workload)
    c = np.full(rows.m, float(targets)) if np.ndim(targets) == 0 else np.asarray(targets, dtype=float)
    if c.shape != (rows.m,) or not np.isfinite(c).all() or (c <= 0).any():
        raise ValueError(f"targets must be one number or ({rows.m},) finite values > 0")
    inner_tol = 1e-12 if inner_tol is None else float(inner_tol)
    options = {"tol": tol, "max_iter": max_iter, "inner_tol": inner_tol, "step": step, "newton_gap": newton_gap}
    Wt = transposed_rows(rows, c) if transpose else None
    if Wt is not None:
        stop = [False]  # set when the callback stops the transposed run

        def swapped(i: dict[str, Any]) -> bool:  # the callback sees this problem's u and d
            stop[0] = callback is not None and bool(callback({**i, "u": i["d"], "d": i["u"], "n": rows.n}))
            return stop[0]
        r = untranspose(solve_minimax(Wt.T, time_limit=time_limit, callback=swapped, transpose=False, **options),
                        Wt, c, t_wall, t_cpu)
        left = None if time_limit is None else time_limit - (time.perf_counter() - t_wall)
        if r.status == CONVERGED or (left is not None and left <= 0) or stop[0]:
            return r
        direct = solve_minimax(workload, c, time_limit=left, callback=callback, transpose=False, **options)
        return _best_of(r, direct, tol, t_wall, t_cpu)
    U = row_space_basis(rows, c)
    rank_w = rows.n if U is None else U.shape[1]

    # Wall seconds of the last inner solve and of the last joint point: no unit of work starts that would end
    # past the deadline at that cost (at n = 4096 either takes 30 to 200 s; a TIME_LIMIT solve used to end up
    # to one iteration late: Width32(4096) at 5672 s of a 5400 s budget).
    cost = {"inner": 0.0, "point": 0.0}
    deadline = None if time_limit is None else t_wall + time_limit  # a time.perf_counter() value

    def leaving(*units: str) -> float | None:  # the deadline for work that must leave room for these units
        return None if deadline is None else deadline - sum(cost[k] for k in units)

    def fits(*units: str) -> bool:
        return deadline is None or time.perf_counter() <= leaving(*units)  # type: ignore[operator]

    def inner(u: np.ndarray, d: np.ndarray | None, gap_asked: float) -> tuple[SolverResult, np.ndarray, np.ndarray]:
        t_start = time.perf_counter()
        G = rows.gram(u / c)
        if d is not None:
            d = np.maximum(d, 1e-14 * d.max())
        remaining = None if time_limit is None else max(time_limit - (time.perf_counter() - t_wall), 1e-3)
        res = solve_convex_dp(G, tol=gap_asked, x0=d, time_limit=remaining)
        # X and best_X below are k x k triangular factors R (strategy Gram U R^T R U^T).
        R = strategy_factor(res, U)
        out = res, R, factor_variances(rows, R, U) / c
        cost["inner"] = time.perf_counter() - t_start
        return out

    half = None if time_limit is None else time_limit / 2
    level = coarse_start(workload, c, time_limit=half, callback=callback, **options) if coarse else None
    u, d_start = (np.full(rows.m, 1.0 / rows.m), None) if level is None else level[:2]
    lower, best_u, best_d, upper, best_X, best_var = 0.0, u, d_start, math.inf, None, None
    p = float(step)
    damping, n_solves, n_newton, newton_target, upper_stuck = _NEWTON_DAMPING, 0, 0, 0.1 * tol, False
    start: tuple[Any, ...] | None = None  # the iterate at which the first Newton ascent began
    history: list[dict[str, float]] = []
    status, message, nit = MAX_ITER, f"reached max_iter = {max_iter}", 0

    def trial(u_new: np.ndarray, d_start: np.ndarray, slack: float = _ASCENT_RTOL) -> bool | None:
        """Inner solve at u_new (best bounds kept); moves there if the inner dual bound did not fall.

        Returns True (moved), False (no ascent) or None (G_u of lower rank than W: zero weights left a query
        outside range(X), or made X singular on W's row space).
        """
        nonlocal u, res, X, g, lower, best_u, best_d, upper, best_X, best_var, n_solves
        r2, X2, g2 = inner(u_new, d_start, gap_asked)
        n_solves += 1
        if float(r2.dual_bound) > lower:
            lower, best_u, best_d = float(r2.dual_bound), u_new, r2.extra["d"]
        if g2.max() < upper:
            upper, best_X, best_var = float(g2.max()), X2, g2
        # A step is taken only from a converged inner solve with finite variances: a stalled one (the sum
        # solver fails on some very ill-conditioned G_u, e.g. WRange(16, 64) with one weight near 1e-6)
        # gives a wrong g, and a zero weight can leave a query outside range(X) (WidthK).
        if not np.isfinite(g2).all() or int(r2.extra["rank"]) < rank_w:
            return None
        if r2.status != CONVERGED or float(r2.dual_bound) < float(res.dual_bound) * (1.0 - slack):
            return False
        u, res, X, g = u_new, r2, X2, g2
        return True

    def certify(p: JointPoint) -> None:
        """Bounds at a joint point without an inner solve, kept when better: the sum problem's dual bound at (u, d)
        (`dual_bound_from_factor`: an eigendecomposition of G_u and an SVD) and the variances of p's strategy."""
        nonlocal lower, best_u, best_d, upper, best_X, best_var
        low = dual_bound_from_factor(range_factor(rows.gram(p.u / c), full=False)[0], p.d)
        if low > lower:
            lower, best_u, best_d = low, p.u, p.d
        A = (p.Pi * np.sqrt(p.s)).T  # A^T A = X(p), k x n
        R = _unit_diag(_triangular_factor(A if U is None else A @ U), U)
        g_p = factor_variances(rows, R, U) / c
        if g_p.max() < upper:
            upper, best_X, best_var = float(g_p.max()), R, g_p

    if level is not None:  # Newton from the prolonged weights at once; its end certified without an inner solve
        try:
            moved, damping, n_newton = newton_ascent(JointPoint(rows, c, U, u, d_start), newton_target,
                                                     _NEWTON_MAX_STEPS, _NEWTON_MAX_CG, damping, _NEWTON_DAMPING_MAX,
                                                     _NEWTON_FLOOR, leaving("point", "inner"))
            certify(moved)
            u, d_start = np.maximum(moved.u, 1e-12 * moved.u.max()), moved.d
            u = u / u.sum()
        except np.linalg.LinAlgError:
            pass
    res = None  # the inner solve at the current u, unless the start is certified already
    if not relative_gap(upper, lower) <= tol:  # nan while upper is inf
        res, X, g = inner(u, d_start, _INNER_TOL_MAX)
        n_solves = 1
        if level is not None and (not np.isfinite(g).all() or int(res.extra["rank"]) < rank_w):  # misses W's row space
            u, n_solves = np.full(rows.m, 1.0 / rows.m), 2
            res, X, g = inner(u, None, _INNER_TOL_MAX)
        if float(res.dual_bound) > lower:
            lower, best_u, best_d = float(res.dual_bound), u, res.extra["d"]
        if g.max() < upper:
            upper, best_X, best_var = float(g.max()), X, g

    for nit in range(max_iter + 1):
        gap = relative_gap(upper, lower)
        history.append({"nit": nit, "upper": upper, "lower": lower, "gap": gap, "step": p, "solves": n_solves})
        report = {"n": rows.n, "nit": nit, "fun": upper, "dual_bound": lower, "gap": gap, "u": u,
                  "d": best_d if res is None else res.extra["d"]}
        stop = stop_rule(callback is not None and bool(callback(report)), gap, tol, nit, max_iter,
                         time.perf_counter() - t_wall + cost["inner"], time_limit)  # the next one must fit
        if stop is not None:
            status, message = stop
            break
        gap_asked = min(_INNER_TOL_MAX, max(inner_tol, _INNER_GAP_FACTOR * gap * gap))
        accepted = False
        if gap < newton_gap and fits("point", "inner"):  # Newton on the joint dual, then a certifying inner solve
            d_now = res.extra["d"] / float(res.extra["d"].sum())
            t_point = time.perf_counter()
            try:
                point = JointPoint(rows, c, U, u, np.maximum(d_now, 1e-14 * d_now.max()))
            except np.linalg.LinAlgError:
                point = None
            cost["point"] = time.perf_counter() - t_point
            if point is not None and upper_stuck:
                # Once certifying an ascent's end moved neither bound: one Newton step per outer iteration,
                # each trial step an inner solve (WRange(16, 64) stalled at 3.3e-3 with ascents alone).
                accepted, damping, tried = newton_step(
                    point, min(0.1, math.sqrt(gap)), _NEWTON_MAX_CG, damping, _NEWTON_DAMPING_MAX, _NEWTON_FLOOR,
                    functools.partial(trial, slack=max(_ASCENT_RTOL, gap_asked)), leaving("inner"))
                n_newton, accepted = n_newton + tried, bool(accepted)
            elif point is not None:
                moved, damping, trials = newton_ascent(
                    point, newton_target, _NEWTON_MAX_STEPS, _NEWTON_MAX_CG, damping, _NEWTON_DAMPING_MAX,
                    _NEWTON_FLOOR, leaving("point", "inner"))
                n_newton += trials
                if moved is not point and moved.gap <= newton_target:
                    certify(moved)
                if moved is not point and relative_gap(upper, lower) <= tol:
                    continue  # certified at the ascent's end: the stop rule ends the solve
                if moved is not point:  # floored: exponentiated gradient cannot revive a weight at exactly 0
                    u_new = np.maximum(moved.u, 1e-12 * moved.u.max())  # (WidthK(16, 4) stalled at 3.9e-3 without)
                    before, start = (upper, lower), start or (u, res, X, g)
                    accepted = bool(trial(u_new / u_new.sum(), moved.d, max(_ASCENT_RTOL, gap_asked)))
                    if (upper, lower) == before:  # neither bound moved: single steps from where the ascents began
                        (u, res, X, g), upper_stuck, accepted = start, True, True
                # A point whose own gap met the target but whose inner solve did not certify tol: aim lower
                # (psi rises by about gap^2, seen in double precision down to a gap of about sqrt(eps)).
                if moved.gap <= newton_target and relative_gap(upper, lower) > tol:
                    newton_target = max(0.1 * newton_target, 1e-8)
        if accepted:
            continue
        with np.errstate(divide="ignore"):  # a weight that underflowed (or was set) to 0 stays 0
            log_u = np.log(u)
        ascent = g / float(u @ g) - 1.0
        for _ in range(40):
            if not fits("inner"):
                break
            z = log_u + np.minimum(p * ascent, _MAX_EXPONENT)
            u_new = np.exp(z - z.max())
            if trial(u_new / u_new.sum(), res.extra["d"]):
                p *= 1.5
                accepted = True
                break
            p /= 2.0
        if not accepted and not fits("inner"):
            continue  # stop_rule stops: the next inner solve would end past the time limit
        if not accepted or p < _MIN_STEP:
            status, message = STALLED, f"no ascent step found at gap {gap:.2e} (step {p:.1e})"
            break
    F = best_X if U is None else best_X @ U.T  # X = U R^T R U^T, symmetrised, diag <= 1
    X_best = F.T @ F
    X_best = (X_best + X_best.T) / 2.0
    X_best /= max(float(np.diag(X_best).max()), 1.0)
    return SolverResult.since(
        t_wall, t_cpu, x=X_best, fun=upper, status=status, message=message, nit=nit, ninner=n_solves,
        dual_bound=lower, gap=relative_gap(upper, lower),
        extra={
            "u": best_u,
            "variances": best_var * c,
            "d": best_d,
            "R": best_X,
            "basis": U,
            "inner_solves": n_solves,
            "newton_trials": n_newton,
            "history": history,
            "forms": ("direct",),
            "coarse": None if level is None else level[2],
        },
    )


def prolong(v: np.ndarray, n_to: int, n_from: int, edge: int, offset: float) -> np.ndarray:
    """Weights v of WidthK over n_from cells carried to n_to cells (grid sequencing), entry i at (i + offset) / n.

    The optimal weights follow one profile in relative position in the interior (interpolated) and the distance
    from the nearer end within `edge` entries of it (copied, scaled to meet the interior); seen on the Width32
    optima of n = 256 to 1024, where the prolonged weights' joint dual psi^2 is within 5e-5 of the optimum.
    """
    w = np.interp((np.arange(v.size + n_to - n_from) + offset) / n_to, (np.arange(v.size) + offset) / n_from, v)
    w[:edge] = v[:edge] * (w[edge] / v[edge])
    w[-edge:] = v[-edge:] * (w[-edge - 1] / v[-edge - 1])
    return w


def coarse_start(workload: Any, c: np.ndarray, **options: Any) -> tuple[np.ndarray, np.ndarray, SolverResult] | None:
    """Grid sequencing: for WidthK(n, k) with equal targets and n >= _COARSE_WIDTHS k, the minimax query and cell
    weights (u, d) of WidthK(n // 2, k) (`solve_minimax` with options, recursively) prolonged to n, and that result."""
    n, k = (workload.n, workload.n - workload.m + 1) if isinstance(workload, WidthK) else (0, 1)
    if not (np.ptp(c) == 0 and n >= _COARSE_WIDTHS * k):
        return None
    r = solve_minimax(WidthK(n // 2, k), transpose=False, **options)
    u, d = (prolong(r.extra[key], n, n // 2, 2 * k, at) for key, at in (("u", k / 2), ("d", 0.5)))
    d = np.maximum(d, 1e-14 * d.max())
    return u / u.sum(), d / d.sum(), r


def transposed_rows(rows: MatrixRows | RangeRows, c: np.ndarray) -> np.ndarray | None:
    """C^{-1/2} W (m x n) when m <= _TRANSPOSE_MAX_RATIO n and W has full row rank (the transposed form, module
    docstring), else None."""
    if rows.m > _TRANSPOSE_MAX_RATIO * rows.n:
        return None
    W = rows.W if isinstance(rows, MatrixRows) else range_rows(rows.n, rows.lo, rows.hi - 1).toarray()
    Wt = W / np.sqrt(c)[:, None]
    return Wt if row_space_basis(MatrixRows(Wt.T), np.ones(rows.n)) is None else None


def untranspose(r: SolverResult, Wt: np.ndarray, c: np.ndarray, t_wall: float, t_cpu: float) -> SolverResult:
    """The minimax result for W = C^{1/2} Wt from `r`, the result on the transposed workload Wt^T (module docstring).

    With S = R'^T R' the transposed strategy (m x m, diag <= 1) and F = R'^{-T} Wt: X = F^T F / t,
    t = max diag(F^T F), and Var_i(X) = t c_i S_ii exactly; X = U R^T R U^T with U (n x m) orthonormal
    (a QR of Wt^T) and R the triangular factor of F U / sqrt(t).
    """
    Rs = np.asarray(r.extra["R"], dtype=float)  # the transposed workload has full column rank: basis None
    F = sla.solve_triangular(Rs, Wt, trans="T", check_finite=False)
    t = float(np.einsum("ij,ij->j", F, F).max())
    variances = t * c * np.einsum("ij,ij->j", Rs, Rs)
    U = sla.qr(Wt.T, mode="economic", check_finite=False)[0]
    X = F.T @ F / t
    X = (X + X.T) / 2.0
    X /= max(float(np.diag(X).max()), 1.0)
    fun = float((variances / c).max())
    return SolverResult.since(
        t_wall, t_cpu, x=X, fun=fun, status=r.status, message=r.message, nit=r.nit, ninner=r.ninner,
        dual_bound=r.dual_bound, gap=relative_gap(fun, float(r.dual_bound)),
        extra={**r.extra, "u": r.extra["d"] / float(r.extra["d"].sum()), "d": r.extra["u"], "variances": variances,
               "R": _triangular_factor(F @ U / math.sqrt(t)), "basis": U, "forms": ("transposed",)},
    )


def _best_of(a: SolverResult, b: SolverResult, tol: float, t_wall: float, t_cpu: float) -> SolverResult:
    """Two certified results on one optimum combined: the better strategy (upper bound) and the larger lower bound."""
    best, low = (a if a.fun <= b.fun else b), (a if a.dual_bound >= b.dual_bound else b)
    gap = relative_gap(best.fun, float(low.dual_bound))
    status, message = (CONVERGED, f"certified relative gap {gap:.2e} <= tol {tol:.1e} (both forms' bounds)") \
        if gap <= tol else (b.status, b.message)
    return SolverResult.since(
        t_wall, t_cpu, x=best.x, fun=best.fun, status=status, message=message, nit=a.nit + b.nit,
        ninner=a.ninner + b.ninner, dual_bound=low.dual_bound, gap=gap,
        extra={**best.extra, "u": low.extra["u"], "forms": a.extra["forms"] + b.extra["forms"],
               **{k: a.extra[k] + b.extra[k] for k in ("inner_solves", "newton_trials", "history")}},
    )


@dataclass
class FitnessForUse:
    """The strategy meeting every target variance at the least privacy cost (Xiao et al., PVLDB 2021).

    X: strategy Gram with diag(X) <= 1 (sens2 <= 1); value: max_i Var_i(X) / c_i under unit noise;
    scale: t = 1 / value, the factor by which the noise variance may grow (t > 1) or must shrink
    (t < 1) from unit noise with every target still met; sigma = sqrt(t) is the largest noise standard
    deviation per unit L2 sensitivity; result: the certifying SolverResult (value is its upper bound,
    so every target holds; the least possible value is >= result.dual_bound).
    """

    X: np.ndarray
    value: float
    scale: float
    result: SolverResult

    @property
    def sigma(self) -> float:
        return math.sqrt(self.scale)

    def epsilon(self, delta: float, calibration: str = DEFAULT_CALIBRATION) -> float:
        """Least epsilon at this delta for which the calibrated Gaussian noise meets every target."""
        return epsilon_for_sigma(self.sigma, delta, calibration)


def fitness_for_use(
    workload: Workload | np.ndarray, target_var: np.ndarray | float, **options: Any
) -> FitnessForUse:
    """Strategy and noise scale meeting Var_i <= target_var[i] for every query (see FitnessForUse).

    target_var: variance per query under unit-noise calibration with sens2 = 1. options go to
    `solve_minimax` (tol, max_iter, time_limit, ...).
    """
    res = solve_minimax(workload, target_var, **options)
    return FitnessForUse(X=res.x, value=float(res.fun), scale=1.0 / float(res.fun), result=res)
