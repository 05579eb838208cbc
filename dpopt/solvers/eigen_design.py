"""Eigen-design weights (seed 003, "Eigen-design"; Li & Miklau, PVLDB 5(6), 2012) with a certificate.

The strategy rows are the eigenvectors v_i of G = W^T W (eigenvalues lambda_i > 0) scaled by c_i, and the
squared weights u_i = c_i^2 solve the convex program

    minimise  sum_i lambda_i / u_i   subject to  sum_i u_i v_i[j]^2 <= 1 for every cell j,   u >= 0,

i.e. the (eps, delta) problem of seed 002 restricted to X = P diag(u) P^T (P = [v_1 .. v_k]): the total
squared error is trace(G X^+) = sum_i lambda_i / u_i and sens2^2 = max_j X_jj. Eigenvectors with
lambda_i = 0 get weight 0 (they answer nothing the workload asks).

Dual (derived like `convex_dp_core`): with M = P o P (n x k, M_ji = v_i[j]^2) and multipliers y >= 0,
minimising the Lagrangian over u gives u_i = sqrt(lambda_i / (M^T y)_i) and

    g(y) = 2 psi(y) - sum(y),   psi(y) = sum_i sqrt(lambda_i (M^T y)_i),   OPT_eigen >= psi(y)^2 / sum(y),

with psi homogeneous of degree 1/2, grad g = M u - 1 and -Hess g = (1/2) M diag(sqrt(lambda) c^{-3/2}) M^T
(c = M^T y). So the weights come from the same projected Newton-CG ascent as the seed 002 dual
(`diag_dual_newton`), with O(n k) Hessian-vector products: after the eigen-decomposition of G
(O(n^3), done once) an iteration costs a few matrix-vector products with M, which scales to n = 4096.
At y = 1 the bound is the SVD bound and u = sqrt(lambda) (the SVD-bound strategy). Since the problem is
a restriction of seed 002's, its optimum is >= the seed 002 optimum.

Why this algorithm, and the degeneracy it needed removed (measured with benchmarks/bench_eigen_design.py).
The program has k weights and n cell constraints; an interior-point method (Clarabel on
`formulations/eigen_design.py` is one) forms and factors a dense n x n system at every iteration,
O(n^3) each, while the dual Newton-CG iteration costs a few O(n k) products, so after the one
eigen-decomposition the weights cost less than it. What made the ascent stall (AllRange(2048) stopped
at gap 1.8e-8, AllRange(4096) took 51 iterations and 7.8x the CPU time) was the problem, not the method: for a workload
symmetric under reversing the cells (J G J = G: ranges, sliding windows, their Kronecker products) the
eigenvectors are symmetric or antisymmetric, the mirrored cells j, n-1-j have the same constraint, and
the dual depends only on y_j + y_{n-1-j}. A full eigh breaks that symmetry at the 1e-10 level where
eigenvalues nearly coincide, and the Newton step, cut at y >= 0 in one cell of a nearly equal pair, made
no progress. So such G is decomposed in the reflection's two eigenspaces (`_reflection_eigh`: exact
pairs, and two half-size eigh's, about 4x cheaper); that alone restores convergence (measured: the ascent
over all n cells then converges at every size), and merging the now equal constraint rows
(`merge_equal_cells`) halves the multipliers, which cuts the CPU time on Width32 by 1.2-1.9x. Measured
CPU seconds to gap 1e-8 at n = 4096 (eigen-decomposition included): AllRange 6.8, Prefix 15.6 (no
reflection symmetry: one full eigh), Width32 10.3; Clarabel took 36 s at AllRange(1024) (240x ours)
and over 300 s wall at Width32(2048). The certificate is always recomputed on the full, unmerged program.

Where G has a repeated eigenvalue the eigen-design depends on the basis chosen inside its eigenspace
(WidthK(16, 4) has a double eigenvalue 1: 31.0848 in the reflection-adapted basis, 31.0854 in the basis
numpy's eigh returns to the CVXPY model); each value is the certified optimum for its own basis. Nearly
repeated eigenvalues matter too: Width32(1024) has symmetric/antisymmetric pairs 3e-10 * lambda_max apart,
where a full eigh mixes the pair's vectors by about eps / gap ~ 1e-6; its basis gives 5717.0425 (the CVXPY
model and this solver with reflect=False agree on it), the exactly (anti)symmetric basis 5717.0193.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.linalg as sla

from dpopt.solvers.convex_dp_core import (
    RANK_TOL,
    check_newton_options,
    objective_from_factor,
    undo_unit_scale,
    unit_scale,
    unscaled_callback,
)
from dpopt.solvers.diag_dual_newton import DualPoint, PrimalPoint, maximise_dual, pcg
from dpopt.solvers.result import SolverResult
from dpopt.validation import check_gram, check_psd

#: Entry-wise tolerance on rows of P o P for two cells to count as the same constraint (`merge_equal_cells`).
MERGE_ATOL = 1e-13
#: G counts as symmetric under reversing the cells when max|G - J G J| <= REFLECTION_RTOL * max|G|.
REFLECTION_RTOL = 1e-13


class EigenDesignDual:
    """The eigen-design dual as a `diag_dual_newton.DualProblem`; lam (k,) > 0, M (n, k) = P o P."""

    def __init__(self, lam: np.ndarray, M: np.ndarray) -> None:
        self.lam, self.M = lam, M
        self.M2 = M * M

    def evaluate(self, y: np.ndarray) -> DualPoint | None:
        c = self.M.T @ y
        if not np.isfinite(c).all() or c.min() <= 1e-13 * c.max():
            return None  # an eigenvector with no weight on the support of y: psi not differentiable
        u = np.sqrt(self.lam / c)
        return DualPoint(d=y, phi=float(np.sqrt(self.lam * c).sum()), x=self.M @ u, data=(c, u))

    def rescale(self, p: DualPoint, r: float) -> DualPoint:
        c, u = p.data
        return DualPoint(d=p.d * (r * r), phi=p.phi * r, x=p.x / r, data=(c * (r * r), u / r))

    def newton_direction(
        self, p: DualPoint, free: np.ndarray, grad: np.ndarray, eta: float, max_cg: int, damping: float
    ) -> tuple[np.ndarray, int]:
        c, _ = p.data
        w = 0.5 * np.sqrt(self.lam) * c**-1.5
        Mf = self.M[free]

        def hess_vec(v: np.ndarray) -> np.ndarray:
            return Mf @ (w * (Mf.T @ v))

        return pcg(hess_vec, self.M2[free] @ w, grad[free], eta, max_cg, damping)

    def primal(self, p: DualPoint) -> PrimalPoint:
        """Weights u / m, m = max_j (M u)_j: feasible, objective m * psi exactly."""
        _, u = p.data
        m = float(p.x.max())
        return PrimalPoint(u / m, m * p.phi, "uniform scaling")


def _reflection_eigh(G: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigen-decomposition of a G with J G J = G (J reverses the cells) in J's two eigenspaces.

    With h = n // 2, the symmetric vectors are Q_s z = [z_top; (z_mid); J z_top] and the antisymmetric
    Q_a z = [z; (0); -J z] (scaled to unit norm), and G = Q_s G_s Q_s^T + Q_a G_a Q_a^T, so two
    eigen-decompositions of size about n / 2 give eigenvectors that are exactly (anti)symmetric: v_i[j]^2
    and v_i[n-1-j]^2 agree bit for bit, which a full eigh does not give where eigenvalues nearly coincide.
    Returns eigenvalues (n,) ascending and eigenvectors (n, n) as columns.
    """
    n = G.shape[0]
    h, odd = n // 2, n % 2
    r = np.sqrt(0.5)
    top, bot = G[:h], G[n - 1 : n - 1 - h : -1]  # rows j and n-1-j, j < h
    rows_s, rows_a = r * (top + bot), r * (top - bot)  # Q_s^T G, Q_a^T G without the middle row
    left, right = slice(0, h), slice(n - 1, n - 1 - h, -1)
    G_a = r * (rows_a[:, left] - rows_a[:, right])
    G_s = r * (rows_s[:, left] + rows_s[:, right])
    if odd:
        mid = G[h]
        col = r * (mid[left] + mid[right])  # Q_s^T G e_mid restricted to the top block
        G_s = np.block([[G_s, col[:, None]], [col[None, :], np.array([[mid[h]]])]])
    lam_s, E_s = sla.eigh(G_s, driver="evd", check_finite=False)
    lam_a, E_a = sla.eigh(G_a, driver="evd", check_finite=False) if h else (np.zeros(0), np.zeros((0, 0)))
    P = np.zeros((n, n))
    P[:h, : h + odd] = r * E_s[:h]
    P[n - 1 : n - 1 - h : -1, : h + odd] = r * E_s[:h]
    if odd:
        P[h, : h + odd] = E_s[h]
    P[:h, h + odd :] = r * E_a
    P[n - 1 : n - 1 - h : -1, h + odd :] = -r * E_a
    lam = np.concatenate([lam_s, lam_a])
    order = np.argsort(lam, kind="stable")
    return lam[order], P[:, order]


def _eigen_factor(
    G: np.ndarray, rank_tol: float, reflect: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Eigenvalues (n,) ascending, eigenvectors (n, n), and the mask of eigenvalues > rank_tol * max.

    If reflect and G is symmetric under reversing the cells (J G J = G within REFLECTION_RTOL * max|G|, as
    for ranges and sliding windows) the eigenvectors come from `_reflection_eigh`.
    """
    n = G.shape[0]
    if reflect and n >= 2 and np.max(np.abs(G - G[::-1, ::-1])) <= REFLECTION_RTOL * np.max(np.abs(G)):
        lam, P = _reflection_eigh(G)
    else:
        lam, P = sla.eigh(G, driver="evd", check_finite=False)
    if lam[-1] <= 0.0:
        raise ValueError("G must be positive semidefinite with a positive eigenvalue")
    check_psd(lam, "G", 1e-8, lam[-1])
    return lam, P, lam > rank_tol * lam[-1]


def merge_equal_cells(M: np.ndarray, atol: float = MERGE_ATOL) -> tuple[np.ndarray, np.ndarray]:
    """Cells with the same constraint row of M = P o P (n, k), within atol in every entry.

    Symmetric workloads (AllRange, Prefix-free ranges, WidthK, their Kronecker products) have eigenvectors
    that are symmetric or antisymmetric under a reflection of the cells, so v_i[j]^2 = v_i[j']^2 for the
    mirrored cell j' and the two constraints sum_i u_i v_i[j]^2 <= 1 coincide. The dual then depends only
    on y_j + y_j' and its Hessian is singular along y_j - y_j'; the projected Newton step, cut at y >= 0
    in one cell of a pair, stops making progress (AllRange(2048) stalled at gap 1.8e-8). Keeping one
    constraint per group removes that degeneracy without changing the program.

    Candidates are cells with equal keys M @ w (w a fixed vector of distinct weights, no randomness);
    a cell joins a group only if its whole row is within atol of the group's first row, so a merge is
    never wrong, only possibly missed. Returns (reps, label): reps (g,) the first cell of each group in
    ascending order, label (n,) the group index of each cell.
    """
    n, k = M.shape
    w = 1.0 + np.modf(np.arange(1, k + 1) * np.sqrt(2.0))[0]  # distinct weights in [1, 2)
    key = M @ w
    order = np.argsort(key, kind="stable")
    label = np.full(n, -1)
    reps: list[int] = []
    open_groups: list[int] = []  # groups whose first key is within reach of the current key
    for j in order:
        open_groups = [g for g in open_groups if key[j] - key[reps[g]] <= 2.0 * atol * k]
        for g in open_groups:
            if np.max(np.abs(M[j] - M[reps[g]])) <= atol:
                label[j] = g
                break
        else:
            label[j] = len(reps)
            open_groups.append(len(reps))
            reps.append(int(j))
    reps_arr = np.asarray(reps)
    first = np.argsort(reps_arr, kind="stable")  # renumber groups by their first cell
    rank = np.empty_like(first)
    rank[first] = np.arange(first.size)
    return reps_arr[first], rank[label]


def complete_strategy(A: np.ndarray, V: np.ndarray) -> tuple[np.ndarray, float]:
    """Spend each cell's unused sensitivity: X = A^T A + diag(1 - diag(A^T A)) (Li & Miklau's completion).

    A (r, n) with max column norm <= 1; V (k, n) with V^T V = G. Returns (c, fun): c (n,) >= 0 the added
    diagonal (the strategy [A; diag(sqrt(c))] has sens2 = 1 in every cell) and fun = trace(G X^{-1}),
    which is <= trace(G (A^T A)^+). With the completion, AllRange(2048) and AllRange(64, 32) reproduce
    the eigen-design ratios 1.028 and 1.107 of seed 004's Table 2 (1.0278, 1.1071); the converged weights
    alone give 1.0606 and 1.1900. If X is numerically singular, c = 0 and fun = inf.
    """
    X = A.T @ A
    c = np.clip(1.0 - np.diag(X), 0.0, None)
    X[np.diag_indices_from(X)] += c
    try:
        return c, objective_from_factor(V, X)
    except np.linalg.LinAlgError:
        return np.zeros_like(c), float("inf")


def eigen_design_dual_bound(G: np.ndarray, y: np.ndarray, *, rank_tol: float = RANK_TOL) -> float:
    """Lower bound psi(y)^2 / sum(y) on the eigen-design optimum at cell multipliers y >= 0 (n,).

    psi(y) = sum_i sqrt(lambda_i (M^T y)_i), M = P o P (module docstring). y = 1 gives the SVD bound.
    """
    G, c = unit_scale(check_gram(G))
    y = np.asarray(y, dtype=float)
    if y.shape != (G.shape[0],) or not np.isfinite(y).all() or (y < 0).any() or not (y > 0).any():
        raise ValueError(f"y must be a finite ({G.shape[0]},) vector >= 0, not all zero")
    lam, P, keep = _eigen_factor(G, rank_tol)
    y = y / y.max()
    psi = float(np.sqrt(lam[keep] * ((P[:, keep] ** 2).T @ y)).sum())
    return c * psi * psi / float(y.sum())


def solve_eigen_design(
    G: np.ndarray,
    *,
    tol: float = 1e-8,
    max_iter: int = 200,
    forcing: float = 0.5,
    max_cg: int = 500,
    callback: Callable[[dict[str, Any]], bool | None] | None = None,
    time_limit: float | None = None,
    rank_tol: float = RANK_TOL,
    active_tol: float = 1e-3,
    damping: float = 1.0,
    complete: bool = True,
    merge: bool = True,
    reflect: bool = True,
) -> SolverResult:
    """Eigen-design weights (seed 003; Li & Miklau 2012) by dual projected Newton-CG, with a certificate.

    Algorithm and why: module docstring. The eigen-decomposition of G is O(n^3) (half-size pieces when
    G is symmetric under reversing the cells); each Newton iteration is O(n k) per CG step.

    Parameters
    ----------
    G : ndarray (n, n), W^T W (symmetric PSD, finite, not zero).
    tol : relative duality gap at which the solver stops with CONVERGED.
    max_iter, forcing, max_cg, active_tol, damping : Newton iterations, largest CG relative residual, CG
        steps per iteration, relative size below which a multiplier may be frozen at zero, and the
        Levenberg-Marquardt factor c (systems H + c ||grad|| diag(H); the dual is often degenerate here).
    callback : called per iteration with a dict (nit, d, fun, dual_bound, gap); True stops the solver.
    time_limit : wall-clock seconds (the eigen-decomposition of G counts).
    rank_tol : eigenvalues below rank_tol * largest are treated as zero (weight 0).
    complete : also evaluate `complete_strategy` (one O(n^3) Cholesky solve; about a fifth of the time at
        n = 4096); if False, extra["completion"] is zeros and extra["completed_fun"] equals fun.
    merge : solve the dual over one multiplier per group of cells with equal constraint rows
        (`merge_equal_cells`); False solves over all n cells (the degenerate dual; kept for comparison).
    reflect : decompose a G with J G J = G by `_reflection_eigh`; False uses one full eigh (whose
        eigenvectors are only approximately (anti)symmetric; kept for comparison).

    Returns
    -------
    SolverResult with x = u (n,), the squared row weights aligned with the ascending eigenvalues of G
    (0 on its null space), fun = sum_i lambda_i / u_i (P = 1 total squared error, sens2 = 1),
    dual_bound = certified lower bound on the eigen-design optimum, gap; extra["eigenvalues"] (n,),
    extra["eigenvectors"] (n, n) columns v_i, extra["A"] (k, n) strategy rows sqrt(u_i) v_i^T,
    extra["completion"] (n,) and extra["completed_fun"]: the error after `complete_strategy` (strategy
    [A; diag(sqrt(completion))], no longer an eigen-design but never worse), extra["y"] the cell
    multipliers of the certificate (a group's multiplier shared equally by its cells), extra["groups"]
    the number of distinct constraints the dual was solved over, extra["history"].
    """
    t_wall, t_cpu = time.perf_counter(), time.process_time()
    check_newton_options(tol, forcing, max_iter, max_cg, damping)
    G, c = unit_scale(check_gram(G))
    n = G.shape[0]
    lam, P, keep = _eigen_factor(G, rank_tol, reflect)
    M = P[:, keep] ** 2
    reps, label = merge_equal_cells(M) if merge else (np.arange(n), np.arange(n))
    problem = EigenDesignDual(lam[keep], M[reps])
    out = maximise_dual(problem, np.ones(reps.size), tol=tol, max_iter=max_iter, forcing=forcing,
                        max_cg=max_cg, active_tol=active_tol, damping=damping,
                        callback=unscaled_callback(callback, c), time_limit=time_limit, t_start=t_wall)
    # Certificate and weights on the full program: each group's multiplier shared by its cells, the
    # weights scaled by the largest sensitivity over every cell (merged rows agree only within MERGE_ATOL).
    y = out.d[label] / np.bincount(label)[label]
    dual = float(np.sqrt(lam[keep] * (M.T @ y)).sum() ** 2 / y.sum())  # valid at every y >= 0
    u_keep = out.primal.x / float((M @ out.primal.x).max())
    u = np.zeros(n)
    u[keep] = u_keep
    fun = float(np.sum(lam[keep] / u_keep))
    A = np.sqrt(u[keep])[:, None] * P[:, keep].T
    completion, completed_fun = np.zeros(n), fun
    if complete:
        completion, completed_fun = complete_strategy(A, np.sqrt(lam[keep])[:, None] * P[:, keep].T)
    extra = {"eigenvalues": lam, "eigenvectors": P, "A": A, "completion": completion,
             "completed_fun": min(completed_fun, fun), "y": y, "groups": int(reps.size), "rank": int(keep.sum())}
    res = out.result(u, fun, dual, tol, t_wall, t_cpu, extra)
    return undo_unit_scale(res, c)
