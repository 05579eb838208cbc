"""dawa-opt: DAWA's private partition (dpopt.partition), then mm-optimal on the buckets, through the ledger.

The partition tests draw no noise (perturb adds 0), so the dynamic program is checked exactly; the release
tests check the accounting (the statistics, the partition and the second stage charged in that order and summing
to the budget; two charges when the policy skips the partition or is switched off), the policy's statistics and
choices, and the CLI test runs `dpopt answer` end to end with a ledger file.
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
from dpopt.mechanisms.data_aware import (
    DENSE_MARGIN,
    HIGH_SIGNAL,
    LOW_SIGNAL,
    LOW_SIGNAL_RESOLUTION,
    STATS_SHARE,
)
from dpopt.partition import (
    RESOLUTION,
    SIGNAL_STATISTICS_SENSITIVITY,
    bucket_sums,
    candidate_family,
    dense_for_partition,
    deviation_sensitivity,
    expansion,
    family_lengths,
    hilbert_order,
    interval_deviations,
    l1_partition,
    noise_sensitivity,
    partition_sensitivity,
    signal_statistics,
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


def test_family_stops_at_its_longest_bucket_and_still_tiles():
    n = 4096
    family = candidate_family(n, max_length=n // 4)
    lengths = family_lengths(family)
    assert lengths.min() == 1 and lengths.max() <= n // 4 and n not in lengths
    assert np.all(np.diff(lengths[lengths <= 32]) == 1)
    long = lengths[lengths >= 16]
    assert (np.diff(long) / long[:-1]).max() <= 1 / 16 + 1e-12
    # the same lengths as the full family up to the cap, and the partition's noise calibrated on them
    assert lengths.tolist() == [v for v in family_lengths(candidate_family(n)).tolist() if v <= n // 4]
    assert partition_sensitivity(lengths) == 2 * (1 - 1 / lengths.max())
    assert family_lengths(candidate_family(64, max_length=5)).tolist() == [1, 2, 3, 4, 5]


def test_dawa_opt_partition_keeps_buckets_within_a_quarter_of_the_domain():
    # the data's empty run of 32 cells is one bucket without the cap, and at most n / 4 = 16 cells with it
    # (no noise: the dynamic program's exact minimum)
    from dpopt.mechanisms.data_aware import MAX_BUCKET_FRACTION

    x = _data()
    capped = _fitted().partition(x, _no_noise)
    assert np.diff(capped).max() <= MAX_BUCKET_FRACTION * 64
    whole = make_mechanism("dawa-opt", max_bucket_fraction=1.0).fit(Prefix(64), Privacy(1.0)).partition(x, _no_noise)
    assert np.diff(whole).max() == 32
    # each is the exact minimum over its own family: the capped one splits the empty run, nothing else
    assert len(capped) == len(whole) + 1
    with pytest.raises(ValueError, match="max_bucket_fraction"):
        make_mechanism("dawa-opt", max_bucket_fraction=0.0)


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


def test_release_charges_statistics_partition_then_second_stage():
    ledger = PrivacyLedger(1.0)
    out = _fitted().release(_data(), ledger)
    stats, part, second = ledger.history
    assert "signal statistics" in stats.label and "private partition" in part.label and "second stage" in second.label
    assert stats.epsilon == pytest.approx(STATS_SHARE, rel=1e-12) and stats.noise == "laplace"
    assert part.epsilon == pytest.approx(0.25 - STATS_SHARE, rel=1e-12) and part.noise == "laplace"
    assert second.epsilon == pytest.approx(0.75, rel=1e-12)
    assert ledger.remaining_epsilon == pytest.approx(0.0, abs=1e-12)
    assert len(out) == 64 and (out["mode"] == "release").all() and out.attrs["charges"] == 3
    assert out.attrs["partition_skipped"] is False
    edges = out.attrs["partition_edges"]
    assert edges[0] == 0 and edges[-1] == 64


def test_release_without_the_policy_charges_twice():
    ledger = PrivacyLedger(1.0)
    out = make_mechanism("dawa-opt", adaptive=False).fit(Prefix(64), Privacy(1.0)).release(_data(), ledger)
    first, second = ledger.history
    assert "private partition" in first.label and first.epsilon == pytest.approx(0.25, rel=1e-12)
    assert second.epsilon == pytest.approx(0.75, rel=1e-12) and out.attrs["charges"] == 2


def test_release_skips_the_partition_on_dense_data():
    # neighbouring counts far apart and a high signal: the partition cannot pay (dense_for_partition), so the
    # statistics and the second stage on all 64 cells take the budget and nothing is spent on a partition. At eps =
    # 100 the statistics' Laplace scale is b = SIGNAL_STATISTICS_SENSITIVITY / (STATS_SHARE * 100) = 1.5, and C = 63
    # lies 33 - DENSE_MARGIN b above the threshold 64^(0.75^(2/3)) - 1 = 29.9: a wrong decision has probability
    # below exp(-30 / 1.5) / 2.
    x = np.tile([1000.0, 2000.0], 32)
    assert x.sum() * 100 / 64 >= HIGH_SIGNAL
    ledger = PrivacyLedger(100.0)
    out = _fitted(eps=100.0).release(x, ledger)
    stats, second = ledger.history
    assert "signal statistics" in stats.label and "partition skipped" in second.label
    assert stats.epsilon + second.epsilon == pytest.approx(100.0, rel=1e-12)
    assert out.attrs["partition_skipped"] is True and out.attrs["charges"] == 2
    assert out.attrs["partition_edges"] == list(range(65))
    # research mode takes the same path: the second stage measures all 64 cells with eps - STATS_SHARE eps
    mech = _fitted(eps=100.0)
    research = mech.answer_variants(x, np.random.default_rng(2))
    assert research["dense"] and research["buckets"] == 64
    assert mech.stage_.privacy_.epsilon == pytest.approx(100.0 * (1 - STATS_SHARE), rel=1e-12)


def test_release_refused_before_any_charge():
    ledger = PrivacyLedger(0.5)
    with pytest.raises(BudgetExceededError):
        _fitted().release(_data(), ledger)
    assert ledger.history == []


def test_release_under_eps_delta_composes():
    mech = make_mechanism("dawa-opt").fit(Prefix(64), Privacy(1.0, 1e-6))
    ledger = PrivacyLedger(1.0, 1e-6)
    mech.release(_data(), ledger)
    stats, part, second = ledger.history
    assert (stats.noise, part.noise, second.noise) == ("laplace", "laplace", "gaussian")
    assert stats.delta == 0.0 and part.delta == 0.0 and second.delta == pytest.approx(1e-6, rel=1e-12)
    assert stats.epsilon + part.epsilon + second.epsilon == pytest.approx(1.0, rel=1e-12)


def test_signal_statistics_sensitivity_by_brute_force():
    # neighbours differ by one record in one cell: the L1 change of (N, C) never exceeds the stated sensitivity,
    # and a cell between two equal neighbours gaining a record attains it
    rng = np.random.default_rng(5)
    worst = 0.0
    for tau in (0.0, 0.5, 1.5):
        for _ in range(40):
            x = rng.integers(0, 4, 12).astype(float)
            for i in range(12):
                for d in (1.0, -1.0):
                    y = x.copy()
                    y[i] += d
                    if y[i] < 0:
                        continue
                    worst = max(worst, float(np.abs(signal_statistics(y, tau) - signal_statistics(x, tau)).sum()))
    assert worst == SIGNAL_STATISTICS_SENSITIVITY
    assert signal_statistics(np.array([3.0, 3.0, 5.0, 5.0, 0.0]), 1.0).tolist() == [16.0, 2.0]


def test_policy_reads_only_the_noisy_statistics():
    mech = _fitted(eps=1.0, n=4096)
    n = 4096
    low = mech.policy(np.array([0.5 * LOW_SIGNAL * n, 10.0]))
    assert low["resolution"] == LOW_SIGNAL_RESOLUTION and not low["dense"]
    mid = mech.policy(np.array([2 * LOW_SIGNAL * n, 4000.0]))
    assert mid["resolution"] == RESOLUTION and not mid["dense"]  # below HIGH_SIGNAL a partition always runs
    assert dense_for_partition(n, n, 0.75) and not dense_for_partition(1, n, 0.75)
    assert mech.policy(np.array([-5.0, -3.0]))["signal"] == 0.0  # a negative noisy total reads as no signal


def test_dense_test_is_the_model_then_the_exact_errors():
    # above HIGH_SIGNAL, with k = 1 + C - DENSE_MARGIN b (b the noisy C's Laplace scale): the hierarchy model says
    # skip exactly when k >= n^(0.75^(2/3)) for ratio 1/4; where it does, the second stage's exact error on k
    # equal buckets (k rounded up to a power of 2^(1/4)) at eps2 is compared with the dense stage's at its eps.
    # The large-stage limit of 512 buckets makes the dense stage on 1024 cells a baseline, as on DPBench's 4096
    n = 1024
    mech = make_mechanism("dawa-opt", max_large_hdmm_buckets=512).fit(Prefix(n), Privacy(1.0))
    assert mech.dense_stage().inner.short_name in ("identity", "hierarchical", "wavelet")
    k_star = n ** (0.75 ** (2 / 3))
    b = SIGNAL_STATISTICS_SENSITIVITY / (STATS_SHARE * 1.0)

    def dense(k: float) -> bool:
        return bool(mech.policy(np.array([2 * HIGH_SIGNAL * n, k - 1 + DENSE_MARGIN * b]))["dense"])

    assert not dense(0.95 * k_star) and mech._uniform_stage_errors == {}  # the model alone: no fit
    assert not dense(1.05 * k_star - DENSE_MARGIN * b)  # within the margin
    # the model would skip at 1.05 k_star (321 buckets, rounded to 363); the exact errors do not: p-Identity on 363
    # equal buckets at eps 0.75 has about 0.63 of the hierarchy's error on all cells at eps 0.98 (a property of the
    # strategies, not round-off; the hierarchy model puts the two level)
    assert dense_for_partition(1.05 * k_star, n, 0.75)
    assert not dense(1.05 * k_star)
    part = mech._uniform_stage_errors[363]
    equal = np.unique(np.round(np.linspace(0.0, n, 364)).astype(np.int64))
    # the cached value is that stage's error: fitted again here, the same seeded OPT_0 (whose runs stop at 1e-4
    # relative gain over 10 iterations, so round-off from another BLAS moves it far less than 1%)
    assert part == pytest.approx(mech.stage(equal).inner.expected_error_.total, rel=1e-2)
    assert part < 0.9 * mech.dense_stage().inner.expected_error_.total
    assert dense(n)  # a partition keeping every cell cannot pay


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


def test_refuses_three_factors_and_a_wrong_grid():
    from dpopt.mechanisms.base import MechanismError
    from dpopt.workloads import Kron

    with pytest.raises(MechanismError, match="1-D and 2-D"):
        make_mechanism("dawa-opt").fit(Kron([Prefix(4), Prefix(4), Prefix(4)]), Privacy(1.0))
    with pytest.raises(MechanismError, match="grid"):
        make_mechanism("dawa-opt", grid=(4, 8)).fit(Kron([Prefix(4), Prefix(4)]), Privacy(1.0))
    with pytest.raises(MechanismError, match="cells"):
        make_mechanism("dawa-opt", grid=(4, 8)).fit(Prefix(16), Privacy(1.0))
    with pytest.raises(ValueError, match="grid"):
        make_mechanism("dawa-opt", grid=(4, 0))


def test_hilbert_order_is_a_path_through_the_grid():
    # a permutation of the cells in which every step moves to a grid neighbour (on 2^q squares the curve never
    # leaves the grid); the 2 x 2 curve is a U from one corner to the adjacent one
    assert hilbert_order((2, 2)).tolist() in ([0, 1, 3, 2], [0, 2, 3, 1])
    for shape in ((4, 4), (16, 16), (64, 64)):
        order = hilbert_order(shape)
        assert sorted(order.tolist()) == list(range(shape[0] * shape[1]))
        i, j = np.divmod(order, shape[1])
        assert (np.abs(np.diff(i)) + np.abs(np.diff(j)) == 1).all()
    assert sorted(hilbert_order((3, 5)).tolist()) == list(range(15))
    # a quadrant of a 2^q square is one interval of the order (what makes a partition into intervals compact)
    order = hilbert_order((8, 8))
    i, j = np.divmod(order, 8)
    quadrant = 2 * (i >= 4) + (j >= 4)
    assert all(len(set(quadrant[16 * q:16 * (q + 1)].tolist())) == 1 for q in range(4))


def test_two_d_partition_finds_the_quadrants_and_beats_identity():
    from dpopt.error import data_error
    from dpopt.workloads import Kron

    W = Kron([Prefix(8), Prefix(8)])
    x = np.kron(np.array([[300.0, 0.0], [40.0, 120.0]]), np.ones((4, 4))).ravel()
    mech = make_mechanism("dawa-opt").fit(W, Privacy(1.0))
    assert mech.partition(x, _no_noise).tolist() == [0, 16, 32, 48, 64]  # four constant quadrants, four buckets
    # both errors are means of 20 runs: dawa-opt's mean plus three standard errors lies below identity's mean
    # minus three (about four buckets measured against 64 cells)
    dawa = data_error(mech.answer, W, x, 20, np.random.default_rng(4))
    ident = data_error(make_mechanism("identity").fit(W, Privacy(1.0)).answer, W, x, 20, np.random.default_rng(4))
    assert dawa[0] + 3 * dawa[1] < ident[0] - 3 * ident[1]
    ledger = PrivacyLedger(1.0)
    out = mech.release(x, ledger)
    assert len(out) == W.m and sum(c.epsilon for c in ledger.history) == pytest.approx(1.0, rel=1e-12)


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
    assert len(history) == 3  # signal 500 / 64 per cell: statistics, partition, second stage
    assert sum(h["epsilon"] for h in history) == pytest.approx(1.0, rel=1e-12)
    assert "in 3 charges" in err.getvalue()


def test_second_stage_refuses_more_buckets_than_it_decomposes(monkeypatch):
    # the stage eigendecomposes a k x k Gram: above MAX_STAGE_BUCKETS it says so before forming it
    import dpopt.mechanisms.data_aware as data_aware
    from dpopt.mechanisms.base import MechanismError

    mech = _fitted(eps=1.0, n=64)
    monkeypatch.setattr(data_aware, "MAX_STAGE_BUCKETS", 8)
    with pytest.raises(MechanismError, match="kept 16 buckets.*at most 8"):
        mech.stage(np.arange(0, 65, 4))
    assert mech.stage(np.arange(0, 65, 8)).strategy_.shape[1] == 8


def test_too_many_buckets_fall_back_to_the_cells_at_the_stage_budget(monkeypatch):
    # a partition that keeps more buckets than the stage decomposes is not a failure: the second stage is the
    # stage on all cells at the same (1 - ratio) eps, so the ledger still sees statistics, partition and stage
    # summing to the budget, and every query is answered from a measurement of x itself
    import dpopt.mechanisms.data_aware as data_aware

    monkeypatch.setattr(data_aware, "MAX_STAGE_BUCKETS", 8)
    # 16 steps of 1,000 records a cell: the partition's noisy costs (Laplace scales of a few records) keep the
    # steps apart, and with C = 15 changes the policy's model says the partition pays (it runs)
    x = np.repeat(np.arange(16) * 1000.0, 4)
    mech = _fitted()
    stage, why = mech.cells_stage(np.arange(0, 65, 4))
    assert "16 buckets" in why and stage is mech.dense_stage(mech.stage_privacy_)
    assert stage.privacy_.epsilon == pytest.approx(0.75, rel=1e-12) and stage.workload_ is mech.workload_
    eight, why8 = mech.cells_stage(np.arange(0, 65, 8))  # 1-D, within the limit: the stage on the 8 buckets
    assert why8 == "" and eight.strategy_.shape[1] == 8
    ledger = PrivacyLedger(1.0)
    out = mech.release(x, ledger, label="t")
    stats, part, second = ledger.history
    assert "private partition" in part.label and "second stage on all 64 cells" in second.label
    assert stats.epsilon + part.epsilon + second.epsilon == pytest.approx(1.0, rel=1e-12)
    assert out.attrs["charges"] == 3 and out.attrs["partition_skipped"] is False and out.attrs["cells_stage"]
    assert len(out) == 64 and len(out.attrs["partition_edges"]) - 1 > 8  # the partition's own edges are reported
    # research mode takes the same path, and its answers are unbiased: the mean of 200 runs lies within 4
    # standard errors of W x in every query (the error is the stage's Laplace noise only)
    runs = np.array([mech.answer(x, np.random.default_rng(i)) for i in range(200)])
    assert mech.answer_variants(x, np.random.default_rng(0))["cells_stage"]
    truth = Prefix(64).matvec(x)
    se = runs.std(axis=0, ddof=1) / math.sqrt(len(runs))
    assert np.all(np.abs(runs.mean(axis=0) - truth) <= 4 * se + 1e-9)


def test_two_d_stage_on_cells_when_its_error_is_lower():
    # on a 2-D grid the partition always runs; the second stage is then the one of least expected error at the
    # stage's eps: 64 one-cell buckets of 8 x 8 prefix rectangles (p-Identity on them) against the least-error
    # baseline on all cells, and four quadrant buckets against it. Each choice is the smaller of the two exact
    # errors (a tie goes to the cells, which carry no bias)
    from dpopt.workloads import Kron

    mech = make_mechanism("dawa-opt").fit(Kron([Prefix(8), Prefix(8)]), Privacy(1.0))
    cells = mech.dense_stage(mech.stage_privacy_)
    assert cells.privacy_.epsilon == pytest.approx(0.75, rel=1e-12) and cells.workload_ is mech.workload_
    for edges in (np.arange(65), np.array([0, 16, 32, 48, 64])):
        bucket = mech.stage(edges)
        chosen, why = mech.cells_stage(edges)
        e_cells, e_buckets = cells.inner.expected_error_.total, bucket.inner.expected_error_.total
        assert (chosen is cells) == (e_cells <= e_buckets) and bool(why) == (chosen is cells)
    # four buckets answer prefix rectangles with far fewer noisy counts than 64 cells: kept as buckets
    assert mech.cells_stage(np.array([0, 16, 32, 48, 64]))[1] == ""


def test_auto_inference_on_a_factored_stage_is_least_squares(monkeypatch):
    # the rule's NNLS reads the strategy's matrix; a stage held through Kronecker factors (hierarchies over a
    # 256 x 256 grid) answers by least squares under "auto" (and says so) and refuses only inference="nnls"
    import dpopt.mechanisms.data_aware as data_aware
    from dpopt.mechanisms.base import MechanismError
    from dpopt.workloads import boxes

    monkeypatch.setattr(data_aware, "BASELINE_STAGES", ("hierarchical",))
    W = boxes((256, 256), (np.array([0, 10, 37]), np.array([0, 5, 90])), (np.array([100, 255, 37]),
                                                                          np.array([200, 255, 91])))
    x = np.zeros(W.n)
    for inference in ("auto", "both"):
        mech = make_mechanism("dawa-opt", inference=inference).fit(W, Privacy(1.0))
        stage = mech.dense_stage(mech.stage_privacy_)
        assert stage.strategy_.factored
        y = stage.strategy_.measured(x) - 1.0  # every estimate negative: the rule would pick NNLS
        out = stage.estimates(y)
        assert stage.answer_info_["inference"] == "ls" and np.array_equal(out["auto"], out["ls"])
    mech = make_mechanism("dawa-opt", inference="nnls").fit(W, Privacy(1.0))
    stage = mech.dense_stage(mech.stage_privacy_)
    with pytest.raises(MechanismError, match="held through its factors"):
        stage.estimates(stage.strategy_.measured(x))


def test_a_large_second_stage_is_p_identity_below_the_baselines():
    # 301 buckets of unequal lengths (300 within the first 700 cells, one of 324): above MAX_HDMM_BUCKETS the
    # eps-DP stage is hdmm's p-Identity (p = LARGE_HDMM_P, OPT_0 only), not the baselines on the buckets, and its
    # exact expected error is below each baseline's on the same factor. The margin is not round-off: p-Identity's
    # error here is about half the hierarchy's (measured 0.52), and keep_best_factor keeps a baseline that ties.
    from dpopt.mechanisms.data_aware import MAX_HDMM_BUCKETS, _ReducedFactor

    n = 1024
    mech = make_mechanism("dawa-opt").fit(Prefix(n), Privacy(1.0))
    cuts = np.sort(np.random.default_rng(0).choice(np.arange(1, 700), 299, replace=False))
    edges = np.concatenate([[0], cuts, [700, n]])
    assert len(edges) - 1 > MAX_HDMM_BUCKETS
    stage = mech.stage(edges)
    assert stage.inner.short_name == "hdmm" and stage.strategy_.name == "kron-p-identity"
    factor = _ReducedFactor(mech.reduced_workload(edges).gram(), "factor")
    for name in ("identity", "hierarchical", "wavelet"):
        baseline = make_mechanism(name).fit(factor, mech.stage_privacy_)
        assert stage.inner.expected_error_.total < 0.9 * baseline.expected_error_.total, name
    # with the large-stage limit at MAX_HDMM_BUCKETS the stage is mm-optimal with its baselines, as before: its
    # L2 optimum does not target the Laplace error, and the hierarchy it keeps is above p-Identity again
    small = make_mechanism("dawa-opt", max_large_hdmm_buckets=MAX_HDMM_BUCKETS).fit(Prefix(n), Privacy(1.0))
    old = small.stage(edges).inner
    assert old.short_name == "mm-optimal"
    assert stage.inner.expected_error_.total < 0.9 * old.expected_error_.total


def test_a_two_d_grid_skips_its_partition_only_where_no_stage_could_match():
    # the dense test's model is 1-D's hierarchy; on a 2-D grid the stage on k equal buckets enters through
    # P(eps2) SVDB(W P), a lower bound on every stage's error on them, against the dense stage's exact error
    from dpopt.workloads import Kron

    # ratio 0.9: the stage on buckets has eps2 = 10 against 98 for the dense stage, so the decision turns between
    # 4 and 256 buckets (at ratio 0.25 the bound stays below the dense error up to k = n, and only k >= n skips)
    mech = make_mechanism("dawa-opt", ratio=0.9).fit(Kron([Prefix(16), Prefix(16)]), Privacy(100.0))
    b = SIGNAL_STATISTICS_SENSITIVITY / (STATS_SHARE * 100.0)
    dense = mech.dense_stage().inner.expected_error_.total
    decisions = []
    for k in (4, 16, 64, 128):
        edges = np.linspace(0, 256, k + 1).astype(np.int64)
        # a lower bound: never above the stage's exact error on the same buckets (round-off only lowers it)
        assert mech.stage_lower_bound(edges) <= mech.stage(edges).inner.expected_error_.total
        # the decision is that comparison (k a power of two is its own rounding)
        decisions.append(mech.policy(np.array([1e9, k - 1 + DENSE_MARGIN * b]))["dense"])
        assert decisions[-1] == (mech._uniform_stage_errors[k] >= dense)
    assert decisions[0] is False and decisions[-1] is True  # four buckets: partitioned; 128: skipped
    assert make_mechanism("dawa-opt").fit(Kron([Prefix(16), Prefix(16)]), Privacy(100.0)).policy(
        np.array([1e9, 255 + DENSE_MARGIN * b]))["dense"]  # every cell its own bucket: skipped
    assert make_mechanism("dawa-opt").fit(Prefix(64), Privacy(100.0)).policy(np.array([1e9, 63.0]))["dense"]


def test_reduced_factor_reproduces_the_gram_and_its_bound():
    """The second stage's k x k factor V of W P: V^T V = G within the factorisation's backward error, the
    Cholesky factor (upper triangular) when W P has full column rank, the eigen-factor when it has not."""
    from dpopt.bounds import EPS, svd_bound_from_gram
    from dpopt.mechanisms.data_aware import _ReducedFactor

    edges = np.array([0, 5, 20, 21, 40, 64])
    WP = Prefix(64).matrix() @ expansion(edges, 64).toarray()  # full column rank: 5 independent columns
    G = WP.T @ WP
    f = _ReducedFactor(G, "prefix on buckets")
    V = f.matrix()
    k = G.shape[0]
    assert np.array_equal(np.tril(V, -1), np.zeros_like(V))
    # Cholesky's backward error: |V^T V - G| <= (k + 1) eps |V|^T |V| entrywise (Higham, Thm. 10.3), doubled
    assert np.all(np.abs(V.T @ V - G) <= 2 * (k + 1) * EPS * (np.abs(V).T @ np.abs(V)) + 1e-300)
    assert f.svd_bound() == svd_bound_from_gram(G)  # the same eigenvalues of the same symmetric G

    W = np.array([[1.0, 1, 0, 0, 0, 0], [0, 1, 1, 1, 0, 0], [0, 0, 0, 1, 1, 1]])  # rank 3 over 6 cells
    G = W.T @ W
    f = _ReducedFactor(G, "rank-deficient")
    V = f.matrix()
    # a backward-stable symmetric eigensolver: ||V^T V - G||_2 <= c k eps ||G||_2, c = 10 a generous constant
    assert np.linalg.norm(V.T @ V - G, 2) <= 10 * 6 * EPS * np.linalg.norm(G, 2)
    # the eigen-factor: rows sqrt(lam_i) u_i^T, the null space's three within sqrt of the eigenvalues' round-off
    norms = np.sort(np.linalg.norm(V, axis=1))
    assert np.all(norms[:3] <= np.sqrt(10 * 6 * EPS * np.linalg.norm(G, 2))) and norms[3] > 0.1
    # the bound lies below SVDB(W) = (1/n)(sum of W's singular values)^2 computed from W itself
    s = np.linalg.svd(W, compute_uv=False)
    assert f.svd_bound() <= s.sum() ** 2 / 6


def test_a_workloads_svd_bound_is_computed_once(monkeypatch):
    """Every mechanism fitted on one workload reads the same SVDB: the dense one is computed once and kept."""
    import dpopt.bounds as bounds
    from dpopt.workloads import ExplicitWorkload

    calls = []
    real = bounds.dense_svd_bound
    monkeypatch.setattr(bounds, "dense_svd_bound", lambda w: calls.append(w) or real(w))
    w = ExplicitWorkload(np.tril(np.ones((8, 8))), name="prefix 8")
    first = w.svd_bound()
    assert w.svd_bound() == first and len(calls) == 1
    assert first == real(ExplicitWorkload(np.tril(np.ones((8, 8)))))
