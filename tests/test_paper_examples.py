"""The seed papers' worked examples, computed by the library from the matrices they print."""

from __future__ import annotations

import numpy as np
import pytest
from paper_matrices import EX1_B as OM_B  # noqa: E402
from paper_matrices import EX1_W as OM_W  # noqa: E402
from paper_matrices import EX1_W_TILDE as OM_WT  # noqa: E402
from paper_matrices import LRM_A, LRM_B, LRM_W  # noqa: E402

from dpopt.baselines import identity_strategy, workload_strategy
from dpopt.error import expected_error
from dpopt.privacy import Privacy
from dpopt.strategy import Strategy
from dpopt.workloads import ExplicitWorkload

# The papers' values here are exact (integers, halves, sums of printed 4-digit entries), and each side is
# a handful of float operations on small exact or nearly exact inputs, so they agree to a few ulps; the
# least-squares route goes through a Cholesky solve with cond(A^T A) = 3.1 at n = 4 (n * cond *
# eps_mach ~ 3e-15). 1e-13 covers both with margin and is far below any wrong formula.
RTOL = 1e-13


@pytest.mark.parametrize("eps", [1.0, 0.1])
def test_lrm_section1_example(eps):
    w = ExplicitWorkload(LRM_W, name="lrm-example")
    p = Privacy(eps)
    nod = expected_error(identity_strategy(4), w, p)
    assert nod.total * eps**2 == pytest.approx(40.0, rel=RTOL)
    np.testing.assert_allclose(nod.per_query * eps**2, [12, 10, 18], rtol=RTOL)
    shown = Strategy(LRM_A, B=LRM_B, name="section-1 strategy")
    # column sums 1/3 + 2/3 and 1: within an ulp of 1
    assert shown.sens1 == pytest.approx(1.0, rel=RTOL)
    err = expected_error(shown, w, p)
    assert err.total * eps**2 == pytest.approx(39.0, rel=RTOL)
    np.testing.assert_allclose(err.per_query * eps**2, [12.5, 10, 16.5], rtol=RTOL)
    # the same A with least-squares reconstruction gives the same B (A is invertible)
    assert expected_error(Strategy(LRM_A), w, p).total * eps**2 == pytest.approx(39.0, rel=RTOL)
    # noise on queries: sensitivity 5, as the paper says (a sum of small integers: exact in floats)
    assert workload_strategy(w).sens1 == 5.0




def test_om_example1():
    w = ExplicitWorkload(OM_W, name="om-example-1")
    p = Privacy(1.0)
    noq = workload_strategy(w)
    # "S(Q) ~ 2.5 and there are 6 queries": noise variance ~ 75/eps^2 (2 S^2 per query)
    # a sum of three printed entries, 0.9812 + 0.7602 + 0.7122: a few ulps from the decimal 2.4536
    assert noq.sens1 == pytest.approx(2.4536, rel=RTOL)
    assert round(noq.sens1 * 2) / 2 == 2.5  # 4.9072 is far from a rounding boundary of round()
    noq_err = expected_error(noq, w, p).total
    assert noq_err == pytest.approx(2 * 6 * 2.4536**2, rel=RTOL)
    assert 70 < noq_err < 75  # 72.2, the paper's "~ 75" read to its one printed digit
    om = Strategy(OM_WT, B=OM_B, name="om example")
    # W~ is a permutation: B W~ only moves entries and adds zeros, exact in floating point
    np.testing.assert_array_equal(OM_B @ OM_WT, OM_W)
    assert om.sens1 == 1.0  # column sums of a 0/1 permutation matrix: exact
    # Theorem 5: 2 trace(B B^T) S(W~)^2 / eps^2, "less than 18/eps^2"
    om_err = expected_error(om, w, p).total
    assert om_err == pytest.approx(2 * np.trace(OM_B @ OM_B.T), rel=RTOL)
    assert om_err < 18  # 8.84, far inside the published bound
