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
    levels = int(np.ceil(np.log2(n))) + 1
    # every cell is covered once per level it reaches; root covers all, leaves are single cells
    assert A[0].sum() == n
    assert h.sens1 <= levels and h.rank == n
    assert set(np.unique(A)) <= {0.0, 1.0}


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
