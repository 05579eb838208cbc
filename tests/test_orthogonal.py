"""Orthogonal Mechanism (seed 001): Example 1, W = B W~, sub-domain structure, Theorem 5, W_tau."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from paper_matrices import EX1_B, EX1_W, EX1_W_TILDE  # noqa: E402
from scipy.stats import laplace

from dpopt.error import expected_error
from dpopt.privacy import Privacy
from dpopt.solvers.orthogonal import (
    OMStrategy,
    construct_b,
    construct_w_tilde,
    om_expected_error,
    orthogonal_mechanism,
    orthogonal_strategy,
    select_independent_rows,
    split_domain,
    subdomain_queries,
    w_tau_matrix,
)
from dpopt.strategy import Strategy


def _match_rows(W_tilde: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """perm, sign with W_tilde[k] == sign[k] * ref[perm[k]]; fails if no such matching exists."""
    perm, sign = [], []
    for row in W_tilde:
        hits = [(j, s) for j in range(ref.shape[0]) for s in (1.0, -1.0) if np.allclose(row, s * ref[j])]
        assert len(hits) == 1, f"row {row} has {len(hits)} matches in the reference"
        perm.append(hits[0][0])
        sign.append(hits[0][1])
    assert sorted(perm) == list(range(ref.shape[0]))
    return np.array(perm), np.array(sign)


def _sens1(M: np.ndarray) -> float:
    return float(np.abs(M).sum(axis=0).max())


def _random_workloads():
    """(label, W) pairs: W_tau at several sizes and seeds, square, tall, tiny-m (large sub-domains)."""
    cases = []
    for seed, (m, n, tau) in enumerate(
        [(128, 128, 0.2), (64, 128, 0.4), (128, 64, 0.8), (5, 128, 0.4), (8, 100, 0.8), (3, 40, 0.5),
         (128, 128, 0.05), (20, 128, 1.0)]
    ):
        cases.append((f"wtau{m}x{n}t{tau}s{seed}", w_tau_matrix(m, n, tau, np.random.default_rng(seed))))
    return cases


RANDOM_CASES = _random_workloads()


# ------------------------------------------------------------------------------------------------
# Example 1
# ------------------------------------------------------------------------------------------------


def test_example1_exact_in_input_order():
    om = orthogonal_strategy(EX1_W)
    np.testing.assert_array_equal(om.W_tilde, EX1_W_TILDE)
    np.testing.assert_allclose(om.B, EX1_B, rtol=0, atol=1e-15)
    assert list(om.independent_rows) == [0, 1, 2, 3]
    assert [list(d) for d in om.subdomains] == [[1], [2], [0], [3]]


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5])
@pytest.mark.parametrize("basis", ["auto", "rows", "orthonormal"])
def test_example1_up_to_row_order_and_sign(seed, basis):
    om = orthogonal_strategy(EX1_W, rng=seed, basis=basis)
    perm, sign = _match_rows(om.W_tilde, EX1_W_TILDE)
    np.testing.assert_allclose(om.B, EX1_B[:, perm] * sign, atol=1e-12)


def test_example1_sensitivities_and_errors():
    eps = 0.7
    S_Q = _sens1(EX1_W)
    assert S_Q == pytest.approx(0.9812 + 0.7602 + 0.7122)  # column 3
    assert round(S_Q, 1) == 2.5  # "S(Q) ~ 2.5"
    # Laplace on the 6 queries directly: "around 75/eps^2" (72.2 with the exact S(Q) = 2.4536).
    lm_error = 6 * 2 * S_Q**2 / eps**2
    assert lm_error * eps**2 == pytest.approx(75, rel=0.05)
    om = orthogonal_strategy(EX1_W)
    assert om.sens1 == 1.0  # "S(Q~) = 1"
    # B holds W's entries, so trace(B B^T) = ||W||_F^2.
    err = om.expected_error(eps)
    assert err == pytest.approx(2 * float(np.sum(EX1_W**2)) / eps**2, rel=1e-12)
    assert err * eps**2 == pytest.approx(8.8402765, abs=1e-6)
    assert err * eps**2 < 18  # "less than 18/eps^2"


# ------------------------------------------------------------------------------------------------
# W = B W~ and the structure of W~
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("basis", ["auto", "rows", "orthonormal"])
@pytest.mark.parametrize("label,W", RANDOM_CASES, ids=[c[0] for c in RANDOM_CASES])
@pytest.mark.parametrize("seed", [None, 11, 12])
def test_decomposition_exact(label, W, seed, basis):
    om = orthogonal_strategy(W, rng=seed, basis=basis)
    assert np.max(np.abs(W - om.B @ om.W_tilde)) <= 1e-10
    # Corollary 1: W~ has independent rows, so B is the unique solution W pinv(W~).
    assert np.linalg.matrix_rank(om.W_tilde) == om.W_tilde.shape[0]
    np.testing.assert_allclose(om.B, W @ np.linalg.pinv(om.W_tilde), atol=1e-8)
    assert om.diagnostics["rank"] == np.linalg.matrix_rank(W)
    assert om.sens1 == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("basis", ["auto", "rows", "orthonormal"])
@pytest.mark.parametrize("label,W", RANDOM_CASES, ids=[c[0] for c in RANDOM_CASES])
def test_subdomain_structure(label, W, basis):
    om = orthogonal_strategy(W, rng=3, basis=basis)
    n = W.shape[1]
    # Disjoint sub-domains (Definition 6/7), together the non-zero columns of W.
    cells = np.concatenate(om.subdomains)
    assert len(cells) == len(set(cells.tolist()))
    np.testing.assert_array_equal(np.sort(cells), np.flatnonzero(np.any(W != 0, axis=0)))
    np.testing.assert_array_equal(np.sort(np.concatenate(om.blocks)), np.arange(om.W_tilde.shape[0]))
    # Sub-domains are the classes of cells with equal incidence among the selected rows.
    support = W[om.independent_rows] != 0
    classes = {}
    for x in range(n):
        if support[:, x].any():
            classes.setdefault(support[:, x].tobytes(), []).append(x)
    assert sorted(map(tuple, om.subdomains)) == sorted(map(tuple, classes.values()))
    for D_j, rows_j in zip(om.subdomains, om.blocks, strict=True):
        block = om.W_tilde[rows_j]
        outside = np.setdiff1d(np.arange(n), D_j)
        assert not np.any(block[:, outside])  # each query lives in its sub-domain
        Q = block[:, D_j]
        assert np.linalg.matrix_rank(Q) == Q.shape[0]  # independent queries
        # tau_j is the rank of the selected rows restricted to the sub-domain.
        S_l = np.flatnonzero(support[:, D_j[0]])
        assert Q.shape[0] == np.linalg.matrix_rank(W[om.independent_rows][np.ix_(S_l, D_j)])
        assert _sens1(Q) == pytest.approx(1.0, abs=1e-12)  # normalised: block sensitivity 1
        assert np.all(np.max(Q, axis=1) >= np.max(-Q, axis=1))  # sign: largest entry positive
        if basis == "orthonormal":
            G = Q @ Q.T
            np.testing.assert_allclose(G, G[0, 0] * np.eye(Q.shape[0]), atol=1e-12)
        elif basis == "auto" and Q.shape[0] == D_j.size:
            # full-rank sub-domain: unit queries, so B's block is W's columns
            np.testing.assert_array_equal(Q, np.eye(D_j.size))
            np.testing.assert_allclose(om.B[:, rows_j], W[:, D_j], atol=1e-15)
        else:
            # each query is a scaled restriction of one of the selected rows
            C = W[om.independent_rows][np.ix_(S_l, D_j)]
            for q in Q:
                assert any(np.linalg.matrix_rank(np.vstack([q, c])) == 1 for c in C)


def test_large_subdomains_occur_for_few_queries():
    W = w_tau_matrix(5, 128, 0.4, np.random.default_rng(0))
    om = orthogonal_strategy(W)
    assert om.diagnostics["max_subdomain_size"] > 1
    assert om.diagnostics["max_block_queries"] > 1


def test_paper_sized_wtau_is_all_singletons():
    """With m independent rows and 2^m >> n patterns, every cell is its own sub-domain: W~ = I."""
    W = w_tau_matrix(60, 120, 0.2, np.random.default_rng(4))
    om = orthogonal_strategy(W)
    assert om.diagnostics["n_singleton_subdomains"] == 120
    perm, _ = _match_rows(om.W_tilde, np.eye(120))
    np.testing.assert_allclose(om.B, W[:, perm], atol=0)


def test_split_domain_ties_only_reorder():
    support = np.array([[1, 1, 0, 0, 1], [0, 1, 1, 0, 1], [0, 0, 1, 1, 0]], dtype=bool)
    parts = split_domain(support)
    # kappa = [1, 2, 2, 1, 2]; first argmax is cell 1 with S_l = {0, 1}, whose intersection is {1, 4}.
    assert [list(d) for d, _ in parts] == [[1, 4], [2], [0], [3]]
    assert [list(s) for _, s in parts] == [[0, 1], [1, 2], [0], [2]]
    permuted = split_domain(support[:, ::-1])
    assert sorted(tuple(sorted(4 - d)) for d, _ in permuted) == sorted(tuple(d) for d, _ in parts)


def test_rank_deficient_with_cancellation():
    """Dependent rows whose support cuts across sub-domains still satisfy W = B W~."""
    W_hat = np.array([[1.0, 2.0, 0, 0], [1.0, 0, 3.0, 0], [0, 0, 1.0, 4.0]])
    W = np.vstack([W_hat, W_hat[0] - W_hat[1], 2 * W_hat[2], W_hat[0] + W_hat[2], np.zeros(4)])
    om = orthogonal_strategy(W)
    assert om.diagnostics["rank"] == 3
    np.testing.assert_allclose(om.B @ om.W_tilde, W, atol=1e-12)
    np.testing.assert_array_equal(om.B[-1], 0.0)


def test_zero_columns_negative_entries():
    W = np.array([[1.0, 0, -2.0, 0], [0, 0, 3.0, -1.0], [2.0, 0, -1.0, -1.0]])
    om = orthogonal_strategy(W)
    np.testing.assert_allclose(om.B @ om.W_tilde, W, atol=1e-12)
    np.testing.assert_array_equal(om.diagnostics["uncovered_cells"], [1])
    np.testing.assert_array_equal(om.W_tilde[:, 1], 0.0)


@settings(max_examples=60, deadline=None)
@given(arrays(np.int8, st.tuples(st.integers(1, 7), st.integers(1, 9)), elements=st.integers(-2, 2)))
def test_property_small_integer_workloads(W):
    W = W.astype(float)
    if not np.any(W):
        with pytest.raises(ValueError, match="no non-zero entry"):
            orthogonal_strategy(W)
        return
    for basis in ("auto", "rows", "orthonormal"):
        om = orthogonal_strategy(W, rng=0, basis=basis)
        np.testing.assert_allclose(om.B @ om.W_tilde, W, atol=1e-10)
        assert om.diagnostics["rank"] == np.linalg.matrix_rank(W)


def test_selection_deterministic_given_seed():
    W = np.vstack([w_tau_matrix(10, 30, 0.5, np.random.default_rng(1))] * 2)
    a = select_independent_rows(W, rng=7)
    b = select_independent_rows(W, rng=np.random.default_rng(7))
    np.testing.assert_array_equal(a, b)
    assert len(a) == 10
    chosen = {tuple(np.sort(select_independent_rows(W, rng=s))) for s in range(10)}
    assert len(chosen) > 1  # the scan order is really random
    np.testing.assert_array_equal(select_independent_rows(W), np.arange(10))


# ------------------------------------------------------------------------------------------------
# Theorem 5 and Algorithm 1
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("label,W", RANDOM_CASES[:5], ids=[c[0] for c in RANDOM_CASES[:5]])
def test_theorem5_against_noise_covariance(label, W):
    eps = 0.5
    om = orthogonal_strategy(W, rng=2)
    s, n = om.W_tilde.shape
    # Sensitivity by its definition: neighbours x, x + e_j differ in one cell; the answers of W~ move by
    # ||W~ e_j||_1. Laplace variance from scipy's distribution, not from the 2 b^2 formula.
    sens = max(np.abs(om.W_tilde @ np.eye(n)[:, j]).sum() for j in range(n))
    b = sens / eps
    cov = om.B @ (laplace(scale=b).var() * np.eye(s)) @ om.B.T  # covariance of B beta
    # Both sides sum at most m s <= 16384 non-negative terms: rounding <= m s u ~ 4e-12 relative.
    theorem5 = om_expected_error(om.B, om.W_tilde, eps)
    assert theorem5 == pytest.approx(np.trace(cov), rel=1e-10)
    # What the expectation means: E ||B beta||^2 for beta drawn with i.i.d. Laplace(b) entries, within
    # 4 Monte Carlo standard errors of 20,000 draws.
    rng = np.random.default_rng(len(label))
    sq = np.sum((om.B @ rng.laplace(0.0, b, size=(s, 20_000))) ** 2, axis=0)
    assert abs(sq.mean() - theorem5) <= 4 * sq.std(ddof=1) / np.sqrt(sq.size)
    # Any rescaling of W~ (with B rescaled inversely) gives Theorem 5 its own sensitivity.
    D = np.diag(np.linspace(0.5, 2.0, om.W_tilde.shape[0]))
    A2, B2 = D @ om.W_tilde, om.B @ np.linalg.inv(D)
    expected = 2 * _sens1(A2) ** 2 * np.sum(B2**2) / eps**2
    assert om_expected_error(B2, A2, eps) == pytest.approx(expected, rel=1e-12)


def test_theorem5_matches_generic_error_module():
    """Theorem 5 against dpopt.error's matrix-mechanism formula with the same (W~, B)."""
    W = w_tau_matrix(12, 40, 0.4, np.random.default_rng(21))
    om = orthogonal_strategy(W, basis="rows")
    report = expected_error(Strategy(om.W_tilde, om.B), W, Privacy(0.3))
    assert om.expected_error(0.3) == pytest.approx(report.total, rel=1e-10)


def test_auto_basis_beats_literal_rows_on_full_subdomain():
    """Cells 0, 1 are touched by the same three independent rows; the first two, restricted to them,
    are nearly dependent, so the literal basis expresses the third through huge coefficients."""
    W = np.array([[1.0, 1.0, 1, 0, 0], [1.0, 1.001, 0, 1, 0], [1.0, -1.0, 0, 0, 1]])
    literal = orthogonal_strategy(W, basis="rows")
    auto = orthogonal_strategy(W, basis="auto")
    assert [d.tolist() for d in auto.subdomains][0] == [0, 1]
    np.testing.assert_array_equal(auto.W_tilde, np.eye(5))
    assert auto.expected_error(1.0) == pytest.approx(2 * np.sum(W**2), rel=1e-12)
    assert literal.expected_error(1.0) > 1e5 * auto.expected_error(1.0)
    np.testing.assert_allclose(literal.B @ literal.W_tilde, W, atol=1e-9)


def test_algorithm1_monte_carlo_matches_theorem5():
    eps = 1.0
    om = orthogonal_strategy(EX1_W)
    x = np.array([10.0, 3.0, 7.0, 0.0])
    rng = np.random.default_rng(2024)
    draws = np.array([orthogonal_mechanism(om, x, eps, rng) for _ in range(20000)])
    sq = np.sum((draws - EX1_W @ x) ** 2, axis=1).mean()
    assert sq == pytest.approx(om.expected_error(eps), rel=0.05)


def test_om_vs_baselines_on_wtau():
    """OM (S = 1) is exactly noise-on-data when W~ = I, and beats noise-on-queries on W_tau."""
    W = w_tau_matrix(40, 100, 0.4, np.random.default_rng(9))
    om = orthogonal_strategy(W)
    eps = 1.0
    nod = 2 * np.sum(W**2) / eps**2
    noq = 2 * W.shape[0] * _sens1(W) ** 2 / eps**2
    assert om.expected_error(eps) == pytest.approx(nod, rel=1e-12)
    assert om.expected_error(eps) < noq


# ------------------------------------------------------------------------------------------------
# W_tau (Section 5)
# ------------------------------------------------------------------------------------------------


def test_w_tau_definition():
    W = w_tau_matrix(50, 60, 0.3, np.random.default_rng(5))
    g = np.random.default_rng(5)
    H, V = g.random((50, 60)), g.random((50, 60))
    np.testing.assert_array_equal(W, np.where(H <= 0.3, V, 0.0))
    np.testing.assert_array_equal(W, w_tau_matrix(50, 60, 0.3, 5))
    assert np.all((W >= 0) & (W < 1))


@pytest.mark.parametrize("tau", [0.2, 0.4, 0.8])
def test_w_tau_density_and_values(tau):
    W = w_tau_matrix(200, 500, tau, np.random.default_rng(17))
    density = np.count_nonzero(W) / W.size
    sd = np.sqrt(tau * (1 - tau) / W.size)
    assert abs(density - tau) < 5 * sd
    assert np.mean(W[W != 0]) == pytest.approx(0.5, abs=0.01)  # values U[0, 1)


def test_w_tau_extremes():
    assert not np.any(w_tau_matrix(4, 5, 0.0, 0))
    assert np.count_nonzero(w_tau_matrix(4, 5, 1.0, 0)) == 20


# ------------------------------------------------------------------------------------------------
# Bad input
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "W,match",
    [
        (np.ones(4), "2-D"),
        (np.ones((0, 3)), "at least one row"),
        (np.array([[1.0, np.nan]]), "NaN or infinite"),
        (np.array([[1.0, np.inf]]), "NaN or infinite"),
        (np.zeros((3, 4)), "no non-zero entry"),
        ([["a", "b"]], "numeric"),
    ],
)
def test_bad_workloads(W, match):
    with pytest.raises(ValueError, match=match):
        orthogonal_strategy(W)


def test_bad_parameters():
    with pytest.raises(ValueError, match="tol"):
        orthogonal_strategy(EX1_W, tol=0.0)
    with pytest.raises(ValueError, match="basis"):
        orthogonal_strategy(EX1_W, basis="qr")
    with pytest.raises(ValueError, match="rng"):
        orthogonal_strategy(EX1_W, rng="seed")
    with pytest.raises(ValueError, match="residual_tol"):
        orthogonal_strategy(EX1_W, residual_tol=2.0)
    om = orthogonal_strategy(EX1_W)
    with pytest.raises(ValueError, match="eps"):
        om.expected_error(0.0)
    with pytest.raises(ValueError, match="equal s"):
        om_expected_error(om.B[:, :3], om.W_tilde, 1.0)
    with pytest.raises(ValueError, match="length n"):
        orthogonal_mechanism(om, np.ones(3), 1.0, 0)
    with pytest.raises(ValueError, match="rng"):
        orthogonal_mechanism(om, np.ones(4), 1.0, None)
    with pytest.raises(ValueError, match="equal n"):
        construct_b(EX1_W, om.W_tilde[:, :3], om.subdomains, om.blocks)
    with pytest.raises(ValueError, match="no non-zero row"):
        subdomain_queries(np.zeros((2, 3)))
    for args, match in [((0, 3, 0.5, 0), "m must"), ((3, 2.5, 0.5, 0), "n must"),
                        ((3, 3, 1.5, 0), "tau"), ((3, 3, 0.5, None), "rng")]:
        with pytest.raises(ValueError, match=match):
            w_tau_matrix(*args)


def test_too_loose_tolerance_is_reported():
    """A rank tolerance that discards a truly independent row is caught by the W = B W~ check."""
    W = np.array([[1.0, 1.0], [1.0, 1.0 + 1e-6]])
    with pytest.raises(ValueError, match="W = B W~ fails"):
        orthogonal_strategy(W, tol=1e-3)
    om = orthogonal_strategy(W)
    np.testing.assert_allclose(om.B @ om.W_tilde, W, atol=1e-10)


def test_accepts_objects_with_matrix_method():
    class Wrapped:
        def matrix(self):
            return EX1_W

    om = orthogonal_strategy(Wrapped())
    assert isinstance(om, OMStrategy)
    W_tilde, subdomains, blocks, rows = construct_w_tilde(EX1_W)
    np.testing.assert_array_equal(W_tilde, om.W_tilde)
