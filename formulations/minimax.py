"""Weighted minimax per-query error: the strategy whose worst query, relative to its target, is best.

    minimise  s = max_i w_i X^+ w_i^T / c_i   over X PSD with diag(X) <= 1 (L2 sensitivity 1).

It is the fitness-for-use program of `formulations.per_query` read the other way round: scaling X by
a > 0 divides every variance by a and multiplies diag(X) by a, so the least max diag(X) under
w_i X^+ w_i^T <= c_i (per_query's t) equals the least s here, and an optimum of either is a multiple
of an optimum of the other. The model states it directly, in per_query's whitened row-space basis
(S = R S' R is the estimate's covariance in the basis U, X = L S'^{-1} L^T, `per_query.row_space_data`):

    minimise s  s.t.  [[S', L^T], [L, Z]] PSD,  diag(Z) <= 1,  p_i S' p_i^T <= s (i with w_i != 0),

where p_i S' p_i^T = v_i S v_i^T / c_i is query i's variance over its target. The Schur block says
Z >= L S'^{-1} L^T = X, so diag(X) <= diag(Z) <= 1. The hand-written counterpart is
`dpopt.solvers.minimax.solve_minimax` (a certified outer ascent over the query weights on the
(eps, delta) sum solver).
"""

from __future__ import annotations

import time

import numpy as np

from dpopt.workloads import Workload
from formulations.model import Model
from formulations.per_query import row_space_data, row_space_model

NAME = "minimax"


def build(
    workload: Workload | np.ndarray,
    targets: np.ndarray | float = 1.0,
    *,
    zero_columns: str = "error",
    basis: str = "auto",
) -> Model:
    """Weighted minimax SDP: least max_i w_i X^+ w_i^T / c_i subject to diag(X) <= 1.

    workload: a dpopt Workload with rows, or the query matrix W (m x n).
    targets: c (m,) or one number: the weight of query i is 1 / c_i (c_i > 0 for every nonzero query;
        c = 1 is the plain minimax of the per-query variances).
    Variables S' (k x k), Z (n x n), s (scalar); the objective is s in the workload's units (scale 1).
    basis: the bound rows' basis, as in `per_query.build` ("auto": the sparse prefix basis on a
        full-rank range workload, else whitened).
    model.data has per_query's keys ("gram", "W", "bounds" = c, "basis" = L, "U", "R", "rows" = P,
    "row_basis"), so `formulations.per_query.strategy_gram(model)` gives X = L S'^{-1} L^T and the
    recovered Strategy has A^T A = X / max diag X.
    """
    t0 = time.perf_counter()
    rs = row_space_data(workload, targets, zero_columns=zero_columns, basis=basis)
    return row_space_model(NAME, rs, t0, "s", bounds="variances")
