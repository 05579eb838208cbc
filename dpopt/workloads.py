"""Workloads: batches of linear counting queries W (m x n) over a data vector of n cells.

A workload always knows its shape, its name and its Gram matrix W^T W. Where the rows are too many to
list (AllPredicate has 2^n rows, AllRange(4096) has 8.4 million), the Gram matrix is given in closed form
and `matrix()` refuses with a clear error instead of exhausting memory. Everything the matrix mechanism
needs (error, SVD bound, the convex optimum) depends on W only through W^T W.

Scale: AllPredicate(1024)'s Gram entries are about 2^1022, so a workload may carry `gram_log_scale`
(natural log of a positive factor c with W^T W = c * gram()). Scale-free quantities (error ratios, optimal
strategies) use `gram()` directly; absolute numbers are multiplied by c at the end.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from functools import cached_property
from itertools import combinations
from typing import ClassVar

import numpy as np
import scipy.sparse as sp

from dpopt.linalg import (
    column_norm_powers,
    down_closure,
    eigen_weights,
    kron_column_norms,
    kron_matvec,
    mask_of,
    operand,
    residual_rank,
)
from dpopt.validation import (
    as_generator,
    check_finite_matrix,
    check_gram,
    check_positive_int,
    count_text,
)

# Dense matrices larger than this many entries are refused (8 bytes each: 2 GB).
MAX_DENSE_ENTRIES = 250_000_000
#: Entries of one block of rows times M in `Workload.row_quadratic_forms` (32 MB of float64).
QUADRATIC_FORM_BLOCK = 4_000_000
#: Largest domain on which a stack's column norms are scanned exactly (`Stack.max_column_norm`).
EXACT_SENS_CELLS = 50_000_000

#: One term a (G_1, ..., G_d) of a Gram in Kronecker form W^T W = sum_k a_k (G_k1 (x) ... (x) G_kd).
KronTerm = tuple[float, list[np.ndarray]]


class WorkloadTooLargeError(ValueError):
    """Raised when a workload's rows cannot be materialised within the memory limit."""


class Workload(ABC):
    """A batch of m linear queries over n cells; subclasses give rows and/or a closed-form Gram."""

    name: str = "workload"
    gram_log_scale: float = 0.0
    #: True when `gram_matvec` goes through the rows' structure, O((m + n) k) for k vectors, never forming W^T W.
    structured_gram: ClassVar[bool] = False
    # Set by `bind`: the Domain the cells are over (dpopt.data.Domain) and one label per query.
    domain: object | None = None
    _labels: list[str] | None = None

    def bind(self, domain: object, labels: Sequence[str]) -> Workload:
        """Bind the workload to the Domain its cells are over and label its rows; returns self."""
        labels = [str(s) for s in labels]
        if len(labels) != self.m:
            raise ValueError(f"{len(labels)} labels for workload {self.name} with {self.m} queries")
        self.domain, self._labels = domain, labels
        return self

    @property
    @abstractmethod
    def shape(self) -> tuple[int, int]:
        """(m, n): number of queries and number of cells (m may exceed any machine integer)."""

    @property
    def n(self) -> int:
        """Number of cells of the data vector."""
        return self.shape[1]

    @property
    def m(self) -> int:
        """Number of queries."""
        return self.shape[0]

    @property
    def has_rows(self) -> bool:
        """True when the rows can be materialised (dense or sparse) within MAX_DENSE_ENTRIES."""
        m, n = self.shape
        return m * n <= MAX_DENSE_ENTRIES and self.gram_log_scale == 0.0

    @property
    def queries_known(self) -> bool:
        """True when m is the number of queries (a workload known only through W^T W may not say how many)."""
        return True

    def sparse(self) -> sp.csr_matrix:
        """W as a scipy CSR matrix (m x n)."""
        return sp.csr_matrix(self.matrix())

    def matrix(self) -> np.ndarray:
        """W as a dense float array (m x n); raises WorkloadTooLargeError when that is infeasible."""
        self._check_materialisable()
        return np.asarray(self.sparse().todense(), dtype=float)

    def gram(self) -> np.ndarray:
        """W^T W / exp(gram_log_scale) as a dense symmetric array (n x n); a 1-D range family by `range_gram`."""
        bounds = self.range_bounds()
        if bounds is not None and self.gram_log_scale == 0.0:
            return range_gram(self.n, *bounds)
        S = self.sparse()
        return np.asarray((S.T @ S).todense(), dtype=float)

    def row_labels(self) -> list[str]:
        """Human-readable label of every query (default q0, q1, ...)."""
        self._check_materialisable()
        return [f"q{i}" for i in range(self.m)]

    def frobenius_sq(self) -> float:
        """||W||_F^2 = trace(W^T W) (inf if it overflows float64)."""
        return _scaled(float(np.trace(self.gram())), self.gram_log_scale)

    # -- the Kronecker-term form every structured computation works with ---------------------------
    @property
    def domain_sizes(self) -> tuple[int, ...]:
        """(n_1, ..., n_d): the factor sizes of the product domain; a plain workload is one factor (n,)."""
        return (int(self.n),)

    @property
    def n_factors(self) -> int:
        """d, the number of attributes (Kronecker factors)."""
        return len(self.domain_sizes)

    def kron_terms(self) -> list[KronTerm]:
        """W^T W = sum_k a_k (x)_i G_ki as [(a_k, [G_k1, ..., G_kd])]; a plain workload is one term [(1, [W^T W])]."""
        self._check_unscaled()
        return [(1.0, [np.asarray(self.gram(), dtype=float)])]

    def stored(self) -> np.ndarray | sp.spmatrix:
        """W as held for products: the given matrix (dense or sparse) of an explicit workload, else the sparse rows."""
        return self.sparse()

    def matvec(self, x: np.ndarray) -> np.ndarray:
        """W x for x of shape (n,) or (n, k), by the stored rows (the structured forms go through their factors)."""
        return np.asarray(self.stored() @ operand(x, self.n))

    def rmatvec(self, y: np.ndarray) -> np.ndarray:
        """W^T y for y of shape (m,) or (m, k), by the stored rows (the structured forms go through their factors)."""
        return np.asarray(self.stored().T @ operand(y, self.m))

    def max_column_norm(self, norm: int) -> float:
        """The largest column L1 (norm 1) or L2 (norm 2) norm of W: the sensitivity of W as measured queries."""
        if norm not in (1, 2):
            raise ValueError(f"norm must be 1 or 2, got {norm}")
        top = float(column_norm_powers(self.stored(), norm).max())
        return top if norm == 1 else math.sqrt(top)

    def range_bounds(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(starts, ends) when query q sums the cells starts[q]..ends[q] (a 1-D range family), else None."""
        return None

    def row_quadratic_forms(self, M: np.ndarray) -> np.ndarray:
        """w_i^T M w_i for every query (m,), M symmetric n x n: with M = (A^T A)^+ each query's variance per unit
        noise (seed 004 Prop. 3.3 per query). A range family sums M over each query's square block from 2-D
        prefix sums (O(n^2 + m)); other workloads go through their rows in blocks (about nnz(W) n operations)."""
        M = np.asarray(M, dtype=float)
        bounds = self.range_bounds()
        if bounds is not None:
            S = np.zeros((self.n + 1, self.n + 1))
            S[1:, 1:] = M.cumsum(axis=0).cumsum(axis=1)
            lo, hi = bounds[0], bounds[1] + 1
            return S[hi, hi] - S[lo, hi] - S[hi, lo] + S[lo, lo]
        W = self.stored()
        step = max(1, QUADRATIC_FORM_BLOCK // self.n)
        out = np.empty(self.m)
        for i in range(0, self.m, step):
            R = W[i : i + step]
            P = np.asarray(R @ M)
            out[i : i + step] = np.asarray(R.multiply(P).sum(axis=1)).ravel() if sp.issparse(R) else np.einsum(
                "ij,ij->i", R, P)
        return out

    def gram_matvec(self, v: np.ndarray) -> np.ndarray:
        """W^T W v through the Kronecker terms; v has shape (n,) or (n, k)."""
        out = None
        for a, Gs in self.kron_terms():
            term = a * kron_matvec(Gs, v)
            out = term if out is None else out + term
        assert out is not None
        return out

    def svd_bound(self) -> float:
        """SVDB(W) (seed 004 Def. 4.1) from the rows or the Gram (`dpopt.bounds.dense_svd_bound`), kept once
        computed (a workload is not changed after it is made; every mechanism fitted on it reads the same bound);
        the structured workloads compute it through their factors or spectrum."""
        from dpopt.bounds import dense_svd_bound

        memo = self.__dict__.get("_svd_bound_memo")
        if memo is None:
            memo = self.__dict__["_svd_bound_memo"] = dense_svd_bound(self)
        return memo

    def toeplitz_column(self) -> np.ndarray | None:
        """First column a of W when W is square lower-triangular Toeplitz (W_tj = a_(t-j)), else None."""
        return None

    def error_lower_bound(self) -> tuple[float, str]:
        """A certified lower bound on trace(W^T W X^+) * max diag(X) over all strategies, and what it is."""
        return self.svd_bound(), "svd bound"

    def _check_unscaled(self) -> None:
        if self.gram_log_scale != 0.0:
            raise ValueError(f"workload {self.name} has a scaled Gram (gram_log_scale != 0); it has no Kronecker "
                             "factor form here")

    def _check_materialisable(self) -> None:
        m, n = self.shape
        if not self.has_rows:
            raise WorkloadTooLargeError(
                f"workload {self.name} has {count_text(m)} x {count_text(n)} entries; its rows cannot be materialised "
                f"(limit {MAX_DENSE_ENTRIES} entries); use its Gram matrix instead"
            )

    def __repr__(self) -> str:
        m, n = self.shape
        return f"<{type(self).__name__} {self.name}: {m} queries x {n} cells>"


def _scaled(value: float, log_scale: float) -> float:
    """value * exp(log_scale), returning inf instead of raising on overflow."""
    if log_scale == 0.0:
        return value
    if value == 0.0:
        return 0.0
    log_v = math.log(abs(value)) + log_scale
    return math.copysign(math.exp(log_v) if log_v < 709.0 else math.inf, value)


class ExplicitWorkload(Workload):
    """A workload given by its matrix (dense ndarray or scipy sparse), with optional row labels."""

    def __init__(
        self,
        W: np.ndarray | sp.spmatrix,
        name: str = "explicit",
        row_labels: Sequence[str] | None = None,
        domain: object | None = None,
    ) -> None:
        self._W: np.ndarray | sp.csr_matrix = check_finite_matrix(W, "workload", keep_sparse=True)
        if row_labels is not None and len(row_labels) != self._W.shape[0]:
            raise ValueError(
                f"row_labels has {len(row_labels)} entries but the workload has {self._W.shape[0]} rows"
            )
        self._labels = list(row_labels) if row_labels is not None else None
        self.name = name
        self.domain = domain

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self._W.shape[0]), int(self._W.shape[1]))

    def sparse(self) -> sp.csr_matrix:
        return sp.csr_matrix(self._W)

    def stored(self) -> np.ndarray | sp.csr_matrix:
        return self._W

    def matrix(self) -> np.ndarray:
        if sp.issparse(self._W):
            self._check_materialisable()
            return np.asarray(self._W.todense(), dtype=float)
        return self._W

    def gram(self) -> np.ndarray:
        if sp.issparse(self._W):
            return np.asarray((self._W.T @ self._W).todense(), dtype=float)
        return self._W.T @ self._W

    def row_labels(self) -> list[str]:
        return self._labels if self._labels is not None else super().row_labels()
    def toeplitz_column(self) -> np.ndarray | None:
        """First column of a dense square lower-triangular Toeplitz W (checked entry by entry), else None."""
        W = self._W
        if sp.issparse(W) or W.shape[0] != W.shape[1]:
            return None
        a = W[:, 0].copy()
        n = W.shape[0]
        t, j = np.tril_indices(n)
        if np.any(np.triu(W, 1) != 0) or not np.array_equal(W[t, j], a[t - j]):
            return None
        return a


def as_workload(W: Workload | np.ndarray | sp.spmatrix, name: str = "explicit") -> Workload:
    """Return W unchanged if it is a Workload, else wrap a matrix as an ExplicitWorkload."""
    if isinstance(W, Workload):
        return W
    return ExplicitWorkload(W, name=name)


class GramWorkload(Workload):
    """A workload known only through its Gram matrix W^T W (n x n, symmetric PSD); rows unavailable.

    m, the number of queries, is not in W^T W: give it, or `queries_known` is False and the rank of G stands
    in for the shape (any V with V^T V = G serves the strategy algebra), never for a per-query average.
    """

    def __init__(self, gram: np.ndarray, name: str = "gram", m: int | None = None) -> None:
        self._G = check_gram(gram, name="Gram matrix", allow_zero=True, psd_rtol=1e-9)
        self._m = None if m is None else check_positive_int(m, "m (the number of queries)")
        self.name = name

    @property
    def shape(self) -> tuple[int, int]:
        m = self._m if self._m is not None else int(np.linalg.matrix_rank(self._G))
        return (m, self._G.shape[0])

    @property
    def has_rows(self) -> bool:
        return False

    @property
    def queries_known(self) -> bool:
        return self._m is not None

    def _check_materialisable(self) -> None:
        raise WorkloadTooLargeError(
            f"workload {self.name} is known only through its Gram matrix W^T W: it has no rows to list, so what "
            "needs the queries themselves (noise on each query, per-query variances) cannot run on it"
        )

    def gram(self) -> np.ndarray:
        return self._G


class _Family(Workload):
    """A 1-D family on n cells, named `family(n)`, with `_m()` queries (n unless the family says otherwise)."""

    family: ClassVar[str] = ""

    def __init__(self, n: int) -> None:
        self._n = check_positive_int(n, "n")
        self.name = f"{self.family}({self._n})"

    def _m(self) -> int:
        return self._n

    @property
    def shape(self) -> tuple[int, int]:
        return (self._m(), self._n)


class Identity(_Family):
    """Identity(n): every cell count (the histogram); Li and Miklau (seed 004) and seed 003."""

    family = "identity"

    def sparse(self) -> sp.csr_matrix:
        return sp.identity(self._n, format="csr", dtype=float)

    def gram(self) -> np.ndarray:
        return np.eye(self._n)

    def range_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        i = np.arange(self._n)
        return i, i

    structured_gram = True

    def gram_matvec(self, v: np.ndarray) -> np.ndarray:
        """W^T W v = v."""
        return operand(v, self._n).copy()


class Total(_Family):
    """Total(n): the single query summing all cells (seed 003)."""

    family = "total"

    def _m(self) -> int:
        return 1

    def sparse(self) -> sp.csr_matrix:
        return sp.csr_matrix(np.ones((1, self._n)))

    def gram(self) -> np.ndarray:
        return np.ones((self._n, self._n))

    def range_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros(1, dtype=int), np.full(1, self._n - 1)

    structured_gram = True

    def gram_matvec(self, v: np.ndarray) -> np.ndarray:
        """W^T W v = 1 (1^T v)."""
        v = operand(v, self._n)
        return np.broadcast_to(v.sum(axis=0), v.shape).copy()


class Prefix(_Family):
    """Prefix(n): the n prefix sums x_0 + ... + x_i (lower-triangular ones; HDMM's 1-D table)."""

    family = "prefix"

    def sparse(self) -> sp.csr_matrix:
        return sp.csr_matrix(np.tril(np.ones((self._n, self._n))))

    def gram(self) -> np.ndarray:
        """Closed form: (W^T W)[i, j] = n - max(i, j) (0-indexed)."""
        i = np.arange(self._n)
        return (self._n - np.maximum.outer(i, i)).astype(float)

    structured_gram = True

    def gram_matvec(self, v: np.ndarray) -> np.ndarray:
        """(W^T W v)_i = (n - i) sum_{j <= i} v_j + sum_{j > i} (n - j) v_j, by two cumulative sums (O(n k))."""
        v = operand(v, self._n)
        tail = (self._n - np.arange(self._n, dtype=float)).reshape((-1,) + (1,) * (v.ndim - 1))
        return tail * np.cumsum(v, axis=0) + _strict_tail_sums(tail * v)

    def row_labels(self) -> list[str]:
        return [f"[0,{i}]" for i in range(self._n)]

    def range_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros(self._n, dtype=int), np.arange(self._n)

    def toeplitz_column(self) -> np.ndarray:
        """Prefix sums are lower-triangular Toeplitz with every coefficient 1."""
        return np.ones(self._n)

    def singular_values(self) -> np.ndarray:
        """Closed form: sigma_j = 1 / (2 sin((2j - 1) pi / (4n + 2))), j = 1..n (W^-1 is the first-difference
        matrix, whose W^-T W^-1 = 2 - 2 cos((2j - 1) pi / (2n + 1)) spectrum is the tridiagonal one with a 1 in
        its corner); each within 4 units of round-off of the exact value (the angle, sin, the division)."""
        j = np.arange(1, self._n + 1, dtype=float)
        return 1.0 / (2.0 * np.sin((2.0 * j - 1.0) * np.pi / (4.0 * self._n + 2.0)))

    def svd_bound(self) -> float:
        """SVDB(W) (seed 004 Def. 4.1) from the closed-form singular values, rounding only lowering it."""
        from dpopt.bounds import EPS, svdb_from_singular_value_bounds

        return svdb_from_singular_value_bounds(self.singular_values(), self._n, term_rel_err=8.0 * EPS)


def cooldown_schedule(n: int, fraction: float = 0.25, target: float = 0.05) -> np.ndarray:
    """Learning-rate cooldown of Choquette-Choo et al. 2023 (multi-epoch DP-MF, the momentum_with_cooldown workload):
    eta_t = 1, then the last floor(fraction n) steps fall linearly from 1 to `target` (both ends included)."""
    n = check_positive_int(n, "n")
    if not 0.0 <= fraction <= 1.0 or not 0.0 < target <= 1.0:
        raise ValueError(f"cooldown needs fraction in [0, 1] and target in (0, 1], got {fraction}, {target}")
    eta = np.ones(n)
    m = int(math.floor(fraction * n))
    if m > 0:
        eta[n - m:] = np.linspace(1.0, target, num=m)
    return eta


class MomentumPrefix(Workload):
    """MomentumPrefix(n, beta, eta): SGD with heavy-ball momentum beta and learning rates eta as a workload
    (Denisov et al. 2022; Choquette-Choo et al. 2023): A_tj = sum_{s=j..t} eta_s beta^(s-j), lower triangular.

    beta = 0 and eta = 1 is Prefix(n). With a constant eta the matrix is Toeplitz, a_l = eta (1 - beta^(l+1)) /
    (1 - beta), and every streaming family works through that column at any n; a schedule makes it dense.
    """

    def __init__(self, n: int, momentum: float = 0.0, learning_rates: Sequence[float] | np.ndarray | None = None,
                 name: str | None = None) -> None:
        self._n = check_positive_int(n, "n")
        beta = float(momentum)
        if not math.isfinite(beta) or not 0.0 <= beta < 1.0:
            raise ValueError(f"momentum must lie in [0, 1), got {momentum}")
        self.momentum = beta
        if learning_rates is None:
            eta = np.ones(self._n)
        else:
            eta = np.asarray(learning_rates, dtype=float).reshape(-1)
            if eta.shape != (self._n,):
                raise ValueError(f"learning_rates has {eta.size} entries; expected one per step ({self._n})")
            if not np.all(np.isfinite(eta)) or np.any(eta <= 0):
                raise ValueError("learning_rates must be finite and > 0 (a zero rate makes A singular)")
        self.learning_rates = eta
        default = f"momentum-prefix({self._n}, beta={beta:g}" + ("" if learning_rates is None else ", schedule") + ")"
        self.name = name or default

    @property
    def shape(self) -> tuple[int, int]:
        return (self._n, self._n)

    def toeplitz_column(self) -> np.ndarray | None:
        """a_l = eta (1 - beta^(l+1)) / (1 - beta) when every learning rate is the same eta, else None."""
        eta = self.learning_rates
        if not np.all(eta == eta[0]):
            return None
        beta, l = self.momentum, np.arange(self._n)
        if beta == 0.0:
            return np.full(self._n, eta[0])
        return eta[0] * -np.expm1((l + 1) * math.log(beta)) / (1.0 - beta)

    def matrix(self) -> np.ndarray:
        """A (n x n): row t is the cumulative sum over s <= t of eta_s times the momentum row beta^(s-j)."""
        self._check_materialisable()
        n, beta = self._n, self.momentum
        lag = np.subtract.outer(np.arange(n), np.arange(n))
        M = np.where(lag >= 0, beta ** np.maximum(lag, 0), 0.0)  # momentum buffer: M_sj = beta^(s-j)
        return np.cumsum(self.learning_rates[:, None] * M, axis=0)

    def sparse(self) -> sp.csr_matrix:
        return sp.csr_matrix(self.matrix())

    def gram(self) -> np.ndarray:
        A = self.matrix()
        return A.T @ A

    def row_labels(self) -> list[str]:
        return [f"step {t}" for t in range(self._n)]


def range_rows(n: int, starts: np.ndarray, ends: np.ndarray) -> sp.csr_matrix:
    """Sparse 0/1 matrix whose row q covers cells starts[q]..ends[q] inclusive."""
    lengths = ends - starts + 1
    rows = np.repeat(np.arange(len(starts)), lengths)
    offsets = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    cols = np.repeat(starts, lengths) + offsets
    data = np.ones(len(rows))
    return sp.csr_matrix((data, (rows, cols)), shape=(len(starts), n))


def range_gram(n: int, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """W^T W of the 0/1 rows covering cells starts[q]..ends[q]: entry (i, j), i <= j, counts the ranges with
    start <= i and end >= j, a 2-D cumulative sum of the (start, end) counts (O(m + n^2), no sparse product)."""
    counts = np.zeros((n, n))
    np.add.at(counts, (np.asarray(starts), np.asarray(ends)), 1.0)
    G = np.triu(np.cumsum(counts, axis=0)[:, ::-1].cumsum(axis=1)[:, ::-1])  # G[i, j] = #{start <= i, end >= j}
    return G + np.triu(G, 1).T


def _strict_tail_sums(v: np.ndarray) -> np.ndarray:
    """sum_{j > i} v_j for every i (along axis 0)."""
    out = np.zeros_like(v)
    out[:-1] = np.cumsum(v[:0:-1], axis=0)[::-1]
    return out


def range_gram_matvec(n: int, starts: np.ndarray, ends: np.ndarray, v: np.ndarray) -> np.ndarray:
    """W^T W v for the 0/1 rows covering cells starts[q]..ends[q] (inclusive), O((m + n) k) for v (n,) or (n, k).

    W v from the prefix sums S of v (row q answers S[ends + 1] - S[starts]); W^T y spreads each answer over its
    range by a difference array and one more cumulative sum.
    """
    v = operand(v, n)
    S = np.concatenate([np.zeros((1,) + v.shape[1:]), np.cumsum(v, axis=0)])
    y = S[ends + 1] - S[starts]
    D = np.zeros((n + 1,) + v.shape[1:])
    np.add.at(D, starts, y)
    np.add.at(D, ends + 1, -y)
    return np.cumsum(D[:n], axis=0)


class AllRange(_Family):
    """AllRange(n): all n(n+1)/2 range queries [i, j], i <= j, ordered by (i, j) (seed 004, Table 2)."""

    family = "allrange"

    def _m(self) -> int:
        return self._n * (self._n + 1) // 2

    @property
    def has_rows(self) -> bool:
        # Count non-zeros, not entries: the sparse matrix holds n(n+1)(n+2)/6 ones.
        n = self._n
        return n * (n + 1) * (n + 2) // 6 <= MAX_DENSE_ENTRIES // 4

    def _bounds(self) -> tuple[np.ndarray, np.ndarray]:
        i, j = np.triu_indices(self._n)
        return i, j

    def range_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        return self._bounds()

    def sparse(self) -> sp.csr_matrix:
        self._check_materialisable()
        i, j = self._bounds()
        return range_rows(self._n, i, j)

    def matrix(self) -> np.ndarray:
        m, n = self.shape
        if m * n > MAX_DENSE_ENTRIES:
            raise WorkloadTooLargeError(f"{self.name} has {m} x {n} entries; use sparse() or gram()")
        return np.asarray(self.sparse().todense(), dtype=float)

    def gram(self) -> np.ndarray:
        """Closed form: ranges containing both i <= j number (i + 1)(n - j) (0-indexed)."""
        i = np.arange(self._n)
        lo = np.minimum.outer(i, i)
        hi = np.maximum.outer(i, i)
        return ((lo + 1) * (self._n - hi)).astype(float)

    structured_gram = True

    def gram_matvec(self, v: np.ndarray) -> np.ndarray:
        """(W^T W v)_i = (n - i) sum_{j <= i} (j + 1) v_j + (i + 1) sum_{j > i} (n - j) v_j, by cumulative sums
        (O(n k); the m = n(n + 1)/2 rows are never listed)."""
        v = operand(v, self._n)
        shape = (-1,) + (1,) * (v.ndim - 1)
        head = np.arange(1, self._n + 1, dtype=float).reshape(shape)
        tail = (self._n - np.arange(self._n, dtype=float)).reshape(shape)
        return tail * np.cumsum(head * v, axis=0) + head * _strict_tail_sums(tail * v)

    def row_labels(self) -> list[str]:
        i, j = self._bounds()
        return [f"[{a},{b}]" for a, b in zip(i, j, strict=True)]

    def max_column_norm(self, norm: int) -> float:
        """Cell j lies in (j + 1)(n - j) ranges, so the largest column norm is max_j (j + 1)(n - j) (L1) or its
        square root (L2), at every size (the rows are never listed)."""
        if norm not in (1, 2):
            raise ValueError(f"norm must be 1 or 2, got {norm}")
        j = (self._n - 1) // 2
        top = float((j + 1) * (self._n - j))
        return top if norm == 1 else math.sqrt(top)


class WidthK(Workload):
    """WidthK(n, k): all n - k + 1 ranges of width exactly k (HDMM's width32 workload)."""

    def __init__(self, n: int, k: int) -> None:
        self._n = check_positive_int(n, "n")
        self._k = check_positive_int(k, "k")
        if self._k > self._n:
            raise ValueError(f"width k must be at most the domain size n = {self._n}, got k = {self._k}")
        self.name = f"width{self._k}({self._n})"

    @property
    def shape(self) -> tuple[int, int]:
        return (self._n - self._k + 1, self._n)

    def sparse(self) -> sp.csr_matrix:
        return range_rows(self._n, *self.range_bounds())

    def range_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        starts = np.arange(self._n - self._k + 1)
        return starts, starts + self._k - 1

    structured_gram = True

    def gram_matvec(self, v: np.ndarray) -> np.ndarray:
        """W^T W v through the ranges' prefix sums (`range_gram_matvec`)."""
        return range_gram_matvec(self._n, *self.range_bounds(), v)

    def row_labels(self) -> list[str]:
        return [f"[{s},{s + self._k - 1}]" for s in range(self._n - self._k + 1)]


class WRange(Workload):
    """WRange(m, n): m random ranges, endpoints uniform on the domain (seed 000, Section 6)."""

    def __init__(self, m: int, n: int, seed: int | np.random.Generator | None = 0) -> None:
        self._m = check_positive_int(m, "m")
        self._n = check_positive_int(n, "n")
        rng = as_generator(seed)
        a = rng.integers(0, self._n, size=self._m)
        b = rng.integers(0, self._n, size=self._m)
        self._starts, self._ends = np.minimum(a, b), np.maximum(a, b)
        self.name = f"wrange({self._m}x{self._n})"

    @property
    def shape(self) -> tuple[int, int]:
        return (self._m, self._n)

    def sparse(self) -> sp.csr_matrix:
        return range_rows(self._n, self._starts, self._ends)

    def range_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        return self._starts, self._ends

    structured_gram = True

    def gram_matvec(self, v: np.ndarray) -> np.ndarray:
        """W^T W v through the ranges' prefix sums (`range_gram_matvec`)."""
        return range_gram_matvec(self._n, *self.range_bounds(), v)

    def row_labels(self) -> list[str]:
        return [f"[{a},{b}]" for a, b in zip(self._starts, self._ends, strict=True)]


class WDiscrete(ExplicitWorkload):
    """WDiscrete(m, n): W_ij = 1 with probability p = 0.02, else off_value (seed 000, Section 6).

    The paper's text sets the non-selected entries to -1 (`off_value=-1`, the default, as printed); the
    0/1 variant (`off_value=0`) is the reading in which each query counts a sparse random subset.
    """

    def __init__(
        self,
        m: int,
        n: int,
        seed: int | np.random.Generator | None = 0,
        off_value: float = -1.0,
        p: float = 0.02,
    ) -> None:
        m, n = check_positive_int(m, "m"), check_positive_int(n, "n")
        if off_value not in (-1, 0):
            raise ValueError(f"off_value must be -1 (the paper's text) or 0 (0/1 variant), got {off_value}")
        if not 0.0 < p < 1.0:
            raise ValueError(f"p must lie in (0, 1), got {p}")
        on = as_generator(seed).random((m, n)) < p
        super().__init__(np.where(on, 1.0, float(off_value)), f"wdiscrete({m}x{n}{'' if off_value == -1 else ',0/1'})")
        self.off_value = float(off_value)


class WRelated(ExplicitWorkload):
    """WRelated(m, n, s) = C A with standard normal C (m x s) and A (s x n): rank s (seed 000, Section 6)."""

    def __init__(self, m: int, n: int, s: int, seed: int | np.random.Generator | None = 0) -> None:
        m, n = check_positive_int(m, "m"), check_positive_int(n, "n")
        self.s = check_positive_int(s, "s")
        rng = as_generator(seed)
        A = rng.standard_normal((self.s, n))
        C = rng.standard_normal((m, self.s))
        super().__init__(C @ A, f"wrelated({m}x{n},s={self.s})")


class WTau(ExplicitWorkload):
    """W_tau(m, n, tau): the Orthogonal Mechanism paper's tau-sparse random workload (seed 001, Section 5)."""

    def __init__(self, m: int, n: int, tau: float, seed: int | np.random.Generator | None = 0) -> None:
        from dpopt.solvers.orthogonal import w_tau_matrix

        m, n = check_positive_int(m, "m"), check_positive_int(n, "n")
        self.tau = float(tau)
        super().__init__(np.asarray(w_tau_matrix(m, n, self.tau, as_generator(seed)), dtype=float),
                         f"wtau({m}x{n},tau={self.tau:g})")


class AllPredicate(_Family):
    """AllPredicate(n): all 2^n subset-count queries; Gram 2^(n-2) (I + 1 1^T) (seed 004, Cor. 5.4).

    Only the Gram matrix exists: gram() returns I + 1 1^T and gram_log_scale = (n - 2) ln 2.
    """

    family = "allpredicate"

    def __init__(self, n: int) -> None:
        super().__init__(n)
        if self._n < 2:
            raise ValueError(f"AllPredicate needs n >= 2 cells, got {self._n}")
        self.gram_log_scale = (self._n - 2) * math.log(2.0)

    def _m(self) -> int:
        return 2**self._n

    @property
    def has_rows(self) -> bool:
        return False

    def gram(self) -> np.ndarray:
        return np.eye(self._n) + np.ones((self._n, self._n))


class Kron(Workload):
    """Kronecker product W_1 (x) ... (x) W_d: multi-dimensional products of 1-D workloads (seed 004).

    Never formed: its Gram is the product of the factors' Grams, its singular values the products of
    theirs, and W x is one tensor contraction per factor, so every cost scales with the factor sizes.
    """

    def __init__(self, factors: Sequence[Workload], name: str | None = None) -> None:
        if len(factors) == 0:
            raise ValueError("Kron needs at least one factor workload")
        self.factors = [as_workload(f) for f in factors]
        self.gram_log_scale = float(sum(f.gram_log_scale for f in self.factors))
        self.name = name or "kron(" + ",".join(f.name for f in self.factors) + ")"

    @property
    def shape(self) -> tuple[int, int]:
        m = math.prod(f.shape[0] for f in self.factors)
        n = math.prod(f.shape[1] for f in self.factors)
        return (m, n)

    @property
    def domain_sizes(self) -> tuple[int, ...]:
        return tuple(int(f.n) for f in self.factors)

    @property
    def has_rows(self) -> bool:
        return super().has_rows and all(f.has_rows for f in self.factors)

    def sparse(self) -> sp.csr_matrix:
        self._check_materialisable()
        out = self.factors[0].sparse()
        for f in self.factors[1:]:
            out = sp.kron(out, f.sparse(), format="csr")
        return out

    @cached_property
    def factor_grams(self) -> list[np.ndarray]:
        """[W_i^T W_i] (each n_i x n_i)."""
        self._check_unscaled()
        return [np.asarray(f.gram(), dtype=float) for f in self.factors]

    def kron_terms(self) -> list[KronTerm]:
        return [(1.0, self.factor_grams)]

    def gram(self) -> np.ndarray:
        """(W_1 (x) W_2)^T (W_1 (x) W_2) = W_1^T W_1 (x) W_2^T W_2."""
        n = self.shape[1]
        if n * n > MAX_DENSE_ENTRIES:
            raise WorkloadTooLargeError(f"Gram of {self.name} is {n} x {n}; use the factors' Grams")
        out = self.factors[0].gram()
        for f in self.factors[1:]:
            out = np.kron(out, f.gram())
        return out

    def frobenius_sq(self) -> float:
        """||W||_F^2 = prod_i ||W_i||_F^2."""
        return _scaled(math.prod(float(np.trace(G)) for G in self.factor_grams), 0.0)

    def svd_bound(self) -> float:
        """prod_i SVDB(W_i) (seed 004 Def. 4.1; singular values of a Kronecker product are the factors' products), never above it.

        Each factor's bound is a lower bound; the d - 1 products add at most (d - 1) eps/2 relative, so the
        product is shrunk by 1 - d eps.
        """
        from dpopt.bounds import EPS

        if len(self.factors) == 1:
            return self.factors[0].svd_bound()
        bounds = [f.svd_bound() for f in self.factors]
        return math.prod(bounds) * max(0.0, 1.0 - len(bounds) * EPS)

    def max_column_norm(self, norm: int) -> float:
        """prod_i max column norm of W_i: exact, as the columns' entries are the products |a_ij| |b_kl|."""
        return math.prod(f.max_column_norm(norm) for f in self.factors)

    def matvec(self, x: np.ndarray) -> np.ndarray:
        """W x = ((x)_i W_i) x through the factors."""
        return kron_matvec([f.stored() for f in self.factors], x)

    def rmatvec(self, y: np.ndarray) -> np.ndarray:
        """W^T y = ((x)_i W_i^T) y through the factors."""
        return kron_matvec([f.stored().T for f in self.factors], y)

    def row_labels(self) -> list[str]:
        if self._labels is not None:
            return list(self._labels)
        labels = self.factors[0].row_labels()
        for f in self.factors[1:]:
            labels = [f"{a} x {b}" for a in labels for b in f.row_labels()]
        return labels


class Stack(Workload):
    """Union of workloads over the same cells, row blocks scaled by optional weights: [w_1 W_1; ...].

    A stack of Kronecker products over one product domain (HDMM's union workloads) keeps that form:
    its Gram is sum_k w_k^2 (x)_i G_ki, so traces and matvecs go through the factors.
    """

    def __init__(
        self,
        workloads: Sequence[Workload],
        weights: Sequence[float] | None = None,
        name: str | None = None,
    ) -> None:
        if len(workloads) == 0:
            raise ValueError("Stack needs at least one workload")
        self.parts = [as_workload(w) for w in workloads]
        ns = {p.n for p in self.parts}
        if len(ns) != 1:
            raise ValueError(f"stacked workloads must have the same number of cells, got {sorted(ns)}")
        if any(p.gram_log_scale != 0.0 for p in self.parts):
            raise ValueError("Stack does not support scaled Gram workloads such as AllPredicate")
        w = np.ones(len(self.parts)) if weights is None else np.asarray(weights, dtype=float)
        if w.shape != (len(self.parts),) or not np.all(np.isfinite(w)) or np.any(w <= 0):
            raise ValueError(f"weights must be {len(self.parts)} positive finite numbers, got {weights}")
        self.weights = w
        self.name = name or "stack(" + ",".join(p.name for p in self.parts) + ")"

    @property
    def shape(self) -> tuple[int, int]:
        return (sum(p.shape[0] for p in self.parts), self.parts[0].n)

    @property
    def kron_parts(self) -> bool:
        """True when every part is a Kronecker product over the same factor sizes (a union of Kronecker products)."""
        return all(isinstance(p, Kron) for p in self.parts) and len({p.domain_sizes for p in self.parts}) == 1

    @property
    def domain_sizes(self) -> tuple[int, ...]:
        return self.parts[0].domain_sizes if self.kron_parts else (int(self.n),)

    @property
    def has_rows(self) -> bool:
        return super().has_rows and all(p.has_rows for p in self.parts)

    def sparse(self) -> sp.csr_matrix:
        self._check_materialisable()
        return sp.vstack([wt * p.sparse() for wt, p in zip(self.weights, self.parts, strict=True)]).tocsr()

    def gram(self) -> np.ndarray:
        """sum_k w_k^2 W_k^T W_k."""
        return sum(wt**2 * p.gram() for wt, p in zip(self.weights, self.parts, strict=True))

    def kron_terms(self) -> list[KronTerm]:
        if not self.kron_parts:
            return super().kron_terms()
        return [(float(w) ** 2, p.factor_grams) for w, p in zip(self.weights, self.parts, strict=True)]  # type: ignore[attr-defined]

    def frobenius_sq(self) -> float:
        """sum_k w_k^2 ||W_k||_F^2."""
        return float(sum(w**2 * p.frobenius_sq() for w, p in zip(self.weights, self.parts, strict=True)))

    def error_lower_bound(self) -> tuple[float, str]:
        """max(SVDB(W) if the Gram fits, sum_k w_k^2 SVDB(W_k)).

        The second is valid because min_X sum_k f_k(X) >= sum_k min_X f_k(X): every part is answered by the
        same strategy, and each part's error is at least its own optimum, hence at least its SVD bound.
        """
        from dpopt.bounds import rounding_shrink

        parts = float(sum(w**2 * p.svd_bound() for w, p in zip(self.weights, self.parts, strict=True)))
        parts *= rounding_shrink(len(self.parts))  # the sum and w^2 round; keep it below the exact sum
        if self.n * self.n <= MAX_DENSE_ENTRIES // 16:
            full = self.svd_bound()
            if full >= parts:
                return full, "svd bound"
        return parts, "sum of part svd bounds"

    @property
    def column_norm_exact(self) -> bool:
        """True when `max_column_norm` scans every cell (n <= EXACT_SENS_CELLS)."""
        return self.n <= EXACT_SENS_CELLS

    def max_column_norm(self, norm: int) -> float:
        """max_j (sum_k w_k^p c_kj)^(1/p), c_k the p-th powers of part k's column norms (p = norm), scanned exactly up to
        EXACT_SENS_CELLS cells; beyond, the triangle-inequality bound (sum_k w_k^p max_j c_kj)^(1/p), exact when every
        part has constant column norms.

        A union of Kronecker products is scanned by blocks of the first factor (never n numbers per part): the
        column norms of a Kronecker product are the Kronecker product of its factors' (|a_ij b_kl| = |a_ij| |b_kl|).
        """
        if norm not in (1, 2):
            raise ValueError(f"norm must be 1 or 2, got {norm}")
        scale = self.weights**norm
        if not self.column_norm_exact:
            best = float(np.dot(scale, [p.max_column_norm(norm) ** norm for p in self.parts]))
        elif self.kron_parts:
            norms = [[column_norm_powers(f.stored(), norm) for f in p.factors] for p in self.parts]  # type: ignore[attr-defined]
            tails = [kron_column_norms(cs[1:]) for cs in norms]  # the same for every block: formed once per part
            best = max(float(np.max(sum(s * cs[0][lo] * tail for s, cs, tail in zip(scale, norms, tails, strict=True))))
                       for lo in range(self.domain_sizes[0]))
        else:
            best = float(np.max(sum(s * column_norm_powers(p.stored(), norm)
                                    for s, p in zip(scale, self.parts, strict=True))))
        return best if norm == 1 else math.sqrt(best)

    def matvec(self, x: np.ndarray) -> np.ndarray:
        """W x = [w_k W_k x]_k, each part through its own form."""
        return np.concatenate([w * p.matvec(x) for w, p in zip(self.weights, self.parts, strict=True)])

    def rmatvec(self, y: np.ndarray) -> np.ndarray:
        """W^T y = sum_k w_k W_k^T y_k over the parts' row blocks y_k."""
        cuts = np.cumsum([p.m for p in self.parts])[:-1]
        blocks = np.split(operand(y, self.m), cuts)
        return sum(w * p.rmatvec(b) for w, p, b in zip(self.weights, self.parts, blocks, strict=True))

    def row_labels(self) -> list[str]:
        if self._labels is not None:
            return list(self._labels)
        return [f"{p.name}:{lab}" for p in self.parts for lab in p.row_labels()]


def flat_stack(workloads: Sequence[Workload], name: str | None = None) -> Stack:
    """The workloads' rows one after another as one Stack, stacked parts flattened (weights kept), so that a union
    of unions of Kronecker products is again one."""
    blocks: list[Workload] = []
    weights: list[float] = []
    for w in workloads:
        if isinstance(w, Stack):
            blocks.extend(w.parts)
            weights.extend(float(v) for v in w.weights)
        else:
            blocks.append(w)
            weights.append(1.0)
    return Stack(blocks, weights, name=name)


class _Ones(Total):
    """The 1 x n all-ones query used to sum out an attribute inside a marginal."""

    family = "sum"

    def row_labels(self) -> list[str]:
        return ["*"]


def marginal(domain_sizes: Sequence[int], attrs: Sequence[int]) -> Kron:
    """The marginal (cuboid) over attribute indices `attrs`: Kronecker of Identity (kept) and 1^T (summed)."""
    sizes = [check_positive_int(s, "domain size") for s in domain_sizes]
    keep = set(attrs)
    if not keep <= set(range(len(sizes))):
        raise ValueError(f"marginal attributes {sorted(keep)} outside 0..{len(sizes) - 1}")
    factors: list[Workload] = [Identity(s) if i in keep else _Ones(s) for i, s in enumerate(sizes)]
    return Kron(factors, name="marginal(" + ",".join(str(a) for a in sorted(keep)) + ")")


class Marginals(Stack):
    """Weighted marginals (cuboids) of a multi-attribute domain: all k-way ones or given attribute subsets (a data cube,
    seed 004 Thm. 5.5).

    Exact spectral form (see `dpopt.linalg`'s marginal algebra): W^T W = sum_A c_A Q_A, so the SVD bound, the
    Frobenius norm and every trace the error needs are sums over the down-closure of the subsets (c_A kept
    divided by N); nothing scales with the number of cells.
    """

    def __init__(
        self,
        domain_sizes: Sequence[int],
        k: int | None = None,
        subsets: Sequence[Sequence[int]] | None = None,
        weights: Sequence[float] | None = None,
        attribute_names: Sequence[str] | None = None,
        name: str | None = None,
    ) -> None:
        sizes = tuple(check_positive_int(s, "domain size") for s in domain_sizes)
        d = len(sizes)
        if d == 0:
            raise ValueError("Marginals needs at least one attribute")
        if (k is None) == (subsets is None):
            raise ValueError("give exactly one of k (all k-way marginals) or subsets")
        if k is not None:
            if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= d:
                raise ValueError(f"k must be an integer in 0..{d}, got {k!r}")
            subsets = list(combinations(range(d), k))
        assert subsets is not None
        if len(subsets) == 0:
            raise ValueError("Marginals needs at least one attribute subset")
        subs = [tuple(sorted({int(a) for a in s})) for s in subsets]
        for s in subs:
            if any(a < 0 or a >= d for a in s):
                raise ValueError(f"marginal {s} names attributes outside 0..{d - 1}")
        masks = [mask_of(s) for s in subs]
        if len(set(masks)) != len(masks):
            raise ValueError("marginal subsets must be distinct")
        if attribute_names is not None and len(attribute_names) != d:
            raise ValueError(f"attribute_names has {len(attribute_names)} entries, expected {d}")
        self._sizes = sizes
        self.subsets = subs
        self.masks = masks
        self.attribute_names = list(attribute_names) if attribute_names is not None else None
        label = f"{k}-way" if k is not None else f"{len(subs)} cuboids"
        super().__init__([marginal(sizes, s) for s in subs], weights,
                         name=name or f"marginals({label} over {'x'.join(map(str, sizes))})")

    @property
    def domain_sizes(self) -> tuple[int, ...]:
        return self._sizes

    @property
    def shape(self) -> tuple[int, int]:
        m = sum(math.prod(self._sizes[i] for i in s) for s in self.subsets)
        return (m, math.prod(self._sizes))

    # -- spectral form ---------------------------------------------------------------------------
    @cached_property
    def closure(self) -> list[int]:
        """Every subset A of some workload marginal (bitmasks): the only Q_A with c_A > 0."""
        return down_closure(self.masks)

    @cached_property
    def scaled_eigenvalues(self) -> np.ndarray:
        """c_A / N for A in `closure`: the eigenvalue of W^T W on Q_A over the number of cells N (seed 004 Thm. 5.5)."""
        return eigen_weights(self._sizes, self.masks, self.weights, self.closure)

    @cached_property
    def multiplicities(self) -> np.ndarray:
        """r_A = prod_{i in A} (n_i - 1) for A in `closure` (float; may exceed int64)."""
        return np.array([float(residual_rank(self._sizes, A)) for A in self.closure])

    def kron_terms(self) -> list[KronTerm]:
        out = []
        for s, w in zip(self.masks, self.weights, strict=True):
            Gs = [np.eye(n) if s >> i & 1 else np.ones((n, n)) for i, n in enumerate(self._sizes)]
            out.append((float(w) ** 2, Gs))
        return out

    def frobenius_sq(self) -> float:
        """sum_S w_S^2 N: each marginal counts every cell exactly once (inf beyond float64)."""
        log_v = math.log(float(np.sum(self.weights**2))) + sum(math.log(n) for n in self._sizes)
        return math.exp(log_v) if log_v < 709.0 else math.inf

    def svd_bound(self) -> float:
        """(sum_A r_A sqrt(c_A))^2 / N = (sum_A r_A sqrt(c_A / N))^2 (seed 004 Def. 4.1, exact spectrum), never above it.

        c_A / N sums at most |S| terms w_S^2 / N_S (each two roundings), so it carries at most (|S| + 1) eps/2
        relative error; its square root and r_A (rounded to float) add eps; `rounding_shrink` covers the rest.
        """
        from dpopt.bounds import EPS, svdb_from_singular_value_bounds

        term_err = (len(self.masks) + 4) * EPS
        return svdb_from_singular_value_bounds(
            np.sqrt(self.scaled_eigenvalues), 1.0, counts=self.multiplicities, term_rel_err=term_err
        )

    def error_lower_bound(self) -> tuple[float, str]:
        return self.svd_bound(), "svd bound (tight for marginals)"


#: The 1-D factor families `kron_marginals` puts on the attributes of each subset.
MARGINAL_FACTORS = {"prefix": Prefix, "range": AllRange}


def kron_marginals(domain_sizes: Sequence[int], orders: Sequence[int], factor: str,
                   attribute_names: Sequence[str] | None = None) -> Stack:
    """Every K-way subset S (K in `orders`) of the attributes as the Kronecker product of a Prefix or AllRange
    factor on S and the total elsewhere, stacked: a union of Kronecker products (the prefix and range
    marginals of QuerySmasher and ResidualPlanner+)."""
    if factor not in MARGINAL_FACTORS:
        raise ValueError(f"factor must be one of {', '.join(MARGINAL_FACTORS)}, got {factor!r}")
    sizes = [check_positive_int(s, "domain size") for s in domain_sizes]
    d = len(sizes)
    ks = [int(k) for k in orders]
    if not ks or len(set(ks)) != len(ks) or any(not 1 <= k <= d for k in ks):
        raise ValueError(f"orders must be distinct integers in 1..{d}, got {list(orders)}")
    names = list(attribute_names) if attribute_names is not None else [str(i) for i in range(d)]
    make = MARGINAL_FACTORS[factor]
    parts = [Kron([make(n) if i in S else _Ones(n) for i, n in enumerate(sizes)],
                  name=f"{factor}(" + ",".join(names[i] for i in S) + ")")
             for k in sorted(ks) for S in combinations(range(d), k)]
    label = ",".join(str(k) for k in sorted(ks))
    return Stack(parts, name=f"marginals({label}-way {factor} over {'x'.join(map(str, sizes))})")


def all_range_nd(sizes: Sequence[int]) -> Kron:
    """ALLRANGE(n_1, ..., n_d): all multi-dimensional range queries, the Kronecker product of AllRange (seed 004)."""
    return Kron([AllRange(s) for s in sizes], name="allrange(" + ",".join(str(s) for s in sizes) + ")")


def boxes(sizes: Sequence[int], lows: Sequence[np.ndarray], highs: Sequence[np.ndarray],
          name: str | None = None) -> Stack:
    """Box (orthogonal range) queries over the product domain n_1 x ... x n_d: query q sums the cells whose
    attribute j lies in lows[j][q]..highs[j][q] inclusive (DPBench's rectangles for d = 2), held as the union of
    the one-row Kronecker products (x)_j range_j(q), so a Kronecker strategy's errors and answers go through its
    factors (cells in row-major order, as `Kron`)."""
    sizes = [check_positive_int(s, "domain size") for s in sizes]
    if len(lows) != len(sizes) or len(highs) != len(sizes):
        raise ValueError(f"lows and highs must give one array per attribute ({len(sizes)}), got {len(lows)} and "
                         f"{len(highs)}")
    lo = [np.asarray(a) for a in lows]
    hi = [np.asarray(b) for b in highs]
    m = {a.shape for a in lo + hi}
    if len(m) != 1 or len(next(iter(m))) != 1 or next(iter(m))[0] == 0:
        raise ValueError(f"lows and highs must be 1-D arrays of one common positive length, got shapes {sorted(m)}")
    for j, (n, a, b) in enumerate(zip(sizes, lo, hi, strict=True)):
        if not (np.issubdtype(a.dtype, np.integer) and np.issubdtype(b.dtype, np.integer)):
            raise ValueError(f"attribute {j}: box ends must be integers, got {a.dtype} and {b.dtype}")
        if np.any(a < 0) or np.any(b >= n) or np.any(a > b):
            raise ValueError(f"attribute {j}: every box needs 0 <= low <= high < {n}")
    rows = [range_rows(n, a, b) for n, a, b in zip(sizes, lo, hi, strict=True)]
    parts = [Kron([ExplicitWorkload(R[q], name=f"range {lo[j][q]}..{hi[j][q]}") for j, R in enumerate(rows)])
             for q in range(len(lo[0]))]
    return Stack(parts, name=name or f"{len(parts)} boxes over {'x'.join(map(str, sizes))}")


def kron_form(workload: Workload | np.ndarray) -> Workload:
    """The workload in a Kronecker-term form with factors: itself when it is a Kronecker product, a union of
    them or marginals; any other workload as a one-factor Kronecker product."""
    w = as_workload(workload)
    if isinstance(w, Kron) or (isinstance(w, Stack) and w.kron_parts):
        return w
    w._check_unscaled()
    return Kron([w], name=w.name)
