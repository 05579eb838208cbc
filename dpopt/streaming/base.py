"""The one result type of every streaming family, the plain-numpy reference losses, and workload checks.

Losses at unit noise (jax_privacy's convention): with decoder B = A C^-1,
mean = sens^2 ||B||_F^2 / n and max = sens^2 max_t ||B_t||^2 (row norms), sens^2 the certified
multi-participation sensitivity of C (`dpopt.streaming.participation`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.linalg import solve_triangular

from dpopt.streaming.participation import Participation, participation_sensitivity
from dpopt.workloads import MAX_DENSE_ENTRIES, ExplicitWorkload, Workload

OBJECTIVES = ("mean", "max")
#: The JSON keys of a factorization's report, in order.
RECORD_KEYS = ("family", "n", "epochs", "objective", "mean_loss", "max_loss", "sensitivity", "lower_bound", "gap",
               "status", "fit_seconds")
#: Largest n for which a dense n x n matrix (C, or a dense workload) is formed by a family.
MAX_DENSE_STEPS = int(math.isqrt(MAX_DENSE_ENTRIES // 4))


@dataclass
class Factorization:
    """A streaming factorization A = B C with its certified sensitivity and losses.

    C is the (n, n) lower-triangular strategy when kept, else None with the family's parameters in `params`.
    sensitivity is sens^2 at unit clipping, a true upper bound for the participation scheme; lower_bound is over
    every factorization on the chosen objective (None unless certified), gap relative (None unless certified).
    """

    family: str
    n: int
    epochs: int
    objective: str
    C: np.ndarray | None
    params: dict[str, Any]
    sensitivity: float
    mean_loss: float
    max_loss: float
    lower_bound: float | None = None
    gap: float | None = None
    status: str = "converged"
    fit_seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def loss(self) -> float:
        """The loss on the chosen objective."""
        return self.mean_loss if self.objective == "mean" else self.max_loss

    def record(self) -> dict[str, Any]:
        """The report as a dict with exactly the JSON keys  (RECORD_KEYS)."""
        return {k: getattr(self, k) for k in RECORD_KEYS}


def check_objective(objective: str) -> str:
    """'mean' or 'max', else ValueError."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be 'mean' or 'max', got {objective!r}")
    return objective


def check_participation(participation: Participation, n: int) -> Participation:
    """The participation, checked to be a Participation over the workload's n steps."""
    if not isinstance(participation, Participation):
        raise ValueError(f"participation must be a dpopt.streaming.Participation, got {type(participation).__name__}")
    if participation.n != n:
        raise ValueError(f"participation is over {participation.n} steps but the workload has {n}")
    return participation


def streaming_workload(A: Workload | np.ndarray) -> Workload:
    """A as a square lower-triangular workload (a matrix is wrapped), else ValueError naming what is wrong."""
    if isinstance(A, Workload):
        W = A
    else:
        M = np.asarray(A, dtype=float)
        if M.ndim != 2:
            raise ValueError(f"workload A must be a matrix, got shape {M.shape}")
        W = ExplicitWorkload(M, name="A")
    m, n = W.shape
    if m != n:
        raise ValueError(f"a streaming workload is square (n steps x n steps); {W.name} is {m} x {n}")
    if W.toeplitz_column() is None:
        if n > MAX_DENSE_STEPS:
            raise ValueError(f"workload {W.name} is not Toeplitz and n = {n} is above {MAX_DENSE_STEPS}, the largest "
                             "dense n x n matrix formed here")
        M = W.matrix()
        if np.any(np.triu(M, 1) != 0):
            raise ValueError(f"workload {W.name} is not lower triangular: a streaming workload uses steps <= t only")
        if np.any(np.diag(M) == 0):
            raise ValueError(f"workload {W.name} has a zero on its diagonal; expected an invertible lower-triangular A")
    return W


def prepare(A: Workload | np.ndarray, participation: Participation, objective: str
            ) -> tuple[Workload, Participation]:
    """The checks every family's `optimise` starts with: (the workload, the participation over its n steps)."""
    W = streaming_workload(A)
    p = check_participation(participation, W.n)
    check_objective(objective)
    return W, p


def decoder(A: np.ndarray, C: np.ndarray) -> np.ndarray:
    """B = A C^-1 by a triangular solve (C^T B^T = A^T)."""
    return solve_triangular(C, A.T, trans="T", lower=True).T


def dense_losses(A: Workload | np.ndarray, C: np.ndarray, p: Participation) -> tuple[float, float, float]:
    """(mean_loss, max_loss, sens2) in plain numpy: B = A C^-1, sens^2 certified on X = C^T C."""
    M = A.matrix() if isinstance(A, Workload) else np.asarray(A, dtype=float)
    C = np.asarray(C, dtype=float)
    B = decoder(M, C)
    sens2 = participation_sensitivity(C.T @ C, p)
    rows = np.einsum("ij,ij->i", B, B)
    n = M.shape[0]
    return sens2 * float(rows.sum()) / n, sens2 * float(rows.max()), sens2
