"""Lower and upper bounds on the optimal error (Li and Miklau, seed 004; Low-Rank Mechanism, seed 000).

Unless a function says otherwise, bounds are per unit privacy constant: multiply by P(eps, delta) =
`Privacy.variance_factor` (2 ln(2/delta)/eps^2 in the seeds' Gaussian convention, 2/eps^2 for Laplace).
Functions accept a Workload or a matrix W; quantities depend on W only through W^T W.

Round-off in the SVD bound may only lower it (a reported lower bound must stay below every error a
strategy reaches). `svdb_from_singular_value_bounds` is the one place the bound is formed; its callers
hand it lower bounds on the singular values:
- from W (`singular_value_lower_bounds`): LAPACK's SVD is backward stable, each computed singular value is
  within p(m, n) eps ||W||_2 of the exact one (Weyl); we take p = 2 max(m, n) and use max(s_i - that, 0);
- from G = W^T W (`gram_singular_value_lower_bounds`): eigvalsh is backward stable, each computed eigenvalue
  is within p(n) eps ||G||_2 of the exact one; we take p = 2n and use sqrt(max(lambda_i - that, 0)). So an
  eigenvalue at or below 2 n eps lambda_max counts as zero: a rank-deficient Gram's round-off eigenvalues
  (about 1e-16 lambda_max each, whose square roots used to add 1e-8 relative) contribute nothing.
  G itself is taken as exact (the closed-form Grams of the families are integer matrices).
The sum, square and division then add at most (k + 2) eps relative (k terms, Higham's gamma_k for a sum of
positive terms, to first order); the result is multiplied by 1 - 2 (2 r + (k + 2) eps), twice that bound
plus the terms' own relative error r.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
from scipy.special import gammaln

from dpopt.linalg import psd_sqrt
from dpopt.validation import check_gram, check_positive_number
from dpopt.workloads import Workload, _scaled, as_workload

EPS = float(np.finfo(float).eps)
# Dense W is used for the bound (instead of its Gram) while m * n * min(m, n) stays below this many flops.
SVD_OF_W_MAX_FLOPS = 2**27


def _gram_eigenvalues(G: np.ndarray) -> np.ndarray:
    """Eigenvalues of a symmetric PSD matrix, round-off negatives clipped to 0."""
    d = np.linalg.eigvalsh((G + G.T) / 2)
    return np.clip(d, 0.0, None)


def rounding_shrink(n_terms: int, term_rel_err: float = 0.0) -> float:
    """1 - 2 (2 r + (k + 2) eps): twice the first-order relative error of (sum of k terms)^2 / n (module note)."""
    return max(0.0, 1.0 - 2.0 * (2.0 * term_rel_err + (n_terms + 2) * EPS))


def svdb_from_singular_value_bounds(
    sigma: np.ndarray, n: float, counts: np.ndarray | None = None, term_rel_err: float = 0.0
) -> float:
    """(1/n)(sum_i r_i sigma_i)^2 times `rounding_shrink`: SVDB (seed 004 Def. 4.1) from lower bounds sigma_i.

    sigma_i must be lower bounds on the singular values (r_i = `counts` of each, default 1), each computed
    with relative error at most `term_rel_err`; the result is then a lower bound on the exact SVDB.
    """
    t = np.asarray(sigma, dtype=float)
    if counts is not None:
        t = t * np.asarray(counts, dtype=float)
    total = float(t.sum())
    return total * total / n * rounding_shrink(t.size + (0 if counts is None else t.size), term_rel_err)


def gram_singular_value_lower_bounds(G: np.ndarray) -> np.ndarray:
    """sqrt(max(lambda_i - 2 n eps lambda_max, 0)) over eigvalsh(G): lower bounds on the singular values of W."""
    return eigenvalue_singular_value_lower_bounds(np.linalg.eigvalsh((G + G.T) / 2))


def eigenvalue_singular_value_lower_bounds(lam: np.ndarray) -> np.ndarray:
    """sqrt(max(lambda_i - 2 n eps lambda_max, 0)) over the n computed eigenvalues of a Gram matrix W^T W (any
    backward-stable symmetric eigensolver): lower bounds on the singular values of W."""
    lam = np.asarray(lam, dtype=float)
    err = 2.0 * lam.size * EPS * float(np.max(np.abs(lam)))
    return np.sqrt(np.clip(lam - err, 0.0, None))


def singular_value_lower_bounds(W: np.ndarray) -> np.ndarray:
    """max(s_i - 2 max(m, n) eps s_max, 0) over the computed singular values s_i of W (m x n)."""
    s = np.linalg.svd(np.asarray(W, dtype=float), compute_uv=False)
    err = 2.0 * max(W.shape) * EPS * (float(s[0]) if s.size else 0.0)
    return np.clip(s - err, 0.0, None)


def svd_bound_from_gram(G: np.ndarray) -> float:
    """SVDB = (1/n)(sum_i sqrt(d_i))^2 over the eigenvalues d_i of W^T W (seed 004 Prop. 4.3), round-off only lowering it."""
    G = check_gram(G, name="Gram matrix", allow_zero=True)
    return svdb_from_singular_value_bounds(gram_singular_value_lower_bounds(G), G.shape[0], term_rel_err=EPS)


def svd_bound_from_matrix(W: np.ndarray) -> float:
    """SVDB = (1/n)(sum of singular values of W)^2 from W itself (seed 004 Def. 4.1), round-off only lowering it."""
    W = np.asarray(W, dtype=float)
    if W.ndim != 2 or W.size == 0 or not np.all(np.isfinite(W)):
        raise ValueError(f"W must be a non-empty finite 2-D array, got shape {W.shape}")
    return svdb_from_singular_value_bounds(singular_value_lower_bounds(W), W.shape[1], term_rel_err=EPS)


def _use_rows(w: Workload) -> bool:
    """True when the SVD of the dense W is cheap (better conditioned than the Gram's eigenvalues)."""
    m, n = w.shape
    return w.has_rows and m * n * min(m, n) <= SVD_OF_W_MAX_FLOPS


def svd_bound(workload: Workload | np.ndarray) -> float:
    """SVDB(W) = (1/n)(lambda_1 + ... + lambda_n)^2, lambda the singular values of W (seed 004 Def. 4.1).

    Dispatches on the workload's form (`Workload.svd_bound`): a Kronecker product multiplies its factors'
    bounds, marginals use their exact spectrum, any other workload `dense_svd_bound`. Round-off only
    lowers it. Returns inf if the value exceeds float64 (AllPredicate(1024)); use `log10_svd_bound` then.
    """
    return as_workload(workload).svd_bound()


def dense_svd_bound(w: Workload) -> float:
    """SVDB(W) from W's singular values when the SVD is cheap, else from W^T W (seed 004 Def. 4.1, Prop. 4.3)."""
    if _use_rows(w):
        return svd_bound_from_matrix(w.matrix())
    return _scaled(svd_bound_from_gram(w.gram()), w.gram_log_scale)


def log10_svd_bound(workload: Workload | np.ndarray) -> float:
    """log10 SVDB(W), finite even where SVDB itself overflows float64."""
    w = as_workload(workload)
    return math.log10(svd_bound_from_gram(w.gram())) + w.gram_log_scale / math.log(10.0)


def l2_optimum_lower_bound(G: np.ndarray, d: np.ndarray) -> float:
    """Lagrangian dual bound ||W D^{1/2}||_*^2 / sum(d) <= min trace(G X^+) over diag(X) <= 1 (seed 002), any d >= 0.

    Computed as n SVDB(W D^{1/2}) / sum(d) from the eigenvalues of D^{1/2} G D^{1/2}, less their backward
    error and the scaling's rounding (5 n eps lambda_max), so round-off only lowers it; d = 1 gives SVDB(W).
    """
    G = check_gram(G, name="Gram matrix", allow_zero=True)
    d = np.asarray(d, dtype=float)
    n = G.shape[0]
    if d.shape != (n,) or not np.all(np.isfinite(d)) or np.any(d < 0) or not d.sum() > 0:
        raise ValueError(f"multipliers d must be {n} finite numbers >= 0, not all zero")
    r = np.sqrt(d)
    lam = np.linalg.eigvalsh(G * r[:, None] * r[None, :])
    err = 5.0 * n * EPS * float(np.max(np.abs(lam)))
    sigma = np.sqrt(np.clip(lam - err, 0.0, None))
    total = float(d.sum()) * (1.0 + (n + 2) * EPS)  # an upper bound on the exact sum: the bound only drops
    return svdb_from_singular_value_bounds(sigma, n, term_rel_err=EPS) * n / total * (1.0 - 2.0 * EPS)


# Largest domain whose (eps, delta) optimum is solved for the certified bound below (one dense solve: 0.6 s at
# n = 512, 3.5-7.4 s at n = 1024 on one core, measured on AllRange and Prefix).
L2_BOUND_MAX_CELLS = 1024


def certified_l2_bound(workload: Workload | np.ndarray, time_limit: float | None = None,
                       max_cells: int = L2_BOUND_MAX_CELLS) -> tuple[float, str]:
    """The larger certified lower bound on min trace(W^T W X^+) over diag(X) <= 1, and its kind.

    'l2-optimum': the dual bound at the multipliers of seed 002's certified solver (`solve_convex_dp`, stopped
    at `time_limit` seconds if given); 'svd': SVDB(W) (seed 004 Prop. 4.3) where that is larger. Times
    P(eps, delta) it bounds every strategy's error under (eps, delta)-DP, and under eps-DP too since
    sens1(A) >= sens2(A). Workloads of at most max_cells cells (default L2_BOUND_MAX_CELLS, where it takes
    seconds; a benchmark may allow more) with an unscaled Gram.
    """
    from dpopt.solvers.convex_dp import solve_convex_dp  # the solvers build on this module

    w = as_workload(workload)
    if w.gram_log_scale != 0.0 or w.n > max_cells:
        raise ValueError(f"the certified L2 bound needs an unscaled Gram of at most {max_cells} cells; "
                         f"{w.name} has {w.n}")
    svdb = svd_bound(w)
    G = w.gram()
    res = solve_convex_dp(G, tol=1e-8, time_limit=time_limit)
    d = res.extra.get("d")
    if d is None:
        return svdb, "svd"
    value = l2_optimum_lower_bound(G, np.asarray(d, dtype=float))
    return (value, "l2-optimum") if value > svdb else (svdb, "svd")


def column_projection_gram(G: np.ndarray, cells: Sequence[int] | np.ndarray) -> np.ndarray:
    """Gram of the column projection mu(W) onto `cells`: W^T W restricted to those rows/columns (seed 004 Def. 2.8)."""
    idx = np.asarray(cells, dtype=int)
    if idx.ndim != 1 or idx.size == 0:
        raise ValueError("a column projection needs a non-empty 1-D list of cell indices")
    if idx.min() < 0 or idx.max() >= G.shape[0]:
        raise ValueError(f"cell indices must lie in 0..{G.shape[0] - 1}")
    return G[np.ix_(idx, idx)]


def range_projections(n: int, min_length: int = 1, stride: int = 1) -> Iterable[np.ndarray]:
    """Column projections onto contiguous ranges [i, j] of cells with j - i + 1 >= min_length (seed 004 Ex. 4.9)."""
    for i in range(0, n, stride):
        for j in range(i + min_length - 1, n, stride):
            yield np.arange(i, j + 1)


def supreme_svd_bound(
    workload: Workload | np.ndarray,
    projections: Iterable[Sequence[int] | np.ndarray] | None = None,
) -> tuple[float, np.ndarray]:
    """SVDB_U(W) = max over projections mu in U of SVDB(mu(W)) (seed 004 Def. 4.5); returns (value, argmax).

    `projections` defaults to all contiguous cell ranges (U of Example 4.9), O(n^2) eigenproblems: pass a
    coarser family (range_projections with a stride) for large n. The full domain is always included.
    """
    w = as_workload(workload)
    G = w.gram()
    n = G.shape[0]
    best_val = svd_bound_from_gram(G)
    best = np.arange(n)
    for cells in projections if projections is not None else range_projections(n):
        val = svd_bound_from_gram(column_projection_gram(G, cells))
        if val > best_val:
            best_val, best = val, np.asarray(cells, dtype=int)
    return _scaled(best_val, w.gram_log_scale), best


def thm56_upper_bound(workload: Workload | np.ndarray) -> float:
    """MINERROR(W) <= n d_0 SVDB(W) / trace(sqrt(W^T W)), d_0 = max diag sqrt(W^T W) (seed 004 Thm. 5.6)."""
    w = as_workload(workload)
    G = w.gram()
    S = psd_sqrt(G)
    n = G.shape[0]
    val = n * float(np.max(np.diag(S))) * svd_bound_from_gram(G) / float(np.trace(S))
    return _scaled(val, w.gram_log_scale)


def lrm_upper_bound_lemma3(workload: Workload | np.ndarray, epsilon: float) -> float:
    """LRM Lemma 3 (seed 000): error of B = sqrt(r) U Sigma, L = V^T / sqrt(r) is <= 2 r sum sigma_k^2 / eps^2.

    The paper prints sum lambda_k^2 r / eps^2; the factor 2 is the Laplace variance 2 b^2 that its
    Theorem 3 and Lemma 1 include, kept here so the bound compares with dpopt's error convention.
    """
    epsilon = check_positive_number(epsilon, "epsilon")
    w = as_workload(workload)
    d = _gram_eigenvalues(w.gram())
    r = int(np.count_nonzero(d > 1e-10 * d.max()))
    return _scaled(2.0 * r * float(d.sum()) / epsilon**2, w.gram_log_scale)


def lrm_lower_bound_lemma4(workload: Workload | np.ndarray, epsilon: float) -> float:
    """LRM Lemma 4 (seed 000): (2^r / r! prod_k sigma_k)^(2/r) r^3 / eps^2, the quantity inside Omega(.).

    Hardt and Talwar's bound holds up to an unspecified constant, so this is an order of magnitude, not a
    certified lower bound; dpopt never uses it as `bound`. Computed in log space.
    """
    epsilon = check_positive_number(epsilon, "epsilon")
    w = as_workload(workload)
    d = _gram_eigenvalues(w.gram())
    d = d[d > 1e-10 * d.max()]
    r = d.size
    log_sigma_sum = 0.5 * float(np.log(d).sum()) + 0.5 * r * w.gram_log_scale
    log_val = (2.0 / r) * (r * math.log(2.0) - float(gammaln(r + 1)) + log_sigma_sum)
    return math.exp(log_val) * r**3 / epsilon**2
