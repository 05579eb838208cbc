"""Strategies with a structured A (Kronecker, union, marginal) agree with the dense Strategy on small products and
answer 10^6-cell data vectors."""

import math

import numpy as np
import pytest
from reference_workloads import explicit

from dpopt.baselines import (
    hierarchical_strategy,
    identity_strategy,
    kron_strategy,
    wavelet_strategy,
)
from dpopt.error import expected_error, unit_error
from dpopt.kron_strategy import KronMatrix
from dpopt.marginal_strategy import MarginalMatrix, helmert_basis
from dpopt.privacy import Privacy, research_perturb
from dpopt.strategy import Strategy, StrategyError
from dpopt.workloads import AllRange, Identity, Kron, Marginals, Prefix, Stack, Total

# Kronecker routes vs the dense matrices here: sensitivities are products and maxima of a few sums (a
# few ulps: 1e-12); errors and estimates are solves with cond <= ~1e3 at n <= 72 (n cond eps < 2e-11:
# 1e-10, or 1e-9 where a dense pinv of random factors is involved).


def test_kron_strategy_matches_dense():
    parts = [hierarchical_strategy(6), wavelet_strategy(4), identity_strategy(3)]
    S = Strategy(KronMatrix(parts))
    D = kron_strategy(parts)
    W = Kron([AllRange(6), Prefix(4), Total(3)])
    assert S.shape == D.shape
    assert S.sens1 == pytest.approx(D.sens1, rel=1e-12)
    assert S.sens2 == pytest.approx(D.sens2, rel=1e-12)
    assert S.unit_error(W) == pytest.approx(unit_error(D, explicit(W)), rel=1e-10)
    for priv in (Privacy(0.5), Privacy(1.0, 1e-5)):
        assert S.expected_error(W, priv).total == pytest.approx(
            expected_error(D, explicit(W), priv).total, rel=1e-10
        )
    U = Stack([Kron([AllRange(6), Identity(4), Total(3)]), W], weights=[2.0, 1.0])
    dense_u = Stack([Kron([AllRange(6), Identity(4), Total(3)]), explicit(W)], weights=[2.0, 1.0])
    assert S.unit_error(U) == pytest.approx(unit_error(D, dense_u), rel=1e-10)
    # one Strategy type: the structured A is never formed behind the caller's back, and takes no B
    for dense_only in (lambda: S.gram, S.pinv, lambda: S.reconstruct(W)):
        with pytest.raises(StrategyError, match="held through its factors"):
            dense_only()
    np.testing.assert_array_equal(S.to_dense().A.toarray(), D.A.toarray())
    with pytest.raises(ValueError, match="give no B or gamma"):
        Strategy(KronMatrix(parts), B=np.eye(S.shape[0]))


def test_kron_support_detects_missing_directions():
    total = np.ones((1, 4))
    S = Strategy(KronMatrix([total, np.eye(3)]))
    ok = Kron([Total(4), Prefix(3)])
    bad = Kron([Prefix(4), Prefix(3)])
    assert S.supports(ok)
    assert not S.supports(bad)
    dense_frac = S.to_dense().unsupported_fraction(explicit(bad))
    assert S.unsupported_fraction(bad) == pytest.approx(dense_frac, rel=1e-10)
    with pytest.raises(StrategyError, match="does not support"):
        S.expected_error(bad, Privacy(1.0))


def test_direct_kron_strategy_answers_only_what_it_measures():
    """B = I on every factor (noise on queries): the answers are the measurements, so only that workload."""
    S = Strategy(KronMatrix([Strategy(Prefix(4).matrix(), B=np.eye(4)), Strategy(np.eye(3), B=np.eye(3))]))
    measured, other = Kron([Prefix(4), Identity(3)]), Kron([AllRange(4), Identity(3)])
    assert S.A.direct and S.unit_error(measured) == 12.0  # ||B||_F^2 = m
    np.testing.assert_array_equal(S.query_unit_variances(measured), np.ones(12))
    for call in (S.unit_error, S.unsupported_fraction, S.query_unit_variances):
        with pytest.raises(StrategyError, match="answers only the Kronecker product it measures"):
            call(other)


def test_estimate_is_least_squares_through_factors():
    rng = np.random.default_rng(3)
    A1, A2 = rng.standard_normal((7, 4)), rng.standard_normal((5, 3))
    S = KronMatrix([A1, A2])
    y = rng.standard_normal(35)
    dense = np.linalg.lstsq(np.kron(A1, A2), y, rcond=None)[0]
    np.testing.assert_allclose(S.estimate(y), dense, rtol=1e-10, atol=1e-10)


def test_answer_on_a_million_cells():
    """2^20 cells: measurement, least squares and W x_hat all through Kronecker matvecs."""
    S = Strategy(KronMatrix([hierarchical_strategy(1024), hierarchical_strategy(1024)]))
    W = Kron([Prefix(1024), Identity(1024)])
    rng = np.random.default_rng(0)
    x = rng.integers(0, 20, 1024 * 1024).astype(float)
    priv = Privacy(1.0, 1e-6)
    ans = S.answer(x, priv, rng, W)
    truth = W.matvec(x)
    assert ans.shape == truth.shape == (1024 * 1024,)
    realised = float(np.sum((ans - truth) ** 2))
    expected = S.expected_error(W, priv).total
    # The total of 2^20 correlated squared Gaussian errors, e^T e with e ~ N(0, C), has mean tr(C) and
    # variance 2 tr(C^2); C = s^2 (B1 B1^T) kron (B2 B2^T) with B_i = W_i A_i^+, so both factor.
    # Within 4 standard deviations (the relative SD is 1.3% here).
    Ap = np.linalg.pinv(hierarchical_strategy(1024).A.toarray())
    C1, C2 = (Prefix(1024).matrix() @ Ap), Ap
    C1, C2 = C1 @ C1.T, C2 @ C2.T
    rel_sd = math.sqrt(2 * np.sum(C1 * C1) * np.sum(C2 * C2)) / (np.trace(C1) * np.trace(C2))
    assert abs(realised / expected - 1) <= 4 * rel_sd


@pytest.mark.parametrize("kind", ["residual", "marginals"])
def test_marginal_strategy_matches_dense(kind):
    sizes = [2, 3, 4]
    W = Marginals(sizes, subsets=[(0, 1), (0, 2), (1, 2), (1,)], weights=[1.0, 2.0, 0.5, 1.5])
    rng = np.random.default_rng(5)
    if kind == "residual":
        subsets = [(), (0,), (1,), (2,), (0, 1), (0, 2), (1, 2)]
    else:
        subsets = [(0, 1), (0, 2), (1, 2), (0,)]
    S = Strategy(MarginalMatrix(sizes, kind, subsets, rng.random(len(subsets)) + 0.3))
    D = S.to_dense()
    Wd = explicit(W)
    assert S.sens2 == pytest.approx(D.sens2, rel=1e-12)
    if kind == "marginals":
        assert S.sens1 == pytest.approx(D.sens1, rel=1e-12)
    assert S.unit_error(W) == pytest.approx(unit_error(D, Wd), rel=1e-10)
    # Per-cell variances, weighted and summed over cells, give the total.
    cells = np.array([np.prod([sizes[i] for i in s]) for s in W.subsets])
    assert float(np.sum(W.weights**2 * cells * S.A.marginal_variances(W))) == pytest.approx(
        S.unit_error(W), rel=1e-10
    )
    # Least squares through the algebra equals W A^+ y for the same noisy measurements.
    x = rng.integers(0, 9, 24).astype(float)
    T = x.reshape(sizes)

    def tables(attrs):
        axes = tuple(i for i in range(3) if i not in attrs)
        return T.sum(axis=axes) if axes else T

    priv = Privacy(1.0, 1e-3)
    y = research_perturb(priv, np.random.default_rng(11))(S.A.measured_tables(tables), S.sens2)
    # measure(x) sums the same tables from x and draws the same noise from the same seed (sums of <= 24
    # integer counts are exact in floating point)
    np.testing.assert_array_equal(S.measure(x, priv, np.random.default_rng(11)), y)
    # same rows, noisy: each entry within 6 noise SDs (sigma_factor * sens2); P(any of < 100 beyond) < 2e-7
    np.testing.assert_allclose(y, D.A @ x, rtol=0, atol=6 * priv.sigma_factor * S.sens2)
    ours = np.concatenate([w * t.ravel() for w, t in zip(W.weights, S.A.reconstruct(S.A.blocks(y), W),
                                                           strict=True)])
    dense = Wd.sparse() @ (D.pinv() @ y)
    # a dense pseudo-inverse (n = 24, cond <= ~1e2 with weights in [0.3, 1.3]) vs the algebra, on answers
    # of size <= ~1e2: n cond eps ~ 5e-13 relative; 1e-9 and 1e-8 absolute
    np.testing.assert_allclose(ours, dense, rtol=1e-9, atol=1e-8)


def _operator_cases():
    from dpopt.union_strategy import UnionKronMatrix

    rng = np.random.default_rng(4)
    kron = KronMatrix([rng.random((5, 4)), np.ones((1, 3)), rng.random((2, 2))])
    union = UnionKronMatrix([kron, KronMatrix([np.eye(4), rng.random((2, 3)), np.eye(2)])], [0.5, 2.0], [0])
    resid = MarginalMatrix([4, 3, 2], "residual", [(), (0,), (1, 2), (0, 1, 2)], [1.0, 0.3, 2.0, 0.7])
    marg = MarginalMatrix([4, 3, 2], "marginals", [(0, 1), (2,), ()], [1.0, 0.3, 2.0])
    return [kron, union, resid, marg]


@pytest.mark.parametrize("A", _operator_cases(), ids=["kron", "union", "residual", "marginals"])
def test_strategy_operator_is_A_and_its_transpose(A):
    """A's `operator` (the workloads' Kron / Stack algebra) has A's shape and is the adjoint pair of the form's own
    measurements: y^T (A x) = (A^T y)^T x, with A x from the form (marginal tables for the marginal forms)."""
    rng = np.random.default_rng(9)
    x, y = rng.standard_normal(A.shape[1]), rng.standard_normal(A.shape[0])
    assert A.operator.shape == A.shape == A.to_matrix().shape
    Ax, ATy = A.measured(x), A.operator.rmatvec(y)
    # two sums of r (resp. n) <= 60 products of O(1) terms: (r + n) eps sum |y| |A| |x| bounds the difference
    scale = float(np.abs(y) @ abs(A.to_matrix()) @ np.abs(x))
    assert abs(float(y @ Ax) - float(ATy @ x)) <= 2 * sum(A.shape) * np.finfo(float).eps * scale
    # two routes to each entry of A x, each a sum of <= n products: within n eps max|A| sum|x| of the exact one
    np.testing.assert_allclose(Ax, A.operator.matvec(x), rtol=0, atol=2 * A.shape[1] * np.finfo(float).eps
                               * float(np.abs(x).sum()) * float(abs(A.to_matrix()).max()))


def test_helmert_basis_is_orthonormal_complement_of_ones():
    for n in (2, 5, 9):
        U = helmert_basis(n)
        # closed-form entries (square roots), n <= 9: a few ulps per entry, n eps per inner product
        np.testing.assert_allclose(U.T @ U, np.eye(n - 1), atol=1e-12)
        np.testing.assert_allclose(U.T @ np.ones(n), 0.0, atol=1e-12)


def test_marginal_strategy_refuses_unmeasured_residuals():
    W = Marginals([2, 3], k=2)
    S = Strategy(MarginalMatrix([2, 3], "marginals", [(0,), (1,)], [1.0, 1.0]))
    assert not S.supports(W)
    with pytest.raises(StrategyError, match="does not support"):
        S.expected_error(W, Privacy(1.0))
    with pytest.raises(ValueError, match="Gaussian"):
        Strategy(MarginalMatrix([2, 3], "residual", [(0,)], [1.0])).sensitivity(1)


def test_union_kron_strategy_sensitivity_and_error_match_dense():
    import scipy.sparse as sp

    from dpopt.union_strategy import UnionKronMatrix

    rng = np.random.default_rng(7)
    p1 = KronMatrix([rng.random((5, 4)), rng.random((3, 3))])
    p2 = KronMatrix([np.eye(4), rng.random((4, 3))])
    S = Strategy(UnionKronMatrix([p1, p2], [0.7, 1.6], assignment=[0, 1]))
    stacked = np.vstack([0.7 * p1.to_matrix().toarray(), 1.6 * p2.to_matrix().toarray()])
    np.testing.assert_array_equal(S.to_dense().A.toarray(), stacked)
    assert S.A.sens_exact
    assert S.sens1 == pytest.approx(np.abs(stacked).sum(axis=0).max(), rel=1e-12)
    assert S.sens2 == pytest.approx(np.sqrt((stacked**2).sum(axis=0).max()), rel=1e-12)
    U = Stack([Kron([AllRange(4), Prefix(3)]), Kron([Identity(4), Total(3)])], weights=[1.0, 2.0])
    dense = 0.0
    for wt, part, k in ((1.0, U.parts[0], 0), (2.0, U.parts[1], 1)):
        Wd = sp.csr_matrix(explicit(part).sparse()).toarray()
        Ak = [p1, p2][k].to_matrix().toarray() * [0.7, 1.6][k]
        dense += wt**2 * float(np.sum((Wd @ np.linalg.pinv(Ak)) ** 2))
    assert S.unit_error(U) == pytest.approx(dense, rel=1e-9)
    x = rng.integers(0, 5, 12).astype(float)
    priv = Privacy(1e6, 1e-6)
    ans = S.answer(x, priv, rng, U)
    # each answer's error is Gaussian with variance <= the total expected error E: within 6 sqrt(E)
    np.testing.assert_allclose(ans, U.matvec(x), rtol=0, atol=6 * math.sqrt(S.expected_error(U, priv).total))
    # a Stack over another product domain (4 x 3 -> 3 x 4) or not a Stack: refused by name, not by a shape error
    other = Stack([Kron([Prefix(3), AllRange(4)]), Kron([Total(3), Identity(4)])], weights=[1.0, 2.0])
    with pytest.raises(StrategyError, match=r"factor sizes \(4, 3\) but workload .* has \(3, 4\)"):
        S.unit_error(other)
    with pytest.raises(StrategyError, match="answers a Stack, got Kron"):
        S.unit_error(U.parts[0])


def test_wide_measured_marginals_are_never_expanded(monkeypatch):
    """A measured marginal over many attributes (the full table) is summed per subset, not expanded into 2^|T|."""
    import dpopt.marginal_strategy as ms

    sizes = [2, 3, 2, 4]
    W = Marginals(sizes, k=2)
    subsets = [(0, 1, 2, 3), (0, 1), (2, 3), (1,)]
    theta = [1.0, 0.5, 2.0, 0.25]
    expanded = ms.MarginalMatrix(sizes, "marginals", subsets, theta)
    expected = (expanded.unit_error(W), expanded.rank, [expanded.eigenvalue(A) for A in W.closure])
    monkeypatch.setattr(ms, "EXPAND_MAX_ATTRS", 1)  # every measured marginal but (1,) is now "wide"
    wide = ms.MarginalMatrix(sizes, "marginals", subsets, theta)
    assert wide._wide and set(wide._x) == {0, 2}
    # the same sums in another order: eigenvalues add <= 4 terms, the error <= 11 (closure of 2-way marginals of
    # 4 attributes), so reordering moves them by <= 11 eps ~ 2.4e-15 relative
    assert wide.unit_error(W) == pytest.approx(expected[0], rel=1e-13)
    np.testing.assert_allclose([wide.eigenvalue(A) for A in W.closure], expected[2], rtol=1e-13)
    assert wide.rank == expected[1] == 48  # the full table contains every other measured marginal
    monkeypatch.undo()
    # 40 attributes of 10 values: 2^40 subsets of the full table would not fit in memory
    full = ms.MarginalMatrix([10] * 40, "marginals", [tuple(range(40))], [1.0])
    assert full.rank == 10**40 and full.eigenvalue(0b101) == pytest.approx(1e-40, rel=1e-15)
