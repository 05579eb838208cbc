"""Ill-posed input gets a clear ValueError from the model builders, before any solver is called."""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest

from dpopt.workloads import ExplicitWorkload, Prefix
from formulations import appendix_b, eigen_design, lrm, mm_approx, mm_pure, per_query
from formulations.inputs import gram_data, thin_factor
from formulations.solve import solve

GRAM_BUILDERS = {
    "mm_approx": mm_approx.build,
    "mm_pure": mm_pure.build,
    "eigen_design": eigen_design.build,
    "appendix_b": appendix_b.build,
}


def _per_query(W, **kw):
    m = W.m if hasattr(W, "m") else np.asarray(W).shape[0]
    return per_query.build(W, np.ones(m), **kw)


@pytest.fixture(autouse=True)
def no_solver_calls(monkeypatch):
    """Any call into CVXPY's solve path during these tests is an error."""

    def refuse(*args, **kwargs):
        raise AssertionError("a solver was called although the input is invalid")

    monkeypatch.setattr(cp.Problem, "get_problem_data", refuse)
    monkeypatch.setattr(cp.Problem, "solve", refuse)


def _bad_workloads() -> dict[str, np.ndarray]:
    W = Prefix(5).matrix()
    zero_col = W.copy()
    zero_col[:, 2] = 0.0
    nan = W.copy()
    nan[1, 1] = np.nan
    inf = W.copy()
    inf[0, 3] = np.inf
    return {
        "zero workload": (np.zeros((4, 5)), "all zeros"),
        "zero column": (zero_col, "all-zero column"),
        "NaN": (nan, "NaN or infinite"),
        "inf": (inf, "NaN or infinite"),
    }


@pytest.mark.parametrize("case", list(_bad_workloads()))
@pytest.mark.parametrize("builder", list(GRAM_BUILDERS))
def test_gram_models_refuse_bad_workloads(builder, case):
    W, message = _bad_workloads()[case]
    if case in ("NaN", "inf"):
        # A Gram matrix given directly (a Workload with NaN entries is refused by dpopt.workloads).
        bad = Prefix(5).gram().copy()
        bad[1, 2] = bad[2, 1] = np.nan if case == "NaN" else np.inf
    else:
        bad = ExplicitWorkload(W)
    with pytest.raises(ValueError, match=message):
        GRAM_BUILDERS[builder](bad)


@pytest.mark.parametrize("case", list(_bad_workloads()))
@pytest.mark.parametrize("builder", ["per_query", "lrm"])
def test_row_models_refuse_bad_workloads(builder, case):
    W, message = _bad_workloads()[case]
    with pytest.raises(ValueError, match=message):
        if builder == "per_query":
            _per_query(W)
        else:
            lrm.fit(W)


@pytest.mark.parametrize("builder", list(GRAM_BUILDERS))
def test_gram_must_be_square_symmetric_psd(builder):
    build = GRAM_BUILDERS[builder]
    with pytest.raises(ValueError, match="square Gram"):
        build(np.ones((3, 4)))
    asym = np.eye(3)
    asym[0, 1] = 0.5
    with pytest.raises(ValueError, match="symmetric"):
        build(asym)
    with pytest.raises(ValueError, match="positive semidefinite"):
        build(np.diag([1.0, -0.5, 2.0]))
    with pytest.raises(ValueError, match="2-D"):
        build(np.ones(3))


def test_per_query_bounds_are_checked():
    W = Prefix(4)
    with pytest.raises(ValueError, match="length 3"):
        per_query.build(W, np.ones(3))
    with pytest.raises(ValueError, match="> 0"):
        per_query.build(W, np.array([1.0, 0.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="NaN"):
        per_query.build(W, np.array([1.0, np.nan, 1.0, 1.0]))


def test_other_options_are_checked():
    with pytest.raises(ValueError, match="zero_columns"):
        mm_approx.build(Prefix(4), zero_columns="ignore")
    with pytest.raises(ValueError, match="cuts"):
        mm_pure.build(Prefix(4), cuts="pentagon")
    with pytest.raises(ValueError, match="mu"):
        appendix_b.build(Prefix(4), mu=-1.0)
    with pytest.raises(ValueError, match="gamma"):
        lrm.fit(Prefix(4), gamma=-1.0)
    with pytest.raises(ValueError, match="r must"):
        lrm.fit(Prefix(4), r=0)
    with pytest.raises(ValueError, match="unit L1 ball"):
        lrm.fit(Prefix(4), start=2 * np.eye(4))


def test_thin_factor_reproduces_the_gram_with_rank_rows():
    rng = np.random.default_rng(3)
    W = rng.normal(size=(40, 3)) @ rng.normal(size=(3, 7))  # rank 3, 40 queries
    V = thin_factor(W.T @ W)
    # the 4 null eigenvalues come out at ~ n eps ||G|| ~ 1.5e-15 ||G||, far below the cut at
    # THIN_FACTOR_RTOL = 1e-12 of the largest; the 3 others are of order ||G||: the rank is robust
    assert V.shape == (3, 7)
    # eigendecomposition backward error ~ n eps ||G||, plus the dropped eigenvalues (4 x <= 1e-12 ||G||)
    np.testing.assert_allclose(V.T @ V, W.T @ W, atol=1e-11 * np.abs(W.T @ W).max())


def test_drop_records_the_dropped_cells():
    W = Prefix(5).matrix()
    W[:, [1, 3]] = 0.0
    data = gram_data(ExplicitWorkload(W), zero_columns="drop")
    assert data.kept.tolist() == [0, 2, 4] and data.dropped.tolist() == [1, 3]
    np.testing.assert_array_equal(data.G_full(), W.T @ W)  # integer Gram: exact in floating point


def test_dropped_columns_get_a_strategy_that_measures_nothing_there(monkeypatch):
    monkeypatch.undo()  # this test solves
    W = Prefix(6).matrix()
    W[:, 4] = 0.0
    res = solve(mm_approx.build(ExplicitWorkload(W), zero_columns="drop"), "clarabel")
    A = np.asarray(res.strategy.A)
    assert A.shape[1] == 6 and np.all(A[:, 4] == 0)
    assert res.strategy.supports(W, rtol=1e-8)  # A has full rank on the kept cells: W = (W A^+) A exactly
    # Seed 004 Prop. 3.6 (v): the optimum equals that of the workload without the zero column.
    reduced = solve(mm_approx.build(ExplicitWorkload(np.delete(W, 4, axis=1))), "clarabel")
    # two Clarabel solves at the default tol 1e-8 (relative gap), each within 1e-8 of the same optimum
    assert res.objective == pytest.approx(reduced.objective, rel=1e-7)
