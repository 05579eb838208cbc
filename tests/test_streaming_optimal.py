"""The optimal streaming family (dpopt.streaming.optimal) and the causal factor (dpopt.streaming.causal).

The family runs once the streaming package's shared modules (dpopt.streaming.base, .participation) are in the build;
the causal factor is checked on its own. Losses are recomputed from the returned C in plain numpy (B = A C^{-1} by
np.linalg.solve, the sensitivity of C^T C by the conic SDP of formulations.streaming), independently of the family's
own `dense_losses`.
"""

from __future__ import annotations

import numpy as np
import pytest

from dpopt.streaming.causal import causal_factor

EPS = np.finfo(float).eps
#: The conic sensitivity (Clarabel at its default 1e-8) and the solver's tol 1e-8: the recomputed losses agree with the
#: reported ones to about their sum; 1e-6 leaves room for the conic residuals (relative to entries of size n).
CONIC_RTOL = 1e-6


def test_causal_factor_is_lower_triangular_with_gram_x():
    rng = np.random.default_rng(0)
    M = rng.standard_normal((20, 20))
    X = M @ M.T + 0.1 * np.eye(20)
    C = causal_factor(X)
    assert np.all(np.triu(C, 1) == 0)
    np.testing.assert_allclose(C.T @ C, X, atol=20 * 20 * EPS * np.abs(X).max() * np.linalg.cond(X) ** 0.5)
    with pytest.raises(ValueError, match="positive definite"):
        causal_factor(-X)
    with pytest.raises(ValueError, match="square"):
        causal_factor(np.ones((3, 4)))


def _base():
    return pytest.importorskip("dpopt.streaming.base", reason="the streaming package's shared modules are not in this build")


def _family(name, A, p, objective):
    from dpopt.streaming.families import FAMILIES

    return FAMILIES[name](A, p, objective=objective)


@pytest.mark.parametrize("objective", ["mean", "max"])
def test_optimal_family_report_and_recomputed_losses(objective):
    base = _base()
    from dpopt.streaming.participation import Participation
    from dpopt.workloads import Prefix
    from formulations.streaming import participation_sensitivity

    n, k = 32, 4
    p = Participation(n, k)
    f = _family("optimal", Prefix(n), p, objective)
    assert tuple(f.record()) == base.RECORD_KEYS
    assert f.family == "optimal" and f.status == "converged" and 0.0 <= f.gap <= 1e-7
    A = Prefix(n).matrix()
    C = f.C
    assert np.all(np.triu(C, 1) == 0)
    B = np.linalg.solve(C.T, A.T).T
    np.testing.assert_allclose(B @ C, A, atol=n * EPS * np.linalg.cond(C) * np.abs(A).max())
    sens = participation_sensitivity(C.T @ C, p.patterns())
    rows = np.einsum("ij,ij->i", B, B)
    assert f.mean_loss == pytest.approx(sens * rows.sum() / n, rel=CONIC_RTOL)
    assert f.max_loss == pytest.approx(sens * rows.max(), rel=CONIC_RTOL)
    assert f.lower_bound <= f.loss
    assert f.sensitivity <= 1.0 + 1e-9  # C^T C is the solver's X, certified at sensitivity <= 1 (rounding of C^T C)


@pytest.mark.parametrize("objective", ["mean", "max"])
def test_lower_bound_is_below_every_family(objective):
    _base()
    from dpopt.streaming.families import FAMILIES
    from dpopt.streaming.participation import Participation
    from dpopt.workloads import Prefix

    n, k = 48, 4
    p = Participation(n, k)
    f = _family("optimal", Prefix(n), p, objective)
    if objective == "mean":
        assert f.lower_bound == pytest.approx(18.0418381, abs=1e-6)  # 18.04 stated to two decimals (mean loss)
    for name in FAMILIES:
        if name != "optimal":
            other = _family(name, Prefix(n), p, objective)
            assert f.lower_bound <= other.loss, name


def test_refuses_what_it_cannot_solve():
    _base()
    from dpopt.streaming.optimal import MAX_OPTIMAL_STEPS, optimise
    from dpopt.streaming.participation import Participation
    from dpopt.workloads import Prefix

    n = 2 * MAX_OPTIMAL_STEPS
    with pytest.raises(ValueError, match="n <= "):
        optimise(Prefix(n), Participation(n, 2))
    with pytest.raises(ValueError):
        optimise(np.triu(np.ones((8, 8))), Participation(8, 2))  # not lower triangular
