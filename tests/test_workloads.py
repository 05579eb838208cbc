"""Workload families: shapes, closed-form Grams against materialised matrices, reproducibility, bad input."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp
from reference_workloads import allrange_matrix

from dpopt.workloads import (
    AllPredicate,
    AllRange,
    ExplicitWorkload,
    GramWorkload,
    Identity,
    Marginals,
    Prefix,
    Stack,
    Total,
    WDiscrete,
    WidthK,
    WorkloadTooLargeError,
    WRange,
    WRelated,
    all_range_nd,
    marginal,
)


@pytest.mark.parametrize("n", [1, 2, 5, 16])
def test_all_range_matrix_and_closed_form_gram(n):
    w = AllRange(n)
    W = allrange_matrix(n)
    assert w.shape == (n * (n + 1) // 2, n)
    np.testing.assert_array_equal(w.matrix(), W)
    np.testing.assert_array_equal(w.gram(), W.T @ W)
    assert len(w.row_labels()) == w.m


@pytest.mark.parametrize("n", [1, 3, 8])
def test_prefix_gram_closed_form(n):
    W = np.tril(np.ones((n, n)))
    np.testing.assert_array_equal(Prefix(n).matrix(), W)
    np.testing.assert_array_equal(Prefix(n).gram(), W.T @ W)


def test_width_k_rows():
    w = WidthK(10, 3)
    W = w.matrix()
    assert W.shape == (8, 10)
    assert np.all(W.sum(axis=1) == 3)
    np.testing.assert_array_equal(W[2], [0, 0, 1, 1, 1, 0, 0, 0, 0, 0])
    with pytest.raises(ValueError, match="width k"):
        WidthK(4, 5)


def test_identity_total():
    np.testing.assert_array_equal(Identity(4).matrix(), np.eye(4))
    np.testing.assert_array_equal(Total(4).gram(), np.ones((4, 4)))


def test_random_families_reproducible_and_seeded():
    for make in (lambda s: WRange(20, 30, seed=s), lambda s: WDiscrete(20, 30, seed=s),
                 lambda s: WRelated(20, 30, 4, seed=s)):
        np.testing.assert_array_equal(make(3).matrix(), make(3).matrix())
        assert not np.array_equal(make(3).matrix(), make(4).matrix())
    gen_a, gen_b = np.random.default_rng(7), np.random.default_rng(7)
    np.testing.assert_array_equal(WRange(5, 9, seed=gen_a).matrix(), WRange(5, 9, seed=gen_b).matrix())


def test_wrange_rows_are_ranges():
    W = WRange(50, 40, seed=1).matrix()
    for row in W:
        idx = np.flatnonzero(row)
        assert idx.size >= 1 and np.all(np.diff(idx) == 1) and np.all(row[idx] == 1)


def test_wdiscrete_variants():
    lit = WDiscrete(200, 100, seed=0).matrix()
    zero = WDiscrete(200, 100, seed=0, off_value=0).matrix()
    assert set(np.unique(lit)) == {-1.0, 1.0}
    assert set(np.unique(zero)) == {0.0, 1.0}
    np.testing.assert_array_equal(lit == 1, zero == 1)  # same selected entries
    # 20,000 Bernoulli(0.02) entries: standard error sqrt(0.02 * 0.98 / 20000) = 0.001, so 5 SE
    assert abs((zero == 1).mean() - 0.02) < 0.005
    with pytest.raises(ValueError, match="off_value"):
        WDiscrete(3, 3, off_value=2)


def test_wrelated_rank():
    w = WRelated(30, 40, 6, seed=2)
    # Rank by a stated gap rather than matrix_rank's threshold (40 * eps_mach * s_max, the same order as
    # the rounding floor of a product of random factors): a backward-stable SVD puts the exactly-zero
    # singular values below ~ min(m, n) * eps_mach * s_max ~ 1e-14 * s_max, and the six nonzero ones of
    # random Gaussian factors are order s_max, far above 1e-8 * s_max.
    sv = np.linalg.svd(w.matrix(), compute_uv=False)
    assert sv[5] > 1e-8 * sv[0] and sv[6] < 1e-12 * sv[0]


def test_all_predicate_gram_matches_enumeration():
    n = 5
    rows = np.array(list(itertools.product([0, 1], repeat=n)), dtype=float)
    w = AllPredicate(n)
    assert w.shape == (2**n, n)
    # The right side is exact (integer counts); the left is an exact Gram times exp(log 8), which exp and
    # log return to within an ulp or two each: a few 1e-16 relative, so 1e-13.
    np.testing.assert_allclose(np.exp(w.gram_log_scale) * w.gram(), rows.T @ rows, rtol=1e-13)
    with pytest.raises(WorkloadTooLargeError):
        AllPredicate(1024).matrix()
    assert AllPredicate(1024).gram().shape == (1024, 1024)


def test_kron_and_all_range_nd():
    w = all_range_nd([3, 4])
    W = np.kron(allrange_matrix(3), allrange_matrix(4))
    np.testing.assert_array_equal(w.matrix(), W)
    np.testing.assert_array_equal(w.gram(), W.T @ W)  # integer entries: exact in floating point
    assert w.shape == W.shape


def test_marginals_data_cube():
    sizes = [2, 3, 2]
    w = Marginals(sizes, k=1)
    assert w.shape == (2 + 3 + 2, 12)
    W = w.matrix()
    # each 1-way marginal's rows partition the cells
    assert np.all(W.sum(axis=0) == 3)
    m01 = marginal(sizes, [0, 1]).matrix()
    assert m01.shape == (6, 12) and np.all(m01.sum(axis=0) == 1)
    weighted = Marginals(sizes, subsets=[(0,), (1, 2)], weights=[2.0, 1.0])
    # integer Grams scaled by 2^2: exact in floating point
    np.testing.assert_array_equal(
        weighted.gram(), 4 * marginal(sizes, [0]).gram() + marginal(sizes, [1, 2]).gram())


def test_stack_weights_and_gram():
    a, b = Prefix(5), Identity(5)
    s = Stack([a, b], weights=[3.0, 0.5])
    # 0/1 matrices times 3 and 2^-1, and their Gram (sums of 9s and 1/4s): all exact in floating point
    np.testing.assert_array_equal(s.matrix(), np.vstack([3 * a.matrix(), 0.5 * b.matrix()]))
    np.testing.assert_array_equal(s.gram(), s.matrix().T @ s.matrix())
    with pytest.raises(ValueError, match="same number of cells"):
        Stack([Prefix(3), Prefix(4)])
    with pytest.raises(ValueError, match="positive"):
        Stack([a, b], weights=[1.0, -1.0])


def test_explicit_workload_validation():
    with pytest.raises(ValueError, match="NaN or infinite"):
        ExplicitWorkload(np.array([[1.0, np.nan]]))
    with pytest.raises(ValueError, match="at least one row"):
        ExplicitWorkload(np.zeros((0, 3)))
    with pytest.raises(ValueError, match="2-D"):
        ExplicitWorkload(np.ones(3))
    with pytest.raises(ValueError, match="row_labels"):
        ExplicitWorkload(np.ones((2, 2)), row_labels=["a"])
    w = ExplicitWorkload(sp.csr_matrix(np.eye(3)), row_labels=["a", "b", "c"])
    assert w.row_labels() == ["a", "b", "c"]
    np.testing.assert_array_equal(w.gram(), np.eye(3))


def test_gram_workload_validation():
    with pytest.raises(ValueError, match="symmetric"):
        GramWorkload(np.array([[1.0, 2.0], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="positive semidefinite"):
        GramWorkload(np.array([[1.0, 2.0], [2.0, 1.0]]))
    g = GramWorkload(AllRange(6).gram())
    assert g.shape == (6, 6) and not g.has_rows


@pytest.mark.parametrize("bad", [0, -3, 2.5, "4", True])
def test_sizes_must_be_positive_integers(bad):
    with pytest.raises(ValueError, match="positive integer"):
        AllRange(bad)


def test_boxes_are_the_explicit_box_rows_and_keep_the_kronecker_form():
    # query q of boxes is the indicator of [lo1, hi1] x [lo2, hi2] in row-major order, np.kron of the two interval
    # indicators; held as a union of one-row Kronecker products, so a Kronecker strategy's per-query variances go
    # through its factors: for a product X1 (x) X2 of pseudo-inverted Grams they are (a^T X1 a)(b^T X2 b)
    from dpopt.workloads import Stack, boxes

    rng = np.random.default_rng(3)
    n1, n2, m = 6, 5, 9
    a, b = rng.integers(0, n1, (2, m)), rng.integers(0, n2, (2, m))
    lo, hi = (a.min(0), b.min(0)), (a.max(0), b.max(0))
    W = boxes((n1, n2), lo, hi)
    assert isinstance(W, Stack) and W.kron_parts and W.domain_sizes == (n1, n2) and W.shape == (m, n1 * n2)

    def ind(n, i, j):
        v = np.zeros(n)
        v[i:j + 1] = 1.0
        return v

    rows = np.array([np.kron(ind(n1, lo[0][q], hi[0][q]), ind(n2, lo[1][q], hi[1][q])) for q in range(m)])
    assert np.array_equal(W.sparse().toarray(), rows)
    x = rng.normal(size=n1 * n2)
    # each answer sums at most 30 terms: round-off below 30 eps sum|x_i| per query, far inside 1e-12 of that sum
    np.testing.assert_allclose(W.matvec(x), rows @ x, rtol=0, atol=1e-12 * np.abs(rows).sum(1).max() * np.abs(x).max())
    from dpopt.mechanisms import make_mechanism
    from dpopt.privacy import Privacy

    s = make_mechanism("hierarchical").fit(W, Privacy(1.0)).strategy_
    A = s.matrix()
    A = A.toarray() if sp.issparse(A) else np.asarray(A)
    expect = np.einsum("ij,ij->i", rows, rows @ np.linalg.pinv(A.T @ A))
    # a hierarchy over at most 6 cells: A^T A's condition number is below 1e3, far inside 1e-9 of round-off
    np.testing.assert_allclose(s.query_unit_variances(W), expect, rtol=1e-9)
    for bad in (((0,), (0,)), ((np.array([0]), np.array([0])), (np.array([6]), np.array([0])))):
        with pytest.raises(ValueError):
            boxes((n1, n2), *bad)
    with pytest.raises(ValueError, match="low <= high"):
        boxes((n1, n2), (np.array([3]), np.array([0])), (np.array([2]), np.array([0])))
