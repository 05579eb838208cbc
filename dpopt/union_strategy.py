"""Unions of Kronecker strategy matrices (HDMM's OPT_+, `UnionKronMatrix`, a Strategy's A), with each workload
term answered by its own part.

A = [w_1 A^(1); ...; w_K A^(K)] with Kronecker parts A^(k) = (x)_i A_i^(k).

Sensitivity. The column norms of a Kronecker product are the Kronecker products of the factors' column
norms, so the exact L1 sensitivity is max_j sum_k w_k c1^(k)_j and the exact L2 sensitivity is
sqrt(max_j sum_k w_k^2 c2^(k)_j^2), with c^(k) = (x)_i c_i^(k) over the n cells. `sensitivity` evaluates this
maximum exactly when n <= EXACT_SENS_CELLS (one pass over n cells, by blocks); beyond that it returns the
upper bound sum_k w_k sens1(A^(k)) (resp. sqrt(sum_k w_k^2 sens2(A^(k))^2)) from the triangle inequality,
which is exact whenever every part has constant column norms, as the p-Identity (unit L1 columns) and the
certified (eps, delta) factors (unit diagonal X) produced by dpopt's optimisers do. `sens_exact` says which.

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
from dpopt.linalg import column_norm_powers, kron_column_norms
from dpopt.strategy import StrategyError, StructuredMatrix
from dpopt.workloads import Stack, Workload

# Largest domain on which the stacked column norms are scanned exactly.
EXACT_SENS_CELLS = 50_000_000


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
        """True when `sensitivity` scans every cell (n <= EXACT_SENS_CELLS)."""
        return math.prod(self.domain_sizes) <= EXACT_SENS_CELLS

    def sensitivity(self, norm: int) -> float:
        """Exact stacked sensitivity on domains up to EXACT_SENS_CELLS, else the triangle-inequality bound."""
        if norm not in (1, 2):
            raise ValueError(f"norm must be 1 or 2, got {norm}")
        scale = self.weights if norm == 1 else self.weights**2
        if not self.sens_exact:
            per = [p.sensitivity(norm) ** norm for p in self.parts]
            tot = float(np.dot(scale, per))
            return tot if norm == 1 else math.sqrt(tot)
        # sum_k s_k (x)_i c_i^(k), scanned by blocks of the first factor to bound memory.
        first = self.domain_sizes[0]
        best = 0.0
        norms = [[column_norm_powers(M, norm) for M in p.factors] for p in self.parts]
        for lo in range(first):
            acc = 0.0
            for s, cs in zip(scale, norms, strict=True):
                acc = acc + s * cs[0][lo] * kron_column_norms(cs[1:])
            best = max(best, float(np.max(acc)))
        return best if norm == 1 else math.sqrt(best)

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

    def query_unit_variances(self, workload: Stack) -> np.ndarray:
        """Variance of each query's answer per unit noise variance: term j from part k, (w_j / w_k)^2 w_i^T X_k^+ w_i."""
        self._check(workload)
        return np.concatenate([
            (float(wt) / self.weights[k]) ** 2 * self.parts[k].query_unit_variances(p)
            for k, wt, p in zip(self.assignment, workload.weights, workload.parts, strict=True)
        ])
