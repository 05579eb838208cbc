"""Implicit workloads over a product domain: Kronecker products, weighted unions of them, and marginals.

None of these ever forms W or W^T W over the full domain. Each exposes
- `shape` (m, n) and `domain_sizes` (n_1, ..., n_d), `n_factors` = d;
- `kron_terms()`: W^T W = sum_k a_k (G_k1 (x) ... (x) G_kd), the form every trace formula works with;
- `gram_matvec(v)`: W^T W v through the factors (v of n entries, or n x k);
- `frobenius_sq()` = trace(W^T W) and `svd_bound()` (seed 004 Def. 4.1) from the factors;
- `dense()`: the equivalent dense dpopt workload, for cross-checks on small domains.
Costs per operation scale with the factor sizes (and, for matvecs, linearly with n), never with n^2.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cached_property
from itertools import combinations

import numpy as np
import scipy.sparse as sp

from dpopt.implicit.kronecker import kron_matvec, svd_bound_factor
from dpopt.implicit.marginal_algebra import (
    attrs_of,
    down_closure,
    eigen_weights,
    mask_of,
    residual_rank,
)
from dpopt.validation import check_positive_int
from dpopt.workloads import (
    MAX_DENSE_ENTRIES,
    Identity,
    Kron,
    Marginals,
    Stack,
    Workload,
    WorkloadTooLargeError,
    _Ones,
    as_workload,
)

KronTerm = tuple[float, list[np.ndarray]]


class ImplicitWorkload(Workload):
    """Base of the implicit workloads: dense views exist only for small domains."""

    domain_sizes: tuple[int, ...]

    @property
    def n_factors(self) -> int:
        """d, the number of attributes (Kronecker factors)."""
        return len(self.domain_sizes)

    @property
    def has_rows(self) -> bool:
        m, n = self.shape
        return m * n <= MAX_DENSE_ENTRIES

    def kron_terms(self) -> list[KronTerm]:
        """W^T W as sum_k a_k (x)_i G_ki: a list of (a_k, [G_k1, ..., G_kd]) with G_ki dense n_i x n_i."""
        raise NotImplementedError

    def gram_matvec(self, v: np.ndarray) -> np.ndarray:
        """W^T W v through the factors; v has shape (n,) or (n, k)."""
        out = None
        for a, Gs in self.kron_terms():
            term = a * kron_matvec(Gs, v)
            out = term if out is None else out + term
        assert out is not None
        return out

    def frobenius_sq(self) -> float:
        """||W||_F^2 = trace(W^T W) = sum_k a_k prod_i trace(G_ki)."""
        return float(sum(a * math.prod(float(np.trace(G)) for G in Gs) for a, Gs in self.kron_terms()))

    def dense(self) -> Workload:
        """The same workload as a dense dpopt workload (small domains only)."""
        raise NotImplementedError

    def gram(self) -> np.ndarray:
        """W^T W as a dense n x n array; raises WorkloadTooLargeError beyond MAX_DENSE_ENTRIES."""
        n = self.n
        if n * n > MAX_DENSE_ENTRIES:
            raise WorkloadTooLargeError(
                f"Gram of {self.name} would be {n} x {n}; use gram_matvec or kron_terms instead"
            )
        out = np.zeros((n, n))
        for a, Gs in self.kron_terms():
            K = Gs[0]
            for G in Gs[1:]:
                K = np.kron(K, G)
            out += a * K
        return out

    def sparse(self) -> sp.csr_matrix:
        """W as a sparse matrix (small workloads only)."""
        self._check_materialisable()
        return self.dense().sparse()

    def row_labels(self) -> list[str]:
        self._check_materialisable()
        return self.dense().row_labels()

    def error_lower_bound(self) -> tuple[float, str]:
        """A certified lower bound on trace(W^T W X^+) * max diag(X) over all strategies, and what it is."""
        return self.svd_bound(), "svd bound"

    def svd_bound(self) -> float:
        """SVDB(W) = (1/n)(sum of singular values of W)^2 (seed 004 Def. 4.1)."""
        raise NotImplementedError


def _check_factor(w: Workload) -> Workload:
    w = as_workload(w)
    if w.gram_log_scale != 0.0:
        raise ValueError(f"factor {w.name} has a scaled Gram (gram_log_scale != 0); not supported as a factor")
    return w


class KronWorkload(ImplicitWorkload):
    """W = W_1 (x) ... (x) W_d for any 1-D dpopt workloads W_i (seed 004, multi-dimensional ranges)."""

    def __init__(self, factors: Sequence[Workload | np.ndarray], name: str | None = None) -> None:
        if len(factors) == 0:
            raise ValueError("KronWorkload needs at least one factor workload")
        self.factors = [_check_factor(f) for f in factors]
        self.domain_sizes = tuple(int(f.n) for f in self.factors)
        self.name = name or "kron(" + ",".join(f.name for f in self.factors) + ")"

    @property
    def shape(self) -> tuple[int, int]:
        return (math.prod(int(f.m) for f in self.factors), math.prod(self.domain_sizes))

    @cached_property
    def factor_grams(self) -> list[np.ndarray]:
        """[W_i^T W_i] (each n_i x n_i)."""
        return [np.asarray(f.gram(), dtype=float) for f in self.factors]

    def kron_terms(self) -> list[KronTerm]:
        return [(1.0, self.factor_grams)]

    def frobenius_sq(self) -> float:
        return math.prod(float(np.trace(G)) for G in self.factor_grams)

    def svd_bound(self) -> float:
        """prod_i SVDB(W_i) (singular values of a Kronecker product are the factors' products), never above it.

        Each factor's bound is a lower bound; the d - 1 products add at most (d - 1) eps/2 relative, so the
        product is shrunk by 1 - d eps.
        """
        from dpopt.bounds import EPS

        bounds = [svd_bound_factor(G) for G in self.factor_grams]
        return math.prod(bounds) * max(0.0, 1.0 - len(bounds) * EPS)

    def matvec(self, x: np.ndarray) -> np.ndarray:
        """W x through the factors (x of n entries); the result has m entries."""
        return kron_matvec([f.sparse() for f in self.factors], x)

    def dense(self) -> Workload:
        return Kron(self.factors, name=self.name)


class UnionWorkload(ImplicitWorkload):
    """Weighted stack [w_1 K_1; ...; w_k K_k] of Kronecker workloads over the same product domain."""

    def __init__(
        self,
        parts: Sequence[KronWorkload],
        weights: Sequence[float] | None = None,
        name: str | None = None,
    ) -> None:
        if len(parts) == 0:
            raise ValueError("UnionWorkload needs at least one Kronecker part")
        if not all(isinstance(p, KronWorkload) for p in parts):
            raise ValueError("UnionWorkload parts must be KronWorkload instances")
        sizes = {p.domain_sizes for p in parts}
        if len(sizes) != 1:
            raise ValueError(f"all parts must share the factor domain sizes, got {sorted(sizes)}")
        w = np.ones(len(parts)) if weights is None else np.asarray(weights, dtype=float)
        if w.shape != (len(parts),) or not np.all(np.isfinite(w)) or np.any(w <= 0):
            raise ValueError(f"weights must be {len(parts)} positive finite numbers, got {weights}")
        self.parts = list(parts)
        self.weights = w
        self.domain_sizes = self.parts[0].domain_sizes
        self.name = name or "union(" + ",".join(p.name for p in self.parts) + ")"

    @property
    def shape(self) -> tuple[int, int]:
        return (sum(p.shape[0] for p in self.parts), self.parts[0].shape[1])

    def kron_terms(self) -> list[KronTerm]:
        return [(float(w) ** 2, p.factor_grams) for w, p in zip(self.weights, self.parts, strict=True)]

    def svd_bound(self) -> float:
        """SVDB of the union from its dense Gram (no factorised form in general; small domains only)."""
        from dpopt.bounds import svd_bound_from_gram

        return svd_bound_from_gram(self.gram())

    def error_lower_bound(self) -> tuple[float, str]:
        """max(SVDB(W) if the Gram fits, sum_k w_k^2 SVDB(K_k)).

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

    def matvec(self, x: np.ndarray) -> np.ndarray:
        """W x (stacked part answers, each scaled by its weight)."""
        return np.concatenate([w * p.matvec(x) for w, p in zip(self.weights, self.parts, strict=True)])

    def dense(self) -> Workload:
        return Stack([p.dense() for p in self.parts], weights=self.weights, name=self.name)


class MarginalsWorkload(ImplicitWorkload):
    """Weighted marginals (cuboids) over a product domain: given attribute subsets, or all k-way ones.

    Exact spectral form (see `marginal_algebra`): W^T W = sum_A c_A Q_A, so the SVD bound, Frobenius norm
    and every trace the error needs are sums over the down-closure of the subsets (c_A kept divided by N).
    """

    def __init__(
        self,
        domain_sizes: Sequence[int],
        subsets: Sequence[Sequence[int]] | None = None,
        k: int | None = None,
        weights: Sequence[float] | None = None,
        attribute_names: Sequence[str] | None = None,
        name: str | None = None,
    ) -> None:
        sizes = tuple(check_positive_int(s, "domain size") for s in domain_sizes)
        d = len(sizes)
        if d == 0:
            raise ValueError("MarginalsWorkload needs at least one attribute")
        if (k is None) == (subsets is None):
            raise ValueError("give exactly one of k (all k-way marginals) or subsets")
        if k is not None:
            if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= d:
                raise ValueError(f"k must be an integer in 0..{d}, got {k!r}")
            subsets = list(combinations(range(d), k))
        assert subsets is not None
        if len(subsets) == 0:
            raise ValueError("MarginalsWorkload needs at least one attribute subset")
        subs = [tuple(sorted({int(a) for a in s})) for s in subsets]
        for s in subs:
            if any(a < 0 or a >= d for a in s):
                raise ValueError(f"marginal {s} names attributes outside 0..{d - 1}")
        masks = [mask_of(s) for s in subs]
        if len(set(masks)) != len(masks):
            raise ValueError("marginal subsets must be distinct")
        w = np.ones(len(subs)) if weights is None else np.asarray(weights, dtype=float)
        if w.shape != (len(subs),) or not np.all(np.isfinite(w)) or np.any(w <= 0):
            raise ValueError(f"weights must be {len(subs)} positive finite numbers, got {weights}")
        if attribute_names is not None and len(attribute_names) != d:
            raise ValueError(f"attribute_names has {len(attribute_names)} entries, expected {d}")
        self.domain_sizes = sizes
        self.subsets = subs
        self.masks = masks
        self.weights = w
        self.attribute_names = list(attribute_names) if attribute_names is not None else None
        label = f"{k}-way" if k is not None else f"{len(subs)} cuboids"
        self.name = name or f"marginals({label} over {'x'.join(map(str, sizes))})"

    @property
    def shape(self) -> tuple[int, int]:
        m = sum(math.prod(self.domain_sizes[i] for i in s) for s in self.subsets)
        return (m, math.prod(self.domain_sizes))

    # -- spectral form ---------------------------------------------------------------------------
    @cached_property
    def closure(self) -> list[int]:
        """Every subset A of some workload marginal (bitmasks): the only Q_A with c_A > 0."""
        return down_closure(self.masks)

    @cached_property
    def scaled_eigenvalues(self) -> np.ndarray:
        """c_A / N for A in `closure`: the eigenvalue of W^T W on Q_A divided by the number of cells N."""
        return eigen_weights(self.domain_sizes, self.masks, self.weights, self.closure)

    @cached_property
    def multiplicities(self) -> np.ndarray:
        """r_A = prod_{i in A} (n_i - 1) for A in `closure` (float; may exceed int64)."""
        return np.array([float(residual_rank(self.domain_sizes, A)) for A in self.closure])

    def kron_terms(self) -> list[KronTerm]:
        out = []
        for s, w in zip(self.masks, self.weights, strict=True):
            Gs = [np.eye(n) if s >> i & 1 else np.ones((n, n)) for i, n in enumerate(self.domain_sizes)]
            out.append((float(w) ** 2, Gs))
        return out

    def frobenius_sq(self) -> float:
        """sum_S w_S^2 N: each marginal counts every cell exactly once (inf beyond float64)."""
        log_v = math.log(float(np.sum(self.weights**2))) + sum(math.log(n) for n in self.domain_sizes)
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

    def gram_matvec(self, v: np.ndarray) -> np.ndarray:
        """sum_S w_S^2 M_S^T M_S v: sum over the non-S axes and broadcast back (v of shape (n,) or (n, k))."""
        v = np.asarray(v, dtype=float)
        n = self.n
        if v.ndim not in (1, 2) or v.shape[0] != n:
            raise ValueError(f"vector has shape {v.shape}; expected ({n},) or ({n}, k)")
        k = 1 if v.ndim == 1 else v.shape[1]
        T = v.reshape(*self.domain_sizes, k)
        out = np.zeros_like(T)
        d = self.n_factors
        for s, w in zip(self.masks, self.weights, strict=True):
            axes = tuple(i for i in range(d) if not s >> i & 1)
            out += w**2 * (T.sum(axis=axes, keepdims=True) if axes else T)
        return out.reshape(v.shape)

    def matvec(self, x: np.ndarray) -> np.ndarray:
        """W x: the weighted marginal tables of x, raveled and stacked in subset order."""
        x = np.asarray(x, dtype=float)
        if x.shape != (self.n,):
            raise ValueError(f"data vector has shape {x.shape}; expected ({self.n},)")
        T = x.reshape(self.domain_sizes)
        d = self.n_factors
        out = []
        for s, w in zip(self.masks, self.weights, strict=True):
            axes = tuple(i for i in range(d) if not s >> i & 1)
            out.append(w * (T.sum(axis=axes) if axes else T).ravel())
        return np.concatenate(out)

    def subset_names(self, subset: Sequence[int]) -> str:
        """Human label of a subset: attribute names joined by 'x' (or indices)."""
        names = self.attribute_names
        return "x".join(names[i] if names else str(i) for i in subset) or "total"

    def as_union(self) -> UnionWorkload:
        """The same workload as a weighted union of Kronecker products of Identity and 1^T."""
        parts = []
        for s in self.subsets:
            fs: list[Workload] = [Identity(n) if i in s else _Ones(n) for i, n in enumerate(self.domain_sizes)]
            parts.append(KronWorkload(fs, name="marginal(" + ",".join(map(str, s)) + ")"))
        return UnionWorkload(parts, self.weights, name=self.name)

    def dense(self) -> Workload:
        return Marginals(list(self.domain_sizes), subsets=self.subsets, weights=list(self.weights))

    def masks_attrs(self) -> list[tuple[int, ...]]:
        """Attribute tuples of the down-closure, in `closure` order."""
        return [attrs_of(a) for a in self.closure]


def as_implicit(workload: Workload | np.ndarray) -> ImplicitWorkload:
    """An implicit view of any dpopt workload: Kron -> KronWorkload, Marginals -> MarginalsWorkload,
    Stack of Kron -> UnionWorkload, anything else -> a one-factor KronWorkload."""
    if isinstance(workload, ImplicitWorkload):
        return workload
    w = as_workload(workload)
    if isinstance(w, Marginals):
        return MarginalsWorkload(w.domain_sizes, subsets=w.subsets, weights=list(w.weights), name=w.name)
    if isinstance(w, Kron):
        return KronWorkload(w.factors, name=w.name)
    if isinstance(w, Stack) and all(isinstance(p, Kron) for p in w.parts):
        parts = [KronWorkload(p.factors, name=p.name) for p in w.parts]  # type: ignore[attr-defined]
        if len({p.domain_sizes for p in parts}) == 1:
            return UnionWorkload(parts, w.weights, name=w.name)
    return KronWorkload([w], name=w.name)
