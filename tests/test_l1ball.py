"""Tests for the column-wise L1-ball projection."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from dpopt.solvers.l1ball import project_l1_ball_columns

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


def test_known_value():
    # |v| = (3, 1, 0.5), radius 2: rho = 1, theta = 3 - 2 = 1 -> (2, 0, 0), L1 norm 2.
    V = np.array([[3.0], [-1.0], [0.5]])
    P = project_l1_ball_columns(V, radius=2.0)
    np.testing.assert_allclose(P[:, 0], [2.0, 0.0, 0.0], atol=1e-15)
    # |v| = (3, 2.5, 0), radius 2: theta = (5.5 - 2) / 2 = 1.75 -> (1.25, -0.75, 0)
    V = np.array([[3.0], [-2.5], [0.0]])
    P = project_l1_ball_columns(V, radius=2.0)
    np.testing.assert_allclose(P[:, 0], [1.25, -0.75, 0.0], atol=1e-15)


def test_against_cvxpy():
    cp = pytest.importorskip("cvxpy")
    rng = np.random.default_rng(0)
    V = rng.normal(size=(6, 4)) * np.array([0.05, 1.0, 3.0, 0.3])
    P = project_l1_ball_columns(V, radius=1.0)
    for j in range(V.shape[1]):
        x = cp.Variable(V.shape[0])
        prob = cp.Problem(cp.Minimize(cp.sum_squares(x - V[:, j])), [cp.norm1(x) <= 1.0])
        prob.solve(solver=cp.CLARABEL)
        np.testing.assert_allclose(P[:, j], x.value, atol=1e-6)


def test_inside_columns_unchanged_bitwise():
    V = np.array([[0.2, 5.0], [-0.3, 1.0], [0.1, -2.0]])
    P = project_l1_ball_columns(V)
    assert np.array_equal(P[:, 0], V[:, 0])
    assert abs(np.abs(P[:, 1]).sum() - 1.0) < 1e-12


def test_vector_input_and_does_not_mutate():
    v = np.array([2.0, -2.0])
    v0 = v.copy()
    p = project_l1_ball_columns(v, 1.0)
    assert p.shape == (2,)
    np.testing.assert_allclose(p, [0.5, -0.5])
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
def test_invalid_input(V, radius, match):
    with pytest.raises(ValueError, match=match):
        project_l1_ball_columns(V, radius)


@settings(max_examples=150, deadline=None)
@given(V=matrices, radius=radii)
def test_kkt_and_matches_bisection(V, radius):
    P = project_l1_ball_columns(V, radius)
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
        assert np.linalg.norm(PV[:, j] - PU[:, j]) <= np.linalg.norm(V[:, j] - U[:, j]) + 1e-9
