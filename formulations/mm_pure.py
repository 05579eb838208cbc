"""eps-DP matrix mechanism: a convex RELAXATION (seed 002, Section 1.2). A LOWER BOUND, NOT A STRATEGY.

    *** The value of this model bounds the eps-DP matrix-mechanism optimum from below. Its solution
    *** is in general not the Gram matrix of any strategy with L1 column norms <= 1, so no strategy is
    *** read off it: solve() returns strategy=None. Use it to certify how far a strategy can be from
    *** the optimum, never to answer queries.

The problem. Under eps-DP (Laplace noise, variance 2/eps^2 per unit L1 sensitivity) the least total
squared error over strategies A (p x n, any p) with W A^+ A = W is

    OPT_1 = (2/eps^2) * min { trace(W^T W (A^T A)^{-1}) : ||A[:, j]||_1 <= 1 for all j }.

With X = A^T A this is the SDP of `mm_approx` with the convex constraint diag(X) <= 1 replaced by
"X is the Gram matrix of vectors in the unit L1 ball", a non-convex set K_1.

What seed 002 does. Its formulas were lost in extraction; its text says that it keeps A as a variable
next to X, writes X = A^T A through the Schur complement lemma as [[I, A], [A^T, X]] PSD with
rank = p, drops the rank constraint and outputs A. Dropping the rank leaves X >= A^T A (PSD order),
which bounds X from below only. The objective decreases as X grows, so on its own this relaxation
is unbounded towards 0 (A = 0, X = t I, Y = V V^T / t is feasible for every t > 0): it needs an upper
bound on X. The one that every point of K_1 satisfies and the lifting keeps is diag(X) <= 1 (since
||a_j||_2 <= ||a_j||_1 <= 1), and with it the variable A no longer matters (A = 0 is always feasible):
the lifted relaxation has exactly the value of the L2 problem, min trace(W^T W X^{-1}) s.t.
diag(X) <= 1. `build(..., lifted=True)` builds that lifted form so the claim can be checked.

What this module adds. Gram matrices of vectors in the L1 ball satisfy the triangle inequalities

    X_ij + X_jk + X_ik >= -1,  X_ij - X_jk - X_ik >= -1,  -X_ij + X_jk - X_ik >= -1,
    -X_ij - X_jk + X_ik >= -1                                        for all i < j < k,

(X_ij = <a_i, a_j> is multilinear in (a_i, a_j, a_k), so its minimum over a product of L1 balls is
attained at vertices +-e_l, where the sum of the three pairwise products is at least -1; flipping the
sign of one vector gives the other three). They are valid for K_1 but cut off points of
{X PSD, diag(X) <= 1}, so with `cuts="triangle"` (the default) the bound is at least as tight as the
L2 relaxation and strictly tighter on some workloads (e.g. random low-rank WRelated). Hence

    (2/eps^2) * value(lifted or cuts=None)  <=  (2/eps^2) * value(cuts="triangle")  <=  OPT_1.

The number of cuts is 4 * C(n, 3) (about 166,000 at n = 64).
"""

from __future__ import annotations

import itertools
import math
import time

import cvxpy as cp
import numpy as np
import scipy.sparse as sp

from dpopt.privacy import Privacy
from dpopt.validation import check_choice
from dpopt.workloads import Workload
from formulations.model import Model
from formulations.schur import schur_block

NAME = "mm_pure"
CUTS = ("triangle", None)
# Sign patterns (on X_ij, X_jk, X_ik) of the four triangle inequalities.
_TRIANGLE_SIGNS = ((1, 1, 1), (1, -1, -1), (-1, 1, -1), (-1, -1, 1))


def triangle_matrix(n: int) -> sp.csr_matrix:
    """T (4 C(n,3) x n^2) with T vec(X) >= -1 the triangle inequalities (vec in column-major order)."""
    if n < 3:
        return sp.csr_matrix((0, n * n))
    triples = np.array(list(itertools.combinations(range(n), 3)), dtype=np.int64)
    i, j, k = triples.T
    pairs = [(i, j), (j, k), (i, k)]
    rows, cols, vals = [], [], []
    for p, signs in enumerate(_TRIANGLE_SIGNS):
        r = np.arange(len(triples)) * 4 + p
        for (a, b), sgn in zip(pairs, signs, strict=True):
            rows.append(r)
            cols.append(a + b * n)  # X[a, b] in column-major vec
            vals.append(np.full(len(triples), float(sgn)))
    return sp.csr_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
        shape=(4 * len(triples), n * n),
    )


def build(
    workload_or_gram: Workload | np.ndarray,
    *,
    cuts: str | None = "triangle",
    lifted: bool = False,
    p: int | None = None,
    zero_columns: str = "error",
) -> Model:
    """Convex relaxation of the eps-DP matrix mechanism (after seed 002, Section 1.2): a lower bound.

    workload_or_gram: a dpopt Workload or its Gram matrix W^T W (n x n).
    cuts: "triangle" adds the 4 C(n,3) triangle inequalities valid for Gram matrices of L1-ball vectors;
        None leaves the L2 relaxation diag(X) <= 1.
    lifted: also keep seed 002's lifted variable A (p x n, p = n unless given) with [[I, A], [A^T, X]]
        PSD and ||A[:, j]||_1 <= 1; this does not change the value (see the module docstring).
    The value (Model.scale * problem.value) is trace-units: multiply by 2/eps^2 (see `bound`).
    """
    check_choice(cuts, CUTS, "cuts")
    t0 = time.perf_counter()
    b = schur_block(workload_or_gram, zero_columns)
    data, s, X, Y = b.data, b.scale, b.X, b.Y
    n = data.G.shape[0]
    constraints = [b.lmi, cp.diag(X) <= 1]
    variables = {"X": X, "Y": Y}
    if cuts == "triangle" and n >= 3:
        constraints.append(triangle_matrix(n) @ cp.vec(X, order="F") >= -1)
    if lifted:
        p = n if p is None else int(p)
        if p < 1:
            raise ValueError(f"p (rows of the lifted A) must be >= 1, got {p}")
        A = cp.Variable((p, n), name="A")
        constraints += [cp.bmat([[np.eye(p), A], [A.T, X]]) >> 0, cp.norm1(A, axis=0) <= 1]
        variables["A"] = A
    return Model(
        name=NAME if cuts else f"{NAME}(no cuts)",
        problem=cp.Problem(cp.Minimize(cp.trace(Y)), constraints),
        variables=variables,
        scale=s,
        recover=None,
        build_seconds=time.perf_counter() - t0,
        data={"gram": data, "cuts": cuts, "lifted": lifted},
    )


def bound(value: float, privacy: Privacy) -> float:
    """Lower bound on the eps-DP total squared error: (2/eps^2) * value (Laplace variance convention)."""
    if not privacy.is_pure:
        raise ValueError("mm_pure bounds the eps-DP (delta = 0) matrix mechanism; got delta > 0")
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"value must be a finite number >= 0, got {value}")
    return privacy.variance_factor * value

