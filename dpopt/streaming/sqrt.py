"""The square-root family: C = A^(1/2), B = A^(1/2), no optimisation.

Prefix sums: C = T(c) with c_j = binom(2j, j) / 4^j (Fichtenberger, Henzinger and Upadhyay 2023; Henzinger,
Upadhyay and Upadhyay 2023). Any Toeplitz A = T(a): C = T(sqrt(a)), the power-series square root
(`dpopt.streaming.series.sqrt`), at any n. Any other lower-triangular A with a positive diagonal (momentum with a
learning-rate schedule, an `npy:` matrix): the principal square root of the triangular matrix (Bjorck and
Hammarling 1983, through scipy.linalg.sqrtm on A^T, which is already in Schur form), n <= DENSE_SQRT_STEPS.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.linalg

from dpopt.streaming.base import Factorization, dense_losses, prepare
from dpopt.streaming.fit import KEEP_C_STEPS, factorization
from dpopt.streaming.participation import Participation
from dpopt.streaming.toeplitz import sqrt_start, toeplitz_matrix
from dpopt.streaming.toeplitz_loss import ToeplitzObjective, pattern_column
from dpopt.workloads import Workload

#: Largest n of a non-Toeplitz workload whose triangular square root is formed (O(n^3), about a minute at 4096).
DENSE_SQRT_STEPS = 4096


def triangular_sqrt(A: np.ndarray) -> np.ndarray:
    """Principal square root of a lower-triangular A with a positive diagonal (Bjorck-Hammarling 1983)."""
    if np.any(np.diag(A) <= 0):
        raise ValueError("the square-root factorization needs a positive diagonal of A")
    R = scipy.linalg.sqrtm(np.ascontiguousarray(A.T))
    return np.tril(np.real(R).T)


def optimise(A: Workload | np.ndarray, participation: Participation, *, objective: str = "mean",
             time_limit: float | None = None, callback: Callable[[dict[str, Any]], None] | None = None
             ) -> Factorization:
    """C = A^(1/2) (closed form; `objective` and `time_limit` only label the report)."""
    t0 = time.perf_counter()
    W, p = prepare(A, participation, objective)
    n = p.n
    if W.toeplitz_column() is not None:
        c = sqrt_start(W, n)
        v = pattern_column(c, p)
        c = c / np.sqrt(v @ v)
        losses = ToeplitzObjective(W, p, objective).losses(c)
        C = toeplitz_matrix(c) if n <= KEEP_C_STEPS else None
        return factorization("sqrt", p, objective, C, {"coefficients": c.tolist()}, losses, "converged", t0)
    if n > DENSE_SQRT_STEPS:
        raise ValueError(f"the square root of a non-Toeplitz workload is formed densely, n <= {DENSE_SQRT_STEPS}; "
                         f"got n = {n}")
    C = triangular_sqrt(W.matrix())
    return factorization("sqrt", p, objective, C, {}, dense_losses(W, C, p), "converged", t0)
