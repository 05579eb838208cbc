"""Kronecker strategy matrices: A = A_1 (x) ... (x) A_d held by its factors (`KronMatrix`, a Strategy's A).

Everything is computed through the factors: column norms of a Kronecker product are products of the factors'
column norms (|a_{(i,k),(j,l)}| = |a_ij| |b_kl|), so sens1 and sens2 are exactly the products of the factors'
maxima. With X_i = A_i^T A_i, X^+ = (x)_i X_i^+ and a workload Gram sum_k a_k (x)_i G_ki,
||W A^+||_F^2 = trace(W^T W X^+) = sum_k a_k prod_i trace(G_ki X_i^+).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cached_property

import numpy as np
import scipy.sparse as sp

from dpopt.data import Records
from dpopt.linalg import kron_matvec
from dpopt.strategy import Strategy, StrategyError, StructuredMatrix
from dpopt.validation import check_finite_matrix
from dpopt.workloads import ExplicitWorkload, Kron, Workload, kron_form

# Relative tolerance for "the strategy supports the workload" (relative Frobenius residual).
SUPPORT_RTOL = 1e-8


def _constant_row(M: np.ndarray | sp.spmatrix) -> float | None:
    """c when M is the single row c 1^T (its factor sums an attribute out), else None."""
    if M.shape[0] != 1:
        return None
    row = np.asarray(M.todense() if sp.issparse(M) else M, dtype=float).ravel()
    return float(row[0]) if np.all(row == row[0]) else None


def _is_identity(B: np.ndarray | sp.spmatrix) -> bool:
    """True when B is a square identity matrix."""
    if B.shape[0] != B.shape[1]:
        return False
    D = sp.csr_matrix(B) - sp.identity(B.shape[0], format="csr")
    return D.count_nonzero() == 0


def _terms(w: Workload) -> list[tuple[float, Kron]]:
    """The weighted Kronecker parts of a workload in Kronecker form: [(1, W)] for one product, else the Stack's."""
    return [(1.0, w)] if isinstance(w, Kron) else [(float(wt), p) for wt, p in zip(w.weights, w.parts, strict=True)]  # type: ignore[attr-defined]


class KronMatrix(StructuredMatrix):
    """A = A_1 (x) ... (x) A_d with least-squares reconstruction B = W A^+ through the factors."""

    def __init__(self, factors: Sequence[np.ndarray | sp.spmatrix | Strategy]) -> None:
        """factors: matrices, or Strategy objects without B (least squares), or all with B = I: then the
        answers are the measurements themselves (noise on queries, A = W) and `direct` is True. A Strategy factor
        without B is kept as the factor's part, with whatever it has computed already (Gram, Cholesky factor)."""
        if len(factors) == 0:
            raise ValueError("a Kronecker strategy needs at least one factor")
        mats = []
        direct = [isinstance(f, Strategy) and f.B is not None for f in factors]
        if any(direct) and not all(direct):
            raise ValueError("either every factor answers its measurements directly (B = I) or none does")
        for i, f in enumerate(factors):
            if isinstance(f, Strategy):
                if f.B is not None and not _is_identity(f.B):
                    raise ValueError(f"factor {i} carries a B other than I; expected a matrix-mechanism strategy")
                f = f.A
            mats.append(check_finite_matrix(f, f"factor {i}", keep_sparse=True))
        self.factors = mats
        self._given = [f if isinstance(f, Strategy) and f.B is None and not f.factored else None for f in factors]
        self.domain_sizes = tuple(int(M.shape[1]) for M in mats)
        self.direct = all(direct)

    @cached_property
    def operator(self) -> Kron:
        """A = A_1 (x) ... (x) A_d as the Kronecker product of its factors."""
        return Kron([ExplicitWorkload(M, name=f"A_{i}") for i, M in enumerate(self.factors)], name="A")

    @property
    def rank(self) -> int:
        """rank(A) = prod_i rank(A_i) (a factor of full column rank is known so from its Cholesky factor)."""
        return math.prod(s.rank for s in self._parts)

    # -- factor Grams ----------------------------------------------------------------------------
    @cached_property
    def _parts(self) -> list[Strategy]:
        """Each factor A_i as a dense Strategy: its Gram X_i, eigen-decomposition and pseudo-inverse."""
        return [Strategy(M, name=f"factor {i}") if g is None else g
                for i, (g, M) in enumerate(zip(self._given, self.factors, strict=True))]

    @property
    def _factor_eigs(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Eigenvalues (cut to 0 below RANK_RTOL * max) and eigenvectors of every X_i."""
        return [s._gram_eig for s in self._parts]

    @cached_property
    def factor_pinvs(self) -> list[np.ndarray]:
        """X_i^+ (n_i x n_i)."""
        return [s.gram_pinv() for s in self._parts]

    @cached_property
    def factor_null_bases(self) -> list[np.ndarray]:
        """Orthonormal bases of the null spaces of A_i (n_i x (n_i - rank_i)); empty, without an eigendecomposition,
        for a factor of full column rank."""
        return [np.zeros((s.shape[1], 0)) if s.full_column_rank else s._gram_eig[1][:, s._gram_eig[0] == 0]
                for s in self._parts]

    def _checked(self, workload: Workload) -> Workload:
        """The workload's Kronecker form, refused on another domain; a strategy that answers with its
        measurements (B = I) supports exactly the workload it measures."""
        w = kron_form(workload)
        self._check_domain(w)
        if self.direct and not (isinstance(w, Kron) and all(
                f.shape == M.shape and abs(sp.csr_matrix(f.sparse()) - sp.csr_matrix(M)).sum() == 0
                for f, M in zip(w.factors, self.factors, strict=True))):
            raise StrategyError(f"a strategy that answers its own measurements (B = I) answers only the Kronecker "
                                f"product it measures; workload {w.name} is not it")
        return w

    # -- error -----------------------------------------------------------------------------------
    def unit_error(self, workload: Workload) -> float:
        """seed 004 Prop. 3.3 through the factors: ||W A^+||_F^2 = sum_k a_k prod_i trace(G_ki X_i^+) (per unit noise
        variance and sensitivity)."""
        w = self._checked(workload)
        if self.direct:
            return float(w.m)  # B = I: ||B||_F^2 = m
        Xp = self.factor_pinvs
        return float(
            sum(
                a * math.prod(float(np.einsum("ij,ij->", G, P)) for G, P in zip(Gs, Xp, strict=True))
                for a, Gs in w.kron_terms()
            )
        )

    def unsupported_fraction(self, workload: Workload) -> float:
        """||W (I - A^+ A)||_F / ||W||_F through the factors, without cancellation.

        For a term (x)_i G_i: ||W P||_F^2 = prod_i (t_i - e_i) with t_i = trace(G_i), e_i = trace(G_i (I - P_i))
        computed on the null-space basis of A_i, so the residual is prod t_i * (1 - prod (1 - e_i / t_i)).
        """
        w = self._checked(workload)
        if self.direct:
            return 0.0
        res = total = 0.0
        for a, Gs in w.kron_terms():
            t = np.array([float(np.trace(G)) for G in Gs])
            e = np.array(
                [float(np.einsum("ij,ij->", N, G @ N)) if N.shape[1] else 0.0
                 for G, N in zip(Gs, self.factor_null_bases, strict=True)]
            )
            tt = a * float(np.prod(t))
            total += tt
            if tt > 0:
                f = np.clip(e / np.where(t > 0, t, 1.0), 0.0, 1.0)
                res += tt * float(-np.expm1(np.sum(np.log1p(-f))) if np.all(f < 1) else 1.0)
        if total == 0.0:
            raise StrategyError(f"workload {w.name} is all zeros")
        return float(math.sqrt(max(res / total, 0.0)))

    # -- answering -------------------------------------------------------------------------------
    def measured(self, data: np.ndarray | Records) -> np.ndarray:
        """Exact measurements A x (r,) by Kronecker matvecs; from Records, only the attributes whose factor
        is not a constant row c 1^T are counted (a marginal table), the others contribute the factor c."""
        if not isinstance(data, Records) or tuple(data.domain.shape) != self.domain_sizes:
            # a vector, or records whose attributes are not this strategy's factors (one factor over all cells)
            return super().measured(data)
        consts = [_constant_row(M) for M in self.factors]
        keep = [i for i, c in enumerate(consts) if c is None]
        scale = math.prod(c for c in consts if c is not None)
        if not keep:
            return np.array([scale * float(data.table(()))])
        t = data.table(keep).ravel()
        return scale * kron_matvec([self.factors[i] for i in keep], t)

    @cached_property
    def _pinv_factors(self) -> list[np.ndarray]:
        """A_i^+ = X_i^+ A_i^T = (A_i X_i^+)^T (n_i x r_i), since X_i^+ is symmetric."""
        return [np.asarray(M @ P).T for P, M in zip(self.factor_pinvs, self.factors, strict=True)]

    def estimate(self, y: np.ndarray) -> np.ndarray:
        """Least-squares data estimate x_hat = A^+ y = ((x)_i A_i^+) y (n,)."""
        if self.direct:
            raise StrategyError("a strategy that answers its measurements directly estimates no data vector")
        return kron_matvec(self._pinv_factors, y)

    def answers(self, y: np.ndarray, workload: Workload | None) -> np.ndarray:
        """W A^+ y for the workload's Kronecker terms, ((x)_i W_ki A_i^+) y each, never forming x_hat over the
        domain (x_hat itself when no workload is given)."""
        if workload is None:
            return self.estimate(y)
        w = self._checked(workload)
        if self.direct:
            return y
        return np.concatenate([
            wt * kron_matvec([np.asarray(f.sparse() @ P) for f, P in zip(part.factors, self._pinv_factors,
                                                                                strict=True)], y)
            for wt, part in _terms(w)
        ])

    def query_unit_variances(self, workload: Workload) -> np.ndarray:
        """Variance of each query's least-squares answer per unit noise variance: w_i^T X^+ w_i (m,).

        For a Kronecker row w = (x)_k w_k and X^+ = (x)_k X_k^+ it is prod_k w_k^T X_k^+ w_k, so the
        vector is the Kronecker product of the factors' diag(W_k X_k^+ W_k^T); a union stacks its parts'.
        """
        w = self._checked(workload)
        if self.direct:
            return np.ones(int(w.m))
        out = []
        for wt, part in _terms(w):
            v = np.ones(1)
            for f, P in zip(part.factors, self.factor_pinvs, strict=True):  # type: ignore[attr-defined]
                v = np.kron(v, f.row_quadratic_forms(P))
            out.append(wt**2 * v)
        return np.concatenate(out)

    def max_query_unit_variance(self, workload: Workload) -> float:
        """The largest per-query variance per unit noise variance: each factor's variances are >= 0, so the largest
        entry of their Kronecker product is the product of the factors' largest (never listing the m queries)."""
        w = self._checked(workload)
        if self.direct:
            return 1.0
        best = 0.0
        for wt, part in _terms(w):
            v = float(wt) ** 2
            for f, P in zip(part.factors, self.factor_pinvs, strict=True):  # type: ignore[attr-defined]
                v *= float(np.max(f.row_quadratic_forms(P)))
            best = max(best, v)
        return best
