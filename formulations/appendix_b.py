"""Seed 000, Appendix B: the matrix mechanism as min_M max(diag M) * trace(W^T W M^{-1}), M > 0.

The product is not convex in M, but it is scale invariant: f(c M) = f(M) for every c > 0. Fixing the
scale by trace(W^T W M^{-1}) <= 1 (the constraint is active at the optimum) gives the convex program

    minimise s  s.t.  diag(M) <= s,  [[M, V^T], [V, Y]] PSD,  trace(Y) <= 1,

(V^T V = W^T W, Schur complement as in seed 002) whose optimal s equals min f. For any feasible M,
rescaling M by 1 / trace(W^T W M^{-1}) shows s* <= f(M); conversely a solution (s, M) of the program
has f(M) <= s. So the optimum is the same number as the (eps, delta) SDP in `mm_approx` (which fixes
the other factor, max diag(M) <= 1, instead): the two are one problem with different normalisations,
and the test suite checks that they agree. This model is the conic reference for a hand-written
solver of Appendix B. SCS converges much more slowly on this normalisation than on mm_approx's
(benchmarks/results/formulations.md: 23 s against 0.2 s at n = 48, tol 1e-6; no convergence to 1e-9
within 200,000 iterations at n = 32); Clarabel solves both at the same cost.

Appendix B smooths max(v) by f_mu(v) = mu log sum_i exp(v_i / mu) (its Eq. (14)), with
max(v) <= f_mu(v) <= max(v) + mu log n. With `mu` given, the objective here becomes f_mu(diag M)
under the same normalisation, so the optimal value lies in [s*, s* + mu log n]. (This is the smoothed
maximum under trace(W^T W M^{-1}) <= 1; the smoothed product is not scale invariant, so it is not the
same function as f_mu(diag M) * trace(W^T W M^{-1}) and may have a different minimiser.)
"""

from __future__ import annotations

import math
import time

import cvxpy as cp
import numpy as np

from dpopt.strategy import Strategy
from dpopt.workloads import Workload
from formulations.inputs import embed_columns, psd_part
from formulations.model import Model
from formulations.schur import schur_block

NAME = "appendix_b"


def build(
    workload_or_gram: Workload | np.ndarray,
    *,
    mu: float | None = None,
    zero_columns: str = "error",
) -> Model:
    """Convex form of seed 000 Appendix B, Formula (13) with M = A^T A (optionally smoothed, Eq. (14)).

    workload_or_gram: a dpopt Workload or its Gram matrix W^T W (n x n).
    Variables: M (n x n), Y (k x k), s (scalar; absent when mu is given). The Gram matrix is divided by
    c = trace(G)/n before solving; since f(M) scales linearly with W^T W, Model.scale = c restores the
    workload's units. mu (> 0) is in those units too.
    """
    t0 = time.perf_counter()
    b = schur_block(workload_or_gram, zero_columns, x_name="M")
    data, c, M, Y = b.data, b.scale, b.X, b.Y
    constraints = [b.lmi, cp.trace(Y) <= 1]
    variables = {"M": M, "Y": Y}
    if mu is None:
        s = cp.Variable(name="s")
        constraints.append(cp.diag(M) <= s)
        objective = cp.Minimize(s)
        variables["s"] = s
    else:
        if not (isinstance(mu, (int, float)) and math.isfinite(mu) and mu > 0):
            raise ValueError(f"mu must be a finite number > 0 (or None for the exact max), got {mu!r}")
        mu_s = mu / c
        objective = cp.Minimize(mu_s * cp.log_sum_exp(cp.diag(M) / mu_s))
    problem = cp.Problem(objective, constraints)
    return Model(
        name=NAME if mu is None else f"{NAME}(mu={mu:g})",
        problem=problem,
        variables=variables,
        scale=c,
        recover=to_strategy,
        build_seconds=time.perf_counter() - t0,
        data={"gram": data, "mu": mu},
    )


def to_strategy(model: Model) -> Strategy:
    """A with A^T A = M / max(diag M) (sens2 = 1; seed 000 Appendix B recovers A from M's eigenpairs)."""
    data = model.data["gram"]
    M = psd_part(model.value("M"), f"M of model {model.name}")
    M = M / np.diag(M).max()
    A = Strategy.from_gram(M, name=model.name).A
    return Strategy(embed_columns(np.asarray(A), data.kept, data.n), name=model.name)
