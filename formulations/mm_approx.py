"""(eps, delta) matrix mechanism: the exact SDP of seed 002, Section 1.1.

With X = A^T A (n x n) and sens2(A)^2 = max diag(X), the strategy problem (seed 004 Prop. 3.3 error,
scaled so that sens2 = 1) is

    minimise trace(W^T W X^{-1})  s.t.  diag(X) <= 1,  X > 0,

and with Y >= V X^{-1} V^T and the Schur complement lemma it is the semidefinite program

    minimise trace(Y)  s.t.  [[X, V^T], [V, Y]] PSD,  diag(X) <= 1,

for any V with V^T V = W^T W. We take the thin factor V = diag(sqrt(lam)) Q^T from the nonzero part of
the eigendecomposition of the Gram matrix, so V is k x n with k = rank(W) <= n whatever the number
of queries. The SDP is exact: A recovered from the optimal X (Cholesky, or the PSD square root when X
is singular) is an optimal strategy, with total squared error P(eps, delta) * trace(W^T W X^{-1}).
"""

from __future__ import annotations

import time

import cvxpy as cp
import numpy as np

from dpopt.bounds import svd_bound_from_gram
from dpopt.privacy import Privacy
from dpopt.strategy import Strategy
from dpopt.workloads import GramWorkload, Workload
from formulations.inputs import embed_columns, gram_data, psd_part
from formulations.model import Model
from formulations.schur import schur_block

NAME = "mm_approx"
# A recovered strategy must reproduce W within this relative Frobenius residual.
SUPPORT_RTOL = 1e-6


def build(workload_or_gram: Workload | np.ndarray, *, zero_columns: str = "error") -> Model:
    """(eps, delta) matrix-mechanism SDP (seed 002, Section 1.1, Eq. (2)).

    workload_or_gram: a dpopt Workload or its Gram matrix W^T W (n x n).
    Variables: X (n x n, the strategy Gram A^T A), Y (k x k, k = rank W). Objective trace(Y) on the
    Gram matrix divided by s = trace(G)/n; Model.scale = s restores the workload's units.
    """
    t0 = time.perf_counter()
    b = schur_block(workload_or_gram, zero_columns)
    data, s, X, Y = b.data, b.scale, b.X, b.Y
    problem = cp.Problem(cp.Minimize(cp.trace(Y)), [b.lmi, cp.diag(X) <= 1])
    return Model(
        name=NAME,
        problem=problem,
        variables={"X": X, "Y": Y},
        scale=s,
        recover=to_strategy,
        build_seconds=time.perf_counter() - t0,
        data={"gram": data},
    )


def strategy_gram(model: Model) -> np.ndarray:
    """The optimal X (n_kept x n_kept), made exactly symmetric PSD (refused if it is not, within 1e-6)."""
    return psd_part(model.value("X"), f"X of model {model.name}")


def to_strategy(model: Model) -> Strategy:
    """A with A^T A = X (upper Cholesky factor, PSD square root if X is singular; seed 002, Section 1.1)."""
    data = model.data["gram"]
    A = Strategy.from_gram(strategy_gram(model), name=model.name).A
    return Strategy(embed_columns(np.asarray(A), data.kept, data.n), name=model.name)


def report(
    strategy: Strategy, workload_or_gram: Workload | np.ndarray, privacy: Privacy
) -> dict[str, float]:
    """Error of a strategy under (eps, delta)-DP and its ratio to the SVD bound (seed 004 Thm. 4.2).

    total = P * sens2(A)^2 * trace(W^T W (A^T A)^+), P = privacy.variance_factor (2 ln(2/delta)/eps^2
    in the classic calibration); svdb = P * SVDB(W); ratio = total / svdb >= 1. Computed on the Gram
    matrix as stored (a workload's gram_log_scale, if any, cancels in the ratio).
    """
    if privacy.is_pure:
        raise ValueError("report() is for (eps, delta)-DP (delta > 0); got delta = 0")
    workload = (
        workload_or_gram
        if isinstance(workload_or_gram, Workload)
        else GramWorkload(gram_data(workload_or_gram, zero_columns="drop").G_full())
    )
    strategy.check_supports(workload, rtol=SUPPORT_RTOL)
    G = workload.gram()
    unit = float(np.einsum("ij,ji->", G, strategy.gram_pinv()))
    total = privacy.variance_factor * strategy.sens2**2 * unit
    svdb = privacy.variance_factor * svd_bound_from_gram(G)
    return {"total": total, "svdb": svdb, "ratio": total / svdb}
