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


@pytest.mark.parametrize("eps", [1.0, 0.1])
def test_lrm_section1_example(eps):
    w = ExplicitWorkload(LRM_W, name="lrm-example")
    p = Privacy(eps)
    nod = expected_error(identity_strategy(4), w, p)
    assert nod.total * eps**2 == pytest.approx(40.0)
    np.testing.assert_allclose(nod.per_query * eps**2, [12, 10, 18])
    shown = Strategy(LRM_A, B=LRM_B, name="section-1 strategy")
    assert shown.sens1 == pytest.approx(1.0)
    err = expected_error(shown, w, p)
    assert err.total * eps**2 == pytest.approx(39.0)
    np.testing.assert_allclose(err.per_query * eps**2, [12.5, 10, 16.5])
    # the same A with least-squares reconstruction gives the same B (A is invertible)
    assert expected_error(Strategy(LRM_A), w, p).total * eps**2 == pytest.approx(39.0)
    # noise on queries: sensitivity 5, as the paper says
    assert workload_strategy(w).sens1 == pytest.approx(5.0)




def test_om_example1():
    w = ExplicitWorkload(OM_W, name="om-example-1")
    p = Privacy(1.0)
    noq = workload_strategy(w)
    # "S(Q) ~ 2.5 and there are 6 queries": noise variance ~ 75/eps^2 (2 S^2 per query)
    assert noq.sens1 == pytest.approx(2.4536)
    assert round(noq.sens1 * 2) / 2 == 2.5
    noq_err = expected_error(noq, w, p).total
    assert noq_err == pytest.approx(2 * 6 * 2.4536**2)
    assert 70 < noq_err < 75
    om = Strategy(OM_WT, B=OM_B, name="om example")
    np.testing.assert_allclose(OM_B @ OM_WT, OM_W)
    assert om.sens1 == 1.0
    # Theorem 5: 2 trace(B B^T) S(W~)^2 / eps^2, "less than 18/eps^2"
    om_err = expected_error(om, w, p).total
    assert om_err == pytest.approx(2 * np.trace(OM_B @ OM_B.T))
    assert om_err < 18
