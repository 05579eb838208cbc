"""The tightest eps-DP lower bound compare reports: P_eps times the certified L2-optimum bound (bound_kind)."""

from __future__ import annotations

import numpy as np
import pytest
from paper_matrices import LRM_W

from dpopt.bounds import certified_l2_bound, l2_optimum_lower_bound, svd_bound, svd_bound_from_gram
from dpopt.compare import compare
from dpopt.mechanisms import make_mechanism
from dpopt.privacy import Privacy
from dpopt.specs import parse_workload


def test_seed000_three_queries_bound() -> None:
    # seed 000, Section 1 (W = LRM_W): P_eps SVDB = 24.29 / eps^2 as reported before; the certified L2
    # optimum gives 31.29 / eps^2 (both to half a unit of the printed second decimal)
    assert 2 * svd_bound(LRM_W) == pytest.approx(24.29, abs=0.005)
    value, kind = certified_l2_bound(LRM_W)
    assert kind == "l2-optimum" and 2 * value == pytest.approx(31.29, abs=0.005)


def test_unit_multipliers_give_the_svd_bound() -> None:
    G = parse_workload("allrange:32").gram()
    # the same quantity with a larger round-off allowance (5 n eps lambda_max instead of 2 n eps lambda_max off
    # every eigenvalue): lower, by at most 3 n eps cond(G) relative (the allowance over the smallest eigenvalue)
    lam = np.linalg.eigvalsh(G)
    a, b = l2_optimum_lower_bound(G, np.ones(32)), svd_bound_from_gram(G)
    assert a <= b and a == pytest.approx(b, rel=3 * 32 * np.finfo(float).eps * lam[-1] / lam[0])


def test_bound_is_below_the_l2_optimum_and_within_its_gap() -> None:
    # mm-optimal under (eps, delta) reaches min trace(G X^+) over diag(X) <= 1 within its certified gap 1e-8;
    # the bound lies below that value (weak duality) and within the gap of it (the certificate is tight)
    W = parse_workload("prefix:48")
    mm = make_mechanism("mm-optimal").fit(W, Privacy(1.0, 1e-6))
    A = np.asarray(mm.strategy_.A)
    X = A.T @ A
    value_opt = float(np.trace(np.linalg.solve(X, W.gram()))) * np.max(np.diag(X))  # sens2^2 = max diag X
    bound, kind = certified_l2_bound(W)
    assert kind == "l2-optimum"
    assert bound <= value_opt and bound >= value_opt * (1 - 3e-8)


def test_random_strategies_never_beat_the_bound() -> None:
    # any strategy's eps-DP error (2 / eps^2) sens1^2 trace(G (A^T A)^-1) is at least the bound (eps = 1)
    W = parse_workload("wrange:24x16:seed=3")
    G = W.gram()
    bound = 2 * certified_l2_bound(W)[0]
    rng = np.random.default_rng(0)
    for _ in range(200):
        A = rng.exponential(size=(rng.integers(16, 40), 16))
        err = 2 * np.abs(A).sum(axis=0).max() ** 2 * np.trace(np.linalg.solve(A.T @ A, G))
        assert err >= bound


@pytest.mark.parametrize("spec", ["allrange:16", "prefix:16", "wrange:12x16", "kron:allrange:4,prefix:3",
                                  "marginals:2x3x4:2", "wrelated:12x16:s=4"])
def test_every_mechanism_at_or_above_the_reported_bound(spec: str) -> None:
    df = compare(parse_workload(spec), Privacy(1.0), time_limit=None)
    done = df[df["expected_total_error"].notna()]
    assert len(done) >= 5
    assert (done["ratio_to_bound"] >= 1 - 1e-12).all(), done[["mechanism", "ratio_to_bound"]]
    assert set(done["bound_kind"]) <= {"l2-optimum", "svd", "pure-relaxation"}
    svdb = 2 * svd_bound(parse_workload(spec))
    assert (done["bound"] >= svdb * (1 - 1e-12)).all()  # never looser than P SVDB


def test_pure_relaxation_is_shown_where_it_is_tighter() -> None:
    # On a random low-rank WRelated the triangle cuts of formulations.mm_pure lift the bound 5.6% above the
    # certified L2 bound (measured); no strategy found by any means here goes below it: the mechanisms, the
    # p-Identity search from OPT_0 on, the baselines, and 200 random non-negative and 200 random signed strategies.
    from dpopt.baselines import hierarchical_strategy, wavelet_strategy
    from dpopt.compare import pure_relaxation_bound
    from dpopt.solvers.pidentity import search_pidentity

    w = parse_workload("wrelated:12x10:s=3")
    l2, _ = certified_l2_bound(w)
    relaxed = pure_relaxation_bound(w)
    assert relaxed is not None and relaxed >= 1.05 * l2
    df = compare(w, Privacy(1.0), time_limit=None)
    done = df[df["expected_total_error"].notna()]
    assert (done["bound_kind"] == "pure-relaxation").all()
    assert (done["ratio_to_bound"] >= 1).all(), done[["mechanism", "ratio_to_bound"]]
    G = w.gram()
    assert search_pidentity(G, 2, rounds=3).fun >= relaxed
    rng = np.random.default_rng(1)
    baselines = [np.eye(10), hierarchical_strategy(10).A.toarray(), wavelet_strategy(10).A.toarray()]
    randoms = [draw(size=(rng.integers(10, 30), 10)) for draw in (rng.exponential, rng.standard_normal)
               for _ in range(200)]
    for A in baselines + randoms:
        assert np.abs(A).sum(axis=0).max() ** 2 * np.trace(np.linalg.solve(A.T @ A, G)) >= relaxed
