"""SVD bound invariances (seed 004 Prop. 3.6), bound <= every baseline, supreme bound, Thm 5.6, LRM lemmas."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from dpopt.baselines import (
    hierarchical_strategy,
    identity_strategy,
    wavelet_strategy,
    workload_strategy,
)
from dpopt.bounds import (
    lrm_lower_bound_lemma4,
    lrm_upper_bound_lemma3,
    range_projections,
    supreme_svd_bound,
    svd_bound,
    thm56_upper_bound,
)
from dpopt.error import expected_error
from dpopt.linalg import svdb_strategy_gram
from dpopt.privacy import Privacy
from dpopt.strategy import Strategy
from dpopt.workloads import AllPredicate, AllRange, ExplicitWorkload, WRelated

matrices = arrays(
    np.float64,
    st.tuples(st.integers(2, 8), st.integers(2, 8)),
    elements=st.floats(-5, 5, allow_nan=False, allow_infinity=False, width=32),
).filter(lambda W: np.abs(W).sum() > 1e-3)


@settings(max_examples=60, deadline=None)
@given(W=matrices, seed=st.integers(0, 2**31 - 1))
def test_svd_bound_invariances(W, seed):
    rng = np.random.default_rng(seed)
    base = svd_bound(W)
    tol = dict(rel=1e-7, abs=1e-9 * max(1.0, np.abs(W).max() ** 2))
    assert svd_bound(W[rng.permutation(W.shape[0])]) == pytest.approx(base, **tol)
    assert svd_bound(W[:, rng.permutation(W.shape[1])]) == pytest.approx(base, **tol)
    Q, _ = np.linalg.qr(rng.standard_normal((W.shape[0], W.shape[0])))
    assert svd_bound(Q @ W) == pytest.approx(base, **tol)
    # the singular values of W directly (Def. 4.1) agree with the Gram route (Prop. 4.3)
    s = np.linalg.svd(W, compute_uv=False)
    assert base == pytest.approx(s.sum() ** 2 / W.shape[1], **tol)


@settings(max_examples=30, deadline=None)
@given(W=matrices)
def test_every_baseline_at_or_above_bound(W):
    w = ExplicitWorkload(W)
    n = W.shape[1]
    for privacy in (Privacy(1.0), Privacy(1.0, 1e-6)):
        bound = privacy.variance_factor * svd_bound(w)
        for s in (identity_strategy(n), hierarchical_strategy(n), wavelet_strategy(n), workload_strategy(w)):
            if s.supports(w):
                assert expected_error(s, w, privacy).total >= bound * (1 - 1e-9)


def test_svdb_strategy_meets_thm56():
    for w in (AllRange(16), WRelated(10, 12, 10, seed=1)):
        G = w.gram()
        s = Strategy.from_gram(svdb_strategy_gram(G))
        err = expected_error(s, w, Privacy(1.0, 1e-6)).total / Privacy(1.0, 1e-6).variance_factor
        assert err == pytest.approx(thm56_upper_bound(w), rel=1e-8)
        assert svd_bound(w) <= thm56_upper_bound(w) * (1 + 1e-12)


def test_thm56_is_tight_for_variable_agnostic():
    w = AllPredicate(8)
    assert thm56_upper_bound(w) == pytest.approx(svd_bound(w), rel=1e-10)


def test_supreme_svd_bound_example_4_4():
    # Example 4.4: queries [1, 0, ..., 0] and [t, ..., t] with n > 8, t < 1/8: projecting onto cell 0 raises the bound.
    n, t = 16, 0.05
    W = np.vstack([np.eye(1, n), np.full((1, n), t)])
    base = svd_bound(W)
    sup, cells = supreme_svd_bound(W, [np.array([0])] + list(range_projections(n, stride=4)))
    assert sup > base
    assert list(cells) == [0]
    assert sup == pytest.approx(1 + t**2)


def test_lrm_lemma3_is_the_error_of_its_decomposition():
    w = WRelated(12, 20, 4, seed=0)
    W = w.matrix()
    U, s, Vt = np.linalg.svd(W, full_matrices=False)
    r = 4
    B = math.sqrt(r) * U[:, :r] * s[:r]
    L = Vt[:r] / math.sqrt(r)
    dec = Strategy(L, B=B)
    assert dec.sens1 <= 1 + 1e-12
    err = expected_error(dec, w, Privacy(0.5)).total
    assert err <= lrm_upper_bound_lemma3(w, 0.5) * (1 + 1e-12)
    assert lrm_upper_bound_lemma3(w, 0.5) == pytest.approx(2 * r * np.sum(s**2) / 0.25)
    # Lemma 4 written out from the paper (seed 000, Appendix): (2^r / r! prod_k lambda_k)^(2/r) r^3 / eps^2,
    # lambda_k the r non-zero singular values of W (here by numpy's SVD; the library takes square roots of
    # eigenvalues of W^T W: relative error ~ n kappa(W)^2 u on each; the r-fold product to the power 2/r
    # keeps that order; 10 times it).
    kappa = s[0] / s[r - 1]
    lemma4 = (2**r / math.factorial(r) * np.prod(s[:r])) ** (2 / r) * r**3 / 0.25
    assert np.sum(s > 1e-10 * s[0]) == r
    assert lrm_lower_bound_lemma4(w, 0.5) == pytest.approx(lemma4, rel=10 * W.shape[1] * kappa**2 * np.finfo(float).eps)
    with pytest.raises(ValueError, match="epsilon"):
        lrm_upper_bound_lemma3(w, 0.0)


@pytest.mark.parametrize("n", [1, 2, 7, 300])
def test_prefix_closed_form_singular_values_and_bound(n):
    """Prefix(n)'s closed-form singular values against LAPACK's SVD of the matrix (backward stable: each within
    10 n eps sigma_max, a generous multiple of its error bound), and its SVDB within that of the SVD's while
    never above the exact value the SVD brackets."""
    from dpopt.bounds import EPS
    from dpopt.workloads import Prefix

    w = Prefix(n)
    s = np.sort(np.linalg.svd(np.tril(np.ones((n, n))), compute_uv=False))
    closed = np.sort(w.singular_values())
    slack = 10 * n * EPS * s[-1]
    assert np.all(np.abs(closed - s) <= slack)
    assert w.svd_bound() <= (s.sum() + n * slack) ** 2 / n
    assert w.svd_bound() >= (s.sum() - n * slack) ** 2 / n * (1 - 1e-12)
