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
with S > 0. It is feasible for every c > 0.

Whitened basis (what is built). Any invertible R (k x k) gives an equivalent program in S' with
S = R S' R^T: the variances are (v_i R) S' (v_i R)^T and U S^{-1} U^T = (U R^{-1}) S'^{-1} (U R^{-1})^T,
so the block becomes [[S', (U R^{-1})^T], [U R^{-1}, Z]] with the same t, Z and optimum. The model
uses R = (V^T C^{-1} V)^{-1/2} (C = diag(c) over the nonzero queries; V has rank k, so this is
positive definite) and divides bound i by c_i:

    minimise t  s.t.  [[S', L^T], [L, Z]] PSD,  diag(Z) <= t,  p_i S' p_i^T <= 1 (i with w_i != 0),

with p_i = v_i R / sqrt(c_i) and L = U R^{-1} (n x k). The rows p_i form a tight frame,
sum_i p_i^T p_i = R (V^T C^{-1} V) R = I: the bound rows, the only non-trivial coefficients of the
program (the PSD block enters as a selection of variables plus the constant L), weigh every direction
of S' alike taken together, and the spread of the singular values of W and of the bounds c moves into
L, a constant. Zero queries are dropped (their bound 0 <= c_i always holds), and scaling W by a and c
by a^2 changes none of p_i, L or t. Why: in the orthonormal basis U the only non-trivial coefficients
are the v_i, whose spread follows the singular values of W and the bounds, and SCS (first order,
eps 1e-6) needed 101,625 iterations on WidthK(16, 4), 59,525 on WidthK(48, 12) and stopped
optimal_inaccurate after 61,950 (240 s limit) on WidthK(64, 16) (W there has rank n - K + 1 and
condition number 10 to 40); whitened, it needs 14,525, 600 and 1,050, and every family of
tests/test_formulations_models.py converges at n = 64. Measured and not adopted: normalising the
rows only (v_i / sqrt(c_i): 2 to 5 times fewer iterations on WidthK), scaling t (0.1 t: 3.6 times
fewer at n = 32, 10 t: 2 times more), SCS settings (scale, adaptive_scale, normalize, acceleration:
at most 1.9 times fewer), dropping duplicate queries (none in these families but three in
WRange(64, 32), no gain) and the conic dual (9,275 iterations on WidthK(64, 16), but
optimal_inaccurate within 100 s on AllRange(48)). S' is the estimate's covariance in the coordinates
U R; S = R S' R is its covariance in the basis U.

Prefix basis (range queries). Whitening in the basis U makes every p_i dense, so the m bound rows
carry m k^2 coefficients: AllRange(128) has 8,256 rows and CVXPY took over 4 minutes to compile them,
and AllRange(512) (131,328 rows, 3.4e10 coefficients) cannot be compiled at all. When W has full column rank, any
invertible basis serves in place of U: with T the prefix-sum matrix (T_ij = 1 for j <= i) write
W = D T, where D = W T^{-1} takes first differences of W's columns (d_ij = w_ij - w_i,j+1); a range
query [a, b] has d_i = e_b - e_{a-1} (e_{-1} = 0), at most two nonzeros. With S the covariance of the estimated prefix
sums T x (X = T^T S^{-1} T: the block's constant is U = T^T) the variances are d_i S d_i^T, and the
same whitening R = (D^T C^{-1} D)^{-1/2} gives P = C^{-1/2} D R (P^T P = I) and L = T^T R^{-1}. For
AllRange with equal bounds, D^T D = (n + 1) I - J, so R is a multiple of I plus a multiple of J: p_i = d_i R keeps the
two nonzeros of d_i for every range not starting at 0 (d_i 1 = 0) and only the n prefix rows are
dense. Entries of P below k eps max|P| (the rounding of an inner product of length k) are dropped and
the bound rows become one sparse (m' x k^2) matrix acting on vec(S'). Measured with SCS at eps 1e-4
(one BLAS thread, single runs on a shared machine): AllRange(64) took 2,550 iterations and 9 s against 800 iterations and 49 s in the
basis U, and its value was closer to the certified optimum (5.0e-4 above it against 7.0e-3); AllRange(128)
took 5,900 iterations and 129 s but stopped 1.2e-2 above the optimum (SCS's eps bounds residuals, not
the objective), and at eps 1e-5 42,300 iterations and 1,067 s, 2.0e-6 above it; in the basis U
CVXPY's compile alone took over 4 minutes. On
Prefix (D = I, m = k) the two bases have the same number of coefficients, but SCS took 4,900
iterations in the prefix basis against 175 in U at n = 64, so `basis="auto"` takes the prefix basis
only when W has full column rank, every query is a difference of at most two prefix sums, there are
more queries than cells, and P stays at most half full; otherwise the basis U.

The strategy returned is A with A^T A = X / t (sens2 = 1), X = L S'^{-1} L^T = U S^{-1} U^T; under a
privacy setting with variance factor P (Privacy.variance_factor) query i then has variance
P * t * w_i X^+ w_i^T <= P t c_i, so the bounds hold exactly when P = 1 / t.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import cvxpy as cp
import numpy as np
import scipy.sparse as sp

from dpopt.strategy import Strategy
from dpopt.validation import check_choice, check_finite_vector
from dpopt.workloads import Workload
from formulations.inputs import THIN_FACTOR_RTOL, GramData, embed_columns, psd_part, workload_matrix
from formulations.model import Model

NAME = "per_query"
# Bases of the bound rows (module docstring): "whitened" (dense, P^T P = I), "prefix" (sparse, for
# full-rank range workloads), "auto" (prefix when it applies).
BASES = ("auto", "whitened", "prefix")


def whitened_rows(V: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Whitening of the variance bounds (module docstring, "Whitened basis"): P, R and R^{-1}.

    V: the nonzero queries in the row-space basis, v_i = w_i U (m' x k, rank k); c: their bounds (m',),
    all > 0. R = (V^T C^{-1} V)^{-1/2} (k x k, symmetric positive definite) and P = C^{-1/2} V R
    (m' x k), whose rows satisfy P^T P = I; v_i S v_i^T <= c_i iff p_i S' p_i^T <= 1 for S = R S' R.
    """
    M = V.T @ (V / c[:, None])
    lam, Q = np.linalg.eigh((M + M.T) / 2)
    if lam[0] <= 0:
        raise ValueError(
            f"V^T C^-1 V must be positive definite (rank {V.shape[1]}); smallest eigenvalue {lam[0]}"
        )
    R = (Q / np.sqrt(lam)) @ Q.T
    R_inv = (Q * np.sqrt(lam)) @ Q.T
    P = (V @ R) / np.sqrt(c)[:, None]
    return P, R, R_inv


def prefix_differences(W: np.ndarray) -> np.ndarray:
    """D = W T^{-1} (T the prefix-sum matrix): d_ij = w_ij - w_i,j+1, exact for 0/1 entries."""
    D = W.copy()
    D[:, :-1] -= W[:, 1:]
    return D


def prefix_rows(D: np.ndarray, c: np.ndarray) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray]:
    """Prefix basis (module docstring, "Prefix basis"): P (sparse, P^T P = I), R and R^{-1}.

    D: the nonzero queries' prefix differences (m' x n, rank n); c: their bounds (m',), all > 0.
    `whitened_rows(D, c)` with the entries of P below n eps max|P| (inner-product rounding) dropped.
    """
    P, R, R_inv = whitened_rows(D, c)
    P[np.abs(P) <= D.shape[1] * np.finfo(float).eps * np.abs(P).max()] = 0.0
    return sp.csr_matrix(P), R, R_inv


def quadratic_rows(P: sp.csr_matrix) -> sp.csr_matrix:
    """M (m' x k^2) with M vec(S) = (p_i S p_i^T)_i for symmetric S: row i holds p_ij p_il at j + k l."""
    P = P.tocsr()
    m, k = P.shape
    counts = np.diff(P.indptr)
    owner = np.repeat(np.arange(m), counts)  # the row of each stored entry
    reps = counts[owner]  # each entry pairs with every entry of its row
    first = np.repeat(np.arange(P.nnz), reps)
    offset = np.arange(first.size) - np.repeat(np.cumsum(reps) - reps, reps)
    second = P.indptr[owner[first]] + offset
    return sp.csr_matrix(
        (P.data[first] * P.data[second], (owner[first], P.indices[first] + k * P.indices[second])),
        shape=(m, k * k),
    )


@dataclass(frozen=True)
class RowSpaceData:
    """The constants of the program (module docstring), shared with formulations.minimax.

    W (m x n_kept) and its GramData; c (m,) the bounds as given; basis "whitened" or "prefix"; U
    (n_kept x k) the basis in which S is the estimate's covariance, X = U S^{-1} U^T (W's orthonormal
    row-space basis, or T^T for the prefix basis); P (m' x k) the scaled rows of the nonzero queries
    (P^T P = I; sparse in the prefix basis); R (S = R S' R); L = U R^{-1} (n_kept x k, X = L S'^{-1} L^T).
    """

    W: np.ndarray
    gram: GramData
    c: np.ndarray
    basis: str
    U: np.ndarray
    P: np.ndarray | sp.csr_matrix
    R: np.ndarray
    L: np.ndarray


def row_space_data(
    workload: Workload | np.ndarray,
    bounds: np.ndarray | float,
    *,
    zero_columns: str = "error",
    basis: str = "auto",
) -> RowSpaceData:
    """Validate W and the per-query bounds c and build the program's constants (module docstring)."""
    check_choice(basis, BASES, "basis")
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
    if basis != "whitened":
        D = prefix_differences(W[row_nonzero])
        lam = np.linalg.eigvalsh((data.G + data.G.T) / 2)
        full_rank = lam[0] > THIN_FACTOR_RTOL * lam[-1]
        if basis == "prefix" and not full_rank:
            raise ValueError(
                f"the prefix basis needs W of full column rank; W^T W has eigenvalue ratio {lam[0] / lam[-1]:.3g}"
            )
        ranges = np.count_nonzero(D, axis=1).max() <= 2 and D.shape[0] > D.shape[1]
        if basis == "prefix" or (full_rank and ranges):
            P, R, R_inv = prefix_rows(D, c[row_nonzero])
            if basis == "prefix" or P.nnz <= P.shape[0] * P.shape[1] / 2:
                U = np.triu(np.ones((W.shape[1], W.shape[1])))
                return RowSpaceData(W=W, gram=data, c=c, basis="prefix", U=U, P=P, R=R, L=U @ R_inv)
    _, sing, Vt = np.linalg.svd(W, full_matrices=False)
    # n x k orthonormal basis of the row space (singular values, hence the square root of the
    # eigenvalue cut used for thin factors).
    U = Vt[sing > math.sqrt(THIN_FACTOR_RTOL) * sing[0]].T
    P, R, R_inv = whitened_rows(W[row_nonzero] @ U, c[row_nonzero])
    return RowSpaceData(W=W, gram=data, c=c, basis="whitened", U=U, P=P, R=R, L=U @ R_inv)


def build(
    workload: Workload | np.ndarray,
    bounds: np.ndarray | float,
    *,
    zero_columns: str = "error",
    basis: str = "auto",
) -> Model:
    """Fitness-for-use SDP: least max diag(X) with w_i X^{-1} w_i^T <= c_i (Xiao et al., PVLDB 2021).

    workload: a dpopt Workload with rows, or the query matrix W (m x n) itself.
    bounds: c (m,) or one number for every query: the largest variance each query may have under unit
        noise. Must be > 0 for every nonzero query (a zero query has variance 0 and any c_i >= 0).
    Built in the whitened basis of the module docstring: variables S' (k x k, the estimate's covariance
    in the coordinates U R, k = rank W), Z (n x n), t (scalar); constants P (m' x k, one row per
    nonzero query, P^T P = I) and L = U R^{-1} (n x k); basis "prefix" (or "auto" on a full-rank range
    workload) uses the sparse prefix basis instead. Model.scale = 1 (t is unchanged by scaling W).
    model.data: "gram", "W", "bounds" (c as given), "basis" (L, so that X = L S'^{-1} L^T), "U" (X =
    U S^{-1} U^T), "R" (S = R S' R), "rows" (P), "row_basis" ("whitened" or "prefix").
    """
    t0 = time.perf_counter()
    rs = row_space_data(workload, bounds, zero_columns=zero_columns, basis=basis)
    return row_space_model(NAME, rs, t0, "t", bounds="diag")


def row_space_model(name: str, rs: RowSpaceData, t0: float, scalar: str, bounds: str) -> Model:
    """min over S' (k x k), Z (n x n) and a scalar of the scalar, s.t. [[S', L^T], [L, Z]] >> 0 (so
    Z >= L S'^{-1} L^T = X) and, for bounds "diag", diag(Z) <= scalar with every variance diag(P S' P^T) <= 1
    (fitness for use), or for bounds "variances", diag(Z) <= 1 with every variance <= scalar (minimax)."""
    P, L = rs.P, rs.L
    n, k = L.shape
    S = cp.Variable((k, k), symmetric=True, name="S")
    Z = cp.Variable((n, n), symmetric=True, name="Z")
    v = cp.Variable(name=scalar)
    diag_bound, variance_bound = (v, 1.0) if bounds == "diag" else (1.0, v)
    if sp.issparse(P):
        variances = quadratic_rows(P) @ cp.vec(S, order="F")
    else:
        variances = cp.sum(cp.multiply(P @ S, P), axis=1)
    problem = cp.Problem(
        cp.Minimize(v),
        [
            cp.bmat([[S, L.T], [L, Z]]) >> 0,
            cp.diag(Z) <= diag_bound,
            variances <= variance_bound,
        ],
    )
    return Model(
        name=name,
        problem=problem,
        variables={"S": S, "Z": Z, scalar: v},
        scale=1.0,
        recover=to_strategy,
        build_seconds=time.perf_counter() - t0,
        data={"gram": rs.gram, "W": rs.W, "bounds": rs.c, "basis": L, "U": rs.U, "R": rs.R, "rows": P,
              "row_basis": rs.basis},
    )


def strategy_gram(model: Model) -> np.ndarray:
    """X = L S'^{-1} L^T = U S^{-1} U^T (n_kept x n_kept), the optimal strategy Gram matrix (rank k)."""
    S = psd_part(model.value("S"), f"S of model {model.name}")
    L = model.data["basis"]
    return L @ np.linalg.solve(S, L.T)


def to_strategy(model: Model) -> Strategy:
    """A with A^T A = X / max(diag X), X = U S^{-1} U^T: the optimal strategy scaled to sens2 = 1."""
    data = model.data["gram"]
    X = strategy_gram(model)
    X = X / np.diag(X).max()
    A = Strategy.from_gram(X, name=model.name).A
    return Strategy(embed_columns(np.asarray(A), data.kept, data.n), name=model.name)
