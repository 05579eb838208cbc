"""The causal (lower-triangular) factor of a strategy Gram: every X has a streaming factorization with its loss.

For X positive definite (n x n) let J be the exchange matrix (J_ij = 1 when i + j = n - 1) and J X J = R R^T its
Cholesky factorisation (R lower triangular). Then C = J R^T J is lower triangular and C^T C = J R R^T J = X:
"C = U^T for X = U U^T, U upper triangular" (Denisov et al., NeurIPS 2022, Sec. 2). The loss of a
factorization A = B C depends on C only through X = C^T C (B = A C^{-1}: ||B||_F^2 = tr(A X^{-1} A^T), and the
sensitivity is a function of X), so the optimum over every X is reached by a causal C: step t's release
(C x + z)_t uses the steps <= t only.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg as sla

from dpopt.validation import check_finite_matrix


def causal_factor(X: np.ndarray) -> np.ndarray:
    """C lower triangular with C^T C = X (X positive definite) by a Cholesky factorisation of J X J (Denisov et al. 2022)."""
    X = check_finite_matrix(X, "strategy Gram X")
    if X.shape[0] != X.shape[1]:
        raise ValueError(f"strategy Gram X must be square; got shape {X.shape}")
    X = (X + X.T) / 2.0
    try:
        R = sla.cholesky(X[::-1, ::-1], lower=True, check_finite=False)
    except np.linalg.LinAlgError:
        raise ValueError("strategy Gram X must be positive definite for a causal factor (Cholesky failed)") from None
    return np.ascontiguousarray(R.T[::-1, ::-1])
