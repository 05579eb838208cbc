"""The Schur-complement block shared by the matrix-mechanism SDPs (seed 002, Section 1.1).

trace(G X^{-1}) <= trace(Y) iff [[X, V^T], [V, Y]] is PSD, with V (k x n) any factor of V^T V = G. The
models (mm_approx, mm_pure, appendix_b) state it on the scaled Gram G / s so entries are of order 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import cvxpy as cp
import numpy as np

from dpopt.workloads import Workload
from formulations.inputs import GramData, gram_data, gram_scale, thin_factor


@dataclass
class SchurBlock:
    """Validated Gram data, its scale s, thin factor V of G / s, variables X (n x n), Y (k x k), the LMI."""

    data: GramData
    scale: float
    V: np.ndarray
    X: cp.Variable
    Y: cp.Variable
    lmi: cp.Constraint


def schur_block(workload_or_gram: Workload | np.ndarray, zero_columns: str, x_name: str = "X") -> SchurBlock:
    """[[X, V^T], [V, Y]] >> 0 on G / s, s = trace(G)/n (see `gram_scale`); X is named `x_name`."""
    data = gram_data(workload_or_gram, zero_columns=zero_columns)
    s = gram_scale(data.G)
    V = thin_factor(data.G / s)
    n, k = data.G.shape[0], V.shape[0]
    X = cp.Variable((n, n), symmetric=True, name=x_name)
    Y = cp.Variable((k, k), symmetric=True, name="Y")
    return SchurBlock(data, s, V, X, Y, cp.bmat([[X, V.T], [V, Y]]) >> 0)
