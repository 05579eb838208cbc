"""hdmm honours the fit budget: a capped selection is valid, flagged time_limit, and never worse than identity.

The time limit is so small that it always fires; the tests check the status and the returned strategy,
never how long anything took.
"""

from __future__ import annotations

import math
import time

import numpy as np

from dpopt.compare import compare
from dpopt.hdmm import optimize_union, select_strategy
from dpopt.mechanisms.base import fit_budget
from dpopt.mechanisms.registry import make_mechanism
from dpopt.privacy import Privacy
from dpopt.solvers.marginal_opt import (
    laplace_marginal_error,
    marginal_baselines,
    optimize_marginals_laplace,
)
from dpopt.solvers.pidentity import optimize_pidentity
from dpopt.solvers.result import TIME_LIMIT
from dpopt.workloads import AllRange, Identity, Kron, Marginals, Prefix, Stack

TINY = 1e-9
PURE = Privacy(1.0)
GAUSS = Privacy(1.0, 1e-6)


def _past() -> float:
    """A deadline that has already passed."""
    return time.perf_counter() - 1.0


def _check_capped_fit(W, privacy) -> None:
    mech = make_mechanism("hdmm").fit(W, privacy, time_limit=TINY)
    assert mech.fit_info_.status == f"{TIME_LIMIT}: valid, not certified optimal"
    err = mech.expected_error_.total
    assert math.isfinite(err) and err > 0
    assert mech.strategy_.to_dense().supports(W)
    ans = mech.answer(np.arange(W.n, dtype=float), np.random.default_rng(0))
    assert ans.shape == (W.m,) and np.all(np.isfinite(ans))
    ident = make_mechanism("identity").fit(W, privacy)
    assert err <= ident.expected_error_.total * (1 + 1e-9)
    assert mech.record()["status"].startswith(TIME_LIMIT)


def test_capped_eps_dp_fit_is_valid_and_never_worse_than_identity():
    _check_capped_fit(Prefix(64), PURE)
    _check_capped_fit(Kron([AllRange(8), Prefix(6)]), PURE)


def test_capped_gaussian_fit_is_valid_with_a_certified_gap():
    W = AllRange(32)
    _check_capped_fit(W, GAUSS)
    mech = make_mechanism("hdmm").fit(W, GAUSS, time_limit=TINY)
    assert mech.fit_info_.gap is not None and mech.fit_info_.gap >= 0
    assert mech.expected_error_.total >= mech.bound_ * (1 - 1e-9)


def test_budget_context_reaches_hdmm():
    with fit_budget(TINY):
        mech = make_mechanism("hdmm").fit(Prefix(32), PURE)
    assert mech.fit_info_.status.startswith(TIME_LIMIT)


def test_unbudgeted_fit_is_not_capped_and_reports_progress():
    events: list[dict] = []
    mech = make_mechanism("hdmm").fit(Prefix(16), PURE, progress=events.append)
    assert not mech.fit_info_.status.startswith(TIME_LIMIT)
    assert events and all(isinstance(e["iteration"], int) and "stage" in e for e in events)


def test_pidentity_past_deadline_keeps_its_first_run_and_skips_the_rest():
    G = np.asarray(Prefix(32).gram(), dtype=float)
    res = optimize_pidentity(G, 2, restarts=3, deadline=_past())
    assert res.status == TIME_LIMIT
    assert res.extra["restarts_run"] == 1 and len(res.extra["losses"]) == 1
    assert "2 skipped" in res.message
    assert res.x.shape == (2, 32) and np.all(res.x >= 0) and np.all(np.isfinite(res.x))
    assert math.isfinite(res.fun) and res.fun > 0
    # the returned Theta is the best iterate seen: no worse than the run's reported loss
    assert res.fun <= res.extra["losses"][0] * (1 + 1e-6)


def test_marginal_template_past_deadline_still_compares_baselines():
    w = Marginals([3, 4, 5, 2], k=2)
    strat, res = optimize_marginals_laplace(w, restarts=3, deadline=_past())
    assert res.status == TIME_LIMIT and len(res.extra["losses"]) == 1
    base = min(laplace_marginal_error(s, w) for s in marginal_baselines(w).values())
    assert laplace_marginal_error(strat, w) <= base * (1 + 1e-12)
    sel = select_strategy(w, PURE, deadline=_past())
    assert sel.status == TIME_LIMIT and math.isfinite(sel.error.total)


def test_union_descent_stops_after_one_sweep_and_skips_the_union_of_parts():
    U = Stack([Kron([AllRange(8), Identity(6)]), Kron([Identity(8), Prefix(6)])])
    for privacy in (PURE, GAUSS):
        sel = optimize_union(U, privacy, deadline=_past())
        assert sel.status == TIME_LIMIT
        assert len(sel.extra["history"]) == 1
        assert "skipped" in sel.extra
        assert math.isfinite(sel.error.total)


def test_compare_row_of_a_capped_hdmm():
    df = compare(Prefix(32), PURE, ["hdmm", "identity"], time_limit=TINY)
    row = df.set_index("mechanism").loc["hdmm"]
    assert str(row["status"]).startswith(TIME_LIMIT)
    assert math.isfinite(row["expected_total_error"])
