"""mm-optimal on marginal workloads: the (eps, delta) optimum in closed form through the marginal algebra."""

from __future__ import annotations

import numpy as np
import pytest

from dpopt.mechanisms import make_mechanism
from dpopt.privacy import Privacy
from dpopt.specs import parse_workload
from dpopt.workloads import MAX_DENSE_ENTRIES, GramWorkload

APPROX = Privacy(1.0, 1e-6)


@pytest.mark.parametrize("spec", ["marginals:3x4x5:2", "marginals:2x3x4:1", "marginals:2x2x3x3:3"])
def test_closed_form_is_the_dense_convex_optimum(spec):
    # The dense solver is certified to its gap (tol 1e-8 on the normalised Gram); the closed form meets the
    # SVD bound. They agree within the dense gap plus the rounding of both evaluations (1e-12 relative).
    w = parse_workload(spec)
    fac = make_mechanism("mm-optimal").fit(w, APPROX)
    assert fac.strategy_.factored and fac.fit_info_.solver.startswith("residual planner")
    assert 0 <= fac.fit_info_.gap <= 1e-9 and fac.fit_info_.status == "converged"
    dense = make_mechanism("mm-optimal").fit(GramWorkload(w.gram(), name="dense", m=w.m), APPROX)
    gap = max(dense.fit_info_.gap, 0.0)
    assert fac.expected_error_.total <= dense.expected_error_.total * (1 + 1e-12)
    assert fac.expected_error_.total >= dense.expected_error_.total * (1 - gap - 1e-12)


def test_a_marginal_domain_too_large_for_dense_is_fitted_and_answered():
    w = parse_workload("marginals:20x20x20x20:2")
    assert w.n**2 > MAX_DENSE_ENTRIES
    mech = make_mechanism("mm-optimal").fit(w, APPROX)
    assert mech.fit_info_.gap <= 1e-9
    x = np.random.default_rng(0).integers(0, 5, w.n).astype(float)
    got = mech.answers_with(x, lambda y, sens: y)  # noiseless: the reconstruction must give W x
    want = mech.workload_.matvec(x)
    # Each answer is a sum over at most 2^4 residual blocks with orthonormal bases: rounding about
    # 16 * 1.6e5 cells * eps ~ 6e-10 of the largest answer at worst, so 1e-9 of it leaves room, and a wrong
    # block or weight is off by whole counts.
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-9 * np.abs(want).max())


def test_eps_dp_keeps_the_dense_selection():
    # Under eps-DP the marginal algebra's L2 optimum is not the objective; the dense path (with its
    # baselines) runs where it fits, as before.
    w = parse_workload("marginals:3x4x5:2")
    mech = make_mechanism("mm-optimal").fit(w, Privacy(1.0))
    assert not mech.strategy_.factored
