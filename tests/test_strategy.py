"""Strategy: sensitivities, construction from a Gram matrix, support checks."""

from __future__ import annotations

import numpy as np
import pytest

from dpopt.baselines import (
    hierarchical_strategy,
    identity_strategy,
    kron_strategy,
    total_strategy,
    wavelet_strategy,
    workload_strategy,
)
from dpopt.strategy import Strategy, StrategyError
from dpopt.workloads import AllRange, Identity, Prefix, Total


def test_sensitivities():
    A = np.array([[1.0, -2.0], [3.0, 0.5]])
    s = Strategy(A)
    assert s.sens1 == pytest.approx(4.0)
    assert s.sens2 == pytest.approx(np.sqrt(10.0))


@pytest.mark.parametrize("n", [2, 7, 16, 33])
def test_hierarchical_structure(n):
    h = hierarchical_strategy(n)
    A = h.A.toarray()
    assert set(np.unique(A)) <= {0.0, 1.0}
    # Every row is one interval [lo, hi) of cells (its ones are contiguous).
    intervals = []
    for row in A:
        cells = np.flatnonzero(row)
        assert cells.size and np.all(np.diff(cells) == 1)
        intervals.append((int(cells[0]), int(cells[-1]) + 1))
    assert len(set(intervals)) == len(intervals)
    # A binary tree with near-equal splits (docstring): the root is every cell, each node longer than one
    # cell has exactly two children, which split it into halves of lengths differing by at most one, and
    # the leaves are the n single cells; so there are 2n - 1 nodes.
    nodes = set(intervals)
    assert (0, n) in nodes and len(nodes) == 2 * n - 1
    for lo, hi in nodes:
        inner = [(a, b) for a, b in nodes if lo <= a and b <= hi and (a, b) != (lo, hi)]
        if hi - lo == 1:
            assert not inner
            continue
        children = [(a, b) for a, b in inner if not any(c <= a and b <= d and (c, d) != (a, b) for c, d in inner)]
        assert len(children) == 2 and sorted(children)[0][0] == lo and sorted(children)[1][1] == hi
        (a, m1), (m2, b) = sorted(children)
        assert m1 == m2 and abs((m1 - a) - (b - m2)) <= 1
    # Halving a length-n interval reaches single cells after ceil(log2 n) splits, so every cell lies on
    # at most ceil(log2 n) + 1 nodes (exactly that on the deepest path): sens1 = levels, sens2 = sqrt(levels).
    levels = int(np.ceil(np.log2(n))) + 1
    depth = A.sum(axis=0)
    assert depth.max() == levels
    assert h.sens1 == levels and h.sens2 == pytest.approx(np.sqrt(levels), rel=1e-15)
    assert h.rank == n == np.linalg.matrix_rank(A)


@pytest.mark.parametrize("n", [2, 8, 12, 64])
def test_wavelet_is_invertible_with_log_sensitivity(n):
    wv = wavelet_strategy(n)
    assert wv.shape == (n, n) and wv.rank == n
    if n & (n - 1) == 0:
        assert wv.sens2 == pytest.approx(np.sqrt(1 + np.log2(n)))


def test_from_gram_roundtrip_and_singular():
    rng = np.random.default_rng(0)
    M = rng.standard_normal((6, 6))
    X = M.T @ M
    s = Strategy.from_gram(X)
    np.testing.assert_allclose(s.gram, X, atol=1e-10)
    P = np.outer([1.0, 2.0, 0.0], [1.0, 2.0, 0.0])
    s2 = Strategy.from_gram(P)
    np.testing.assert_allclose(s2.gram, P, atol=1e-10)
    assert s2.rank == 1
    with pytest.raises(ValueError, match="positive semidefinite"):
        Strategy.from_gram(-np.eye(3))


def test_supports_and_clear_error():
    assert identity_strategy(8).supports(AllRange(8))
    assert hierarchical_strategy(8).supports(Prefix(8))
    assert total_strategy(8).supports(Total(8))
    assert not total_strategy(8).supports(Identity(8))
    with pytest.raises(StrategyError, match="does not support workload identity"):
        total_strategy(8).check_supports(Identity(8))
    with pytest.raises(StrategyError, match="covers 8 cells"):
        identity_strategy(8).check_supports(AllRange(9))


def test_factorisation_residual():
    w = AllRange(6)
    s = workload_strategy(w)
    assert s.residual(w) == pytest.approx(0.0, abs=1e-12)
    B_bad = np.ones((w.m, w.m))
    bad = Strategy(s.A, B=B_bad)
    assert not bad.supports(w)
    with pytest.raises(ValueError, match="columns but A has"):
        Strategy(np.eye(3), B=np.ones((2, 4)))


def test_kron_strategy_sensitivity_is_product():
    a, b = hierarchical_strategy(4), wavelet_strategy(8)
    k = kron_strategy([a, b])
    assert k.sens1 == pytest.approx(a.sens1 * b.sens1)
    assert k.sens2 == pytest.approx(a.sens2 * b.sens2)


def test_rejects_bad_strategies():
    with pytest.raises(ValueError, match="all zeros"):
        Strategy(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="NaN or infinite"):
        Strategy(np.array([[np.inf, 1.0]]))


def test_dense_answer_is_B_of_the_noisy_measurements_drawn_once():
    # One draw z of r noise values: answer returns W A^+ (A x + z), the data estimate A^+ (A x + z) without a
    # workload, and the per-query variances are the squared row norms of W A^+ (computed here from lstsq).
    from dpopt.privacy import Privacy

    W = Prefix(8)
    s = hierarchical_strategy(8)
    A = s.A.toarray()
    x = np.arange(8.0)
    priv = Privacy(1.0)
    z = priv.sample_noise(s.sens1, A.shape[0], np.random.default_rng(3))
    B = np.linalg.lstsq(A.T, W.matrix().T, rcond=None)[0].T  # W A^+ for A of full column rank
    got = s.answer(x, priv, np.random.default_rng(3), W)
    # B (A x + z) against the same draw; the scale is ||B||_inf * (|A x| + |z|), rounded relative 1e-12
    scale = np.abs(B).sum(axis=1).max() * (np.abs(A @ x).max() + np.abs(z).max())
    np.testing.assert_allclose(got, B @ (A @ x + z), rtol=0, atol=1e-12 * scale)
    x_hat = s.answer(x, priv, np.random.default_rng(3))
    np.testing.assert_allclose(x_hat, np.linalg.pinv(A) @ (A @ x + z), rtol=0, atol=1e-12 * scale)
    # two routes (Cholesky inverse of A^T A, lstsq) on an A of condition number below 10: each is exact to
    # about cond^2 * 1e-16, far inside 1e-10
    np.testing.assert_allclose(s.query_unit_variances(W), (B**2).sum(axis=1), rtol=1e-10)
    with pytest.raises(StrategyError, match="give the workload"):
        Strategy(A, B=B).answer(x, priv, np.random.default_rng(3))
