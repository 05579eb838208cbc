"""Baseline strategies every comparison starts from (seed 003; seed 004 Table 2; seed 000 Section 6).

identity (noise on data, NOD / M_D), the workload itself (noise on queries, NOQ / M_R, the Laplace
mechanism), hierarchical with branching b (Hay et al. 2010), Haar wavelet (Privelet, Xiao et al. 2010),
total; multi-dimensional versions by Kronecker products.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import scipy.sparse as sp

from dpopt.strategy import Strategy
from dpopt.validation import check_positive_int
from dpopt.workloads import Workload, WorkloadTooLargeError, as_workload, range_rows


def identity_strategy(n: int) -> Strategy:
    """A = I_n: measure every cell (noise on data; seed 000's NOD, seed 003's identity strategy)."""
    n = check_positive_int(n, "n")
    return Strategy(sp.identity(n, format="csr"), name="identity")


def total_strategy(n: int) -> Strategy:
    """A = 1^T: measure only the total (supports the Total workload and nothing richer)."""
    n = check_positive_int(n, "n")
    return Strategy(np.ones((1, n)), name="total")


def workload_strategy(workload: Workload | np.ndarray) -> Strategy:
    """A = W, B = I_m: noise on every query answer (seed 000's NOQ / Laplace mechanism)."""
    w = as_workload(workload)
    W = w.sparse()
    return Strategy(W, B=sp.identity(w.m, format="csr"), name="laplace")


def _tree_splits(lo: int, hi: int, b: int) -> list[tuple[int, int]]:
    """Split [lo, hi) into min(b, hi - lo) contiguous parts of near-equal size (larger parts first)."""
    k = min(b, hi - lo)
    sizes = np.full(k, (hi - lo) // k)
    sizes[: (hi - lo) % k] += 1
    edges = lo + np.concatenate([[0], np.cumsum(sizes)])
    return [(int(edges[i]), int(edges[i + 1])) for i in range(k)]


def tree_height(n: int, b: int) -> int:
    """h = ceil(log_b n), the number of levels below the root of a b-ary tree over n cells (exact integers)."""
    h, cells = 0, 1
    while cells < n:
        cells *= b
        h += 1
    return h


def qardaji_variance(n: int, b: int, gaussian: bool = False) -> float:
    """Qardaji, Yang and Li 2013, Eq. (3): average range-query variance of a b-ary hierarchy with constrained
    inference over n cells, up to a common factor: (b - 1) h^3 - 2 (b + 1) h^2 / 3 with h = ceil(log_b n).

    Eq. (3) counts Laplace noise, whose variance per node grows as sens1^2 = h^2. gaussian=True divides it by
    h: the same count of nodes per query with Gaussian noise, whose variance grows as sens2^2 = h.
    """
    h = tree_height(n, b)
    v = (b - 1) * h**3 - 2 * (b + 1) * h**2 / 3
    return v / h if gaussian else v


def qardaji_branching(n: int, gaussian: bool = False) -> int:
    """Qardaji, Yang and Li 2013 (PVLDB, "Understanding hierarchical methods"), Sec. 4: the branching b in
    2..n with the least Eq. (3) variance (the smallest such b on a tie; `qardaji_variance`); 2 for n = 1."""
    n = check_positive_int(n, "n")
    if n < 2:
        return 2
    return min(range(2, n + 1), key=lambda b: (qardaji_variance(n, b, gaussian), b))


def hierarchical_strategy(n: int, branching: int = 2, root: bool = True) -> Strategy:
    """Hierarchical strategy H_b: one 0/1 row per node of a b-ary tree over the cells, root to leaves (seed 003).

    For n not a power of b the tree splits each node into b near-equal parts, so every leaf is one cell and
    the height is ceil(log_b n) + 1 levels. root=False leaves the root's row out (Qardaji et al. 2013 measure
    the levels below it: the total is the sum of its children), one level less of sensitivity.
    """
    n = check_positive_int(n, "n")
    b = check_positive_int(branching, "branching")
    if b < 2:
        raise ValueError(f"branching must be at least 2, got {b}")
    nodes: list[tuple[int, int]] = []
    frontier = [(0, n)] if root or n == 1 else _tree_splits(0, n, b)
    while frontier:
        nodes.extend(frontier)
        frontier = [c for lo, hi in frontier if hi - lo > 1 for c in _tree_splits(lo, hi, b)]
    starts = np.array([lo for lo, _ in nodes])
    ends = np.array([hi - 1 for _, hi in nodes])
    A = range_rows(n, starts, ends)
    return Strategy(A, name=f"hierarchical(b={b})" if root or n == 1 else f"hierarchical(b={b}, no root)")


def wavelet_strategy(n: int) -> Strategy:
    """Haar wavelet strategy (Privelet): the total plus, for every node of a binary tree, +1 on its left half and -1 on its right half.

    Unnormalised +-1 entries, as in the matrix-mechanism papers (seed 003; seed 004 Table 2). For n not
    a power of 2 the halves are near-equal, which keeps the n rows linearly independent.
    """
    n = check_positive_int(n, "n")
    rows_i, cols_j, vals = [np.zeros(n, dtype=int)], [np.arange(n)], [np.ones(n)]
    frontier = [(0, n)]
    r = 1
    while frontier:
        nxt = []
        for lo, hi in frontier:
            if hi - lo < 2:
                continue
            mid = lo + (hi - lo + 1) // 2
            rows_i.append(np.full(hi - lo, r))
            cols_j.append(np.arange(lo, hi))
            vals.append(np.where(np.arange(lo, hi) < mid, 1.0, -1.0))
            r += 1
            nxt += [(lo, mid), (mid, hi)]
        frontier = nxt
    A = sp.csr_matrix(
        (np.concatenate(vals), (np.concatenate(rows_i), np.concatenate(cols_j))), shape=(r, n)
    )
    return Strategy(A, name="wavelet")


def kron_strategy(factors: Sequence[Strategy], name: str | None = None) -> Strategy:
    """A = A_1 (x) ... (x) A_d: sensitivities multiply across factors (HDMM, McKenna et al. VLDB 2018, Kronecker strategies)."""
    if not factors:
        raise ValueError("kron_strategy needs at least one factor")
    if any(f.B is not None for f in factors):
        raise ValueError("kron_strategy combines matrix-mechanism strategies (no explicit B)")
    A = sp.csr_matrix(factors[0].A)
    for f in factors[1:]:
        A = sp.kron(A, sp.csr_matrix(f.A), format="csr")
    return Strategy(A, name=name or "kron(" + ",".join(f.name for f in factors) + ")")


def per_dimension(workload: Workload, make: Callable[[int], Strategy], name: str) -> Strategy:
    """make(n) for a 1-D workload; the Kronecker product of make(n_i) over the attributes of a product domain
    (a Kron workload's factors, or a union of Kronecker products such as marginals: `Workload.domain_sizes`)."""
    sizes = workload.domain_sizes
    if len(sizes) > 1:
        return kron_strategy([make(int(n)) for n in sizes], name=name)
    return make(workload.n)


def qardaji_tree(n: int, gaussian: bool) -> Strategy:
    """Qardaji et al.'s hierarchy over n cells: their branching (`qardaji_branching`) without the root row, as their
    HB measures it (Qardaji, Yang and Li 2013)."""
    return hierarchical_strategy(n, qardaji_branching(n, gaussian), root=False)


def qardaji_hierarchy(workload: Workload, gaussian: bool) -> Strategy:
    """The hierarchical mechanism's default strategy: `qardaji_tree` per dimension."""

    def make(n: int) -> Strategy:
        return qardaji_tree(n, gaussian)

    if len(workload.domain_sizes) > 1:
        name = "kron(" + ",".join(make(int(n)).name for n in workload.domain_sizes) + ")"
    else:
        name = make(workload.n).name
    return per_dimension(workload, make, name)


def baseline_strategies(workload: Workload | np.ndarray, gaussian: bool = False) -> dict[str, Strategy]:
    """The strategy each baseline mechanism (identity, laplace, hierarchical, wavelet) selects on `workload`
    (the hierarchy's branching depends on the noise: gaussian for (eps, delta), Laplace else)."""
    # As dpopt.mechanisms.baselines builds them: laplace is A = W with B = I, per dimension means a
    # Kronecker product over the attributes of a product domain, hierarchical has its default Qardaji branching.
    w = as_workload(workload)
    out = {"identity": identity_strategy(w.n)}
    if w.has_rows:  # a Gram-only workload has no rows to add noise to: the Laplace mechanism refuses it too
        try:
            out["laplace"] = workload_strategy(w)
        except WorkloadTooLargeError:  # so does the Laplace mechanism
            pass
    out["hierarchical"] = qardaji_hierarchy(w, gaussian)
    out["wavelet"] = per_dimension(w, wavelet_strategy, "wavelet")
    return out
