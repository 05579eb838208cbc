"""Tests for the column-wise L1-ball projection (pivot and sort-based methods)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import dpopt.solvers.l1ball as l1ball
from dpopt.solvers.l1ball import METHODS, project_l1_ball_columns

finite = st.floats(min_value=-50.0, max_value=50.0, allow_nan=False, allow_infinity=False)
matrices = arrays(
    np.float64,
    st.tuples(st.integers(1, 7), st.integers(1, 5)),
    elements=finite,
)
radii = st.floats(min_value=0.05, max_value=20.0)


def _bisection_projection(v: np.ndarray, radius: float) -> np.ndarray:
    """Independent projection: find the threshold theta with sum(max(|v|-theta,0)) = radius by bisection."""
    if np.abs(v).sum() <= radius:
        return v.copy()
    lo, hi = 0.0, float(np.abs(v).max())
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if np.maximum(np.abs(v) - mid, 0.0).sum() > radius:
            lo = mid
        else:
            hi = mid
    return np.sign(v) * np.maximum(np.abs(v) - 0.5 * (lo + hi), 0.0)


@pytest.mark.parametrize("method", METHODS)
def test_known_value(method):
    # |v| = (3, 1, 0.5), radius 2: rho = 1, theta = 3 - 2 = 1 -> (2, 0, 0), L1 norm 2.
    # All inputs, thresholds and outputs here are dyadic rationals, computed exactly in floating point;
    # atol 1e-15 (~2 ulps at 2) only allows for a different but equally exact order of operations.
    V = np.array([[3.0], [-1.0], [0.5]])
    P = project_l1_ball_columns(V, radius=2.0, method=method)
    np.testing.assert_allclose(P[:, 0], [2.0, 0.0, 0.0], atol=1e-15)
    # |v| = (3, 2.5, 0), radius 2: theta = (5.5 - 2) / 2 = 1.75 -> (1.25, -0.75, 0)
    V = np.array([[3.0], [-2.5], [0.0]])
    P = project_l1_ball_columns(V, radius=2.0, method=method)
    np.testing.assert_allclose(P[:, 0], [1.25, -0.75, 0.0], atol=1e-15)


@pytest.mark.parametrize("method", METHODS)
def test_against_cvxpy(method):
    cp = pytest.importorskip("cvxpy")
    rng = np.random.default_rng(0)
    V = rng.normal(size=(6, 4)) * np.array([0.05, 1.0, 3.0, 0.3])
    P = project_l1_ball_columns(V, radius=1.0, method=method)
    for j in range(V.shape[1]):
        x = cp.Variable(V.shape[0])
        prob = cp.Problem(cp.Minimize(cp.sum_squares(x - V[:, j])), [cp.norm1(x) <= 1.0])
        prob.solve(solver=cp.CLARABEL)
        # Clarabel's defaults (relative/absolute gap and feasibility 1e-8) certify its value to
        # ~1e-8 (1 + f), plus its infeasibility times the multiplier theta <= max|v| < 10: 1e-7 (1 + f).
        f = float(np.sum((P[:, j] - V[:, j]) ** 2))
        assert abs(f - prob.value) <= 1e-7 * (1.0 + prob.value)
        # and the objective is 2-strongly convex, so ||x - p||^2 <= f(x) - f(p) <= that same bound
        np.testing.assert_allclose(P[:, j], x.value, rtol=0, atol=np.sqrt(1e-7 * (1.0 + prob.value)))


@pytest.mark.parametrize("method", METHODS)
def test_inside_columns_unchanged_bitwise(method):
    V = np.array([[0.2, 5.0], [-0.3, 1.0], [0.1, -2.0]])
    P = project_l1_ball_columns(V, method=method)
    assert np.array_equal(P[:, 0], V[:, 0])
    # a projected column's L1 norm is the radius up to the rounding of a 3-term sum at scale 5 (~1e-15)
    assert abs(np.abs(P[:, 1]).sum() - 1.0) < 1e-12


@pytest.mark.parametrize("method", METHODS)
def test_vector_input_and_does_not_mutate(method):
    v = np.array([2.0, -2.0])
    v0 = v.copy()
    p = project_l1_ball_columns(v, 1.0, method=method)
    assert p.shape == (2,)
    np.testing.assert_array_equal(p, [0.5, -0.5])  # theta = (4 - 1) / 2 = 1.5: dyadic, exact
    assert np.array_equal(v, v0)


@pytest.mark.parametrize(
    "V, radius, match",
    [
        (np.zeros((2, 2, 2)), 1.0, "dims"),
        (np.array([[np.nan]]), 1.0, "finite"),
        (np.ones((2, 2)), 0.0, "radius"),
        (np.ones((2, 2)), -1.0, "radius"),
        (np.ones((2, 2)), np.inf, "radius"),
    ],
)
@pytest.mark.parametrize("method", METHODS)
def test_invalid_input(V, radius, match, method):
    with pytest.raises(ValueError, match=match):
        project_l1_ball_columns(V, radius, method=method)


@settings(max_examples=150, deadline=None)
@given(V=matrices, radius=radii, method=st.sampled_from(METHODS))
def test_kkt_and_matches_bisection(V, radius, method):
    # Round-off scale: a column has r <= 7 entries of magnitude <= 50, so sums and thresholds carry
    # errors of ~ r * eps_mach * max|v| ~ 1.6e-15 * scale, and the 200-step bisection pins its threshold
    # to an ulp; 1e-9 * scale (the KKT and agreement tolerances below) is a deliberately wide multiple.
    P = project_l1_ball_columns(V, radius, method=method)
    assert P.shape == V.shape
    norms = np.abs(P).sum(axis=0)
    assert np.all(norms <= radius * (1 + 1e-12) + 1e-12)
    scale = max(1.0, float(np.abs(V).max()))
    for j in range(V.shape[1]):
        v, p = V[:, j], P[:, j]
        np.testing.assert_allclose(p, _bisection_projection(v, radius), atol=1e-9 * scale)
        if np.abs(v).sum() <= radius:
            assert np.array_equal(p, v)
            continue
        # KKT: v - p = theta * g with g a subgradient of ||.||_1 at p and theta >= 0:
        # on the support, v - p = theta * sign(p); off the support |v_i| <= theta.
        d = v - p
        support = p != 0
        assert support.any()
        theta = d[support][0] * np.sign(p[support][0])
        assert theta >= -1e-12
        np.testing.assert_allclose(d[support], theta * np.sign(p[support]), atol=1e-9 * scale)
        assert np.all(np.abs(v[~support]) <= theta + 1e-9 * scale)
        assert abs(norms[j] - radius) <= 1e-9 * scale


@settings(max_examples=100, deadline=None)
@given(V=matrices, radius=radii)
def test_idempotent(V, radius):
    P = project_l1_ball_columns(V, radius)
    P2 = project_l1_ball_columns(P, radius)
    # P's columns lie on or inside the sphere up to r * eps_mach * scale (r <= 7): reprojecting moves
    # them by at most that much
    np.testing.assert_allclose(P2, P, atol=1e-12 * max(1.0, float(np.abs(V).max())))


@settings(max_examples=100, deadline=None)
@given(V=matrices, U=matrices, radius=radii)
def test_non_expansive(V, U, radius):
    r = min(V.shape[0], U.shape[0])
    c = min(V.shape[1], U.shape[1])
    V, U = V[:r, :c], U[:r, :c]
    PV = project_l1_ball_columns(V, radius)
    PU = project_l1_ball_columns(U, radius)
    for j in range(c):
        # exact in real arithmetic; each projection carries ~ r * eps_mach * 50 ~ 1e-13 absolute error
        assert np.linalg.norm(PV[:, j] - PU[:, j]) <= np.linalg.norm(V[:, j] - U[:, j]) + 1e-9


# --- the pivot iteration against the sort-based reference -------------------------------------


def _assert_methods_agree(V: np.ndarray, radius: float = 1.0) -> np.ndarray:
    """Both methods on V: same shape, the pivot result within 1e-12 (relative to max|v|) of sort.

    Both compute theta = (sum of the k largest |v_i| - radius) / k, by different sums over <= r = 300
    entries: each is within ~ r eps_mach max|v| ~ 7e-14 max|v| of exact, and so are the outputs.
    """
    P = project_l1_ball_columns(V, radius, method="michelot")
    S = project_l1_ball_columns(V, radius, method="sort")
    assert P.shape == S.shape == V.shape
    scale = max(1.0, float(np.abs(V).max()))
    np.testing.assert_allclose(P, S, rtol=0, atol=1e-12 * scale)
    inside = np.abs(V).sum(axis=0) <= radius
    assert np.array_equal(P[:, inside], V[:, inside])
    assert np.all(np.signbit(P[:, inside]) == np.signbit(V[:, inside]))
    out = ~inside
    # On the sphere up to rounding, which is relative to the entries, not to the radius.
    np.testing.assert_allclose(np.abs(P[:, out]).sum(axis=0), radius, rtol=1e-12, atol=1e-12 * scale)
    return P


def test_invalid_method():
    with pytest.raises(ValueError, match="method"):
        project_l1_ball_columns(np.ones((2, 2)), method="bisection")


@pytest.mark.parametrize("shape", [(1, 7), (2, 3), (62, 64), (154, 128), (308, 40), (1229, 16)])
@pytest.mark.parametrize("scale", [1e-3, 0.1, 1.0, 30.0])
def test_methods_agree_random(shape, scale):
    rng = np.random.default_rng([shape[0], shape[1], int(1e3 * scale)])
    V = rng.normal(size=shape) * scale * rng.uniform(0.1, 3.0, size=shape[1])
    _assert_methods_agree(V, radius=1.0)
    _assert_methods_agree(V, radius=0.37)


def test_single_row_is_clipping():
    v = np.array([[3.0, -0.5, -2.0, 0.0, 1.0]])
    for method in METHODS:
        P = project_l1_ball_columns(v, 1.0, method=method)
        # one entry per column: theta = |v| - 1, p = |v| - theta, exact for these dyadic values
        np.testing.assert_allclose(P, np.sign(v) * np.minimum(np.abs(v), 1.0), atol=1e-15)


def test_ties_closed_form():
    # Column of r entries of equal magnitude a with r a > radius: theta = (r a - radius) / r and every
    # entry becomes +-radius / r. A second column with a repeated top value 3 (three times) over 1s,
    # radius 3: theta = (9 - 3) / 3 = 2 > 1, so the output is (1, 1, 1, 0, ...).
    r = 8
    V = np.empty((r, 2))
    V[:, 0] = np.where(np.arange(r) % 2 == 0, 0.75, -0.75)
    V[:, 1] = [3.0, 1.0, -3.0, 1.0, 3.0, -1.0, 1.0, 1.0]
    for method in METHODS:
        P = project_l1_ball_columns(V, 3.0, method=method)
        # theta = (6 - 3) / 8 and the outputs 3 / 8 are dyadic, exact; 1e-15 ~ 2 ulps of 1
        np.testing.assert_allclose(P[:, 0], np.sign(V[:, 0]) * 3.0 / r, atol=1e-15)
        np.testing.assert_allclose(P[:, 1], [1.0, 0.0, -1.0, 0.0, 1.0, 0.0, 0.0, 0.0], atol=1e-15)


def test_methods_agree_tied_integer_entries():
    rng = np.random.default_rng(1)
    V = rng.integers(-3, 4, size=(40, 300)).astype(float)
    for radius in (0.5, 1.0, 2.0, 7.0, 30.0, 200.0):
        _assert_methods_agree(V, radius)


def test_methods_agree_sparse_with_zero_and_inside_columns():
    rng = np.random.default_rng(2)
    V = rng.normal(size=(120, 200)) * (rng.random((120, 200)) < 0.05)
    V[:, :5] = 0.0  # all-zero columns
    V[:, 5:10] = -0.0  # negative zeros must come back as negative zeros
    V[:, 10:20] *= 1e-3  # inside the ball
    V[:, 20] = 0.0
    V[3, 20], V[7, 20] = 5.0, -0.5  # theta = 5 - 1 = 4 > 0.5: the projection is e_3
    P = _assert_methods_agree(V, 1.0)
    assert np.all(np.signbit(P[:, 5:10]))
    expected = np.zeros(V.shape[0])
    expected[3] = 1.0
    np.testing.assert_allclose(P[:, 20], expected, atol=1e-15)


@pytest.mark.parametrize("radius", [1.0, 0.01, 250.0])
def test_methods_agree_near_boundary(radius):
    # Columns of L1 norm radius (1 + 10^-k), k = 1..15, exactly radius, and one ulp above it: the
    # regime of LRM's L-step, where most columns are a gradient step away from the sphere.
    rng = np.random.default_rng(3)
    r = 150
    excess = [10.0**-k for k in range(1, 16)]
    G = rng.normal(size=(r, len(excess) + 2))
    G /= np.abs(G).sum(axis=0)
    G[:, : len(excess)] *= radius * (1.0 + np.array(excess))
    G[:, -2] *= radius
    G[:, -1] *= radius
    G[:, -1] *= np.nextafter(radius, np.inf) / np.abs(G[:, -1]).sum()
    P = _assert_methods_agree(G, radius)
    inside = np.abs(G).sum(axis=0) <= radius
    assert np.array_equal(P[:, inside], G[:, inside])
    assert np.all(np.abs(P).sum(axis=0) <= radius * (1.0 + 1e-12))


def test_methods_agree_wide_dynamic_range_and_many_passes():
    # Geometric magnitudes make the support shrink slowly under the pivot iteration.
    r = 300
    x = 1.07 ** np.arange(r)
    V = np.stack([x, -x[::-1], np.logspace(-8, 3, r), np.arange(1.0, r + 1)], axis=1)
    for radius in (1e-3, 1.0, 50.0, 1e4):
        _assert_methods_agree(V, radius)


def test_result_does_not_depend_on_compaction(monkeypatch):
    # Converged columns are fixed points of the iteration, so gathering the moving columns into a
    # smaller array (or never doing so) changes nothing beyond rounding of the sums.
    rng = np.random.default_rng(4)
    V = rng.normal(size=(90, 120)) * rng.uniform(0.01, 2.0, size=120)
    results = []
    for fraction in (0.0, 0.25, 1.0):
        monkeypatch.setattr(l1ball, "_COMPACT_FRACTION", fraction)
        results.append(project_l1_ball_columns(V))
    for P in results[1:]:
        # Each column gets the same elementwise operations, and its sum is a numpy reduction over axis 0
        # (NumPy, not BLAS), whose order within a column does not depend on how many columns the array
        # holds: the results are expected bit for bit; 1e-15 (~ ulp(4)) only allows one ulp should a
        # NumPy build reorder that reduction.
        np.testing.assert_allclose(P, results[0], rtol=0, atol=1e-15)


def test_layout_and_dtype_of_input():
    rng = np.random.default_rng(5)
    V = rng.normal(size=(30, 20))
    ref = project_l1_ball_columns(V)
    for W in (np.asfortranarray(V), V[:, ::-1][:, ::-1], V.astype(np.float32)):
        P = project_l1_ball_columns(W)
        assert P.flags.c_contiguous and P.dtype == np.float64
        # Other layouts are copied into the same C-ordered workspace: the same arithmetic, bit for bit
        # (1e-15 ~ 2 ulps at |v| <~ 3). float32 input differs from V by <= 2^-24 |v| ~ 2e-7 (|v| <~ 4),
        # and the threshold shifts by at most that much again: 1e-6.
        tol = 1e-6 if W.dtype == np.float32 else 1e-15
        np.testing.assert_allclose(P, ref, atol=tol)
    V0 = V.copy()
    project_l1_ball_columns(V)
    assert np.array_equal(V, V0)


@settings(max_examples=150, deadline=None)
@given(V=matrices, radius=radii)
def test_methods_agree_hypothesis(V, radius):
    _assert_methods_agree(V, radius)


@settings(max_examples=60, deadline=None)
@given(
    V=arrays(np.float64, st.tuples(st.integers(1, 40), st.integers(1, 6)),
             elements=st.sampled_from([0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 2.0, 1e-9, -3.25])),
    radius=st.sampled_from([0.25, 1.0, 1.5, 4.0]),
)
def test_methods_agree_hypothesis_ties(V, radius):
    _assert_methods_agree(V, radius)
