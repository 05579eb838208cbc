"""Time budgets for fits and `dpopt compare`: capped solvers keep a valid strategy, estimates skip, Ctrl-C
keeps the finished rows, and the table says what its columns mean and who won.

No test depends on how fast the machine is: a "tiny" time limit is 1e-9 s, which every solver's first
deadline check exceeds (none of them starts at its optimum on all range queries), and cost estimates
are either made to exceed the limit by a monkeypatched probe or are checked only for their message.
"""

from __future__ import annotations

import io
import json
import math
import time

import numpy as np
import pytest

import dpopt.compare as compare_mod
import dpopt.mechanisms.lowrank as lowrank_mod
from dpopt.cli import main
from dpopt.mechanisms.base import MechanismError, fit_budget
from dpopt.mechanisms.baselines import HierarchicalMechanism
from dpopt.mechanisms.convergence import ConvergenceWarning
from dpopt.mechanisms.registry import COST_ORDER, make_mechanism
from dpopt.privacy import Privacy
from dpopt.workloads import AllRange

TINY = 1e-9
ITERATIVE = ("eigen", "mm-optimal", "mm-appendix-b", "lrm")
MATRIX = ("eigen", "mm-optimal", "mm-appendix-b")


def run(capsys, *args):
    code = main(["compare", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _valid(mech, workload) -> None:
    """The fitted strategy answers the workload exactly (fit checked it) and its error is at least the bound."""
    assert mech.strategy_.supports(workload, mech.support_rtol)
    err = mech.expected_error_.total
    assert math.isfinite(err)
    # The bound is a lower bound for every strategy; 1e-9 relative covers the rounding of both sides.
    assert err >= mech.bound_ * (1 - 1e-9)


@pytest.mark.parametrize("name", MATRIX)
@pytest.mark.parametrize("privacy", [Privacy(1.0), Privacy(1.0, 1e-6)], ids=["pure", "approx"])
def test_fit_time_limit_keeps_a_valid_strategy(name, privacy):
    W = AllRange(32)
    with pytest.warns(ConvergenceWarning, match="time_limit"):
        mech = make_mechanism(name).fit(W, privacy, time_limit=TINY)
    assert mech.fit_info_.status.startswith("time_limit: valid, not certified optimal")
    _valid(mech, W)
    # every matrix-mechanism solver certifies a relative duality gap, also when capped
    assert mech.fit_info_.gap is not None and mech.fit_info_.gap >= 0


def test_lrm_refuses_a_budget_below_its_fixed_cost():
    with pytest.raises(MechanismError, match="would take about .* s .*time limit"):
        make_mechanism("lrm").fit(AllRange(16), Privacy(1.0), time_limit=TINY)


def test_lrm_capped_returns_its_best_valid_pair(monkeypatch):
    # With no reserve, the solver itself gets the tiny budget and stops after its first outer iteration.
    monkeypatch.setattr(lowrank_mod, "FIXED_COST_SVDS", 0.0)
    W = AllRange(16)
    with pytest.warns(ConvergenceWarning):
        mech = make_mechanism("lrm").fit(W, Privacy(1.0), time_limit=TINY)
    assert mech.fit_info_.status.startswith("time_limit")
    _valid(mech, W)
    # The noise-on-data start is one of the candidates, so the capped LRM is never worse than identity
    # (same error formula on the same B L = W; 1e-12 relative covers the rounding of the two sums).
    ident = make_mechanism("identity").fit(W, Privacy(1.0))
    assert mech.expected_error_.total <= ident.expected_error_.total * (1 + 1e-12)


def test_budget_reaches_subclass_fits_and_unbudgeted_mechanisms_accept_it():
    W = AllRange(16)
    for name in ("om", "hdmm", "wavelet"):
        mech = make_mechanism(name).fit(W, Privacy(1.0), time_limit=30.0)
        assert math.isfinite(mech.expected_error_.total)
    with pytest.raises(ValueError, match="time_limit"):
        make_mechanism("eigen").fit(W, Privacy(1.0), time_limit=-1.0)
    # the context form: a fit inside fit_budget is capped without passing the keyword
    with fit_budget(TINY), pytest.warns(ConvergenceWarning):
        mech = make_mechanism("mm-optimal").fit(W, Privacy(1.0, 1e-6))
    assert mech.fit_info_.status.startswith("time_limit")


def test_progress_reports_iterations_and_gap():
    events: list[dict] = []
    make_mechanism("eigen").fit(AllRange(32), Privacy(1.0, 1e-6), progress=events.append)
    assert events and all("iteration" in e for e in events)
    assert all(e["gap"] >= 0 for e in events if "gap" in e) and any("gap" in e for e in events)


def test_tiny_time_limit_cli_every_iterative_row_capped_or_skipped(capsys):
    code, out, err = run(capsys, "-w", "allrange:32", "-e", "1", "--time-limit", str(TINY), "-f", "json")
    assert code == 0, err
    assert "Traceback" not in err
    recs = {r["mechanism"]: r for r in json.loads(out)}
    assert set(ITERATIVE) <= set(recs)
    for name in ITERATIVE:
        status = recs[name]["status"]
        if status.startswith("skipped:"):
            assert "would take about" in status and "--time-limit" in status, status
        else:
            assert status.startswith("time_limit"), status
            assert recs[name]["expected_total_error"] is not None


def test_estimate_above_the_limit_skips_with_the_estimate(capsys, monkeypatch):
    # A probe of 10 s per eigendecomposition: Appendix B's 55 of them and the baseline check's 3 exceed the
    # 60 s default.
    monkeypatch.setattr(compare_mod, "eigh_seconds", lambda n: 10.0)
    code, out, err = run(capsys, "-w", "allrange:16", "-e", "1", "-m", "identity,mm-appendix-b", "-f", "json")
    assert code == 0
    rec = {r["mechanism"]: r for r in json.loads(out)}["mm-appendix-b"]
    assert rec["status"].startswith("skipped: would take about 580 s") and "--time-limit" in rec["status"]
    assert "skipping mm-appendix-b on allrange(16): estimated 580 s" in err


def test_budget_options_keep_the_callers_own_limit_and_callback():
    seen: list[str] = []
    mech = make_mechanism("eigen", solver_options={"time_limit": 5.0, "callback": lambda info: seen.append("own")})
    events: list[dict] = []
    opts = mech._budgeted_options(mech.solver_options, fit_budget_of(1e6, events.append), t0=time.perf_counter())
    assert opts["time_limit"] == 5.0  # the caller's own limit is smaller than what is left of 1e6 s
    opts["callback"]({"nit": 2, "gap": 0.5})
    assert seen == ["own"] and events == [{"iteration": 2, "gap": 0.5}]
    assert mech.solver_options["time_limit"] == 5.0 and "callback" in mech.solver_options  # not modified


def fit_budget_of(time_limit, progress):
    from dpopt.mechanisms.base import FitBudget

    return FitBudget(time_limit, progress)


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_ctrl_c_prints_the_finished_rows_and_exits_130(capsys, monkeypatch, fmt):
    monkeypatch.setattr(HierarchicalMechanism, "fit", _interrupt)
    # given out of order: they run laplace, identity, hierarchical (interrupted), wavelet
    code, out, err = run(capsys, "-w", "prefix:16", "-e", "1", "-m", "wavelet,hierarchical,identity,laplace",
                         "-f", fmt)
    assert code == 130
    assert "Traceback" not in err
    assert "not finished: hierarchical, wavelet" in err
    if fmt == "json":
        assert {r["mechanism"] for r in json.loads(out)} == {"laplace", "identity"}
    else:
        table = _parse_table(out)
        assert {r["mechanism"] for r in table} == {"laplace", "identity"}
        assert "interrupted (Ctrl-C) before finishing: hierarchical, wavelet" in out


def _parse_table(text: str) -> list[dict[str, str]]:
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.split()[:1] == ["mechanism"])
    header = lines[first].split()
    rows = []
    for line in lines[first + 1:]:
        if not line.strip():
            break
        rows.append(dict(zip(header, line.split(None, len(header) - 1), strict=True)))
    return rows


def test_table_explains_columns_and_names_the_winner(capsys):
    args = ["-w", "prefix:16", "-e", "0.5", "-d", "1e-6", "-m", "laplace,wavelet,identity,hierarchical"]
    code, out, _ = run(capsys, *args, "-f", "json")
    recs = json.loads(out)
    best = min(recs, key=lambda r: r["expected_total_error"])
    code, out, _ = run(capsys, *args, "-f", "table")
    assert code == 0
    assert "eps=0.5, delta=1e-06" in out and "calibration: gaussian-classic" in out
    assert ("ratio_to_bound = expected_total_error / bound; bound: a lower bound for every strategy, named by "
            "bound_kind: 'svd' = P(eps,delta) * SVDB(W)") in out
    assert f"best: {best['mechanism']} (ratio {best['ratio_to_bound']:.4f})" in out.splitlines()
    # rows were printed as they finished, in the fixed cost order, before the sorted table
    finished = [line.split()[1].rstrip(":") for line in out.splitlines() if line.startswith("finished ")]
    assert finished == [n for n in COST_ORDER if n in {"laplace", "wavelet", "identity", "hierarchical"}]
    # json and csv stay machine-readable: no header or footer
    assert json.loads(run(capsys, *args, "-f", "json")[1])
    csv = run(capsys, *args, "-f", "csv")[1]
    assert csv.splitlines()[0].startswith("mechanism,") and "best:" not in csv


def test_progress_without_a_terminal_is_one_line_per_mechanism(capsys):
    code, _, err = run(capsys, "-w", "prefix:16", "-e", "1", "-m", "identity,eigen")
    assert code == 0
    lines = [line for line in err.splitlines() if line.startswith("fitting ")]
    assert len(lines) == 2 and "eigen on prefix(16) (16 x 16, time limit 60 s)" in lines[1]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_on_a_terminal_shows_mechanism_size_iteration_and_gap():
    stream = _Terminal()
    p = compare_mod._Progress(stream, AllRange(8), 5.0)
    p.start("eigen")
    p.event({"iteration": 3, "gap": 1.5e-3})
    p.finish()
    text = stream.getvalue()
    assert "eigen (36 x 8, time limit 5 s)" in text and "iteration 3" in text and "gap 1.50e-03" in text


@pytest.mark.parametrize("value", ["0", "-1", "abc", "nan"])
def test_bad_time_limit_refused_in_one_line(capsys, value):
    with pytest.raises(SystemExit) as exc:
        main(["compare", "-w", "prefix:4", "-e", "1", "--time-limit", value])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert "--time-limit" in err and len(err.strip().splitlines()) == 1


def test_time_limit_none_means_no_limit(capsys):
    code, out, _ = run(capsys, "-w", "prefix:4", "-e", "1", "-m", "identity", "--time-limit", "none")
    assert code == 0 and "time limit: none" in out


def test_no_time_limit():
    df = compare_mod.compare(AllRange(8), Privacy(1.0), ["eigen", "identity"], time_limit=None)
    assert list(df["status"].str.startswith("converged")).count(True) == 1
    assert np.isfinite(df["expected_total_error"]).all()


def test_unknown_mechanism_refused_before_the_header(capsys):
    code, out, err = run(capsys, "-w", "prefix:4", "-e", "1", "-m", "identity,bogus")
    assert code == 2 and out == "" and "unknown mechanism(s) bogus" in err
