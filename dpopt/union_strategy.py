"""Unions of Kronecker strategy matrices, a Strategy's A: HDMM's OPT_+ (`UnionKronMatrix`), each workload term
answered by its own part; and residual Kronecker strategies (`ResidualKronMatrix`), one Kronecker part per
attribute subset, answered together by least squares.

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
from itertools import combinations

import numpy as np

from dpopt.data import Records
from dpopt.kron_strategy import KronMatrix, _terms
from dpopt.linalg import kron_matvec
from dpopt.marginal_strategy import helmert_basis
from dpopt.strategy import StrategyError, StructuredMatrix
from dpopt.workloads import ExplicitWorkload, Kron, Stack, Workload, kron_form


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


#: |B phi| / (||B||_F ||phi||) above which a residual factor is refused: its rows must annihilate the base phi.
BASE_RTOL = 1e-8


def _residual_ginverse(B: np.ndarray, rtol: float) -> np.ndarray:
    """N = U (U^T B^T B U)^+ U^T for the Helmert basis U of 1-perp: a generalised inverse of B^T B whose range
    lies in 1-perp (n x n); eigenvalues of U^T B^T B U below rtol times the largest count as zero."""
    U = helmert_basis(B.shape[1])
    C = U.T @ (B.T @ B) @ U
    lam, V = np.linalg.eigh((C + C.T) / 2)
    keep = lam > rtol * max(float(lam.max()), np.finfo(float).tiny)
    UV = U @ V[:, keep]
    return (UV / lam[keep]) @ UV.T


class ResidualKronMatrix(StructuredMatrix):
    """A = [w_A (x)_{i in A} B_{A,i} (x)_{i not in A} 1^T]_A: one Kronecker part per attribute subset A, whose
    factors B_{A,i} annihilate a base vector phi_i (B_{A,i} phi_i = 0, 1^T phi_i = 1).

    Per attribute, R^{n_i} = ker(phi_i^T)-rows plus the total row: a query row f splits into its residual
    f - (phi_i^T f) 1 and its base (phi_i^T f) 1^T. In the coordinates x' = (x)_i T_i x with T_i = [a basis of
    phi_i-perp; 1^T] every part measures one block of coordinates, so X = A^T A is block diagonal there and

        X^- = sum_A w_A^{-2} (x)_{i in A} N_{A,i} (x)_{i not in A} phi_i phi_i^T,
        N_{A,i} = U (U^T B_{A,i}^T B_{A,i} U)^{-1} U^T  (U a basis of 1-perp),

    is a generalised inverse of X (X X^- X = X). For a workload W whose rows lie in range(X), W X^- W^T =
    W X^+ W^T: the least-squares error trace(W^T W X^+), the per-query variances and the answers
    W X^- A^T y all go through the factors, part by part (the parts' cross terms vanish: N 1 = 0, B phi = 0).
    With phi_i = 1 / n_i this is ResidualPlanner's orthogonal residual basis (`dpopt.marginal_strategy`); an
    oblique base phi_i changes which queries are cheap.

    Sensitivity: the stack's largest column norm (`dpopt.workloads.Stack.max_column_norm`), exact up to its
    cell limit and a triangle-inequality upper bound beyond (exact when every factor has constant column
    norms, as the certified factors of `dpopt.solvers.residual_kron` have where their multipliers are positive).
    """

    def __init__(self, domain_sizes: Sequence[int], bases: Sequence[np.ndarray],
                 parts: Sequence[tuple[Sequence[int], Sequence[np.ndarray]]], weights: Sequence[float],
                 rank_rtol: float = 1e-10) -> None:
        """bases: phi_i (n_i,) with sum 1; parts: (A, [B_{A,i} for i in sorted A]); weights: w_A > 0."""
        self.domain_sizes = tuple(int(n) for n in domain_sizes)
        d = len(self.domain_sizes)
        if len(bases) != d:
            raise ValueError(f"need one base vector per attribute ({d}), got {len(bases)}")
        self.bases = [np.asarray(p, dtype=float).ravel() for p in bases]
        for i, (p, n) in enumerate(zip(self.bases, self.domain_sizes, strict=True)):
            if p.shape != (n,) or not np.all(np.isfinite(p)) or abs(p.sum() - 1.0) > 1e-9 * max(1.0, np.abs(p).sum()):
                raise ValueError(f"base {i} must be {n} finite numbers summing to 1")
        w = np.asarray(weights, dtype=float)
        if len(parts) == 0 or w.shape != (len(parts),) or not np.all(np.isfinite(w)) or np.any(w <= 0):
            raise ValueError(f"need at least one part and one positive finite weight per part, got {weights}")
        self.subsets: list[tuple[int, ...]] = []
        self.factors: list[list[np.ndarray]] = []
        for A, Bs in parts:
            A = tuple(sorted(int(i) for i in A))
            if len(set(A)) != len(A) or any(not 0 <= i < d for i in A) or A in self.subsets:
                raise ValueError(f"part subsets must be distinct sets of attributes in 0..{d - 1}, got {A}")
            if len(Bs) != len(A):
                raise ValueError(f"part {A} needs {len(A)} factors, got {len(Bs)}")
            mats = []
            for i, B in zip(A, Bs, strict=True):
                B = np.atleast_2d(np.asarray(B, dtype=float))
                if B.shape[1] != self.domain_sizes[i] or not np.all(np.isfinite(B)):
                    raise ValueError(f"factor {i} of part {A} must be finite with {self.domain_sizes[i]} columns")
                scale = float(np.linalg.norm(B)) * float(np.linalg.norm(self.bases[i]))
                if scale == 0.0 or float(np.linalg.norm(B @ self.bases[i])) > BASE_RTOL * scale:
                    raise ValueError(f"factor {i} of part {A} is zero or does not annihilate its base phi_{i}")
                mats.append(B)
            self.subsets.append(A)
            self.factors.append(mats)
        self.weights = w
        self.rank_rtol = rank_rtol

    # -- the matrix -------------------------------------------------------------------------------
    def _part(self, k: int) -> list[np.ndarray]:
        """Part k's Kronecker factors over all attributes: B_{A,i} on A, the total row 1^T elsewhere."""
        own = dict(zip(self.subsets[k], self.factors[k], strict=True))
        return [own.get(i, np.ones((1, n))) for i, n in enumerate(self.domain_sizes)]

    @cached_property
    def operator(self) -> Stack:
        """A = [w_A (x)_i part factors]_A as a weighted stack of Kronecker products."""
        parts = [Kron([ExplicitWorkload(M, name=f"B_{i}") for i, M in enumerate(self._part(k))])
                 for k in range(len(self.subsets))]
        return Stack(parts, self.weights, name="A")

    @property
    def sens_exact(self) -> bool:
        """True when the sensitivity scans every cell (`Stack.max_column_norm`), else it is an upper bound."""
        return self.operator.column_norm_exact

    @cached_property
    def _ginverses(self) -> list[list[np.ndarray]]:
        """N_{A,i} for every part and factor."""
        return [[_residual_ginverse(B, self.rank_rtol) for B in Bs] for Bs in self.factors]

    @property
    def rank(self) -> int:
        """rank(A) = sum_A prod_{i in A} rank(B_{A,i} on 1-perp): the parts measure complementary blocks."""
        return sum(math.prod(int(np.linalg.matrix_rank(N, hermitian=True)) for N in Ns) for Ns in self._ginverses)

    def _inverse_factors(self, k: int) -> list[np.ndarray]:
        """Part k's term of X^- without its weight: N_{A,i} on A, phi_i phi_i^T elsewhere."""
        own = dict(zip(self.subsets[k], self._ginverses[k], strict=True))
        return [own.get(i, np.outer(p, p)) for i, p in enumerate(self.bases)]

    def _workload(self, workload: Workload) -> Workload:
        """The workload's Kronecker form on this domain, else StrategyError."""
        w = kron_form(workload)
        self._check_domain(w)
        return w

    # -- error -----------------------------------------------------------------------------------
    def unit_error(self, workload: Workload) -> float:
        """seed 004 Prop. 3.3 through the factors: trace(W^T W X^-) = sum_k a_k sum_A w_A^{-2} prod_i
        trace(G_ki F_{A,i}), F the factors of X^- (per unit noise variance and sensitivity); exact when the
        strategy supports W (`unsupported_fraction`, which `Strategy.expected_error` checks first)."""
        w = self._workload(workload)
        total = 0.0
        for a, Gs in w.kron_terms():
            for k, wt in enumerate(self.weights):
                Fs = self._inverse_factors(k)
                total += a / wt**2 * math.prod(float(np.einsum("ij,ij->", G, F)) for G, F in zip(Gs, Fs, strict=True))
        return total

    @cached_property
    def _full(self) -> dict[tuple[int, ...], bool]:
        """For every measured A: True when each B_{A,i} has rank n_i - 1, i.e. measures all of phi_i-perp."""
        return {A: all(np.linalg.matrix_rank(N, hermitian=True) == len(p) - 1
                       for N, p in zip(Ns, (self.bases[i] for i in A), strict=True))
                for A, Ns in zip(self.subsets, self._ginverses, strict=True)}

    def _live(self, Gs: Sequence[np.ndarray]) -> list[int]:
        """The attributes on which a term's factor is not a multiple of the total row (its residual is not zero)."""
        return [i for i, (G, p) in enumerate(zip(Gs, self.bases, strict=True))
                if np.linalg.norm(G - np.outer(G @ p, np.ones(len(p)))) > 1e-12 * np.linalg.norm(G)]

    def unsupported_fraction(self, workload: Workload) -> float:
        """||W (I - X^- X)||_F / ||W||_F through the factors: zero exactly when every row of W lies in range(X).

        I - X^- X = sum_A D_A (x)_{i not in A} phi_i 1^T with D_A = (x)_{i in A} (I - phi_i 1^T) - [A measured]
        (x)_{i in A} N_{A,i} B_{A,i}^T B_{A,i}, over the A whose attributes all carry a non-total factor of the
        term (the residual of a total row is zero). A term whose every such A is measured with full-rank
        factors has D_A = 0; any other term's residual is summed as Kronecker products.
        """
        w = self._workload(workload)
        measured = dict(zip(self.subsets, range(len(self.subsets)), strict=True))
        res = total = 0.0
        for a, Gs in w.kron_terms():
            total += a * math.prod(float(np.trace(G)) for G in Gs)
            live = self._live(Gs)
            subsets = [A for r in range(len(live) + 1) for A in combinations(live, r)]
            if all(self._full.get(A, False) for A in subsets):
                continue
            pieces = []  # (coefficient, Kronecker factors) whose sum is the term's I - X^- X
            for A in subsets:
                if self._full.get(A, False):
                    continue
                full = [np.eye(len(p)) - np.outer(p, np.ones(len(p))) if i in A else np.outer(p, np.ones(len(p)))
                        for i, p in enumerate(self.bases)]
                pieces.append((1.0, full))
                if A in measured:
                    k = measured[A]
                    own = dict(zip(A, (N @ B.T @ B for N, B in zip(self._ginverses[k], self.factors[k], strict=True)),
                                   strict=True))
                    pieces.append((-1.0, [own.get(i, f) for i, f in enumerate(full)]))
            for c1, F1 in pieces:
                for c2, F2 in pieces:
                    res += a * c1 * c2 * math.prod(float(np.einsum("ij,ik,kj->", P, G, Q))
                                                   for P, G, Q in zip(F1, Gs, F2, strict=True))
        if total == 0.0:
            raise StrategyError(f"workload {w.name} is all zeros")
        return float(math.sqrt(max(res, 0.0) / total))

    def query_unit_variances(self, workload: Workload) -> np.ndarray:
        """w_q^T X^- w_q for every query: for a Kronecker row (x)_i f_i, sum_A w_A^{-2} prod_i f_i^T F_{A,i} f_i,
        a sum of Kronecker products of per-factor vectors (m,)."""
        w = self._workload(workload)
        out = []
        for wt, part in _terms(w):
            mats = [f.matrix() for f in part.factors]  # type: ignore[attr-defined]
            v = 0.0
            for k, pw in enumerate(self.weights):
                term = np.ones(1)
                for M, F in zip(mats, self._inverse_factors(k), strict=True):
                    term = np.kron(term, np.einsum("ij,jk,ik->i", M, F, M))
                v = v + term / pw**2
            out.append(wt**2 * np.asarray(v))
        return np.concatenate(out)

    # -- answering -------------------------------------------------------------------------------
    def measured(self, data: np.ndarray | Records) -> np.ndarray:
        """A x (r,) part by part, each a Kronecker product (from Records: only its marginal table is counted)."""
        return np.concatenate([wt * KronMatrix(self._part(k)).measured(data) for k, wt in enumerate(self.weights)])

    def _estimate_factors(self, k: int) -> list[np.ndarray]:
        """Part k's map from its measurements to its share of the estimate: N_{A,i} B_{A,i}^T on A, phi_i elsewhere."""
        own = dict(zip(self.subsets[k], (N @ B.T for N, B in zip(self._ginverses[k], self.factors[k], strict=True)),
                       strict=True))
        return [own.get(i, p[:, None]) for i, p in enumerate(self.bases)]

    def answers(self, y: np.ndarray, workload: Workload | None) -> np.ndarray:
        """W X^- A^T y = sum_A w_A^{-1} W ((x)_i E_{A,i}) y_A through the factors (m,); x_hat = X^- A^T y when no
        workload is given."""
        cuts = np.cumsum([math.prod(int(M.shape[0]) for M in self._part(k)) for k in range(len(self.subsets))])[:-1]
        blocks = np.split(np.asarray(y, dtype=float), cuts)
        if workload is None:
            return sum(kron_matvec(self._estimate_factors(k), yk) / wt
                       for k, (yk, wt) in enumerate(zip(blocks, self.weights, strict=True)))  # type: ignore[return-value]
        w = self._workload(workload)
        out = []
        for wt, part in _terms(w):
            acc = 0.0
            for k, (yk, pw) in enumerate(zip(blocks, self.weights, strict=True)):
                mats = [np.asarray(f.stored() @ E) for f, E in zip(part.factors, self._estimate_factors(k),  # type: ignore[attr-defined]
                                                                   strict=True)]
                acc = acc + kron_matvec(mats, yk) / pw
            out.append(wt * np.asarray(acc))
        return np.concatenate(out)
