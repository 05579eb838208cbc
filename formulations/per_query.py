"""Per-query accuracy constraints: the least privacy cost that meets a variance bound for every query.

After Xiao, Wang, Lin, Zhang, Kifer and Miklau, "Optimizing Fitness-For-Use of Differentially Private
Linear Queries" (PVLDB 14(10), 2021), who ask that each query be accurate rather than their sum.

Derivation. Measure A x + z with z ~ N(0, I) (unit noise) and answer query w_i (row i of W) by
w_i A^+ (A x + z). With X = A^T A its variance is w_i X^{-1} w_i^T (X > 0; seed 004 Prop. 3.3 row by
row). The Gaussian mechanism with unit noise is private at a level fixed by the L2 sensitivity,
sens2(A)^2 = max_j X_jj: with the classic calibration sigma = sens2 sqrt(2 ln(2/delta)) / eps = 1
it is (eps, delta)-DP for eps = sens2 sqrt(2 ln(2/delta)), and it is rho-zCDP with rho = sens2^2 / 2.
Every such privacy measure increases with t = max_j X_jj, so the fitness-for-use problem is

    minimise t  s.t.  diag(X) <= t,  w_i X^{-1} w_i^T <= c_i for every query i.

It is convex in the covariance of the estimate of x rather than in X. Let U (n x k) be an orthonormal
basis of the row space of W (k = rank W). Restricting X to that space loses nothing: for X > 0 put
X' = U (U^T X^{-1} U)^{-1} U^T; every query w_i = w_i U U^T has the same variance under X' (w_i X'^+
w_i^T = w_i X^{-1} w_i^T), and X' <= X in the PSD order (X^{-1/2} X' X^{-1/2} is an orthogonal
projector), so diag(X') <= diag(X). Writing X = U S^{-1} U^T with S (k x k) > 0, the covariance of the
estimate is U S U^T and

- the variances are linear in S: w_i U S U^T w_i^T = v_i S v_i^T with v_i = w_i U;
- diag(X) = diag(U S^{-1} U^T) <= t holds if and only if some Z >= U S^{-1} U^T has diag(Z) <= t,
  and by the Schur complement lemma Z >= U S^{-1} U^T is [[S, U^T], [U, Z]] PSD.

So the model is the semidefinite program

    minimise t  s.t.  [[S, U^T], [U, Z]] PSD,  diag(Z) <= t,  v_i S v_i^T <= c_i (i = 1..m),

with one (k + n) block whatever the number of queries (the m variance bounds are linear). The
direct form with one block [[X, w_i^T], [w_i, c_i]] PSD per query is equivalent but has m blocks,
which interior-point solvers factor slowly (about 30 s for a 16-cell, 32-query instance here). The
variance bounds keep S bounded and diag(Z) <= t keeps S^{-1} bounded, so the optimum is attained
with S > 0. It is feasible for every c > 0. The strategy returned is A with A^T A = X / t (sens2 = 1),
X = U S^{-1} U^T; under a privacy setting with variance factor P (Privacy.variance_factor) query i
then has variance P * t * w_i X^+ w_i^T <= P t c_i, so the bounds hold exactly when P = 1 / t.
"""

from __future__ import annotations

import math
import time

import cvxpy as cp
import numpy as np

from dpopt.strategy import Strategy
from dpopt.validation import check_finite_vector
from dpopt.workloads import Workload
from formulations.inputs import THIN_FACTOR_RTOL, embed_columns, psd_part, workload_matrix
from formulations.model import Model

NAME = "per_query"


def build(
    workload: Workload | np.ndarray,
    bounds: np.ndarray | float,
    *,
    zero_columns: str = "error",
) -> Model:
    """Fitness-for-use SDP: least max diag(X) with w_i X^{-1} w_i^T <= c_i (Xiao et al., PVLDB 2021).

    workload: a dpopt Workload with rows, or the query matrix W (m x n) itself.
    bounds: c (m,) or one number for every query: the largest variance each query may have under unit
        noise. Must be > 0 for every nonzero query (a zero query has variance 0 and any c_i >= 0).
    Variables: S (k x k, the estimate's covariance in the row-space basis U, k = rank W), Z (n x n),
    t (scalar). For conditioning W is divided by its largest absolute entry a and c by a^2 before
    solving; this leaves S and t unchanged (Model.scale = 1).
    """
    t0 = time.perf_counter()
    W, data = workload_matrix(workload, zero_columns=zero_columns)
    m = W.shape[0]
    c = np.full(m, float(bounds)) if np.ndim(bounds) == 0 else np.asarray(bounds, dtype=float)
    c = check_finite_vector(c, "per-query variance bounds c", m)
    row_nonzero = np.abs(W).max(axis=1) > 0
    if np.any(c < 0) or np.any(c[row_nonzero] <= 0):
        bad = int(np.count_nonzero((c < 0) | (row_nonzero & (c <= 0))))
        raise ValueError(
            f"per-query variance bounds must be > 0 for every nonzero query (and >= 0 for zero ones); "
            f"{bad} are not"
        )
    a = float(np.abs(W).max())
    Ws, cs = W / a, c / a**2
    _, sing, Vt = np.linalg.svd(Ws, full_matrices=False)
    # n x k orthonormal basis of the row space (singular values, hence the square root of the
    # eigenvalue cut used for thin factors).
    U = Vt[sing > math.sqrt(THIN_FACTOR_RTOL) * sing[0]].T
    V = Ws @ U  # m x k
    n, k = U.shape
    S = cp.Variable((k, k), symmetric=True, name="S")
    Z = cp.Variable((n, n), symmetric=True, name="Z")
    t = cp.Variable(name="t")
    problem = cp.Problem(
        cp.Minimize(t),
        [
            cp.bmat([[S, U.T], [U, Z]]) >> 0,
            cp.diag(Z) <= t,
            cp.sum(cp.multiply(V @ S, V), axis=1) <= cs,
        ],
    )
    return Model(
        name=NAME,
        problem=problem,
        variables={"S": S, "Z": Z, "t": t},
        scale=1.0,
        recover=to_strategy,
        build_seconds=time.perf_counter() - t0,
        data={"gram": data, "W": W, "bounds": c, "basis": U},
    )


def strategy_gram(model: Model) -> np.ndarray:
    """X = U S^{-1} U^T (n_kept x n_kept), the optimal strategy Gram matrix (rank k = rank W)."""
    S = psd_part(model.value("S"), f"S of model {model.name}")
    U = model.data["basis"]
    return U @ np.linalg.solve(S, U.T)


def to_strategy(model: Model) -> Strategy:
    """A with A^T A = X / max(diag X), X = U S^{-1} U^T: the optimal strategy scaled to sens2 = 1."""
    data = model.data["gram"]
    X = strategy_gram(model)
    X = X / np.diag(X).max()
    A = Strategy.from_gram(X, name=model.name).A
    return Strategy(embed_columns(np.asarray(A), data.kept, data.n), name=model.name)


def query_variances(strategy: Strategy, W: np.ndarray) -> np.ndarray:
    """Variance of every query under unit noise per unit sensitivity: sens2^2 * diag(W (A^T A)^+ W^T)."""
    W = np.asarray(W, dtype=float)
    return strategy.sens2**2 * np.einsum("ij,ij->i", W @ strategy.gram_pinv(), W)


def epsilon_for(t: float, delta: float) -> float:
    """eps at which unit-noise measurement with sens2^2 = t is (eps, delta)-DP (classic calibration)."""
    if not (0.0 < delta < 1.0):
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    if not (math.isfinite(t) and t > 0):
        raise ValueError(f"t must be a finite number > 0, got {t}")
    return math.sqrt(2.0 * math.log(2.0 / delta) * t)


def zcdp_rho(t: float) -> float:
    """rho of rho-zCDP for unit-noise Gaussian measurement with sens2^2 = t (rho = t / 2)."""
    if not (math.isfinite(t) and t > 0):
        raise ValueError(f"t must be a finite number > 0, got {t}")
    return t / 2.0
