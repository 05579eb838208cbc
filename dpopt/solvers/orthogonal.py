"""Orthogonal Mechanism (OM) strategy construction (seed 001: Huang, Li, Han, Yu).

OM answers a workload W (m x n) by measuring a new query set W~ (s x n) with Laplace noise and
reconstructing with B (m x s), W = B W~ exactly. W~ is built over disjoint sub-domains of the n cells
(Algorithm 2); queries on disjoint sub-domains are "orthogonal" in the paper's sense (Definition 6), so
the sensitivity of W~ is the largest sensitivity of one sub-domain's block. B follows from W~ one
sub-domain at a time (Algorithm 3); the expected error is Theorem 5's.

Paper map (seed 001, Sections 4.2-4.3 and 5):

- Algorithm 1 (the mechanism: noise on W~ x, then B)        -> `orthogonal_mechanism`
- Algorithm 2, line 1 (r = rank(W) independent rows)       -> `select_independent_rows`
- Algorithm 2, lines 5-12, 20-22 (greedy disjoint split)   -> `split_domain`
- Algorithm 2, lines 13-18 (normalised queries per split)  -> `subdomain_queries`
- Algorithm 2 as a whole (W~)                               -> `construct_w_tilde`
- Algorithm 3 (B with W = B W~)                             -> `construct_b`
- Theorem 5 (expected squared error)                        -> `om_expected_error`
- Section 5 tau-sparse random workloads W_tau               -> `w_tau_matrix`
- everything together                                       -> `orthogonal_strategy` -> `OMStrategy`

Choices made where the paper's text is ambiguous are stated in each function's docstring. Two facts
shape them (both follow from the greedy rule, and the tests check them):

1. The sub-domains of Algorithm 2 are exactly the classes of cells that have the same set of selected
   rows touching them (cells x, y are together iff {i : x in D_i} == {i : y in D_i}). Since x_l has the
   largest count kappa, every y in the intersection of the D_i that contain x_l is contained in exactly
   those D_i. Tie-breaking in line 9 therefore only reorders the blocks of W~; it never changes them.
2. Every row of W (selected or not) restricted to a sub-domain lies in the span of the selected rows
   restricted to it, so W = B W~ is always solvable; Algorithm 3's rank-1 test (lines 7-10) is the
   special case of a sub-domain with one query, and is generalised here to several.
"""

from __future__ import annotations

import numbers
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from dpopt.validation import check_choice, check_finite_matrix, check_positive_number

Basis = Literal["auto", "rows", "orthonormal"]
_BASES = ("auto", "rows", "orthonormal")


# ---------------------------------------------------------------------------------------------------
# Result type
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OMStrategy:
    """An Orthogonal Mechanism decomposition W = B W~.

    W_tilde: (s, n) measured queries; each row is supported inside one sub-domain.
    B: (m, s) reconstruction, W = B @ W_tilde.
    subdomains: disjoint sorted arrays of cell indices (the D~_j of Algorithm 2), in greedy order.
    blocks: for each sub-domain, the indices of its rows in W_tilde (the query subset Q~_j).
    independent_rows: indices into W of the r = rank(W) rows chosen by Algorithm 2, line 1, in the
        order they were chosen.
    diagnostics: rank, counts, residual max|W - B W~| / max|W|, cells left uncovered (zero columns),
        basis, wall and CPU seconds.
    """

    W_tilde: np.ndarray
    B: np.ndarray
    subdomains: list[np.ndarray]
    blocks: list[np.ndarray]
    independent_rows: np.ndarray
    diagnostics: dict[str, Any] = field(default_factory=dict)

    @property
    def A(self) -> np.ndarray:
        """The strategy matrix in the matrix-mechanism naming (A = W~), shape (s, n)."""
        return self.W_tilde

    @property
    def sens1(self) -> float:
        """S(Q~): the largest column L1 norm of W~ (Definition 3, Eq. 2)."""
        return sensitivity_l1(self.W_tilde)

    @property
    def sens2(self) -> float:
        """Largest column L2 norm of W~ (for Gaussian noise; not used by the paper)."""
        return float(np.sqrt(np.max(np.sum(self.W_tilde**2, axis=0))))

    def expected_error(self, eps: float) -> float:
        """Theorem 5's total expected squared error at privacy budget eps (see `om_expected_error`)."""
        return om_expected_error(self.B, self.W_tilde, eps)


# ---------------------------------------------------------------------------------------------------
# Input checks
# ---------------------------------------------------------------------------------------------------


def _check_tol(tol: float, what: str = "tol") -> float:
    if isinstance(tol, bool) or not isinstance(tol, numbers.Real) or not (0.0 < float(tol) < 1.0):
        raise ValueError(f"{what} must be a real number in (0, 1), got {tol!r}")
    return float(tol)


def _as_rng(rng: np.random.Generator | int | None, allow_none: bool = True) -> np.random.Generator | None:
    if rng is None and allow_none:
        return None
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, numbers.Integral) and not isinstance(rng, bool):
        return np.random.default_rng(int(rng))
    expected = "a numpy Generator, an int seed or None" if allow_none else "a numpy Generator or an int seed"
    raise ValueError(f"rng must be {expected}, got {type(rng).__name__}")


def sensitivity_l1(M: np.ndarray) -> float:
    """Query matrix sensitivity S (seed 001, Definition 3, Eq. 2): the largest column L1 norm of M."""
    M = np.asarray(M, dtype=float)
    if M.size == 0:
        return 0.0
    return float(np.max(np.sum(np.abs(M), axis=0)))


# ---------------------------------------------------------------------------------------------------
# Algorithm 2 and its steps
# ---------------------------------------------------------------------------------------------------


def _greedy_independent(M: np.ndarray, order: np.ndarray, tol: float) -> list[int]:
    """Scan rows of M in `order`; keep a row when its component outside the span of the kept rows has
    norm > tol * (its own norm). Gram-Schmidt with one re-orthogonalisation pass."""
    Q = np.zeros((min(M.shape), M.shape[1]))
    kept: list[int] = []
    for i in order:
        w = M[i]
        norm_w = float(np.linalg.norm(w))
        if norm_w == 0.0:
            continue
        k = len(kept)
        res = w - Q[:k].T @ (Q[:k] @ w)
        res -= Q[:k].T @ (Q[:k] @ res)
        norm_res = float(np.linalg.norm(res))
        if norm_res > tol * norm_w:
            Q[k] = res / norm_res
            kept.append(int(i))
            if len(kept) == Q.shape[0]:
                break
    return kept


def select_independent_rows(
    W: np.ndarray, *, rng: np.random.Generator | int | None = None, tol: float = 1e-10
) -> np.ndarray:
    """OM Algorithm 2, line 1 (seed 001, Section 4.2): pick r = rank(W) linearly independent rows of W.

    The paper says "randomly select r independent queries". Here the rows are scanned in a fixed
    order and a row is kept when it is independent of those kept before it (its residual after
    projection onto their span exceeds tol times its own L2 norm); r is the number kept, i.e. the
    numerical rank of W at relative tolerance tol. The scan order is the input order when rng is None
    (this reproduces Example 1) and a uniformly random permutation drawn from rng otherwise, so the
    choice is deterministic given the seed. Zero rows are never chosen.

    W: (m, n). Returns the chosen row indices (int array, length r) in the order they were chosen.
    """
    W = check_finite_matrix(W, "W")
    tol = _check_tol(tol)
    gen = _as_rng(rng)
    m = W.shape[0]
    order = np.arange(m) if gen is None else gen.permutation(m)
    return np.asarray(_greedy_independent(W, order, tol), dtype=int)


def split_domain(support: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """OM Algorithm 2, lines 5-12 and 20-22 (seed 001, Section 4.2): greedy split into disjoint sub-domains.

    support: (r, n) boolean, support[i, x] is True when cell x is in D_i, the query domain of the i-th
    selected row. Each pass counts kappa(x) = #{i : x in D_i}, takes l = argmax kappa (line 9; ties go
    to the smallest cell index, which only reorders the output, see the module docstring), S_l = rows
    whose domain holds x_l (line 10), and D~_j = the intersection of those domains (line 11); then
    removes D~_j from every D_i and from D (lines 20-21). Removing D~_j deletes cells but never changes
    kappa of the other cells, so kappa is counted once and removed cells are masked.

    The loop stops when no remaining cell lies in any D_i (kappa = 0). Such cells are zero columns of
    the selected rows (hence of W, up to the rank tolerance); the paper does not cover them (the
    intersection over an empty S_l is undefined) and they need no measurement: they are left out of
    every sub-domain and W~ is zero on them.

    Returns a list of (D~_j, S_l) pairs: sorted cell indices and sorted selected-row positions (0..r-1).
    """
    support = np.asarray(support, dtype=bool)
    if support.ndim != 2:
        raise ValueError(f"support must be a 2-D boolean matrix (r x n), got {support.ndim} dimension(s)")
    kappa = support.sum(axis=0).astype(np.int64)
    remaining = np.ones(support.shape[1], dtype=bool)
    parts: list[tuple[np.ndarray, np.ndarray]] = []
    while True:
        masked = np.where(remaining, kappa, -1)
        l = int(np.argmax(masked))
        if masked[l] <= 0:
            break
        S_l = np.flatnonzero(support[:, l])
        D_j = np.flatnonzero(remaining & support[S_l].all(axis=0))
        parts.append((D_j, S_l))
        remaining[D_j] = False
    return parts


def subdomain_queries(C: np.ndarray, *, basis: Basis = "auto", tol: float = 1e-10) -> np.ndarray:
    """OM Algorithm 2, lines 13-17 (seed 001, Section 4.2): tau_j independent, normalised queries on one sub-domain.

    C: (|S_l|, p) the selected rows restricted to the sub-domain D~_j (line 14: the query "that
    represents D~_j within D_{S_l(i)}" is read as the restriction of that row to D~_j). tau_j = rank(C)
    at relative tolerance tol. The paper does not say which independent queries to build, nor what
    "normalised" means; the choices here:

    - basis="rows" (the literal reading "from C"): the first tau_j rows of C, in order, that are
      independent of the ones before them.
    - basis="auto" (default): as "rows", except when tau_j = p (C spans every query on the
      sub-domain), where the p unit queries e_x, x in D~_j, are used. They span the same space and
      give B's block W[:, D~_j] at sensitivity 1, where p rows of C, often ill-conditioned when
      p > 1, inflate ||B||_F (measured in benchmarks/results/orthogonal.md, m <= 16).
    - basis="orthonormal": the tau_j leading right singular vectors of C (Euclidean-orthonormal rows).

    Each query is given the sign that makes its largest-magnitude entry positive (first one on ties);
    with "rows"/"auto" it is also divided by that magnitude. Then the whole block is divided by its
    largest column L1 norm, so the block's sensitivity is exactly 1. Equal block sensitivities are the
    best any per-block scaling can do for Theorem 5 (the error scales with max_j S_j^2 while B's
    columns scale with 1/S_j), and with them the per-block noise of Theorem 5's proof
    (Var(beta_j) = 2 S(Q~_j)^2 / eps^2) and the single scale of Algorithm 1 coincide. For one query on
    one cell every basis gives the unit query e_x of Example 1. With basis="orthonormal" the rows stay
    mutually orthogonal with equal L2 norms.

    Returns Q~_j: (tau_j, p).
    """
    C = check_finite_matrix(C, "C")
    tol = _check_tol(tol)
    check_choice(basis, _BASES, "basis")
    if basis in ("rows", "auto"):
        keep = _greedy_independent(C, np.arange(C.shape[0]), tol)
        if not keep:
            raise ValueError("C has no non-zero row; a sub-domain needs at least one query")
        if basis == "auto" and len(keep) == C.shape[1]:
            return np.eye(C.shape[1])
        Q = C[keep].copy()
    else:
        _, sigma, Vt = np.linalg.svd(C, full_matrices=False)
        if sigma.size == 0 or sigma[0] == 0.0:
            raise ValueError("C has no non-zero row; a sub-domain needs at least one query")
        tau_j = int(np.count_nonzero(sigma > tol * sigma[0]))
        Q = Vt[:tau_j].copy()
    peak = Q[np.arange(Q.shape[0]), np.argmax(np.abs(Q), axis=1)][:, None]
    # Rows are scaled to a largest entry of 1; orthonormal rows only get their sign, keeping equal norms.
    Q /= np.sign(peak) if basis == "orthonormal" else peak
    Q /= np.max(np.sum(np.abs(Q), axis=0))
    return Q


def construct_w_tilde(
    W: np.ndarray,
    *,
    rng: np.random.Generator | int | None = None,
    tol: float = 1e-10,
    basis: Basis = "auto",
) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray], np.ndarray]:
    """OM Algorithm 2 (seed 001, Section 4.2): the new query set W~ over disjoint sub-domains.

    Line 1 by `select_independent_rows` (rng, tol), the greedy split by `split_domain`, and each
    sub-domain's queries by `subdomain_queries` (basis, tol). The domain D_i of a row is the set of cells
    where it is non-zero (exact zero test: entries are used as given, negative ones included).

    W: (m, n). Returns (W_tilde (s, n), subdomains, blocks, independent_rows): sub-domain cell indices,
    the W_tilde row indices belonging to each, and the selected rows of W (see `OMStrategy`).
    Raises ValueError when W has no non-zero entry (nothing to measure, sensitivity undefined).
    """
    W = check_finite_matrix(W, "W")
    tol = _check_tol(tol)
    check_choice(basis, _BASES, "basis")
    if not np.any(W):
        raise ValueError("W has no non-zero entry; the Orthogonal Mechanism needs at least one non-zero query")
    rows = select_independent_rows(W, rng=rng, tol=tol)
    W_hat = W[rows]
    parts = split_domain(W_hat != 0)
    n = W.shape[1]
    pieces: list[np.ndarray] = []
    subdomains: list[np.ndarray] = []
    blocks: list[np.ndarray] = []
    s = 0
    for D_j, S_l in parts:
        Q = subdomain_queries(W_hat[np.ix_(S_l, D_j)], basis=basis, tol=tol)
        block = np.zeros((Q.shape[0], n))
        block[:, D_j] = Q
        pieces.append(block)
        subdomains.append(D_j)
        blocks.append(np.arange(s, s + Q.shape[0]))
        s += Q.shape[0]
    W_tilde = np.vstack(pieces)
    return W_tilde, subdomains, blocks, rows


# ---------------------------------------------------------------------------------------------------
# Algorithm 3
# ---------------------------------------------------------------------------------------------------


def construct_b(
    W: np.ndarray, W_tilde: np.ndarray, subdomains: list[np.ndarray], blocks: list[np.ndarray]
) -> np.ndarray:
    """OM Algorithm 3 (seed 001, Section 4.2), generalised: B (m, s) with W = B W~, one sub-domain at a time.

    For row q_i of W and sub-domain D~_j with queries Q~_j (tau_j x p, independent rows), B's entries
    in block j are the coefficients b with q_i(D~_j) = b Q~_j, i.e. b = q_i(D~_j) Q~_j^T (Q~_j Q~_j^T)^-1.
    When tau_j = 1 and q_i(D~_j) = k q~_j this is exactly lines 6-10 (B(i, j) = k). The literal
    algorithm sets B(i, j) = 0 whenever the rank-1 test fails or D~_j is not inside the domain of q_i;
    that loses W = B W~ for blocks with several queries and for rows of W that are combinations with
    cancellations, so the solve above is used instead. Since the rows of W~ are independent, the
    solution is unique (Corollary 1) and equals W pinv(W~); cost O(m sum_j p_j tau_j).

    W: (m, n); W_tilde: (s, n); subdomains / blocks as returned by `construct_w_tilde`.
    Cells outside every sub-domain are not used (they are zero columns of W; the caller checks).
    """
    W = check_finite_matrix(W, "W")
    W_tilde = check_finite_matrix(W_tilde, "W_tilde")
    if W.shape[1] != W_tilde.shape[1]:
        raise ValueError(f"W has {W.shape[1]} columns but W_tilde has {W_tilde.shape[1]}; expected equal n")
    if len(subdomains) != len(blocks):
        raise ValueError(f"got {len(subdomains)} sub-domains but {len(blocks)} blocks; expected one block each")
    B = np.zeros((W.shape[0], W_tilde.shape[0]))
    for D_j, rows_j in zip(subdomains, blocks, strict=True):
        Q = W_tilde[np.ix_(rows_j, D_j)]
        Wj = W[:, D_j]
        if Q.shape[0] == 1:
            q = Q[0]
            B[:, rows_j[0]] = Wj @ q / float(q @ q)
        else:
            B[:, rows_j] = np.linalg.solve(Q @ Q.T, Q @ Wj.T).T
    return B


# ---------------------------------------------------------------------------------------------------
# The whole construction, Theorem 5 and Algorithm 1
# ---------------------------------------------------------------------------------------------------


def orthogonal_strategy(
    W: Any,
    *,
    rng: np.random.Generator | int | None = None,
    tol: float = 1e-10,
    basis: Basis = "auto",
    residual_tol: float = 1e-8,
) -> OMStrategy:
    """OM Algorithms 2 and 3 (seed 001, Section 4.2): the decomposition W = B W~ used by Algorithm 1.

    W: (m, n) array (or sparse matrix, or an object with .matrix()); any sign, any m versus n.
    rng: None scans rows in input order for Algorithm 2, line 1; an int seed or Generator scans them in
        a random order (deterministic given the seed).
    tol: relative tolerance of every rank decision (selection of rows, tau_j per sub-domain).
    basis: how a sub-domain's queries are built, "auto", "rows" or "orthonormal" (see
        `subdomain_queries`).
    residual_tol: W = B W~ is checked before returning; ValueError when max|W - B W~| exceeds
        residual_tol * max|W| (this happens only when tol declares rows dependent that are not).

    Returns an OMStrategy with W_tilde (s, n), B (m, s), S(W~) = 1.
    """
    tol = _check_tol(tol)
    residual_tol = _check_tol(residual_tol, "residual_tol")
    t_wall, t_cpu = time.perf_counter(), time.process_time()
    W = check_finite_matrix(W, "W")
    W_tilde, subdomains, blocks, rows = construct_w_tilde(W, rng=rng, tol=tol, basis=basis)
    B = construct_b(W, W_tilde, subdomains, blocks)
    scale = float(np.max(np.abs(W)))
    residual = float(np.max(np.abs(W - B @ W_tilde))) / scale
    if residual > residual_tol:
        raise ValueError(
            f"W = B W~ fails: max|W - B W~| / max|W| = {residual:.3e} > residual_tol = {residual_tol:.1e}; "
            f"W is numerically rank-deficient at tol = {tol:.1e}; use a smaller tol"
        )
    covered = np.zeros(W.shape[1], dtype=bool)
    for D_j in subdomains:
        covered[D_j] = True
    sizes = np.array([D_j.size for D_j in subdomains])
    taus = np.array([b.size for b in blocks])
    diagnostics = {
        "rank": int(rows.size),
        "n_subdomains": len(subdomains),
        "n_queries": int(W_tilde.shape[0]),
        "n_singleton_subdomains": int(np.count_nonzero(sizes == 1)),
        "max_subdomain_size": int(sizes.max()),
        "max_block_queries": int(taus.max()),
        "uncovered_cells": np.flatnonzero(~covered),
        "residual": residual,
        "basis": basis,
        "wall_seconds": time.perf_counter() - t_wall,
        "cpu_seconds": time.process_time() - t_cpu,
    }
    return OMStrategy(W_tilde, B, subdomains, blocks, rows, diagnostics)


def om_expected_error(B: np.ndarray, W_tilde: np.ndarray, eps: float) -> float:
    """OM Theorem 5 (seed 001, Section 4.3): expected squared error 2 trace(B B^T) S(W~)^2 / eps^2.

    Convention: total squared error summed over the m queries of W = B W~ (divide by m for the
    paper's "average squared error"), eps-differential privacy with i.i.d. Laplace noise of scale
    b = S(W~)/eps on each of the s answers of W~ (variance 2 b^2), S = the largest column L1 norm of
    W~ (Definition 3). trace(B B^T) = ||B||_F^2.

    B: (m, s); W_tilde: (s, n).
    """
    B = check_finite_matrix(B, "B")
    W_tilde = check_finite_matrix(W_tilde, "W_tilde")
    eps = check_positive_number(eps, "eps")
    if B.shape[1] != W_tilde.shape[0]:
        raise ValueError(f"B has {B.shape[1]} columns but W_tilde has {W_tilde.shape[0]} rows; expected equal s")
    return 2.0 * float(np.sum(B**2)) * sensitivity_l1(W_tilde) ** 2 / eps**2


def orthogonal_mechanism(
    strategy: OMStrategy, x: np.ndarray, eps: float, rng: np.random.Generator | int
) -> np.ndarray:
    """OM Algorithm 1 (seed 001, Section 4.2): noisy answers F(Q, D) = B (W~ x + beta), beta ~ Lap(S(W~)/eps)^s.

    x: (n,) cell counts. Returns (m,) noisy answers to W; eps-differentially private (Theorem 3).
    """
    eps = check_positive_number(eps, "eps")
    gen = _as_rng(rng, allow_none=False)
    x = np.asarray(x, dtype=float)
    n = strategy.W_tilde.shape[1]
    if x.shape != (n,):
        raise ValueError(f"x must be a vector of length n = {n} (one count per cell), got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("x has NaN or infinite entries; expected only finite counts")
    beta = gen.laplace(0.0, strategy.sens1 / eps, size=strategy.W_tilde.shape[0])
    return strategy.B @ (strategy.W_tilde @ x + beta)


# ---------------------------------------------------------------------------------------------------
# Section 5 workloads
# ---------------------------------------------------------------------------------------------------


def w_tau_matrix(m: int, n: int, tau: float, rng: np.random.Generator | int) -> np.ndarray:
    """OM tau-sparse random workload W_tau (seed 001, Section 5, third paragraph).

    "We first randomly generate an m x n matrix H, where each element of the matrix is drawn from the
    standard uniform distribution. Then we set w_ij = rand if h_ij <= tau, and w_ij = 0 otherwise."
    Draw order (fixed, so a seed gives one matrix): H = rng.random((m, n)), then the values
    V = rng.random((m, n)) (one fresh U[0, 1) draw per entry, whether used or not); W = V where
    H <= tau, else 0. Each entry is non-zero with probability tau (exactly when its value draw is not
    0.0), so tau = 0 gives the zero matrix and tau = 1 a dense one.

    Returns W: (m, n) float array with entries in [0, 1).
    """
    for value, what in ((m, "m"), (n, "n")):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 1:
            raise ValueError(f"{what} must be a positive integer, got {value!r}")
    if isinstance(tau, bool) or not isinstance(tau, numbers.Real) or not (0.0 <= float(tau) <= 1.0):
        raise ValueError(f"tau must be a number in [0, 1], got {tau!r}")
    gen = _as_rng(rng, allow_none=False)
    H = gen.random((int(m), int(n)))
    V = gen.random((int(m), int(n)))
    return np.where(H <= float(tau), V, 0.0)
