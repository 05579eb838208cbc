"""Unions of Kronecker strategy matrices (HDMM's OPT_+, `UnionKronMatrix`, a Strategy's A), with each workload
term answered by its own part.

A = [w_1 A^(1); ...; w_K A^(K)] with Kronecker parts A^(k) = (x)_i A_i^(k).

Sensitivity: the stack's largest column norm (`dpopt.workloads.Stack.max_column_norm`), exact up to
EXACT_SENS_CELLS cells and beyond that the triangle-inequality bound, which is exact whenever every part has
constant column norms, as the p-Identity (unit L1 columns) and the certified (eps, delta) factors (unit
diagonal X) produced by dpopt's optimisers do. `sens_exact` says which.

Error. Workload term j is answered from part p(j) alone: x_hat_k = A^(k)+ y_k / w_k, so
||B_j||_F^2 = a_j / w_k^2 prod_i trace(G_ji X_i^(k)+). This estimator is unbiased and linear, so by
Gauss-Markov the least-squares estimator over all of A has no larger error: the reported error is exact for
this estimator and an upper bound for least squares on the stacked strategy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cached_property

import numpy as np

from dpopt.kron_strategy import KronMatrix
from dpopt.strategy import StrategyError, StructuredMatrix
from dpopt.workloads import Stack, Workload


class UnionKronMatrix(StructuredMatrix):
    """Weighted stack of Kronecker strategy matrices; workload term j is answered by part `assignment[j]`."""

    def __init__(self, parts: Sequence[KronMatrix], weights: Sequence[float], assignment: Sequence[int]) -> None:
        if len(parts) == 0:
            raise ValueError("a union of Kronecker strategies needs at least one part")
        if len({p.domain_sizes for p in parts}) != 1:
            raise ValueError("all parts must share the factor domain sizes")
        w = np.asarray(weights, dtype=float)
        if w.shape != (len(parts),) or not np.all(np.isfinite(w)) or np.any(w <= 0):
            raise ValueError(f"weights must be {len(parts)} positive finite numbers, got {weights}")
        if any(not 0 <= int(k) < len(parts) for k in assignment):
            raise ValueError(f"assignment entries must index parts 0..{len(parts) - 1}")
        self.parts = list(parts)
        self.weights = w
        self.assignment = [int(k) for k in assignment]
        self.domain_sizes = self.parts[0].domain_sizes

    @cached_property
    def operator(self) -> Stack:
        """A = [w_k A^(k)]_k as a weighted stack of the parts' Kronecker products."""
        return Stack([p.operator for p in self.parts], self.weights, name="A")

    @property
    def rank(self) -> int:
        """An upper bound on rank(A): the parts' ranks summed, capped at n."""
        return min(sum(p.rank for p in self.parts), math.prod(self.domain_sizes))

    @property
    def sens_exact(self) -> bool:
        """True when the sensitivity scans every cell (`Stack.max_column_norm`), else it is an upper bound."""
        return self.operator.column_norm_exact

    def _check(self, workload: Stack) -> None:
        self._check_domain(workload, Stack)
        if len(workload.parts) != len(self.assignment):
            raise StrategyError(
                f"assignment covers {len(self.assignment)} terms but {workload.name} has {len(workload.parts)}"
            )

    def unit_error(self, workload: Stack) -> float:
        """sum_j a_j / w_{p(j)}^2 prod_i trace(G_ji X_i^(p(j))+) (per unit noise variance and sensitivity)."""
        self._check(workload)
        total = 0.0
        for k, wt, part in zip(self.assignment, workload.weights, workload.parts, strict=True):
            total += float(wt) ** 2 * self.parts[k].unit_error(part) / self.weights[k] ** 2
        return total

    def unsupported_fraction(self, workload: Stack) -> float:
        """Largest relative residual of a workload term against the part that answers it."""
        self._check(workload)
        return max(self.parts[k].unsupported_fraction(p) for k, p in zip(self.assignment, workload.parts, strict=True))

    def answers(self, y: np.ndarray, workload: Workload | None) -> np.ndarray:
        """Each term answered from its own part's least-squares estimate x_hat_k = A^(k)+ y_k / w_k (m,)."""
        self._check(workload)  # type: ignore[arg-type]
        cuts = np.cumsum([p.shape[0] for p in self.parts])[:-1]
        x_hat = [part.estimate(yk / wt) for yk, wt, part in
                 zip(np.split(y, cuts), self.weights, self.parts, strict=True)]
        return np.concatenate(
            [wt * p.matvec(x_hat[k]) for k, wt, p in zip(self.assignment, workload.weights, workload.parts, strict=True)]
        )

    def max_query_unit_variance(self, workload: Stack) -> float:
        """The largest per-query variance per unit noise variance: the largest over the terms, each through its part."""
        self._check(workload)
        return max((float(wt) / self.weights[k]) ** 2 * self.parts[k].max_query_unit_variance(p)
                   for k, wt, p in zip(self.assignment, workload.weights, workload.parts, strict=True))

    def query_unit_variances(self, workload: Stack) -> np.ndarray:
        """Variance of each query's answer per unit noise variance: term j from part k, (w_j / w_k)^2 w_i^T X_k^+ w_i."""
        self._check(workload)
        return np.concatenate([
            (float(wt) / self.weights[k]) ** 2 * self.parts[k].query_unit_variances(p)
            for k, wt, p in zip(self.assignment, workload.weights, workload.parts, strict=True)
        ])
