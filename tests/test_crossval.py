"""`dpopt crossval`: independent objectives, verdict rules, and the quick run end to end."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dpopt import crossval as cv
from dpopt.cli import main
from dpopt.workloads import AllRange, Prefix


def test_mm_objective_matches_closed_forms():
    G = Prefix(6).gram()
    # X = I: f = trace(G) = ||W||_F^2 = 21; f is invariant to the scale of X.
    assert cv.mm_objective(np.eye(6), G) == pytest.approx(21.0)
    assert cv.mm_objective(7.5 * np.eye(6), G) == pytest.approx(21.0)
    # A generic positive definite X: the direct formula max(diag X) trace(G X^-1).
    rng = np.random.default_rng(0)
    M = rng.standard_normal((6, 6))
    X = M @ M.T + 6 * np.eye(6)
    assert cv.mm_objective(X, G) == pytest.approx(np.max(np.diag(X)) * np.trace(G @ np.linalg.inv(X)))
    # A singular X that misses part of range(G) cannot answer W.
    assert cv.mm_objective(np.diag([1, 1, 1, 1, 1, 0.0]), G) == math.inf
    # A singular X is fine when G lives in its range.
    Gs = np.diag([2.0, 3.0, 0.0])
    assert cv.mm_objective(np.diag([1.0, 1.0, 0.0]), Gs) == pytest.approx(5.0)


def test_lrm_objective():
    W = AllRange(3).matrix()
    f, res = cv.lrm_objective(W, np.eye(3), W)
    assert f == pytest.approx(np.sum(W * W)) and res == 0.0
    f, res = cv.lrm_objective(2 * W, 0.5 * np.eye(3), W)
    assert f == pytest.approx(4 * np.sum(W * W) * 0.25) and res == 0.0


def _fake_pair(convex: bool, hand_f: float, ref_f: float) -> cv.Pair:
    return cv.Pair(
        name="fake", convex=convex, hand_module="math", ref_module="math",
        hand=lambda inst: cv.Side(hand_f, hand_f, "converged", 0.1, 0.1, 3),
        reference=lambda inst, s: cv.Side(ref_f, ref_f, "optimal", 0.2, 0.2, 5),
        quick_specs=("prefix:4",), full_specs=("prefix:4",),
    )


@pytest.mark.parametrize(
    "convex, hand_f, ref_f, ok",
    [
        (True, 1.0 + 5e-5, 1.0, True),
        (True, 1.0 + 2e-4, 1.0, False),
        (True, 1.0 - 2e-4, 1.0, False),  # a convex result below the conic optimum is also a disagreement
        (False, 1.009, 1.0, True),
        (False, 1.02, 1.0, False),
        (False, 0.5, 1.0, True),  # a better local optimum than the reference is fine
        (True, math.inf, 1.0, False),
    ],
)
def test_verdicts(monkeypatch, convex, hand_f, ref_f, ok):
    monkeypatch.setitem(cv.PAIRS, "fake", _fake_pair(convex, hand_f, ref_f))
    df = cv.run_crossval(quick=True, pairs=["fake"], solvers=["clarabel"])
    assert len(df) == 1
    assert (df["verdict"].iloc[0] == "ok") is ok
    assert (len(cv.failures(df)) == 0) is ok


def test_unknown_pair_and_solver_are_refused():
    with pytest.raises(ValueError, match="unknown crossval pair"):
        cv.run_crossval(pairs=["nope"])
    with pytest.raises(ValueError, match="not installed"):
        cv.run_crossval(pairs=["lrm"], solvers=["no-such-solver"])
    assert main(["crossval", "--pairs", "nope"]) == 2


def test_convex_pair_agrees_with_its_conic_model():
    # The hand-written solver ships with dpopt: "unavailable" is a failure here, not a skip.
    df = cv.run_crossval(quick=True, pairs=["convex_dp"], solvers=["clarabel"])
    assert len(df) and (df["verdict"] == "ok").all(), df.to_string()
    # Objectives are trace(G X^-1) / mean(diag G) with diag X = 1. On Prefix(8) the optimum lies between
    # the SVD bound (sum of singular values)^2 / n (seed 004 Thm. 4.2) and the identity strategy's
    # trace(G) = n mean(diag G), i.e. 8; both written out here. The hand solver returns a feasible X, so
    # its objective is at least the bound (up to rounding); the conic one may sit below the optimum by
    # its feasibility tolerance, bounded by the comparison's own CONVEX_RTOL. Both solvers stop at relative
    # gaps of 1e-8 (the hand solver's tol, Clarabel's default tol_gap_rel), so they agree within 1e-6.
    W = Prefix(8).matrix()
    G = W.T @ W
    svdb = np.linalg.svd(W, compute_uv=False).sum() ** 2 / 8 / np.mean(np.diag(G))
    row = df.set_index("instance").loc["prefix:8"]
    assert svdb * (1 - 1e-12) <= row["hand_objective"] < 8.0
    assert row["ref_objective"] >= svdb * (1 - cv.CONVEX_RTOL)
    assert abs(row["rel_diff"]) < 1e-6


def test_crossval_quick_command(tmp_path, capsys):
    out = tmp_path / "cv.csv"
    png = tmp_path / "cv.png"
    code = main(["crossval", "--quick", "--out", str(out), "--plot", str(png)])
    printed = capsys.readouterr()
    assert out.is_file() and png.is_file()
    df = pd.read_csv(out)
    # Every pair's modules ship with dpopt and every quick comparison must agree: no failure, and no
    # "unavailable" or "skipped" row hiding one.
    assert set(df["pair"]) == set(cv.PAIRS), df["pair"].unique()
    assert (df["verdict"] == "ok").all(), df[["pair", "instance", "verdict"]]
    assert code == 0, printed.out + printed.err


def test_appendix_b_matches_its_conic_model_on_singular_gram():
    df = cv.run_crossval(quick=True, pairs=["appendix_b"], solvers=["scs"])
    assert (df["verdict"] == "ok").all(), df[["instance", "rel_diff", "verdict"]]
