"""dawa-opt: DAWA's private partition (dpopt.partition), then mm-optimal on the buckets, through the ledger.

The partition tests draw no noise (perturb adds 0), so the dynamic program is checked exactly; the release
tests check the accounting (two charges summing to the budget, the partition charged first), and the CLI
test runs `dpopt answer` end to end with a ledger file.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import math

import numpy as np
import pandas as pd
import pytest

from dpopt.cli import main
from dpopt.mechanisms import make_mechanism
from dpopt.partition import (
    bucket_sums,
    candidate_family,
    deviation_sensitivity,
    expansion,
    family_lengths,
    interval_deviations,
    l1_partition,
    noise_sensitivity,
    partition_sensitivity,
)
from dpopt.privacy import Privacy
from dpopt.release import BudgetExceededError, PrivacyLedger
from dpopt.workloads import Prefix


def _no_noise(y: np.ndarray, sensitivity: float) -> np.ndarray:
    return np.asarray(y, dtype=float)


def test_deviations_match_a_loop():
    x = np.random.default_rng(0).integers(0, 9, 40).astype(float)
    for L in (1, 2, 5, 17, 40):
        for step in (1, 2, 3):
            starts = range(0, 40 - L + 1, step)
            mean = [np.abs(x[s:s + L] - x[s:s + L].mean()).sum() for s in starts]
            med = [np.abs(x[s:s + L] - np.median(x[s:s + L])).sum() for s in starts]
            assert np.allclose(interval_deviations(x, L, step), mean, rtol=1e-12, atol=1e-12)
            assert np.allclose(interval_deviations(x, L, step, "median"), med, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("deviation", ["mean", "median"])
def test_one_record_moves_a_deviation_by_at_most_its_sensitivity(deviation):
    # every cell of every bucket of 1..12 cells, one record added or removed: |dev(x') - dev(x)| <= Delta_B, and
    # the bound is attained (it is not loose by construction: sparse data put every record at one end)
    rng = np.random.default_rng(5)
    worst = {}
    for _ in range(200):
        L = int(rng.integers(1, 13))
        x = rng.integers(0, 4, L).astype(float) * (rng.random(L) < 0.5)
        for i in range(L):
            for d in (1.0, -1.0):
                y = x.copy()
                y[i] += d
                if y[i] < 0:
                    continue
                move = abs(interval_deviations(y, L, 1, deviation)[0] - interval_deviations(x, L, 1, deviation)[0])
                # dev is a sum of at most 12 terms of size < 10: its round-off is below 1e-13, so 1e-12 is slack
                assert move <= deviation_sensitivity(L, deviation) + 1e-12
                worst[L] = max(worst.get(L, 0.0), move)
    for L in (2, 5, 8):
        assert worst[L] >= deviation_sensitivity(L, deviation) - 1e-12


def test_noise_calibration_written_out():
    family = candidate_family(64)
    lengths = family_lengths(family)
    # every length to 31 at every start; even lengths 32..62 at even starts; the whole domain
    assert lengths.tolist() == [*range(1, 32), *range(32, 63, 2), 64]
    assert [g for g, _ in family] == [1, 2, 4]
    dmax = 2 * (1 - 1 / 64)
    assert partition_sensitivity(lengths) == dmax
    assert noise_sensitivity(1, lengths) == dmax  # a single cell's cost never moves: Delta_B = 0
    assert noise_sensitivity(64, lengths) == 2 * dmax
    assert partition_sensitivity(lengths, "median") == 1.0
    assert noise_sensitivity(1, lengths, "median") == 1.0 and noise_sensitivity(64, lengths, "median") == 2.0


def test_family_lengths_cover_every_size_to_within_its_resolution():
    n = 4096
    family = candidate_family(n)
    lengths = family_lengths(family)
    assert lengths.min() == 1 and lengths.max() == n
    assert np.all(np.diff(lengths[lengths <= 32]) == 1)  # every length up to 32
    long = lengths[lengths >= 16]
    assert (np.diff(long) / long[:-1]).max() <= 1 / 16 + 1e-12  # then the next is at most 1/16 longer
    for g, ls in family:
        assert np.all(ls % g == 0) and ls.max() <= n


def _best_tiling(x: np.ndarray, c: float, family) -> float:
    """The least sum of (dev + c) over tilings of x by the family's buckets, by exhaustive recursion."""

    n = x.size

    @functools.cache
    def best(start: int) -> float:
        if start == n:
            return 0.0
        out = np.inf
        for g, ls in family:
            if start % g:
                continue
            for L in ls:
                if start + L <= n:
                    dev = float(np.abs(x[start:start + L] - x[start:start + L].mean()).sum())
                    out = min(out, dev + c + best(start + int(L)))
        return out

    return best(0)


def test_dynamic_program_finds_the_least_cost_tiling():
    rng = np.random.default_rng(2)
    for n in (13, 37, 50):
        family = candidate_family(n, resolution=3)
        x = rng.poisson(3.0, n).astype(float) * np.repeat(rng.random(5) < 0.6, -(-n // 5))[:n]
        edges = l1_partition(x, bucket_cost=2.0, perturb=_no_noise, family=family)
        cost = sum(np.abs(x[a:b] - x[a:b].mean()).sum() + 2.0 for a, b in zip(edges[:-1], edges[1:], strict=True))
        # the same bucket costs summed in another order: round-off of a few ulps of a sum below 1e4
        assert cost == pytest.approx(_best_tiling(x, 2.0, family), rel=1e-12, abs=1e-9)
        for a, b in zip(edges[:-1], edges[1:], strict=True):  # every bucket is a candidate
            assert any(a % g == 0 and (b - a) in ls for g, ls in family)


def test_partition_finds_constant_blocks_without_noise():
    x = np.concatenate([np.full(16, 5.0), np.zeros(16), np.full(32, 9.0)])
    edges = l1_partition(x, bucket_cost=1.0, perturb=_no_noise)
    assert edges.tolist() == [0, 16, 32, 64]
    assert bucket_sums(x, edges).tolist() == [80.0, 0.0, 288.0]
    P = expansion(edges, 64).toarray()
    assert np.allclose(P @ bucket_sums(x, edges), x)


def test_partition_keeps_cells_apart_when_a_bucket_costs_nothing():
    x = np.arange(10, dtype=float)
    assert l1_partition(x, bucket_cost=0.0, perturb=_no_noise).tolist() == list(range(11))


def _fitted(eps: float = 1.0, n: int = 64):
    return make_mechanism("dawa-opt").fit(Prefix(n), Privacy(eps))


def _data(n: int = 64) -> np.ndarray:
    return np.concatenate([np.full(n // 4, 40.0), np.zeros(n // 2), np.full(n // 4, 10.0)])


def test_release_charges_partition_then_second_stage():
    ledger = PrivacyLedger(1.0)
    out = _fitted().release(_data(), ledger)
    first, second = ledger.history
    assert "private partition" in first.label and "second stage" in second.label
    assert first.epsilon == pytest.approx(0.25, rel=1e-12) and first.noise == "laplace"
    assert second.epsilon == pytest.approx(0.75, rel=1e-12)
    assert first.epsilon + second.epsilon == pytest.approx(1.0, rel=1e-12)
    assert ledger.remaining_epsilon == pytest.approx(0.0, abs=1e-12)
    assert len(out) == 64 and (out["mode"] == "release").all() and out.attrs["charges"] == 2
    edges = out.attrs["partition_edges"]
    assert edges[0] == 0 and edges[-1] == 64


def test_release_refused_before_any_charge():
    ledger = PrivacyLedger(0.5)
    with pytest.raises(BudgetExceededError):
        _fitted().release(_data(), ledger)
    assert ledger.history == []


def test_release_under_eps_delta_composes():
    mech = make_mechanism("dawa-opt").fit(Prefix(64), Privacy(1.0, 1e-6))
    ledger = PrivacyLedger(1.0, 1e-6)
    mech.release(_data(), ledger)
    first, second = ledger.history
    assert (first.noise, second.noise) == ("laplace", "gaussian")
    assert first.delta == 0.0 and second.delta == pytest.approx(1e-6, rel=1e-12)
    assert first.epsilon + second.epsilon == pytest.approx(1.0, rel=1e-12)


def test_research_answers_are_seeded_and_the_record_says_why_no_error():
    mech = _fitted()
    a = mech.answer(_data(), np.random.default_rng(3))
    b = mech.answer(_data(), np.random.default_rng(3))
    assert a.shape == (64,) and np.array_equal(a, b)
    rec = mech.record()
    assert math.isnan(rec["expected_total_error"]) and math.isnan(rec["bound"])
    assert "data-dependent" in rec["status"]


def test_piecewise_constant_data_beat_identity():
    # four constant blocks: the partition recovers them (or splits a block in a few) and the buckets are measured
    # with 3/4 of eps; identity measures 256 cells. Both errors are means of 20 runs: dawa-opt's mean plus three
    # standard errors lies below half of identity's mean minus three.
    n = 256
    x = np.repeat([400.0, 0.0, 120.0, 30.0], n // 4)
    W = Prefix(n)
    from dpopt.error import data_error

    dawa = data_error(make_mechanism("dawa-opt").fit(W, Privacy(1.0)).answer, W, x, 20, np.random.default_rng(1))
    ident = data_error(make_mechanism("identity").fit(W, Privacy(1.0)).answer, W, x, 20, np.random.default_rng(1))
    assert dawa[0] + 3 * dawa[1] < (ident[0] - 3 * ident[1]) / 2


def test_refuses_a_product_domain():
    from dpopt.mechanisms.base import MechanismError
    from dpopt.workloads import Kron

    with pytest.raises(MechanismError, match="1-D"):
        make_mechanism("dawa-opt").fit(Kron([Prefix(4), Prefix(4)]), Privacy(1.0))


def test_dpopt_answer_end_to_end(tmp_path):
    rng = np.random.default_rng(0)
    ages = np.concatenate([rng.integers(0, 16, 300), rng.integers(40, 48, 200)])
    data, dom, ledger = tmp_path / "people.csv", tmp_path / "dom.json", tmp_path / "ledger.json"
    pd.DataFrame({"age": ages}).to_csv(data, index=False)
    dom.write_text('{"age": 64}')
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["answer", "--data", str(data), "--domain", f"{dom}:age", "--workload", "range:age",
                     "--mechanism", "dawa-opt", "--epsilon", "1", "--ledger", str(ledger),
                     "--out", str(tmp_path / "ans.csv")])
    assert code == 0, err.getvalue()
    answers = pd.read_csv(tmp_path / "ans.csv")
    assert len(answers) == 64 * 65 // 2 and (answers["mechanism"] == "dawa-opt").all()
    history = json.loads(ledger.read_text())["history"]
    assert len(history) == 2
    assert sum(h["epsilon"] for h in history) == pytest.approx(1.0, rel=1e-12)
    assert "in 2 charges" in err.getvalue()
