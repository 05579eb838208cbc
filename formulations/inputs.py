"""Input checks and data preparation shared by the models, run before any solver is called.

Every model works from the Gram matrix G = W^T W (n x n) or from W itself. The checks refuse, with a
ValueError that names the problem and what was expected:
- NaN or infinite entries;
- a Gram matrix that is not square, not symmetric or not positive semidefinite;
- a zero workload (every query is zero: there is nothing to answer and no strategy to choose);
- all-zero columns (cells no query touches). Such a cell makes trace(G X^{-1}) independent of X_jj and
  the optimum non-unique. By default this is an error; with `zero_columns="drop"` the model is built on
  the remaining cells (seed 004 Prop. 3.6 (v): the optimal error is unchanged by this column projection)
  and the recovered strategy gets zero columns for the dropped cells.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpopt.validation import check_choice, check_finite_matrix, check_gram, check_psd
from dpopt.workloads import Workload

ZERO_COLUMN_POLICIES = ("error", "drop")

# Relative tolerances for the structural checks on a given Gram matrix.
SYMMETRY_RTOL = 1e-10
PSD_RTOL = 1e-9
# A column of W is zero when its squared norm G_jj is below this fraction of the largest one.
ZERO_COLUMN_RTOL = 1e-14
# Eigenvalues of G below this fraction of the largest are dropped from the thin factor V.
THIN_FACTOR_RTOL = 1e-12


@dataclass(frozen=True)
class GramData:
    """A validated Gram matrix restricted to the cells some query touches.

    G: W^T W on the kept cells (n_kept x n_kept), exactly as given (not rescaled).
    n: number of cells of the original workload; kept: indices (into 0..n-1) of the cells in G.
    name: the workload's name; gram_log_scale: the workload's log scale factor (W^T W = e^s * G_full).
    """

    G: np.ndarray
    n: int
    kept: np.ndarray
    name: str
    gram_log_scale: float = 0.0

    @property
    def dropped(self) -> np.ndarray:
        """Indices of the cells left out because no query touches them."""
        return np.setdiff1d(np.arange(self.n), self.kept)

    def G_full(self) -> np.ndarray:
        """W^T W on all n cells (zero rows and columns for the dropped cells)."""
        full = np.zeros((self.n, self.n))
        full[np.ix_(self.kept, self.kept)] = self.G
        return full


def _check_zero_columns_policy(zero_columns: str) -> None:
    check_choice(zero_columns, ZERO_COLUMN_POLICIES, "zero_columns")


def _restrict(G: np.ndarray, name: str, zero_columns: str, log_scale: float) -> GramData:
    """Drop or refuse the zero columns of a validated Gram matrix."""
    n = G.shape[0]
    d = np.diag(G)
    if d.max() <= 0.0:
        raise ValueError(
            f"workload {name} is all zeros (W^T W = 0): there is nothing to answer; "
            "expected at least one nonzero query"
        )
    zero = np.flatnonzero(d <= ZERO_COLUMN_RTOL * d.max())
    if zero.size and zero_columns == "error":
        shown = ", ".join(str(j) for j in zero[:10]) + (", ..." if zero.size > 10 else "")
        raise ValueError(
            f"workload {name} has {zero.size} all-zero column(s) (cells {shown}) that no query touches; "
            "the optimum is not unique there. Pass zero_columns='drop' to optimise over the other "
            "cells (the strategy then measures nothing on these cells), or remove them"
        )
    kept = np.setdiff1d(np.arange(n), zero)
    Gk = G[np.ix_(kept, kept)]
    return GramData(G=Gk, n=n, kept=kept, name=name, gram_log_scale=log_scale)


def gram_data(workload_or_gram: Workload | np.ndarray, *, zero_columns: str = "error") -> GramData:
    """Validated W^T W from a dpopt Workload or from a Gram matrix given directly.

    An ndarray is read as the Gram matrix W^T W (n x n, symmetric PSD), never as W: wrap a query matrix
    with `dpopt.workloads.as_workload(W)` first.
    """
    _check_zero_columns_policy(zero_columns)
    if isinstance(workload_or_gram, Workload):
        name = workload_or_gram.name
        G = workload_or_gram.gram()
        log_scale = float(workload_or_gram.gram_log_scale)
    else:
        name = "gram"
        G = check_finite_matrix(workload_or_gram, "Gram matrix W^T W")
        log_scale = 0.0
        if G.shape[0] != G.shape[1]:
            raise ValueError(
                f"expected a square Gram matrix W^T W (n x n), got shape {G.shape}; "
                "to pass a query matrix W use dpopt.workloads.as_workload(W)"
            )
    G = check_gram(G, name=f"Gram matrix of {name}", sym_rtol=SYMMETRY_RTOL, allow_zero=True, psd_rtol=PSD_RTOL)
    return _restrict(G, name, zero_columns, log_scale)


def workload_matrix(
    workload: Workload | np.ndarray, *, zero_columns: str = "error"
) -> tuple[np.ndarray, GramData]:
    """Validated dense W (m x n_kept) and its GramData, for the models that need the rows themselves.

    An ndarray is read as the query matrix W (m x n).
    """
    _check_zero_columns_policy(zero_columns)
    if isinstance(workload, Workload):
        name = workload.name
        W = check_finite_matrix(workload.matrix(), f"workload {name}")
    else:
        name = "explicit"
        W = check_finite_matrix(workload, "workload matrix W")
    data = _restrict(W.T @ W, name, zero_columns, 0.0)
    return W[:, data.kept], data


def thin_factor(G: np.ndarray, rtol: float = THIN_FACTOR_RTOL) -> np.ndarray:
    """V (k x n) with V^T V = G up to the dropped eigenvalues, k = numerical rank of G.

    From G = Q diag(lam) Q^T keep lam_i > rtol * max(lam): V = diag(sqrt(lam_k)) Q_k^T. Any factor with
    V^T V = W^T W gives the same matrix-mechanism problem (seed 002, Section 1.1), and this one has k <= n
    rows however many queries W has.
    """
    lam, Q = np.linalg.eigh((G + G.T) / 2)
    keep = lam > rtol * lam.max()
    return np.sqrt(lam[keep])[:, None] * Q[:, keep].T


def gram_scale(G: np.ndarray) -> float:
    """s = trace(G) / n: models are solved on G / s (entries of order 1) and objectives scaled back."""
    return float(np.trace(G)) / G.shape[0]


def embed_columns(A: np.ndarray, kept: np.ndarray, n: int) -> np.ndarray:
    """A (r x n_kept) placed in the columns `kept` of an r x n zero matrix (dropped cells unmeasured)."""
    if A.shape[1] == n:
        return A
    full = np.zeros((A.shape[0], n))
    full[:, kept] = A
    return full


def psd_part(X: np.ndarray, what: str, rtol: float = 1e-6) -> np.ndarray:
    """Symmetric X with eigenvalues below 0 clipped to 0; refuses if they were below -rtol * max.

    Interior-point and first-order solvers return PSD variables up to their tolerance; a solution whose
    negative part is larger than rtol is not a PSD matrix and is refused.
    """
    X = (X + X.T) / 2
    lam, Q = np.linalg.eigh(X)
    check_psd(lam, what, rtol, max(float(lam.max()), np.finfo(float).tiny))
    return (Q * np.clip(lam, 0.0, None)) @ Q.T
