"""A sweep with a data vector answers through every mechanism's own strategy form (Kronecker, marginal, dense)."""

from __future__ import annotations

import numpy as np
import pytest

from dpopt.experiments import Task, run_sweep

TRIALS = 3000
# The sample mean of TRIALS i.i.d. squared-error totals lies within 5 standard errors of its expectation
# except with probability below 1e-6 (the totals have finite fourth moments: Laplace and Gaussian noise).
Z = 5.0


@pytest.mark.parametrize(
    ("spec", "mechanism", "delta"),
    [
        ("kron:allrange:8,prefix:4", "hdmm", 0.0),
        ("kron:allrange:8,prefix:4", "hdmm", 1e-6),
        ("allrange:8", "hdmm", 1e-6),
        ("marginals:3x4x2:2", "hdmm", 1e-6),
        ("prefix:8", "lrm", 0.0),
    ],
)
def test_sweep_with_data_runs_every_strategy_form(spec: str, mechanism: str, delta: float) -> None:
    t = Task(workload=spec, mechanism=mechanism, epsilon=1.0, delta=delta, data="poisson:20",
             monte_carlo_trials=TRIALS)
    r = run_sweep([t], max_workers=0, progress=False).iloc[0]
    assert not str(r["status"]).startswith(("error", "skipped")), r["status"]
    assert r["mc_status"] == "ok"
    # noise is zero-mean, so E||answers - W x||^2 = expected total error + bias (bias 0 unless W != B A)
    expected = r["expected_total_error"] + r["bias_sq"]
    assert abs(r["mc_total_mean"] - expected) < Z * r["mc_total_se"], (r["mc_total_mean"], expected)
    assert np.isfinite(r["bias_sq"]) and r["bias_sq"] >= 0
