"""Streaming factorization with several participations per user: the exact SDP over every factorization.

A workload A (n x n; lower triangular in streaming), a strategy C with Gram X = C^T C, and participation patterns
pi (a partition of the n steps into sets of k; k epochs of b = n / k steps: pi_r = {r, r + b, ..., r + (k-1) b}).
A user's contributions move C x by at most sqrt(sens(X)), sens(X) = max_pi min{1^T y : Diag(y) - X_pi PSD}
(Choquette-Choo et al., "Multi-epoch matrix factorization mechanisms for private machine learning", ICML 2023;
Denisov et al., NeurIPS 2022, for k = 1). With the Schur complement of seed 002, Section 1.1, the least losses at
unit noise over every factorization A = B C are the SDPs

    mean:  minimise tr(Y)  s.t. [[X, V^T], [V, Y]] PSD (V^T V = A^T A),  Diag(y_pi) - X_pi PSD,  1^T y_pi <= 1,
    max:   minimise s      s.t. [[X, A^T], [A, Y]] PSD,  diag(Y) <= s,  the same pattern constraints,

(mean loss = tr(Y) / n, max loss = s: Y >= A X^{-1} A^T). The hand-written counterparts are
`dpopt.solvers.participation_dual.solve_participation` (mean) and `dpopt.solvers.participation_max` (max).
`sensitivity_sdp` states the sensitivity itself as a CVXPY problem per pattern (the independent scorer of
`dpopt crossval`).
"""

from __future__ import annotations

import time

import cvxpy as cp
import numpy as np

from dpopt.strategy import Strategy
from dpopt.validation import check_choice, check_finite_matrix
from dpopt.workloads import Workload
from formulations.inputs import gram_scale, psd_part, thin_factor
from formulations.model import Model

NAME = "streaming"
OBJECTIVES = ("mean", "max")


def _check_patterns(patterns: np.ndarray, n: int) -> np.ndarray:
    """patterns (b, k) integers covering 0..n-1 once each."""
    P = np.asarray(patterns)
    if P.ndim != 2 or not np.issubdtype(P.dtype, np.integer) or not np.array_equal(np.sort(P.ravel()), np.arange(n)):
        raise ValueError(f"patterns must be a (b, k) integer array holding every step 0..{n - 1} once")
    return P


def pattern_constraints(X: cp.Expression, patterns: np.ndarray) -> list[cp.Constraint]:
    """Diag(y_pi) - X_pi PSD and 1^T y_pi <= 1 for every pattern (sensitivity <= 1); k = 1: diag(X) <= 1."""
    if patterns.shape[1] == 1:
        return [cp.diag(X) <= 1]
    out: list[cp.Constraint] = []
    for idx in patterns:
        y = cp.Variable(idx.size)
        block = X[idx, :][:, idx]
        out += [cp.diag(y) - (block + block.T) / 2 >> 0, cp.sum(y) <= 1]
    return out


def build(workload: Workload | np.ndarray, patterns: np.ndarray, *, objective: str = "mean") -> Model:
    """Seed 002's Schur SDP with the k-participation constraints (Choquette-Choo et al. 2023) for A and patterns (b, k).

    Variables X (n x n, the strategy Gram C^T C) and Y; solved on A / sqrt(s), s = trace(A^T A) / n, with
    Model.scale = s restoring the loss in A's units: mean loss = scale * value / n, max loss = scale * value.
    """
    t0 = time.perf_counter()
    check_choice(objective, OBJECTIVES, "objective")
    A = check_finite_matrix(workload.matrix() if isinstance(workload, Workload) else workload, "workload A")
    n = A.shape[1]
    P = _check_patterns(patterns, n)
    s = gram_scale(A.T @ A)
    X = cp.Variable((n, n), symmetric=True, name="X")
    if objective == "mean":
        V = thin_factor(A.T @ A / s)
        Y = cp.Variable((V.shape[0], V.shape[0]), symmetric=True, name="Y")
        constraints = [cp.bmat([[X, V.T], [V, Y]]) >> 0]
        goal = cp.trace(Y)
        variables = {"X": X, "Y": Y}
    else:
        W = A / np.sqrt(s)
        Y = cp.Variable((W.shape[0], W.shape[0]), symmetric=True, name="Y")
        t = cp.Variable(name="s")
        constraints = [cp.bmat([[X, W.T], [W, Y]]) >> 0, cp.diag(Y) <= t]
        goal = t
        variables = {"X": X, "Y": Y, "s": t}
    problem = cp.Problem(cp.Minimize(goal), constraints + pattern_constraints(X, P))
    return Model(name=NAME, problem=problem, variables=variables, scale=s, recover=to_strategy,
                 build_seconds=time.perf_counter() - t0, data={"objective": objective, "patterns": P, "n": n})


def to_strategy(model: Model) -> Strategy:
    """A strategy with Gram X (Cholesky factor, or the PSD square root when X is singular)."""
    return Strategy.from_gram(psd_part(model.value("X"), f"X of model {model.name}"), name=model.name)


def sensitivity_sdp(block: np.ndarray) -> cp.Problem:
    """min 1^T y s.t. Diag(y) - X_pi PSD for one k x k block (the participation sensitivity of a pattern)."""
    B = np.asarray(block, dtype=float)
    y = cp.Variable(B.shape[0])
    return cp.Problem(cp.Minimize(cp.sum(y)), [cp.diag(y) - (B + B.T) / 2 >> 0])


def participation_sensitivity(X: np.ndarray, patterns: np.ndarray, solver: str = "CLARABEL") -> float:
    """sens(X) = max over patterns of `sensitivity_sdp` by a conic solver (Choquette-Choo et al. 2023; k = 1: max diag X)."""
    X = np.asarray(X, dtype=float)
    P = _check_patterns(patterns, X.shape[0])
    if P.shape[1] == 1:
        return float(np.diag(X).max())
    values = []
    for idx in P:
        problem = sensitivity_sdp(X[np.ix_(idx, idx)])
        problem.solve(solver=solver.upper())
        values.append(float(problem.value))
    return max(values)
