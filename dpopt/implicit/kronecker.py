"""Kronecker-product linear algebra through the factors: never forms A_1 (x) ... (x) A_d.

A vector over a product domain of sizes (n_1, ..., n_d) is stored in C order (last attribute fastest),
which is the order of `numpy.kron` and of `numpy.ravel_multi_index`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

Matrix = np.ndarray | sp.spmatrix


def kron_matvec(factors: Sequence[Matrix], v: np.ndarray) -> np.ndarray:
    """(M_1 (x) ... (x) M_d) v through the factors (M_i is r_i x n_i).

    v has shape (prod n_i,) or (prod n_i, k); the result has shape (prod r_i,) or (prod r_i, k). Cost is
    sum_i (prod_{j != i} size_j) * nnz(M_i): one tensordot per factor on the reshaped tensor.
    """
    if len(factors) == 0:
        raise ValueError("kron_matvec needs at least one factor")
    ns = [int(M.shape[1]) for M in factors]
    n = math.prod(ns)
    v = np.asarray(v, dtype=float)
    if v.ndim not in (1, 2) or v.shape[0] != n:
        raise ValueError(f"vector has shape {v.shape}; expected ({n},) or ({n}, k) for factor sizes {ns}")
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


def svd_bound_factor(G: np.ndarray) -> float:
    """(1/n) (sum_i sqrt(eig_i(G)))^2 for one factor's Gram G = W^T W (seed 004 Def. 4.1 via Prop. 4.3), never above it."""
    from dpopt.bounds import svd_bound_from_gram

    return svd_bound_from_gram(G)
