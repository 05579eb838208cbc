"""mm-optimal with objective='max' (certified minimax per-query variance) and compare's max_query_std."""

from __future__ import annotations

import contextlib
import io
import json
import math

import numpy as np
import pytest

from dpopt.cli import main
from dpopt.mechanisms import make_mechanism
from dpopt.mechanisms.base import MechanismError
from dpopt.privacy import Privacy
from dpopt.specs import parse_workload

PRIV = Privacy(1.0, 1e-6)
# dense per-query variances through pinv: accurate to n cond(A) eps, far inside this for n <= 64
RTOL = 1e-9


def _dense_query_variances(mech) -> np.ndarray:
    """P sens^2 diag(W A^+ A^+T W^T) computed from the dense matrices (independent of the library's paths)."""
    W = mech.workload_.matrix()
    A = np.asarray(mech.strategy_.A.todense() if hasattr(mech.strategy_.A, "todense") else mech.strategy_.A)
    sens = np.sqrt((A**2).sum(axis=0)).max() if mech.privacy_.norm == 2 else np.abs(A).sum(axis=0).max()
    B = W @ np.linalg.pinv(A)
    return mech.privacy_.variance_factor * sens**2 * np.einsum("ij,ij->i", B, B)


@pytest.mark.parametrize("spec", ["prefix:32", "allrange:16", "wrange:20x24"])
def test_minimax_strategy_beats_the_sum_optimum_and_baselines_on_the_largest_variance(spec: str) -> None:
    W = parse_workload(spec)
    mx = make_mechanism("mm-optimal", objective="max").fit(W, PRIV)
    sm = make_mechanism("mm-optimal").fit(W, PRIV)
    v_max = _dense_query_variances(mx)
    gap = mx.fit_info_.gap
    assert mx.fit_info_.status.startswith("converged") and gap <= 1e-6
    # certified: the largest variance is within the gap of the certified lower bound (unit noise, sens2 = 1)
    lower = mx.fit_info_.extra["unit_lower_bound"] * PRIV.variance_factor
    assert lower * (1 - RTOL) <= v_max.max() <= lower * (1 + gap) * (1 + RTOL)
    for other in [sm] + [make_mechanism(b).fit(W, PRIV) for b in ("identity", "hierarchical", "wavelet")]:
        assert v_max.max() <= _dense_query_variances(other).max() * (1 + RTOL)


def test_weighted_targets_are_minimised_relative_to_each_query() -> None:
    W = parse_workload("prefix:16")
    c = np.linspace(1.0, 3.0, 16)
    mx = make_mechanism("mm-optimal", objective="max", targets=c).fit(W, PRIV)
    sm = make_mechanism("mm-optimal").fit(W, PRIV)
    ratio = _dense_query_variances(mx) / c
    lower = mx.fit_info_.extra["unit_lower_bound"] * PRIV.variance_factor
    assert ratio.max() <= lower * (1 + mx.fit_info_.gap) * (1 + RTOL)
    assert ratio.max() < (_dense_query_variances(sm) / c).max()


def test_bad_objective_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="objective must be one of"):
        make_mechanism("mm-optimal", objective="median")
    with pytest.raises(ValueError, match="mm-optimal"):
        make_mechanism("eigen", objective="max")
    with pytest.raises(ValueError, match="targets"):
        make_mechanism("mm-optimal", objective="max", targets=[1.0, -2.0])
    with pytest.raises(MechanismError, match="3 targets for 8 queries"):
        make_mechanism("mm-optimal", objective="max", targets=[1.0, 2.0, 3.0]).fit(parse_workload("prefix:8"), PRIV)


def _compare_json(*args: str) -> list[dict]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["compare", *args, "--format", "json"]) == 0
    return json.loads(out.getvalue())


def test_compare_reports_max_query_std_and_optimises_it_on_request() -> None:
    args = ["--workload", "prefix:24", "--epsilon", "1", "--delta", "1e-6", "-m", "identity,wavelet,mm-optimal"]
    rows = {r["mechanism"]: r for r in _compare_json(*args)}
    rows_max = {r["mechanism"]: r for r in _compare_json(*args, "--objective", "max")}
    # identity on Prefix(n): query i sums i + 1 cells, the largest variance is n P (sens2 = 1)
    assert rows["identity"]["max_query_std"] == pytest.approx(math.sqrt(24 * PRIV.variance_factor), rel=RTOL)
    for name in ("wavelet", "mm-optimal"):
        mech = make_mechanism(name).fit(parse_workload("prefix:24"), PRIV)
        assert rows[name]["max_query_std"] == pytest.approx(math.sqrt(_dense_query_variances(mech).max()), rel=1e-7)
    assert rows_max["mm-optimal"]["max_query_std"] < rows["mm-optimal"]["max_query_std"]
    assert rows_max["mm-optimal"]["expected_total_error"] >= rows["mm-optimal"]["expected_total_error"] * (1 - 1e-8)
    assert rows_max["identity"]["max_query_std"] == rows["identity"]["max_query_std"]
