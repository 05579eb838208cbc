"""The residual Kronecker family for unions of Kronecker products (`ResidualKronMatrix`, `dpopt.solvers.residual_kron`,
`residual_kron_max`, `union_bound`): every number it reports recomputed from dense matrices on small domains.

Tolerances. The dense side computes trace(W^T W X^+) and w^T X^+ w from the formed A with eigendecompositions
and pseudo-inverses of n x n matrices (n <= 72 here) whose condition numbers stay below about 1e5 (the factors are
certified optima or random well-conditioned matrices), so both sides agree to about kappa n eps < 1e-9 relative:
RTOL = 1e-8 leaves a margin of 10. Bounds are compared with their own certificates, which only round down.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from dpopt.mechanisms import make_mechanism
from dpopt.mechanisms import matrix as matrix_mod
from dpopt.privacy import Privacy
from dpopt.solvers.convex_dp import solve_convex_dp
from dpopt.solvers.residual_kron import UnionTerms, optimize_residual_kron, residual_factor
from dpopt.solvers.residual_kron_max import exposed_rows, optimize_residual_kron_max
from dpopt.solvers.union_bound import ProductDual, parts_bound, union_lower_bound
from dpopt.strategy import Strategy
from dpopt.union_strategy import ResidualKronMatrix
from dpopt.workloads import (
    AllRange,
    Identity,
    Kron,
    Marginals,
    Prefix,
    Stack,
    Total,
    kron_marginals,
)

RTOL = 1e-8
APPROX = Privacy(1.0, 1e-6)


def _random_matrix(sizes, full=True, drop=(), seed=0):
    """A ResidualKronMatrix with random oblique bases and random factors annihilating them (parts `drop` left out)."""
    rng = np.random.default_rng(seed)
    bases = [(p := rng.random(n) + 0.2) / p.sum() for n in sizes]
    parts, weights = [], []
    for r in range(len(sizes) + 1):
        for A in itertools.combinations(range(len(sizes)), r):
            if A in drop:
                continue
            Bs = []
            for i in A:
                B = rng.standard_normal((sizes[i] - 1 if full else 1, sizes[i]))
                Bs.append(B - np.outer(B @ bases[i], np.ones(sizes[i])))  # B phi = 0 since 1^T phi = 1
            parts.append((A, Bs))
            weights.append(rng.random() + 0.5)
    return ResidualKronMatrix(sizes, bases, parts, weights)


def _union(sizes):
    return Stack([Kron([Prefix(sizes[0]), Total(sizes[1]), AllRange(sizes[2])]),
                  Kron([Identity(sizes[0]), Prefix(sizes[1]), Total(sizes[2])]),
                  Kron([Total(n) for n in sizes])], [1.0, 2.0, 0.5])


def test_residual_matrix_agrees_with_its_dense_form():
    S = Strategy(_random_matrix((3, 4, 5)))
    D = S.to_dense()
    W = _union((3, 4, 5))
    assert S.unsupported_fraction(W) == 0.0 and D.unsupported_fraction(W) < 1e-12
    assert S.unit_error(W) == pytest.approx(D.unit_error(W), rel=RTOL)
    assert S.sens2 == pytest.approx(D.sens2, rel=1e-12)
    np.testing.assert_allclose(S.query_unit_variances(W), D.query_unit_variances(W), rtol=RTOL)
    y = np.random.default_rng(1).standard_normal(S.shape[0])
    np.testing.assert_allclose(S.answers(y, W), D.answers(y, W), rtol=RTOL, atol=RTOL * np.abs(D.answers(y, W)).max())
    x = np.random.default_rng(2).random(60)
    np.testing.assert_allclose(S.measured(x), D.measured(x), rtol=1e-12)
    assert S.rank == D.rank == 60


def test_unmeasured_or_deficient_parts_are_caught():
    W = _union((3, 4, 5))
    missing = Strategy(_random_matrix((3, 4, 5), drop=((0, 2),)))
    assert missing.unsupported_fraction(W) > 0.1 and missing.to_dense().unsupported_fraction(W) > 0.1
    assert not missing.supports(W)
    thin = Strategy(_random_matrix((3, 4, 5), full=False))  # rank-1 factors: phi-perp is not covered
    assert thin.unsupported_fraction(W) > 0.1 and not thin.supports(W)
    only_total = Stack([Kron([Total(n) for n in (3, 4, 5)])])
    assert thin.unsupported_fraction(only_total) == 0.0  # the total needs the empty part only


def test_factors_must_annihilate_their_base():
    with pytest.raises(ValueError, match="annihilate"):
        ResidualKronMatrix((3,), [np.full(3, 1 / 3)], [((0,), [np.eye(3)])], [1.0])
    with pytest.raises(ValueError, match="summing to 1"):
        ResidualKronMatrix((3,), [np.ones(3)], [((), [])], [1.0])


def test_residual_factor_is_the_certified_optimum_shorted():
    """Shorting keeps the value: trace(M^T G M Y^+) equals the solver's certified optimum, with diag(Y) <= 1."""
    G = Prefix(7).gram()
    phi = np.linspace(1.0, 2.0, 7)
    phi /= phi.sum()
    f = residual_factor(G, phi)
    M = np.eye(7) - np.outer(phi, np.ones(7))
    value = float(np.einsum("ij,ij->", M.T @ G @ M, f.Yp))
    assert value <= f.result.fun * (1 + RTOL)
    assert value >= f.result.dual_bound * (1 - RTOL)
    assert np.abs(f.B @ phi).max() < 1e-12 * np.abs(f.B).max()
    assert np.diag(f.B.T @ f.B).max() == pytest.approx(1.0, rel=1e-12)


@pytest.mark.parametrize("factor", ["prefix", "range"])
def test_family_error_recomputed_from_dense_matrices(factor):
    """The family's reported error (at its exact sensitivity) equals P sens^2 trace(W^T W (A^T A)^+) from A formed;
    it lies between the dense certified optimum and the family at the orthogonal bases."""
    W = kron_marginals([5, 4, 3], [1, 2], factor)
    M, res = optimize_residual_kron(W)
    S = Strategy(M)
    report = S.expected_error(W, APPROX)
    A = M.to_matrix().toarray()
    Wd = W.matrix()
    dense = np.trace(Wd @ np.linalg.pinv(A.T @ A, hermitian=True) @ Wd.T) * (np.linalg.norm(A, axis=0).max()) ** 2
    assert report.total == pytest.approx(APPROX.variance_factor * dense, rel=RTOL)
    assert report.total / APPROX.variance_factor <= res.fun * (1 + RTOL)  # the exact sensitivity is never above 1
    assert res.fun <= res.extra["orthogonal_fun"] * (1 + RTOL)
    opt = solve_convex_dp(Wd.T @ Wd, tol=1e-9)
    assert res.fun >= opt.dual_bound * (1 - RTOL)


def test_family_is_residual_planner_on_marginals():
    """Identity factors at the orthogonal bases: the family is ResidualPlanner's optimum, the SVD bound."""
    W = Marginals([3, 4, 5], k=2)
    M, res = optimize_residual_kron(W)
    assert res.fun == pytest.approx(W.svd_bound(), rel=1e-9)
    for phi in M.bases:
        np.testing.assert_allclose(phi, np.full(len(phi), 1 / len(phi)), atol=1e-7)


def test_bounds_never_above_the_dense_optimum_or_the_family():
    """sum of the parts' SVD bounds <= parts bound <= product dual <= dense optimum <= family (1,2-way 4^3)."""
    for factor in ("prefix", "range"):
        W = kron_marginals([4, 4, 4], [1, 2], factor)
        terms = UnionTerms.of(W)
        bound, info = union_lower_bound(terms)
        opt = solve_convex_dp(W.gram(), tol=1e-10)
        _, res = optimize_residual_kron(W)
        parts_svd = sum(w**2 * part.svd_bound() for w, part in zip(W.weights, W.parts, strict=True))
        assert parts_svd <= info["parts"] * (1 + 1e-12)
        assert info["parts"] <= bound and info["svd_bound"] <= bound
        assert info["svd_bound"] == pytest.approx(W.svd_bound(), rel=1e-9)
        assert bound <= opt.fun
        assert opt.dual_bound <= res.fun * (1 + RTOL)


def test_product_dual_gradient_matches_differences():
    """d value / d log u from the eigenbasis against central differences (step 1e-5: error O(1e-10) relative)."""
    dual = ProductDual(UnionTerms.of(kron_marginals([4, 3, 3], [1, 2], "prefix")))
    rng = np.random.default_rng(0)
    us = [np.exp(0.3 * rng.standard_normal(n)) for n in (4, 3, 3)]
    p = dual.evaluate(us)
    h = 1e-5 * rng.standard_normal(4)
    up = [us[0] * np.exp(h), us[1], us[2]]
    down = [us[0] * np.exp(-h), us[1], us[2]]
    diff = (dual.evaluate(up, False).value - dual.evaluate(down, False).value) / 2
    assert diff == pytest.approx(float(p.grad[0] @ h), rel=1e-5)
    assert p.bound <= p.value


def test_groups_bound_a_union_too_large_for_one_dual():
    W = kron_marginals([4, 4, 4], [1, 2], "prefix")
    terms = UnionTerms.of(W)
    whole, _ = union_lower_bound(terms)
    split, info = union_lower_bound(terms, max_rows=40)
    assert len(info["groups"]) > 1
    assert parts_bound(terms) <= split <= whole


def test_exposed_rows_keep_every_maximiser():
    rng = np.random.default_rng(3)
    F = rng.random((40, 2))
    keep = exposed_rows(F)
    for c in rng.random((200, 2)):
        assert (F[keep] @ c).max() == pytest.approx((F @ c).max(), rel=1e-15)
    G = rng.random((40, 3))
    keep = exposed_rows(G)
    for c in rng.random((200, 3)):
        assert (G[keep] @ c).max() == pytest.approx((G @ c).max(), rel=1e-15)


@pytest.mark.parametrize("factor", ["prefix", "range"])
def test_largest_variance_recomputed_from_dense_matrices(factor):
    """The max family's largest variance equals max_q w_q^T (A^T A)^+ w_q sens^2 from A formed; its certified bound
    lies below the dense minimax optimum's upper value."""
    from dpopt.solvers.minimax import solve_minimax

    W = kron_marginals([4, 3, 3], [1, 2], factor)
    M, res = optimize_residual_kron_max(W)
    A = M.to_matrix().toarray()
    Wd = W.matrix()
    dense = np.einsum("ij,jk,ik->i", Wd, np.linalg.pinv(A.T @ A, hermitian=True), Wd)
    dense_max = dense.max() * np.linalg.norm(A, axis=0).max() ** 2
    assert np.sum(M.weights**2) == pytest.approx(1.0, rel=1e-12)  # unit factors: sensitivity^2 <= sum w_A^2 = 1
    assert res.fun * (1 + RTOL) >= dense_max  # fun is at sensitivity 1; the exact sensitivity is at most 1
    # the certified factors have unit diagonals where their multipliers are positive (here everywhere): the exact
    # sensitivity is 1 up to the factor solves' relative gap 1e-10, well inside 1e-6
    assert dense_max == pytest.approx(res.fun, rel=1e-6)
    assert res.extra["family_bound"] <= res.fun
    mm = solve_minimax(Wd, 1.0, tol=1e-6)
    assert res.dual_bound <= mm.fun
    assert mm.dual_bound <= res.fun


def test_mm_optimal_fits_a_large_union_through_the_family(monkeypatch):
    """Above UNION_DENSE_MAX_CELLS mm-optimal answers through the family, its certified bound below its error and
    below the dense optimum (here the limit is lowered so that the dense optimum is known)."""
    monkeypatch.setattr(matrix_mod, "UNION_DENSE_MAX_CELLS", 10)
    W = kron_marginals([4, 4, 3], [1, 2], "prefix")
    for objective in ("sum", "max"):
        mech = make_mechanism("mm-optimal", objective=objective).fit(W, APPROX)
        rec = mech.record()
        assert mech.strategy_.name == "residual-kron"
        assert rec["certified_bound"] > 0 and rec["gap"] >= 0
        if objective == "sum":
            assert rec["certified_bound"] <= rec["expected_total_error"]
            dense = solve_convex_dp(W.gram(), tol=1e-10)
            assert rec["certified_bound"] <= APPROX.variance_factor * dense.fun
            assert rec["expected_total_error"] == pytest.approx(
                APPROX.variance_factor * mech.strategy_.unit_error(W) * mech.strategy_.sens2**2, rel=1e-12)
        else:
            variances = mech.query_unit_variances() * APPROX.variance_factor * mech.strategy_.sens2**2
            assert rec["certified_bound"] <= variances.max()
    assert math.isfinite(rec["bound"])
