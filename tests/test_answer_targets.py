"""Fitness for use: the least epsilon meeting every per-query target std (library and `dpopt answer --target-std`)."""

from __future__ import annotations

import contextlib
import io
import math

import numpy as np
import pandas as pd
import pytest

from dpopt.cli import main
from dpopt.privacy import analytic_gaussian_sigma
from dpopt.solvers.minimax import fitness_for_use
from dpopt.workloads import Prefix

DELTA = 1e-6
# The largest std at the returned epsilon equals the target up to the eps search's accuracy (rtol 1e-10 in
# dpopt.privacy.epsilon_for_sigma; SIGMA_RTOL 1e-9 in OpenDP's sigma): far inside the 1e-6 asked.
EXACT = 1e-6
BELOW = 1 - 1e-4  # "no smaller epsilon does": checked at eps (1 - 1e-4)


def _check_fitness(n: int, target_std: float) -> None:
    W = Prefix(n)
    fit = fitness_for_use(W, target_std**2, time_limit=600)  # any feasible X: eps is computed from its own value
    eps = fit.epsilon(DELTA, "analytic")
    # Unit noise, sens2 <= 1 (diag X <= 1), by a dense solve independent of the solver's factors.
    var_unit = np.einsum("ij,ji->i", W.matrix(), np.linalg.solve(fit.X, W.matrix().T))
    sens2 = math.sqrt(float(np.max(np.diag(fit.X))))
    std = analytic_gaussian_sigma(eps, DELTA, sens2) * np.sqrt(var_unit)
    assert std.max() <= target_std * (1 + EXACT) and std.max() >= target_std * (1 - EXACT)
    smaller = analytic_gaussian_sigma(eps * BELOW, DELTA, sens2) * np.sqrt(var_unit)
    assert smaller.max() > target_std
    # No strategy does: any X with diag(X) <= 1 has max_i Var_i / c_i >= the certified lower bound, so its
    # largest std at eps (1 - 1e-4) is at least the target times sqrt(dual_bound) sigma(eps') / sigma(eps).
    # Margin: sigma(eps') / sigma(eps) - 1 is about 1e-4 (sigma ~ 1 / eps), against at most tol / 2 = 5e-7
    # lost to the gap in sqrt(dual_bound) and 1e-10 to the eps search (EXACT above).
    least = analytic_gaussian_sigma(eps * BELOW, DELTA, 1.0) * math.sqrt(fit.result.dual_bound) * target_std
    assert least > target_std


def test_fitness_for_use_prefix_small() -> None:
    _check_fitness(64, 10.0)


@pytest.mark.slow
def test_fitness_for_use_prefix_1024() -> None:
    _check_fitness(1024, 50.0)  # about 40 s at one BLAS thread: certified sum solves at n = 1024


def _answer(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["answer", "--workload", "marginals:2", "--delta", repr(DELTA), *args])
    return rc, out.getvalue(), err.getvalue()


def test_answer_reports_the_epsilon_needed_and_releases_only_when_met(tmp_path) -> None:
    rc, out, _ = _answer("--target-std", "20")
    assert rc == 0 and out.startswith("epsilon needed: ")
    needed = float(out.split()[2])
    # at the epsilon reported every released std is within the target, and the largest one meets it exactly
    path = tmp_path / "a.csv"
    rc, _, _ = _answer("--target-std", "20", "--epsilon", repr(needed), "--out", str(path), "--quiet")
    assert rc == 0
    df = pd.read_csv(path)
    assert (df["strategy"] == "minimax").all()
    assert df["std"].max() <= 20.0 and df["std"].max() >= 20.0 * (1 - EXACT)
    # just below it, refused with the query that misses and nothing released
    rc, out, err = _answer("--target-std", "20", "--epsilon", repr(needed * BELOW))
    assert rc == 2 and out == ""
    assert "targets cannot be met" in err and f"least epsilon meeting every target is {needed:.6g}" in err


def test_per_query_targets_from_a_csv(tmp_path) -> None:
    labels = pd.read_csv(io.StringIO(_answer("--epsilon", "1", "--out", "-", "--quiet")[1]))["query"]
    targets = pd.DataFrame({"query": labels[::-1], "target_std": np.where(np.arange(len(labels)) % 2, 15.0, 40.0)})
    f = tmp_path / "targets.csv"
    targets.to_csv(f, index=False)
    rc, out, _ = _answer("--target-std", str(f))
    assert rc == 0
    eps = float(out.split()[2])
    path = tmp_path / "a.csv"
    assert _answer("--target-std", str(f), "--epsilon", repr(eps), "--out", str(path), "--quiet")[0] == 0
    df = pd.read_csv(path).merge(targets, on="query")
    ratio = df["std"] / df["target_std"]
    assert ratio.max() <= 1.0 and ratio.max() >= 1 - EXACT


@pytest.mark.parametrize(("flags", "limit"), [([], 60.0), (["--time-limit", "7.5"], 7.5), (["--time-limit", "none"], None)])
def test_answer_selects_within_its_time_limit(flags: list[str], limit: float | None,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """--time-limit (default compare's 60 s) reaches the minimax solver, with a progress callback beside it."""
    import dpopt.solvers.minimax as minimax

    seen: list[dict] = []
    solve = minimax.solve_minimax
    monkeypatch.setattr(minimax, "solve_minimax", lambda *a, **k: seen.append(k) or solve(*a, **k))
    rc, out, _ = _answer("--target-std", "20", *flags)
    assert rc == 0 and "epsilon needed" in out and len(seen) == 1
    given = seen[0].get("time_limit")
    assert given is None if limit is None else 0.0 < given <= limit
    assert callable(seen[0]["callback"])


@pytest.mark.parametrize(("args", "message"), [
    (["--target-std", "0"], "standard deviation > 0"),
    (["--target-std", "nowhere.csv"], "neither a number nor a CSV"),
    (["--target-std", "5", "--mechanism", "hdmm"], "cannot be combined"),
])
def test_bad_targets_are_refused(args: list[str], message: str) -> None:
    rc, _, err = _answer(*args)
    assert rc == 2 and message in err


def test_target_std_needs_gaussian_noise() -> None:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["answer", "--workload", "marginals:1", "--target-std", "5"])
    assert rc == 2 and "needs --delta > 0" in err.getvalue()
