"""Marginal-algebra strategy matrices (`MarginalMatrix`, a Strategy's A): strategy Gram X = sum_A x_A Q_A over
a product domain (see `marginal_algebra`).

Two ways to measure such an X:
All eigenvalues are kept divided by N = prod n_i (written x~_A = x_A / N; see `marginal_algebra`).

- kind "residual" (ResidualPlanner, Xiao et al. NeurIPS 2023), params x~_A: for each subset A, the block
  sqrt(x_A) B_A with B_A = (x)_{i in A} U_i^T (x)_{i not in A} 1^T / sqrt(n_i), U_i an orthonormal basis of
  1-perp (Helmert); B_A has orthonormal rows and B_A^T B_A = Q_A, and sqrt(x_A) B_A x equals
  sqrt(x~_A N_A) (x)_{i in A} U_i^T applied to the A-marginal table of x. Every column of the stack has
  squared norm sum_A x~_A r_A, so sens2 is exact. Intended for Gaussian noise.
- kind "marginals" (HDMM's marginal template, OPT_M), params theta_T: the marginal tables T weighted
  theta_T; x~_A = sum_{T superset of A} theta_T^2 / N_T; every column holds exactly one 1 per marginal, so
  sens1 = sum theta_T and sens2 = sqrt(sum theta_T^2) are exact.

Least squares through the algebra: X^+ = sum_A Q_A / x_A, so the estimate of the data's Q_A component
needs only an A-table z_A (an array over the attributes in A; the component is z_A / N broadcast over the
other axes), and a workload marginal S is (1 / N_S) sum_{A subset of S} z_A broadcast over S. The full data
vector is never formed: measuring needs only the data's marginal tables over the measured subsets.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import cached_property

import numpy as np
import scipy.sparse as sp

from dpopt.data import Records, marginal_tables
from dpopt.linalg import attrs_of, cells_of, residual_rank, submasks
from dpopt.strategy import StrategyError, StructuredMatrix
from dpopt.validation import check_choice
from dpopt.workloads import ExplicitWorkload, Kron, Marginals, Stack, Workload

KINDS = ("residual", "marginals")
#: A measured marginal over more attributes than this is not expanded into its 2^|T| subsets (the full table of
#: 40 attributes would need 2^40): its eigenvalue share is summed per subset asked for instead.
EXPAND_MAX_ATTRS = 20
TableFn = Callable[[tuple[int, ...]], np.ndarray]


def helmert_basis(n: int) -> np.ndarray:
    """Orthonormal basis of the complement of the ones vector in R^n (n x (n - 1)), Helmert's construction."""
    U = np.zeros((n, n - 1))
    for j in range(1, n):
        U[:j, j - 1] = 1.0
        U[j, j - 1] = -float(j)
        U[:, j - 1] /= math.sqrt(j * (j + 1))
    return U


def _apply_axes(T: np.ndarray, mats: Sequence[np.ndarray]) -> np.ndarray:
    """Apply mats[k] (r_k x n_k) along axis k of T, for every axis."""
    for k, M in enumerate(mats):
        T = np.moveaxis(np.tensordot(M, T, axes=(1, k)), 0, k)
    return T


def _center(T: np.ndarray, axes: Sequence[int]) -> np.ndarray:
    """Apply I - 1 1^T / n_k along each axis in `axes`."""
    for k in axes:
        T = T - T.mean(axis=k, keepdims=True)
    return T


class MarginalMatrix(StructuredMatrix):
    """Strategy Gram sum_A x_A Q_A measured as residual blocks or weighted marginal tables."""

    def __init__(
        self,
        domain_sizes: Sequence[int],
        kind: str,
        subsets: Sequence[Sequence[int]],
        params: Sequence[float] | np.ndarray,
    ) -> None:
        check_choice(kind, KINDS, "kind")
        self.domain_sizes = tuple(int(n) for n in domain_sizes)
        d = len(self.domain_sizes)
        subs = [tuple(sorted({int(a) for a in s})) for s in subsets]
        if any(a < 0 or a >= d for s in subs for a in s):
            raise ValueError(f"subsets name attributes outside 0..{d - 1}")
        p = np.asarray(params, dtype=float)
        if p.shape != (len(subs),) or not np.all(np.isfinite(p)) or np.any(p < 0):
            raise ValueError(f"params must be {len(subs)} finite non-negative numbers")
        keep = p > 0
        if not np.any(keep):
            raise ValueError("strategy measures nothing: every parameter is zero")
        self.kind = kind
        self.subsets = [s for s, k in zip(subs, keep, strict=True) if k]
        self.masks = [sum(1 << a for a in s) for s in self.subsets]
        self.params = p[keep]

    # -- spectrum and sensitivity ------------------------------------------------------------------
    @cached_property
    def _x(self) -> dict[int, float]:
        """x_A / N for every A with x_A > 0, except the share of measured marginals over more than
        EXPAND_MAX_ATTRS attributes (`_wide`), whose 2^|T| subsets are never enumerated."""
        out: dict[int, float] = {}
        if self.kind == "residual":
            for A, v in zip(self.masks, self.params, strict=True):
                out[A] = out.get(A, 0.0) + float(v)
            return out
        for T, th in zip(self.masks, self.params, strict=True):
            if T.bit_count() <= EXPAND_MAX_ATTRS:
                val = float(th) ** 2 / cells_of(self.domain_sizes, T)
                for A in submasks(T):
                    out[A] = out.get(A, 0.0) + val
        return out

    @cached_property
    def _wide(self) -> list[tuple[int, float]]:
        """(T, theta_T^2 / N_T) for the measured marginals over more than EXPAND_MAX_ATTRS attributes."""
        if self.kind == "residual":
            return []
        return [(T, float(th) ** 2 / cells_of(self.domain_sizes, T))
                for T, th in zip(self.masks, self.params, strict=True) if T.bit_count() > EXPAND_MAX_ATTRS]

    def eigenvalue(self, mask: int) -> float:
        """x_A / N = sum over measured T containing A of theta_T^2 / N_T (0 if A is unmeasured)."""
        return self._x.get(mask, 0.0) + sum(v for T, v in self._wide if mask & T == mask)

    def sensitivity(self, norm: int) -> float:
        """Exact and constant over cells. L2: sqrt(sum_A x_A r_A / N), or sqrt(sum theta_T^2); L1 (the marginal
        form only, residual blocks are for Gaussian noise): sum theta_T."""
        if norm == 1 and self.kind == "residual":
            raise ValueError("residual-basis strategies need Gaussian noise (L2 sensitivity): give a Privacy with "
                             "delta > 0")
        if self.kind == "marginals":
            return float(np.sum(self.params) if norm == 1 else np.sqrt(np.sum(self.params**2)))
        return math.sqrt(sum(v * residual_rank(self.domain_sizes, A) for A, v in self._x.items()))

    @cached_property
    def operator(self) -> Stack:
        """A as a weighted stack of Kronecker products: the tables theta_T M_T, or the residual blocks
        sqrt(x~_A N_A) (x)_{i in A} U_i^T (x)_{i not in A} 1^T (a block of rank 0 has no rows and is left out)."""
        def factor(i: int, n: int, s: tuple[int, ...]) -> np.ndarray | sp.spmatrix:
            if i not in s:
                return np.ones((1, n))
            return helmert_basis(n).T if self.kind == "residual" else sp.identity(n, format="csr")

        parts, weights = [], []
        for s, A, v in zip(self.subsets, self.masks, self.params, strict=True):
            if self.kind == "marginals" or residual_rank(self.domain_sizes, A) > 0:
                parts.append(Kron([ExplicitWorkload(factor(i, n, s)) for i, n in enumerate(self.domain_sizes)]))
                weights.append(v if self.kind == "marginals" else math.sqrt(v * cells_of(self.domain_sizes, A)))
        return Stack(parts, weights, name="A")

    @property
    def rank(self) -> int:
        """rank(A) = sum of r_A over the measured residual spaces; with a measured marginal T too wide to
        expand, N_T when T contains every other measured marginal (exact), else min(sum of N_T, N), an upper bound."""
        if not self._wide:
            return sum(residual_rank(self.domain_sizes, A) for A, v in self._x.items() if v > 0)
        top = max(self._wide, key=lambda t: t[0].bit_count())[0]
        if all(T & top == T for T in self.masks):
            return cells_of(self.domain_sizes, top)
        return min(sum(cells_of(self.domain_sizes, T) for T in self.masks), math.prod(self.domain_sizes))

    # -- error -----------------------------------------------------------------------------------
    def unsupported_fraction(self, workload: Marginals) -> float:
        """sqrt(sum of c_A r_A over unmeasured A / trace(W^T W)): the workload outside the strategy's range."""
        self._check_domain(workload, Marginals)
        cr = workload.scaled_eigenvalues * workload.multiplicities
        miss = np.array([self.eigenvalue(A) <= 0 for A in workload.closure])
        return float(math.sqrt(cr[miss].sum() / cr.sum()))

    def unit_error(self, workload: Marginals) -> float:
        """seed 004 Prop. 3.3 in closed form: trace(W^T W X^+) = sum_A c_A r_A / x_A over the workload's
        down-closure."""
        self._check_domain(workload, Marginals)
        x = np.array([self.eigenvalue(A) for A in workload.closure])
        cr = workload.scaled_eigenvalues * workload.multiplicities
        live = cr > 0
        if np.any(x[live] <= 0):
            return math.inf
        return float(np.sum(cr[live] / x[live]))

    def marginal_variances(self, workload: Marginals) -> np.ndarray:
        """Noise variance of each cell of each workload marginal S (unweighted; per unit noise variance).

        trace(G_S X^+) = N_{-S} sum_{A subset of S} r_A / x_A spreads evenly over the N_S cells of S, so
        each cell has variance (1 / N_S^2) sum_{A subset of S} r_A / (x_A / N).
        """
        self._check_domain(workload, Marginals)
        out = []
        for S in workload.masks:
            tot = sum(
                residual_rank(self.domain_sizes, A) / self.eigenvalue(A)
                for A in submasks(S)
                if residual_rank(self.domain_sizes, A) > 0
            )
            out.append(tot / cells_of(self.domain_sizes, S) ** 2)
        return np.array(out)

    # -- measuring and reconstructing ------------------------------------------------------------------
    def measured(self, data: np.ndarray | Records) -> np.ndarray:
        """The exact measurements (r,) from the data's marginal tables, counted from Records or summed from x."""
        return self.measured_tables(marginal_tables(data, self.domain_sizes))

    def measured_tables(self, tables: TableFn) -> np.ndarray:
        """The exact measurements (r,), every measured subset's block in turn, from the data's marginal tables.

        `tables(attrs)` returns the count table over the sorted attribute tuple attrs (shape (n_i for i in
        attrs); a 0-d array for the empty tuple).
        """
        exact: list[np.ndarray] = []
        for s, A, v in zip(self.subsets, self.masks, self.params, strict=True):
            t = np.asarray(tables(s), dtype=float)
            expect = tuple(self.domain_sizes[i] for i in s)
            if t.shape != expect:
                raise ValueError(f"table for attributes {s} has shape {t.shape}, expected {expect}")
            if self.kind == "residual":
                U = [helmert_basis(self.domain_sizes[i]).T for i in s]
                exact.append(math.sqrt(v * cells_of(self.domain_sizes, A)) * _apply_axes(t, U))
            else:
                exact.append(v * t)
        return np.concatenate([y.ravel() for y in exact])

    def blocks(self, y: np.ndarray) -> dict[int, np.ndarray]:
        """Measurements (r,) split into one table per measured subset (its mask to the block's shape)."""
        less = 1 if self.kind == "residual" else 0  # a residual block has n_i - 1 rows per attribute
        shapes = [tuple(self.domain_sizes[i] - less for i in s) for s in self.subsets]
        cuts = np.cumsum([math.prod(sh) for sh in shapes])[:-1]
        return {A: z.reshape(sh) for A, sh, z in zip(self.masks, shapes, np.split(y, cuts), strict=True)}

    def residual_estimates(self, y: dict[int, np.ndarray], need: Sequence[int]) -> dict[int, np.ndarray]:
        """Least-squares A-tables z_A (the data's Q_A component is z_A / N broadcast over the other axes)."""
        sizes = self.domain_sizes
        out: dict[int, np.ndarray] = {}
        for A in need:
            xa = self.eigenvalue(A)
            if xa <= 0:
                raise StrategyError(f"subset {attrs_of(A)} is not measured by the strategy")
            a_attrs = attrs_of(A)
            if self.kind == "residual":
                U = [helmert_basis(sizes[i]) for i in a_attrs]
                out[A] = _apply_axes(y[A], U) * math.sqrt(cells_of(sizes, A) / xa)
                continue
            acc = np.zeros(tuple(sizes[i] for i in a_attrs))
            for s, T, th in zip(self.subsets, self.masks, self.params, strict=True):
                if A & T != A:
                    continue
                drop = tuple(k for k, i in enumerate(s) if not A >> i & 1)
                m = y[T].sum(axis=drop) if drop else y[T]
                acc += th * m / math.prod(sizes[s[k]] for k in drop)
            out[A] = _center(acc, range(len(a_attrs))) / xa
        return out

    def reconstruct(self, y: dict[int, np.ndarray], workload: Marginals) -> list[np.ndarray]:
        """Least-squares answers W A^+ y: one table per workload marginal (unweighted counts)."""
        self._check_domain(workload, Marginals)
        z = self.residual_estimates(y, [A for A in workload.closure if residual_rank(self.domain_sizes, A) > 0])
        tables = []
        for s, S in zip(workload.subsets, workload.masks, strict=True):
            shape = tuple(self.domain_sizes[i] for i in s)
            acc = np.zeros(shape)
            for A in submasks(S):
                if A not in z:
                    continue
                idx = tuple(slice(None) if A >> i & 1 else None for i in s)
                acc = acc + z[A][idx]
            tables.append(acc / cells_of(self.domain_sizes, S))
        return tables

    def answers(self, y: np.ndarray, workload: Workload | None) -> np.ndarray:
        """The workload's weighted marginal tables W A^+ y, raveled in query order (m,)."""
        self._check_domain(workload, Marginals)  # type: ignore[arg-type]
        out = self.reconstruct(self.blocks(y), workload)  # type: ignore[arg-type]
        return np.concatenate([wt * t.ravel() for wt, t in zip(workload.weights, out, strict=True)])

    def max_query_unit_variance(self, workload: Marginals) -> float:
        """The largest per-query variance per unit noise variance: every cell of a marginal has its marginal's."""
        v = self.marginal_variances(workload)
        return max(float(wt) ** 2 * float(vs) for wt, vs in zip(workload.weights, v, strict=True))

    def query_unit_variances(self, workload: Marginals) -> np.ndarray:
        """Variance of each workload query per unit noise variance: each marginal's cell variance, times its weight^2."""
        v = self.marginal_variances(workload)
        return np.concatenate([
            np.full(cells_of(self.domain_sizes, S), float(wt) ** 2 * vs)
            for S, wt, vs in zip(workload.masks, workload.weights, v, strict=True)
        ])
