"""compare's release_total_error is the error `dpopt answer` gives: the noise OpenDP's release draws."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from dpopt.cli import main
from dpopt.compare import compare
from dpopt.data import Domain, IntegerRange
from dpopt.mechanisms import make_mechanism
from dpopt.privacy import Privacy
from dpopt.queries import marginal_workload, range_workload, stack_workloads
from dpopt.release import PrivacyLedger, release

# Both sides are sums over the same per-query variances (B's row norms, computed by two code paths) times
# the same certified sigma^2: they agree to rounding, far inside 1e-9.
RTOL = 1e-9


@pytest.fixture(scope="module")
def dom() -> Domain:
    return Domain([IntegerRange("a", 0, 7), IntegerRange("b", 0, 3)])


@pytest.mark.parametrize("calibration", ["classic", "analytic"])
@pytest.mark.parametrize(("eps", "delta"), [(1.0, 0.0), (1.0, 1e-6), (0.3, 1e-9), (3.0, 1e-3)])
def test_release_total_error_is_what_a_release_states(dom: Domain, eps: float, delta: float,
                                                      calibration: str) -> None:
    W = stack_workloads([range_workload(dom, "a"), marginal_workload(dom, ["b"])])
    privacy = Privacy(eps, delta, calibration=calibration)
    names = ["identity", "hierarchical", "hdmm"]
    df = compare(W, privacy, names, time_limit=None).set_index("mechanism")
    x = np.arange(dom.size, dtype=float)
    for name in names:
        mech = make_mechanism(name).fit(W, privacy)
        out = release(mech, x, PrivacyLedger(eps, delta), domain=dom)
        stated = float((out["std"] ** 2).sum())
        assert df.loc[name, "release_total_error"] == pytest.approx(stated, rel=RTOL)
        if delta == 0:  # Laplace: a release draws b = sens1/eps, the model's scale
            assert df.loc[name, "release_total_error"] == pytest.approx(df.loc[name, "expected_total_error"],
                                                                       rel=RTOL)


def test_compare_says_how_release_noise_differs() -> None:
    out = io.StringIO()
    import contextlib

    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        main(["compare", "--workload", "prefix:16", "--epsilon", "1", "--delta", "1e-6", "--mechanisms",
              "identity", "--calibration", "analytic"])
    text = out.getvalue()
    assert "release_total_error" in text and "OpenDP's certified Gaussian sigma" in text
    js = io.StringIO()
    with contextlib.redirect_stdout(js), contextlib.redirect_stderr(io.StringIO()):
        main(["compare", "--workload", "prefix:16", "--epsilon", "1", "--delta", "1e-6", "--mechanisms",
              "identity", "--calibration", "analytic", "--format", "json"])
    (row,) = json.loads(js.getvalue())
    # OpenDP's certified sigma is 4.5-15% above the analytic Gaussian's for eps 0.1-3 (see README)
    assert 1.04**2 < row["release_total_error"] / row["expected_total_error"] < 1.16**2
