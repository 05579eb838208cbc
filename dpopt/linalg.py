"""Structured linear algebra: Kronecker products through their factors, and the marginal (residual) algebra.

Kronecker products. Kronecker-product linear algebra through the factors: never forms A_1 (x) ... (x) A_d.

A vector over a product domain of sizes (n_1, ..., n_d) is stored in C order (last attribute fastest),
which is the order of `numpy.kron` and of `numpy.ravel_multi_index`.

Marginal algebra. The algebra of marginal workloads over a product domain (seed 004 Thm. 5.5; ResidualPlanner, Xiao et al. 2023).

On attribute i (size n_i) split R^{n_i} into span(1) and its orthogonal complement, with projectors
P0_i = 1 1^T / n_i and P1_i = I - P0_i. For an attribute subset A the residual projector is
Q_A = (x)_{i in A} P1_i (x)_{i not in A} P0_i; the Q_A are orthogonal projectors summing to I, Q_A has rank
r_A = prod_{i in A} (n_i - 1) and constant diagonal r_A / N (N = prod n_i).

The marginal on S has Gram (x)_{i in S} I (x)_{i not in S} 1 1^T = N_{-S} sum_{A subset of S} Q_A with
N_{-S} = prod_{i not in S} n_i, so a weighted marginal workload has Gram sum_A c_A Q_A with
c_A = sum_{S superset of A} w_S^2 N_{-S}: its eigenvalues are c_A with multiplicity r_A.

Scale: N overflows float64 beyond about 300 attributes of size 10, while every error is a ratio of
eigenvalues. dpopt therefore works with eigenvalues divided by N: c_A / N = sum_S w_S^2 / N_S and, for a
strategy, x_A / N, where N_S = prod_{i in S} n_i is the (small) number of cells of marginal S.

Subsets are Python int bitmasks (bit i = attribute i), so any number of attributes works; only subsets of
workload marginals ("the down-closure") are ever enumerated, never all 2^d.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
import scipy.sparse as sp

Matrix = np.ndarray | sp.spmatrix


def operand(v: np.ndarray, n: int) -> np.ndarray:
    """v as a float array of shape (n,) or (n, k): the right operand of an n-column linear map."""
    v = np.asarray(v, dtype=float)
    if v.ndim not in (1, 2) or v.shape[0] != n:
        raise ValueError(f"vector has shape {v.shape}; expected ({n},) or ({n}, k)")
    return v


def kron_matvec(factors: Sequence[Matrix], v: np.ndarray) -> np.ndarray:
    """(M_1 (x) ... (x) M_d) v through the factors (M_i is r_i x n_i).

    v has shape (prod n_i,) or (prod n_i, k); the result has shape (prod r_i,) or (prod r_i, k). Cost is
    sum_i (prod_{j != i} size_j) * nnz(M_i): one tensordot per factor on the reshaped tensor.
    """
    if len(factors) == 0:
        raise ValueError("kron_matvec needs at least one factor")
    ns = [int(M.shape[1]) for M in factors]
    v = operand(v, math.prod(ns))
    k = 1 if v.ndim == 1 else v.shape[1]
    T = v.reshape(*ns, k)
    for i, M in enumerate(factors):
        T = np.moveaxis(T, i, 0)
        shp = T.shape
        flat = T.reshape(shp[0], -1)
        out = M @ flat
        out = np.asarray(out.todense() if sp.issparse(out) else out)
        T = np.moveaxis(out.reshape((M.shape[0],) + shp[1:]), 0, i)
    r = math.prod(int(M.shape[0]) for M in factors)
    out = np.ascontiguousarray(T).reshape(r, k)
    return out[:, 0] if v.ndim == 1 else out


def column_norm_powers(M: Matrix, norm: int) -> np.ndarray:
    """sum_i |M_ij|^norm for every column j of a dense or sparse M: L1 norms (norm 1), squared L2 norms (norm 2)."""
    if norm == 1:
        return np.asarray(abs(M).sum(axis=0), dtype=float).ravel()
    return np.asarray(M.multiply(M).sum(axis=0) if sp.issparse(M) else np.einsum("ij,ij->j", M, M), dtype=float).ravel()


def row_sq_norms(M: Matrix) -> np.ndarray:
    """Squared L2 norm of every row of M (dense or sparse)."""
    if sp.issparse(M):
        return np.asarray(M.multiply(M).sum(axis=1)).ravel()
    return np.einsum("ij,ij->i", M, M)


def kron_column_norms(col_norms: Sequence[np.ndarray]) -> np.ndarray:
    """Column norms of a Kronecker product from the factors' column norms: their Kronecker product (n,)."""
    out = np.ones(1)
    for c in col_norms:
        out = np.kron(out, np.asarray(c, dtype=float))
    return out


def psd_pinv(X: np.ndarray, rtol: float = 1e-10) -> tuple[np.ndarray, int]:
    """Pseudo-inverse of a symmetric PSD matrix (n x n) and its rank, eigenvalues below rtol * max cut to 0."""
    lam, V = np.linalg.eigh((X + X.T) / 2)
    cut = rtol * max(float(lam.max()), np.finfo(float).tiny)
    keep = lam > cut
    inv = np.zeros_like(lam)
    inv[keep] = 1.0 / lam[keep]
    return (V * inv) @ V.T, int(keep.sum())


def psd_sqrt(X: np.ndarray) -> np.ndarray:
    """Symmetric PSD square root (n x n), round-off negative eigenvalues clipped to 0."""
    lam, V = np.linalg.eigh((X + X.T) / 2)
    return (V * np.sqrt(np.clip(lam, 0.0, None))) @ V.T


def unit_diagonal(X: np.ndarray) -> np.ndarray:
    """D^{-1/2} X D^{-1/2}, D = diag(X) > 0: X rescaled to unit diagonal, its diagonal set to 1 exactly (n x n)."""
    scale = 1.0 / np.sqrt(np.diag(X))
    out = X * scale[:, None] * scale[None, :]
    np.fill_diagonal(out, 1.0)
    return out


def svdb_strategy_gram(G: np.ndarray, unit: bool = False) -> np.ndarray:
    """X = sqrt(W^T W) rescaled to max diagonal 1: the strategy behind Thm. 5.6 (seed 004 Sec. 4.2); with unit,
    rescaled to unit diagonal instead (proof of Thm. 4.2; the start of the primal Newton-CG), (n, n)."""
    S = psd_sqrt(G)
    return unit_diagonal(S) if unit else S / float(np.max(np.diag(S)))


#: Singular values below this fraction of the largest count as zero (`rank_from_singular_values`).
SVD_RANK_RTOL = 1e-10


def rank_from_singular_values(s: np.ndarray, rtol: float = SVD_RANK_RTOL) -> int:
    """Number of singular values in s (descending) above rtol times the largest one (0 for an empty or zero s)."""
    if s.size == 0 or s[0] == 0.0:
        return 0
    return int(np.count_nonzero(s > rtol * s[0]))


def svd_start(W: np.ndarray, r: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Feasible SVD start for LRM's Algorithm 1 (after the construction in seed 000, Lemma 3).

    With W = U diag(s) V^T (thin SVD, k = min(r, rank W) leading triplets), L0 stacks V_k^T (k x n)
    on top of r - k rows of i.i.d. N(0, 1/n) entries drawn from rng (so the extra rank is not stuck
    at zero: a zero row of L gets a zero gradient in both the B- and the L-step), and is then divided
    by its largest column L1 norm, so max_j ||L0[:, j]||_1 = 1 exactly. B0 = W L0^+ is the least-squares
    (minimum Frobenius norm) reconstruction; B0 L0 = W exactly when k = rank W.
    Lemma 3 (B = sqrt(k) U diag(s), L = V^T / sqrt(k)) scales by sqrt(k) instead of the largest
    column L1 norm, which is never smaller; the authors' released Matlab code uses that scaling
    with sqrt(r) and pads the extra rows and columns with the constant 1e-8.

    Returns (B0 (m x r), L0 (r x n)).
    """
    m, n = W.shape
    _, s, Vt = np.linalg.svd(W, full_matrices=False)
    k = min(r, rank_from_singular_values(s))
    L0 = np.vstack([Vt[:k], rng.normal(scale=1.0 / math.sqrt(n), size=(r - k, n))])
    L0 /= np.abs(L0).sum(axis=0).max()
    B0 = W @ np.linalg.pinv(L0)
    return B0, L0


# -- the marginal (residual) algebra ------------------------------------------------------------

def mask_of(attrs: Iterable[int]) -> int:
    """Bitmask of an attribute subset."""
    m = 0
    for a in attrs:
        m |= 1 << int(a)
    return m


def attrs_of(mask: int) -> tuple[int, ...]:
    """Sorted attribute indices of a bitmask."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return tuple(out)


def submasks(mask: int) -> list[int]:
    """All subsets of `mask` (including 0 and mask itself)."""
    out, s = [], mask
    while True:
        out.append(s)
        if s == 0:
            return out
        s = (s - 1) & mask


def down_closure(masks: Iterable[int]) -> list[int]:
    """Every subset of every given mask, sorted by (size, mask)."""
    seen: set[int] = set()
    for m in masks:
        if m not in seen:
            seen.update(submasks(m))
    return sorted(seen, key=lambda s: (s.bit_count(), s))


def cells_of(sizes: Sequence[int], mask: int) -> int:
    """N_S = prod_{i in S} n_i: the number of cells of the marginal on S."""
    return math.prod(sizes[i] for i in attrs_of(mask))


def residual_rank(sizes: Sequence[int], mask: int) -> int:
    """r_A = prod_{i in A} (n_i - 1): rank of Q_A (0 when some attribute in A has a single value)."""
    return math.prod(sizes[i] - 1 for i in attrs_of(mask))


def eigen_weights(
    sizes: Sequence[int], masks: Sequence[int], weights: np.ndarray, closure: Sequence[int]
) -> np.ndarray:
    """c_A / N = sum_{S in masks, S superset of A} w_S^2 / N_S for every A in `closure`.

    c_A is the eigenvalue of W^T W on Q_A; N = prod n_i is divided out (see the module note on scale).
    """
    index = {a: j for j, a in enumerate(closure)}
    c = np.zeros(len(closure))
    for S, w in zip(masks, weights, strict=True):
        val = float(w) ** 2 / cells_of(sizes, S)
        for A in submasks(S):
            c[index[A]] += val
    return c


def superset_incidence(sizes: Sequence[int], rows: Sequence[int], cols: Sequence[int]) -> sp.csr_matrix:
    """K[A, T] = 1 / N_T when A is a subset of T, else 0 (rows: subsets A, columns: measured marginals T).

    With strategy marginals T weighted theta_T, the strategy Gram has eigenvalue x_A on Q_A with
    x_A / N = (K theta^2)_A (since N_{-T} / N = 1 / N_T).
    """
    index = {a: j for j, a in enumerate(rows)}
    r, c, v = [], [], []
    for jt, T in enumerate(cols):
        val = 1.0 / cells_of(sizes, T)
        for A in submasks(T):
            if A in index:
                r.append(index[A])
                c.append(jt)
                v.append(val)
    return sp.csr_matrix((v, (r, c)), shape=(len(rows), len(cols)))
