"""Strategy: measured queries A (r x n) and reconstruction B (m x r), W = B A (seed 003; seed 004 Prop. 3.1).

Two kinds:
- matrix-mechanism strategies hold only A; the reconstruction is least squares, B = W A^+, and every
  quantity the error needs depends on W only through W^T W;
- factorisation strategies (LRM, OM) also hold B, and W = B A holds exactly or within gamma (relaxed LRM).

A is a dense or sparse matrix, or a `StructuredMatrix` held through its factors and never formed: a Kronecker
product (`dpopt.kron_strategy.KronMatrix`), a weighted stack of them (`dpopt.union_strategy.UnionKronMatrix`)
or a marginal-algebra strategy (`dpopt.marginal_strategy.MarginalMatrix`). The one Strategy class computes
everything through A's form.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp

from dpopt.data import Records, data_vector
from dpopt.linalg import column_norm_powers, row_sq_norms
from dpopt.privacy import Perturb, Privacy, research_perturb
from dpopt.validation import check_finite_matrix
from dpopt.workloads import MAX_DENSE_ENTRIES, Workload, as_workload

if TYPE_CHECKING:
    from dpopt.error import ErrorReport

# Relative tolerance below which an eigenvalue of A^T A counts as zero (rank decisions).
RANK_RTOL = 1e-10


class StrategyError(ValueError):
    """A strategy cannot answer a workload (it does not support it, or shapes disagree)."""


class StructuredMatrix(ABC):
    """A strategy matrix A (r x n) held through its structure, never formed. A itself is `operator`, a matrix of
    the one structured algebra the workloads are written in (`Kron`, `Stack`), which gives its shape, A x and
    A^T y; what a Strategy needs beyond that is computed through the factors: sensitivity, rank, the
    least-squares error trace(W^T W X^+) and per-query variances on a workload, the support residual and the
    least-squares answers."""

    #: The factor (attribute) sizes of the product domain A acts on.
    domain_sizes: tuple[int, ...]
    #: True when the answers are the measurements themselves (B = I, noise on queries).
    direct: bool = False

    @property
    @abstractmethod
    def operator(self) -> Workload:
        """A as a Kronecker product or a weighted stack of them (`dpopt.workloads`), never formed."""

    @property
    def shape(self) -> tuple[int, int]:
        """(r, n): measured rows and cells."""
        return self.operator.shape

    @property
    @abstractmethod
    def rank(self) -> int:
        """rank(A), or an upper bound where the form says so."""

    def sensitivity(self, norm: int) -> float:
        """The largest column L1 (norm 1) or L2 (norm 2) norm of A, through the operator's factors."""
        return self.operator.max_column_norm(norm)

    @abstractmethod
    def unit_error(self, workload: Workload) -> float:
        """||W A^+||_F^2 = trace(W^T W X^+): the error per unit noise variance and sensitivity."""

    @abstractmethod
    def unsupported_fraction(self, workload: Workload) -> float:
        """||W (I - A^+ A)||_F / ||W||_F."""

    @abstractmethod
    def query_unit_variances(self, workload: Workload) -> np.ndarray:
        """w_i^T X^+ w_i for every query (m,)."""

    def max_query_unit_variance(self, workload: Workload) -> float:
        """The largest of `query_unit_variances` (the factored forms compute it without listing every query)."""
        return float(np.max(self.query_unit_variances(workload)))

    def measured(self, data: np.ndarray | Records) -> np.ndarray:
        """The exact measurements A x (r,) through the factors."""
        return self.operator.matvec(data_vector(data, self.shape[1]))

    @abstractmethod
    def answers(self, y: np.ndarray, workload: Workload | None) -> np.ndarray:
        """The least-squares answers W A^+ y (m,), or the data estimate A^+ y where the form has one."""

    def to_matrix(self) -> sp.csr_matrix:
        """A formed (small domains only), for cross-checks."""
        return self.operator.sparse()

    def _check_domain(self, workload: Workload, form: type[Workload] = Workload) -> None:
        """Refuses a workload that is not a `form` or lies on another product domain than A's."""
        if not isinstance(workload, form):
            raise StrategyError(f"a {type(self).__name__} strategy answers a {form.__name__}, "
                                f"got {type(workload).__name__}")
        if workload.domain_sizes != self.domain_sizes:
            raise StrategyError(f"the strategy has factor sizes {self.domain_sizes} but workload {workload.name} "
                                f"has {workload.domain_sizes}; expected the same product domain")


class Strategy:
    """Measured queries A (r x n) and optionally a reconstruction B (m x r): the one strategy type.

    A is dense, sparse or a `StructuredMatrix` (then B is least squares through A's factors, or the
    measurements themselves for a direct Kronecker product, and `factored` is True). Every quantity the
    error, the support check and the answers need is computed through A's form; asking a structured A for a
    dense one (Gram, pseudo-inverse, reconstruction matrix) raises StrategyError (`to_dense` gives it on small
    domains).
    """

    #: (workload, B): the reconstruction of the last workload answered, kept for repeated answers.
    _kept: tuple[Workload | None, np.ndarray | sp.spmatrix | None] = (None, None)

    def __init__(
        self,
        A: np.ndarray | sp.spmatrix | StructuredMatrix,
        B: np.ndarray | sp.spmatrix | None = None,
        name: str = "strategy",
        gamma: float = 0.0,
    ) -> None:
        if isinstance(A, StructuredMatrix):
            if B is not None or gamma != 0.0:
                raise ValueError("a structured A answers by least squares through its factors; give no B or gamma")
            self.A: np.ndarray | sp.csr_matrix | StructuredMatrix = A
            self.B: np.ndarray | sp.csr_matrix | None = None
            self.name, self.gamma = name, 0.0
            return
        self.A = check_finite_matrix(A, "strategy A", keep_sparse=True)
        if B is not None:
            B = check_finite_matrix(B, "reconstruction B", keep_sparse=True)
            if B.shape[1] != self.A.shape[0]:
                raise ValueError(
                    f"reconstruction B has {B.shape[1]} columns but A has {self.A.shape[0]} rows; "
                    "expected B (m x r) with A (r x n)"
                )
        if gamma < 0 or not np.isfinite(gamma):
            raise ValueError(f"gamma must be a finite non-negative number, got {gamma}")
        self.B = B
        self.name = name
        self.gamma = float(gamma)
        if column_norm_powers(self.A, 2).max() == 0.0:
            raise ValueError("strategy A is all zeros; it measures nothing")

    # -- shape and sensitivity -------------------------------------------------------------------
    @property
    def factored(self) -> bool:
        """True when A is a StructuredMatrix, computed through its factors and never formed."""
        return isinstance(self.A, StructuredMatrix)

    @property
    def shape(self) -> tuple[int, int]:
        """(r, n): number of measured queries and number of cells."""
        return (int(self.A.shape[0]), int(self.A.shape[1]))

    @cached_property
    def sens1(self) -> float:
        """L1 sensitivity: the largest column L1 norm of A (eps-DP, Laplace noise)."""
        if isinstance(self.A, StructuredMatrix):
            return self.A.sensitivity(1)
        return float(column_norm_powers(self.A, 1).max())

    @cached_property
    def sens2(self) -> float:
        """L2 sensitivity: the largest column L2 norm of A ((eps, delta)-DP, Gaussian noise)."""
        if isinstance(self.A, StructuredMatrix):
            return self.A.sensitivity(2)
        return float(np.sqrt(column_norm_powers(self.A, 2).max()))

    def sensitivity(self, norm: int) -> float:
        """sens1 for norm=1, sens2 for norm=2."""
        if norm == 1:
            return self.sens1
        if norm == 2:
            return self.sens2
        raise ValueError(f"norm must be 1 or 2, got {norm}")

    def matrix(self) -> np.ndarray | sp.csr_matrix:
        """A as a dense or sparse matrix; refused for a structured A, which is never formed."""
        if isinstance(self.A, StructuredMatrix):
            r, n = self.shape
            raise StrategyError(f"strategy {self.name} ({r} x {n}) is held through its factors; its dense A is "
                                "not formed")
        return self.A

    @cached_property
    def gram(self) -> np.ndarray:
        """X = A^T A (n x n, dense)."""
        A = self.matrix()
        if sp.issparse(A):
            return np.asarray((A.T @ A).todense(), dtype=float)
        return A.T @ A

    @cached_property
    def _gram_eig(self) -> tuple[np.ndarray, np.ndarray]:
        """Eigenvalues (clipped at their rank cut to 0) and eigenvectors of X = A^T A."""
        lam, V = np.linalg.eigh(self.gram)
        cut = RANK_RTOL * max(float(lam.max()), np.finfo(float).tiny)
        lam = np.where(lam > cut, lam, 0.0)
        return lam, V

    @cached_property
    def _cholesky(self) -> np.ndarray | None:
        """Lower Cholesky factor of X = A^T A when A has full column rank (well conditioned), else None."""
        try:
            L = sla.cholesky(self.gram, lower=True)
        except sla.LinAlgError:
            return None
        d = np.diag(L)
        if d.min() <= 0 or (d.min() / d.max()) ** 2 <= 1e3 * RANK_RTOL:
            return None
        return L

    @property
    def full_column_rank(self) -> bool:
        """True when A has full column rank n (then every workload on the n cells is supported)."""
        return self._cholesky is not None

    @property
    def rank(self) -> int:
        """Rank of A."""
        if isinstance(self.A, StructuredMatrix):
            return self.A.rank
        if self.full_column_rank:
            return self.shape[1]
        return int(np.count_nonzero(self._gram_eig[0]))

    # -- construction ----------------------------------------------------------------------------
    @classmethod
    def from_gram(cls, X: np.ndarray, name: str = "strategy") -> Strategy:
        """A with A^T A = X: upper Cholesky factor, or the PSD square root if X is singular."""
        X = check_finite_matrix(X, "strategy Gram X")
        if X.shape[0] != X.shape[1]:
            raise ValueError(f"strategy Gram X must be square, got shape {X.shape}")
        X = (X + X.T) / 2
        try:
            A = sla.cholesky(X, lower=False)
        except sla.LinAlgError:
            lam, V = np.linalg.eigh(X)
            if lam.min() < -1e-8 * max(1.0, lam.max()):
                raise ValueError(
                    f"strategy Gram X must be positive semidefinite; smallest eigenvalue {lam.min():.3g}"
                ) from None
            keep = lam > RANK_RTOL * lam.max()
            A = np.sqrt(lam[keep])[:, None] * V[:, keep].T
        return cls(A, name=name)

    # -- relation to a workload ------------------------------------------------------------------
    def _check_cells(self, workload: Workload) -> None:
        if workload.n != self.shape[1]:
            raise StrategyError(
                f"strategy {self.name} covers {self.shape[1]} cells but workload {workload.name} has "
                f"{workload.n}; expected the same domain"
            )

    def pinv(self) -> np.ndarray:
        """A^+ (n x r) through the eigendecomposition of A^T A: A^+ = X^+ A^T."""
        Xp = self.gram_pinv()
        return np.asarray(self.matrix() @ Xp).T  # (A X^+)^T = X^+ A^T since X^+ is symmetric

    def gram_pinv(self) -> np.ndarray:
        """X^+ = (A^T A)^+ (n x n, read-only, computed once); a Cholesky inverse when A has full column rank."""
        return self._gram_pinv

    @cached_property
    def _gram_pinv(self) -> np.ndarray:
        """`gram_pinv`'s value."""
        if self._cholesky is not None:  # LAPACK potri: 2n^3/3 flops against 2n^3 for n solves with the factor
            low, info = sla.lapack.dpotri(self._cholesky, lower=1)
            if info != 0:
                raise StrategyError(f"the Cholesky factor of {self.name}'s Gram is singular (LAPACK potri info {info})")
            # low: X^{-1}'s lower triangle over the factor's zero upper one (scipy's clean factor), mirrored
            out = low + low.T
            out[np.diag_indices_from(out)] = np.diag(low)
        else:
            lam, V = self._gram_eig
            inv = np.divide(1.0, lam, out=np.zeros_like(lam), where=lam > 0)
            out = (V * inv) @ V.T
        out.flags.writeable = False
        return out

    def reconstruct(self, workload: Workload | np.ndarray) -> np.ndarray | sp.csr_matrix:
        """The reconstruction matrix: the given B, or the least-squares B = W A^+ (m x r)."""
        workload = as_workload(workload)
        self._check_cells(workload)
        if self.B is not None:
            if self.B.shape[0] != workload.m:
                raise StrategyError(
                    f"reconstruction B has {self.B.shape[0]} rows but workload {workload.name} has "
                    f"{workload.m} queries"
                )
            return self.B
        W = workload.matrix()
        return W @ self.pinv()

    def unsupported_fraction(self, workload: Workload | np.ndarray) -> float:
        """Relative residual ||W - B A||_F / ||W||_F (least-squares B via W^T W when B is not given)."""
        workload = as_workload(workload)
        if isinstance(self.A, StructuredMatrix):
            return self.A.unsupported_fraction(workload)
        self._check_cells(workload)
        if self.B is not None and self.B.shape[0] != workload.m:
            raise StrategyError(
                f"reconstruction B of {self.name} answers {self.B.shape[0]} queries but workload "
                f"{workload.name} has {workload.m}; a factorisation strategy answers only its own workload"
            )
        G = workload.gram()
        trG = float(np.trace(G))
        if trG == 0.0:
            raise StrategyError(f"workload {workload.name} is all zeros")
        if self.B is None and self.full_column_rank:
            res2 = 0.0
        elif self.B is None:
            lam, V = self._gram_eig
            Vn = V[:, lam == 0]
            # ||W (I - P)||_F^2 = trace(Vn^T G Vn), Vn spanning the null space of A (no cancellation).
            res2 = float(np.einsum("ij,ij->", Vn, G @ Vn)) if Vn.shape[1] else 0.0
        else:
            R = workload.sparse() - sp.csr_matrix(self.B) @ sp.csr_matrix(self.A)
            res2 = float(R.multiply(R).sum())
        return float(np.sqrt(max(res2, 0.0) / trG))

    def residual(self, workload: Workload | np.ndarray) -> float:
        """||W - B A||_F in absolute terms."""
        workload = as_workload(workload)
        return self.unsupported_fraction(workload) * float(np.sqrt(np.trace(workload.gram())))

    def supports(self, workload: Workload | np.ndarray, rtol: float = 1e-8) -> bool:
        """True when W A^+ A = W (or W = B A) within relative Frobenius tolerance rtol (or gamma)."""
        workload = as_workload(workload)
        if self.gamma > 0 and self.B is not None:
            return self.residual(workload) <= self.gamma * (1 + rtol)
        return self.unsupported_fraction(workload) <= rtol

    def check_supports(self, workload: Workload | np.ndarray, rtol: float = 1e-8) -> None:
        """Raise StrategyError unless the strategy supports the workload (see `supports`)."""
        workload = as_workload(workload)
        if not self.supports(workload, rtol):
            frac = self.unsupported_fraction(workload)
            limit = f"gamma = {self.gamma:g}" if self.gamma > 0 else f"relative tolerance {rtol:g}"
            raise StrategyError(
                f"strategy {self.name} does not support workload {workload.name}: relative residual "
                f"||W - B A||_F / ||W||_F = {frac:.3g} exceeds {limit}; some queries lie outside the "
                "row space of the strategy"
            )

    # -- error and answers (the structured forms compute these through their factors) ---------------
    def expected_error(self, workload: Workload | np.ndarray, privacy: Privacy, rtol: float = 1e-8) -> ErrorReport:
        """Exact expected total squared error on the workload (seed 004 Prop. 3.3; `dpopt.error.expected_error`)."""
        from dpopt.error import expected_error

        return expected_error(self, workload, privacy, rtol=rtol)

    def unit_error(self, workload: Workload | np.ndarray) -> float:
        """||B||_F^2, the error per unit noise variance and sensitivity (`dpopt.error.unit_error`, or through A's
        factors)."""
        from dpopt.error import unit_error

        if isinstance(self.A, StructuredMatrix):
            return self.A.unit_error(as_workload(workload))
        return unit_error(self, as_workload(workload))

    def query_unit_variances(self, workload: Workload | np.ndarray) -> np.ndarray:
        """Variance of each query's answer per unit noise variance (m,): the squared row norms of the given B,
        or w_i^T (A^T A)^+ w_i for every row w_i of W under least squares (seed 004 Prop. 3.3 per query)."""
        workload = as_workload(workload)
        if isinstance(self.A, StructuredMatrix):
            return self.A.query_unit_variances(workload)
        if self.B is not None:
            return row_sq_norms(self.reconstruct(workload))
        self._check_cells(workload)
        return workload.row_quadratic_forms(self.gram_pinv())

    def max_query_unit_variance(self, workload: Workload | np.ndarray) -> float:
        """max_i of `query_unit_variances`: the largest per-query variance per unit noise variance (seed 004 Prop. 3.3
        per query), through A's structure where it has one (a Kronecker product's is the product of its factors'
        largest), so that the m variances of a large structured workload are never listed."""
        workload = as_workload(workload)
        if isinstance(self.A, StructuredMatrix):
            return self.A.max_query_unit_variance(workload)
        return float(np.max(self.query_unit_variances(workload)))

    # -- measuring and answering -------------------------------------------------------------------
    def measured(self, data: np.ndarray | Records) -> np.ndarray:
        """The exact measurements A x (r,) of a data vector or of Records over the strategy's cells (a structured
        A counts only the marginal tables it needs from Records, never forming x)."""
        if isinstance(self.A, StructuredMatrix):
            return self.A.measured(data)
        return np.asarray(self.A @ data_vector(data, self.shape[1]), dtype=float).ravel()

    def measure(self, x: np.ndarray | Records, privacy: Privacy, rng: np.random.Generator | None = None, *,
                perturb: Perturb | None = None) -> np.ndarray:
        """Noisy measurements y = A x + z (r,); z from `perturb` (default: research noise from rng)."""
        if perturb is None:
            perturb = research_perturb(privacy, rng)  # type: ignore[arg-type]
        return perturb(self.measured(x), self.sensitivity(privacy.norm))

    def answer(
        self, x: np.ndarray | Records, privacy: Privacy, rng: np.random.Generator | None = None,
        workload: Workload | None = None, *, perturb: Perturb | None = None,
    ) -> np.ndarray:
        """`answers` of the noisy measurements y of `measure`."""
        return self.answers(self.measure(x, privacy, rng, perturb=perturb), workload)

    def answers(self, y: np.ndarray, workload: Workload | None = None) -> np.ndarray:
        """B y for measurements y (r,), or each row of a batch y (k, r): the workload's reconstruction B
        (`reconstruct`, kept for the last workload asked, or through A's factors), or the least-squares data
        estimate A^+ y when no workload is given."""
        y = np.asarray(y, dtype=float)
        if y.ndim not in (1, 2) or y.shape[-1] != self.shape[0]:
            raise StrategyError(f"measurements have shape {y.shape}; expected ({self.shape[0]},) or (k, "
                                f"{self.shape[0]}) for strategy {self.name}")
        if isinstance(self.A, StructuredMatrix):
            one = self.A.answers
            return one(y, workload) if y.ndim == 1 else np.stack([one(row, workload) for row in y])
        if workload is None:
            if self.B is not None:
                raise StrategyError(f"strategy {self.name} answers through its B; give the workload it answers")
            return np.asarray((self.gram_pinv() @ np.asarray(self.A.T @ y.T)).T)  # X^+ A^T y, never A^+ itself
        if self._kept[0] is not workload:
            self._kept = (workload, self.reconstruct(workload))
        return np.asarray((self._kept[1] @ y.T).T, dtype=float)

    def to_dense(self) -> Strategy:
        """The strategy with A formed as a sparse matrix (small domains only), for cross-checks; itself if dense."""
        if not isinstance(self.A, StructuredMatrix):
            return self
        r, n = self.shape
        if r * n > MAX_DENSE_ENTRIES:
            raise ValueError(f"{self.name} is {r} x {n}; too large to materialise")
        return Strategy(self.A.to_matrix(), B=sp.identity(r, format="csr") if self.A.direct else None, name=self.name)

    def __repr__(self) -> str:
        r, n = self.shape
        if isinstance(self.A, StructuredMatrix):
            return f"<Strategy {self.name} ({type(self.A).__name__}): {r} x {n}>"
        kind = "factorisation" if self.B is not None else "matrix"
        return f"<Strategy {self.name} ({kind}): {r} x {n}, sens1={self.sens1:.4g}, sens2={self.sens2:.4g}>"
