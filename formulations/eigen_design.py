"""Eigen-design (Li and Miklau's adaptive mechanism; seed 003 "efficient strategy selection", seed 004 Table 2).

The strategy's rows are the eigenvectors v_i of W^T W = sum_i d_i v_i v_i^T with non-negative weights:
A = [sqrt(u_1) v_1; ...; sqrt(u_k) v_k]. Then A^T A = sum_i u_i v_i v_i^T, so

    trace(W^T W (A^T A)^+) = sum_i d_i / u_i     and     diag(A^T A)_j = sum_i u_i v_i[j]^2,

and the (eps, delta) matrix mechanism restricted to this family is the convex program

    minimise sum_i d_i / u_i  s.t.  sum_i u_i v_i[j]^2 <= 1 for every cell j,  u >= 0.

Only eigenvectors with d_i > 0 are used (k = rank W): the others are not needed to answer W. The
optimum is at least the full SDP's (mm_approx) and at most the identity strategy's trace(W^T W)
(u = 1 is feasible).
"""

from __future__ import annotations

import time

import cvxpy as cp
import numpy as np

from dpopt.strategy import Strategy
from dpopt.workloads import Workload
from formulations.inputs import THIN_FACTOR_RTOL, embed_columns, gram_data, gram_scale
from formulations.model import Model

NAME = "eigen_design"


def build(workload_or_gram: Workload | np.ndarray, *, zero_columns: str = "error") -> Model:
    """Eigen-design weights program (seed 003, "Algorithm for efficient strategy selection").

    workload_or_gram: a dpopt Workload or its Gram matrix W^T W (n x n).
    Variable u (k,), k = rank W. data["eigenvectors"] holds the v_i as columns (n_kept x k) and
    data["eigenvalues"] the d_i / s, with s = trace(G)/n = Model.scale.
    """
    t0 = time.perf_counter()
    data = gram_data(workload_or_gram, zero_columns=zero_columns)
    s = gram_scale(data.G)
    d, Q = np.linalg.eigh(data.G / s)
    keep = d > THIN_FACTOR_RTOL * d.max()
    d, Q = d[keep], Q[:, keep]
    u = cp.Variable(d.size, nonneg=True, name="u")
    problem = cp.Problem(cp.Minimize(d @ cp.inv_pos(u)), [(Q**2) @ u <= 1])
    return Model(
        name=NAME,
        problem=problem,
        variables={"u": u},
        scale=s,
        recover=to_strategy,
        build_seconds=time.perf_counter() - t0,
        data={"gram": data, "eigenvalues": d, "eigenvectors": Q},
    )


def to_strategy(model: Model) -> Strategy:
    """A = diag(sqrt(u)) V^T (k x n): row i is sqrt(u_i) v_i (seed 003, eigen-design strategy matrix)."""
    data = model.data["gram"]
    u = np.clip(np.asarray(model.value("u"), dtype=float), 0.0, None)
    if not np.all(u > 0):
        raise ValueError("eigen-design weights u must be > 0 for every eigenvector with d_i > 0")
    Q = model.data["eigenvectors"]
    A = np.sqrt(u)[:, None] * Q.T
    return Strategy(embed_columns(A, data.kept, data.n), name=model.name)
