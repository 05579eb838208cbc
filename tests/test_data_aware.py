"""dawa-opt: DAWA's private partition (dpopt.partition), then mm-optimal on the buckets, through the ledger.

The partition tests draw no noise (perturb adds 0), so the dynamic program is checked exactly; the release
tests check the accounting (two charges summing to the budget, the partition charged first), and the CLI
test runs `dpopt answer` end to end with a ledger file.
"""

from __future__ import annotations

import contextlib
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
    candidate_lengths,
    expansion,
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
        want = [np.abs(x[s:s + L] - x[s:s + L].mean()).sum() for s in range(40 - L + 1)]
        assert np.allclose(interval_deviations(x, L), want, rtol=1e-12, atol=1e-12)


def test_noise_calibration_written_out():
    lengths = candidate_lengths(64)
    assert lengths.max() == 64 and set(range(1, 17)) <= set(lengths.tolist())
    dmax = 2 * (1 - 1 / 64)
    assert partition_sensitivity(lengths) == dmax
    assert noise_sensitivity(1, lengths) == dmax  # a single cell's cost never moves: Delta_B = 0
    assert noise_sensitivity(64, lengths) == 2 * dmax


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
    # four constant blocks: the partition recovers them and the buckets are measured with 3/4 of eps; identity
    # measures 256 cells. Both errors are means of 20 runs; the margin (3x) is many standard errors wide.
    n = 256
    x = np.repeat([400.0, 0.0, 120.0, 30.0], n // 4)
    W = Prefix(n)
    from dpopt.error import data_error

    dawa = data_error(make_mechanism("dawa-opt").fit(W, Privacy(1.0)).answer, W, x, 20, np.random.default_rng(1))
    ident = data_error(make_mechanism("identity").fit(W, Privacy(1.0)).answer, W, x, 20, np.random.default_rng(1))
    assert dawa[0] + 3 * dawa[1] < (ident[0] - 3 * ident[1]) / 3


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
