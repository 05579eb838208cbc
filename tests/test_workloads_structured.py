"""Structured workloads (Kron, Stack of Krons, Marginals) agree with their explicit rows on small products; they never
need the rows on large ones."""

import math

import numpy as np
import pytest
from reference_workloads import explicit

from dpopt.bounds import svd_bound
from dpopt.linalg import column_norm_powers, kron_matvec
from dpopt.workloads import (
    AllRange,
    Identity,
    Kron,
    Marginals,
    Prefix,
    Stack,
    Total,
    WidthK,
    Workload,
    WorkloadTooLargeError,
    WRange,
    kron_form,
    range_gram,
)

EPS = np.finfo(float).eps


def assert_products_close(ours: np.ndarray, M: np.ndarray, X: np.ndarray) -> None:
    """ours = M @ X by another summation order: |error| <= 2 n eps (|M| |X|) componentwise (n = inner size)."""
    bound = 2 * M.shape[1] * EPS * (np.abs(M) @ np.abs(X))
    assert np.all(np.abs(ours - M @ X) <= bound)


@pytest.mark.parametrize("shapes", [[(3, 4), (2, 5)], [(4, 2), (3, 3), (2, 4)], [(5, 6)]])
def test_kron_matvec_equals_numpy_kron(shapes):
    rng = np.random.default_rng(1)
    mats = [rng.standard_normal(s) for s in shapes]
    K = mats[0]
    for M in mats[1:]:
        K = np.kron(K, M)
    v = rng.standard_normal(K.shape[1])
    V = rng.standard_normal((K.shape[1], 3))
    # random signs cancel, so entries can be near 0: compared componentwise against the sum's error bound
    assert_products_close(kron_matvec(mats, v), K, v)
    assert_products_close(kron_matvec(mats, V), K, V)


def test_kron_matvec_rejects_wrong_length():
    with pytest.raises(ValueError, match="expected"):
        kron_matvec([np.eye(3), np.eye(2)], np.ones(5))


def _small_workloads():
    kron = Kron([AllRange(5), Prefix(4), WidthK(3, 2)])
    union = Stack(
        [Kron([AllRange(6), Identity(4)]), Kron([Total(6), Prefix(4)])], weights=[1.0, 2.5]
    )
    marg = Marginals([2, 3, 4], subsets=[(0, 1), (2,), (1, 2)], weights=[1.0, 3.0, 0.5])
    plain = Stack([Prefix(24), WidthK(24, 5), Kron([Identity(4), Total(6)])], weights=[2.0, 1.0, 0.5])
    return [(w, explicit(w)) for w in (kron, union, marg, plain)]


@pytest.mark.parametrize("pair", _small_workloads(), ids=["kron", "union", "marginals", "plain-stack"])
def test_structured_matches_explicit_rows(pair):
    imp, dense = pair
    G = dense.gram()
    assert imp.shape == dense.shape
    rng = np.random.default_rng(0)
    v = rng.standard_normal(dense.n)
    V = rng.standard_normal((dense.n, 2))
    assert_products_close(imp.gram_matvec(v), G, v)
    assert_products_close(imp.gram_matvec(V), G, V)
    # integer Grams scaled by 1, 2.5^2, 3^2, 0.5^2: every entry exact in floating point, in any order
    np.testing.assert_array_equal(imp.gram(), G)
    # a sum of <= 60 exact terms by a closed form: a few ulps
    assert imp.frobenius_sq() == pytest.approx(float(np.trace(G)), rel=1e-12)
    x = rng.integers(0, 9, dense.n).astype(float)
    # integer data through integer/dyadic rows: exact in either order (atol for safety only, << 1)
    np.testing.assert_allclose(imp.matvec(x), dense.sparse() @ x, rtol=1e-12, atol=1e-9)
    # W X and W^T Y through the structure against the explicit rows, one vector and a batch of them
    M, Y = dense.matrix(), rng.standard_normal((dense.m, 3))
    assert imp.matvec(V).shape == (dense.m, 2) and imp.rmatvec(Y).shape == (dense.n, 3)
    assert_products_close(imp.matvec(V), M, V)
    assert_products_close(imp.rmatvec(Y[:, 0]), M.T, Y[:, 0])
    assert_products_close(imp.rmatvec(Y), M.T, Y)
    with pytest.raises(ValueError, match="expected"):
        imp.rmatvec(np.ones(dense.m + 1))
    if isinstance(imp, Kron | Marginals):
        # Two routes to the SVD bound (the factors' Gram eigenvalues vs W's singular values), each
        # rounded downwards. On these rank-deficient products the Gram route can only place a null
        # singular value to sqrt(n eps) of the largest (the square root of an eigenvalue known to
        # n eps ||G||), ~1e-7 relative at n <= 60, which the library's lowering absorbs: 1e-7.
        assert imp.svd_bound() == pytest.approx(svd_bound(dense), rel=1e-7)


@pytest.mark.parametrize("pair", _small_workloads(), ids=["kron", "union", "marginals", "plain-stack"])
def test_max_column_norm_through_the_structure(pair, monkeypatch):
    """The largest column L1 / L2 norm (sensitivity) through the factors equals the explicit rows'; past the exact
    scan's cell limit a stack reports the triangle-inequality bound, never less than the exact value."""
    import dpopt.workloads as wl

    imp, dense = pair
    M = np.abs(dense.matrix())
    # maxima of sums of <= 60 products of exact dyadic / small-integer entries: a few ulps (1e-13)
    exact = {1: float(M.sum(axis=0).max()), 2: float(np.sqrt((M**2).sum(axis=0).max()))}
    for norm in (1, 2):
        assert imp.max_column_norm(norm) == pytest.approx(exact[norm], rel=1e-13)
    if isinstance(imp, Stack):
        monkeypatch.setattr(wl, "EXACT_SENS_CELLS", imp.n - 1)
        assert not imp.column_norm_exact
        for norm in (1, 2):
            assert imp.max_column_norm(norm) >= exact[norm] * (1 - 1e-13)
    with pytest.raises(ValueError, match="norm must be 1 or 2"):
        imp.max_column_norm(3)


def test_svd_bound_of_kron_is_product_of_factors():
    """Singular values of a Kronecker product are products, so SVDB(W1 x W2) = SVDB(W1) SVDB(W2)."""
    W1, W2 = AllRange(7), Prefix(5)
    prod = svd_bound(W1) * svd_bound(W2)
    # Full-rank factors (n <= 7): each factor's bound is good to ~ n eps sqrt(cond) < 1e-13 whichever
    # route computes it; the product of two such bounds: 1e-12.
    assert Kron([W1, W2]).svd_bound() == pytest.approx(prod, rel=1e-12)
    # the dense 35-cell product from its own SVD, lowered by that SVD's round-off bound (a small multiple
    # of n^2 eps ~ 3e-13 relative): 1e-9
    assert svd_bound(Kron([W1, W2])) == pytest.approx(prod, rel=1e-9)


def test_marginal_spectrum_is_exact():
    """Eigenvalues c_A with multiplicities r_A reproduce the dense spectrum of W^T W."""
    w = Marginals([2, 3, 4], k=2, weights=[1.0, 2.0, 0.5])
    dense_eigs = np.sort(np.linalg.eigvalsh(explicit(w).gram()))
    ours = np.sort(np.repeat(w.scaled_eigenvalues * 24, w.multiplicities.astype(int)))
    ours = np.concatenate([np.zeros(24 - ours.size), ours])
    # eigvalsh at n = 24 with ||G|| = 16.5: each eigenvalue to ~ n eps ||G|| ~ 1e-13
    np.testing.assert_allclose(ours, dense_eigs, atol=1e-11)


def test_large_workloads_never_densify():
    w = Kron([AllRange(256), AllRange(256)])
    assert w.shape == (32896**2, 65536)
    with pytest.raises(WorkloadTooLargeError):
        w.gram()
    # Li and Miklau's closed forms through the factors stay cheap
    # trace(G_AllRange(256)) = 2.8e6 is an integer and its square (8e12) is below 2^53: exact, but allow
    # the product to be formed in another order (an ulp)
    assert w.frobenius_sq() == pytest.approx(float(np.trace(AllRange(256).gram())) ** 2, rel=1e-15)
    adult_like = Marginals([85, 9, 100, 16, 7, 15, 6, 5, 2, 100, 100, 99, 42, 2], k=3)
    assert adult_like.n == math.prod([85, 9, 100, 16, 7, 15, 6, 5, 2, 100, 100, 99, 42, 2])
    assert len(adult_like.closure) == 1 + 14 + 91 + 364
    # 364 marginals of ||W_A||_F^2 = n each (n ~ 1e19 > 2^53, so each term is already rounded): a 364-term
    # sum carries <= 364 eps relative
    assert adult_like.frobenius_sq() == pytest.approx(364 * float(adult_like.n), rel=1e-13)


def test_as_implicit_converts_dense_structures():
    assert isinstance(kron_form(Kron([AllRange(3), Prefix(2)])), Kron)
    m = kron_form(Marginals([2, 3], k=1))
    assert isinstance(m, Marginals) and m.subsets == [(0,), (1,)]
    u = kron_form(Stack([Kron([AllRange(3), Prefix(2)]), Kron([Identity(3), Total(2)])]))
    assert isinstance(u, Stack)
    one = kron_form(AllRange(4))
    assert isinstance(one, Kron) and one.n_factors == 1


def test_validation_errors_name_the_problem():
    with pytest.raises(ValueError, match="exactly one of k"):
        Marginals([2, 3])
    with pytest.raises(ValueError, match="outside"):
        Marginals([2, 3], subsets=[(0, 5)])
    with pytest.raises(ValueError, match="weights"):
        Marginals([2, 3], k=1, weights=[1.0, -1.0])
    with pytest.raises(ValueError, match="same number of cells"):
        Stack([Kron([AllRange(3)]), Kron([AllRange(4)])])
    with pytest.raises(ValueError, match="at least one"):
        Kron([])


@pytest.mark.parametrize(
    "W",
    [Identity(7), Total(7), Prefix(1), Prefix(9), AllRange(1), AllRange(9), WidthK(9, 3), WidthK(5, 5), WRange(20, 9)],
    ids=lambda w: w.name,
)
def test_gram_matvec_through_the_rows_structure(W):
    assert W.structured_gram
    rng = np.random.default_rng(2)
    G = W.gram()
    m, n = W.shape
    for v in (rng.standard_normal(n), rng.standard_normal((n, 3))):
        out = W.gram_matvec(v)
        assert out.shape == v.shape
        absv = np.abs(v) if v.ndim == 2 else np.abs(v)[:, None]
        # Prefix and AllRange: two cumulative sums of terms |G_ij v_j|, each partial sum within n eps of its terms'
        # absolute sum, then one product and one sum: 4 (n + 1) eps (|G| |v|). The range rows take differences
        # of prefix sums (each within n eps ||v||_1) and spread m answers by a cumulative sum of partial sums up
        # to m ||v||_1: 4 (n + 1)(m + 1) eps ||v||_1.
        bound = np.maximum(4 * (n + 1) * EPS * (np.abs(G) @ absv),
                           4 * (n + 1) * (m + 1) * EPS * absv.sum(axis=0))
        assert np.all(np.abs(out.reshape(n, -1) - (G @ v).reshape(n, -1)) <= bound)


def test_allrange_products_and_sensitivity_without_its_rows():
    W = AllRange(1200)  # 1200 * 720,600 entries: its rows cannot be listed
    assert not W.has_rows
    j = np.array([0, 599, 1199])
    E = np.zeros((1200, 3))
    E[j, np.arange(3)] = 1.0
    # integer sums below 2^53: exact in float64
    np.testing.assert_array_equal(W.gram_matvec(E), W.gram()[:, j])
    assert W.max_column_norm(1) == 600 * 601 and W.max_column_norm(2) == math.sqrt(600 * 601)
    small = AllRange(9)
    for norm in (1, 2):  # the closed form against the scan of the rows
        assert small.max_column_norm(norm) == pytest.approx(float(column_norm_powers(small.sparse(), norm).max()) ** (
            1 / norm), rel=4 * EPS)


@pytest.mark.parametrize("W", [Prefix(9), AllRange(7), WidthK(9, 3), WRange(40, 13, seed=5)], ids=lambda w: w.name)
def test_range_gram_counts_equal_the_rows_product(W):
    """W^T W of a range family by 2-D cumulative counts equals the sparse rows' product exactly (integer counts
    below 2^53 are exact in float64)."""
    S = W.sparse()
    assert np.array_equal(range_gram(W.n, *W.range_bounds()), np.asarray((S.T @ S).todense()))
    assert np.array_equal(Workload.gram(W), np.asarray((S.T @ S).todense()))
