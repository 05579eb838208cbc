"""hdmm's eps-DP factor path: OPT_0 first and never worse after it, structured Gram products, every size reports.

Speed (reaching OPT_0's value in no more CPU than its restarts) is measured in benchmarks/bench_hdmm_opt0.py, never
here; these tests check values and the path taken.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from dpopt.hdmm import baseline_candidates, laplace_factor, own_queries_error
from dpopt.mechanisms.registry import make_mechanism
from dpopt.privacy import Privacy
from dpopt.solvers.pidentity import (
    HDMM_FTOL,
    OPT0_RESTARTS,
    optimize_pidentity,
    pidentity_error,
    pidentity_loss_and_grad,
    search_pidentity,
)
from dpopt.solvers.result import TIME_LIMIT
from dpopt.workloads import AllRange, Prefix, Total, WidthK, WRange

EPS = np.finfo(float).eps
PURE = Privacy(1.0)


def test_loss_through_the_structured_gram_equals_the_dense_one():
    # The same formula with G V formed two ways; G V by cumulative sums differs from the dense product by at most
    # 4 (n + 1) eps (|G| |V|) per entry (`test_workloads_structured`), which moves the loss and gradient by the
    # same relative order times the terms' size: 1e-10 relative is far above that (n = 48) and far below any
    # wrong term.
    rng = np.random.default_rng(0)
    for W in (Prefix(48), AllRange(48), WidthK(48, 7)):
        G, p = W.gram(), 3
        th = rng.random(p * 48)
        dense = pidentity_loss_and_grad(th, G, p)
        fast = pidentity_loss_and_grad(th, G, p, W.gram_matvec)
        assert fast[0] == pytest.approx(dense[0], rel=1e-10)
        np.testing.assert_allclose(fast[1], dense[1], rtol=1e-10, atol=1e-10 * np.abs(dense[1]).max())


@pytest.mark.parametrize("W", [Prefix(64), AllRange(64)], ids=lambda w: w.name)
def test_search_runs_opt0_first_and_only_improves_on_it(W):
    G, p, seed = W.gram(), 4, 3
    opt0 = optimize_pidentity(G, p, restarts=OPT0_RESTARTS, seed=seed, ftol=HDMM_FTOL, gram_matvec=W.gram_matvec)
    # with HDMM's own stopping test: the same runs from the same starts in the same arithmetic, OPT_0's value exactly
    hdmm_test = search_pidentity(G, p, seed=seed, rounds=0, gram_matvec=W.gram_matvec, screen=None)
    assert hdmm_test.extra["opt0"] == min(opt0.extra["losses"])
    # with the default test over ten iterations the same runs go on at least as far (a window of steps each gaining
    # under 1e-4 contains a step that ends HDMM's run), so no run ends higher
    res = search_pidentity(G, p, seed=seed, rounds=1, gram_matvec=W.gram_matvec)
    assert res.extra["opt0"] <= min(opt0.extra["losses"])
    assert res.fun <= res.extra["opt0"]
    history = res.extra["history"]
    values = [v for _, v, _ in history]
    assert all(b < a for a, b in zip(values, values[1:], strict=False))  # only improvements are recorded
    assert all(b >= a for (a, _, _), (b, _, _) in zip(history, history[1:], strict=False))  # CPU seconds
    assert history[0][2].startswith("OPT_0") and res.fun == values[-1]
    assert res.extra["rounds"] == 1 and np.all(res.x >= 0) and res.x.shape == (p, W.n)
    # the value it reports is the strategy's error as the optimiser evaluated it (Woodbury form, 1e-8 relative
    # at n = 256 per `pidentity_error`'s note); its Cholesky evaluation agrees far inside 1e-6
    assert res.fun == pytest.approx(pidentity_error(res.x, G), rel=1e-6)


def test_monitor_ends_a_run_whose_last_k_iterations_gained_less_than_rtol():
    from types import SimpleNamespace

    from dpopt.solvers.lbfgs import LbfgsMonitor

    mon = LbfgsMonitor(np.zeros(1), None, None, "test", flat=(3, 1e-3))
    values = [10.0, 9.0, 8.999, 8.998, 8.997, 8.996]  # from 9.0 on, three steps gain 3e-3 in all: 3.3e-4 relative
    for i, v in enumerate(values):
        step = SimpleNamespace(fun=v, x=np.full(1, v))
        if i < 4:
            mon(step)  # 10 -> 8.998 over three steps gains more than 1e-3 of 8.998: goes on
        else:
            with pytest.raises(StopIteration):
                mon(step)
            break
    assert mon.flat and not mon.stopped and mon.best_fun == 8.997


def test_search_past_its_deadline_keeps_a_valid_strategy():
    G = Prefix(32).gram()
    res = search_pidentity(G, 2, deadline=time.perf_counter() - 1.0)
    assert res.status == TIME_LIMIT and res.extra["rounds"] == 0
    assert res.x.shape == (2, 32) and np.all(res.x >= 0) and math.isfinite(res.fun)


def test_factor_is_never_worse_than_its_baselines():
    # AllRange(16): OPT_0 alone lost to identity here (852 against 816)
    G = AllRange(16).gram()
    A, res = laplace_factor(G, deadline=time.perf_counter() - 1.0)
    base = {name: err for name, (_, err) in baseline_candidates(G, norm=1).items()}
    kept = res.extra["candidates"][res.extra["kept"]]
    assert kept <= min(base.values())
    # the identity's error is trace(G) without a solve; the others through their Cholesky factors (cond < 1e3 at
    # n = 16): the scored errors are those of the returned matrix, to n cond eps
    assert base["identity"] == float(np.trace(G))
    S = A / np.abs(A).sum(axis=0).max()
    assert kept == pytest.approx(float(np.trace(G @ np.linalg.inv(S.T @ S))), rel=1e-10)


def test_own_queries_error_is_sensitivity_squared_times_rank():
    # WRange(6, 40): 6 queries of rank <= 6 over 40 cells, where measuring the queries themselves can win
    W = WRange(6, 40, seed=1)
    G = W.gram()
    rank = np.linalg.matrix_rank(W.matrix())
    assert own_queries_error(W, G, 1, math.inf) == W.max_column_norm(1) ** 2 * rank
    # Prefix(64): sens1 = 64, and rank >= trace(G)^2 / ||G||_F^2 >= 1, so it cannot beat 64^2; not computed
    assert own_queries_error(Prefix(64), Prefix(64).gram(), 1, 64.0**2) is None
    assert own_queries_error(Total(5), Total(5).gram(), 1, math.inf) == 1.0  # one query, each column one 1


@pytest.mark.parametrize("privacy", [PURE, Privacy(1.0, 1e-6)], ids=["eps", "eps-delta"])
def test_hdmm_reports_its_row_where_allrange_rows_cannot_be_listed(privacy):
    # AllRange(810) has 810 * 328,455 > MAX_DENSE_ENTRIES entries: the factor's own queries are scored through
    # its sensitivity and rank, never formed (the row used to be skipped after the fit)
    W = AllRange(810)
    assert not W.has_rows
    rec = make_mechanism("hdmm").fit(W, privacy, time_limit=1e-9).record()
    assert math.isfinite(rec["expected_total_error"]) and rec["expected_total_error"] > 0
    assert rec["status"].startswith(TIME_LIMIT) and rec["bound_kind"] == "svd"


def test_records_name_their_bound():
    W = Prefix(16)
    svdb = PURE.variance_factor * W.svd_bound()
    for name in ("wavelet", "hdmm"):
        rec = make_mechanism(name).fit(W, PURE).record()
        # both are P times the one SVD bound function of the same workload: the same number
        assert rec["bound_kind"] == "svd" and rec["bound"] == svdb, name
    hd = make_mechanism("hdmm").fit(W, PURE)
    assert hd.record()["certified_bound"] == hd.bound_ >= svdb


def test_factor_is_never_worse_than_the_hierarchical_mechanism():
    # WRange(300, 256): Qardaji et al.'s 16-ary hierarchy without its root beats the binary one and the wavelet here,
    # so a factor search stopped before its first step must keep it, at the hierarchical mechanism's error
    W = WRange(300, 256, seed=3)
    privacy = Privacy(epsilon=1.0)
    G = W.gram()
    _, res = laplace_factor(G, deadline=time.perf_counter() - 1.0)
    hier = make_mechanism("hierarchical").fit(W, privacy)
    unit = hier.expected_error_.total / privacy.variance_factor
    # both are sens1^2 trace(G (A^T A)^-1) of one 0/1 strategy through Cholesky solves, cond(A^T A) < 1e4 at n = 256
    assert res.extra["kept"] == "hierarchical(b=16)"
    assert res.extra["candidates"]["hierarchical(b=16)"] == pytest.approx(unit, rel=1e-9)
