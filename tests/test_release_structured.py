"""Release over any strategy form: domain-bound workloads stay Kronecker / marginal / union, and release
measures through that structure (never a dense A over the domain), with the std it states."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dpopt.data import Domain, IntegerRange, histogram, records
from dpopt.datasets import load_fair
from dpopt.mechanisms import make_mechanism
from dpopt.privacy import Privacy
from dpopt.queries import (
    Between,
    Equals,
    marginal_workload,
    marginals_workload,
    predicate_workload,
    range_workload,
    stack_workloads,
)
from dpopt.release import PrivacyLedger, release
from dpopt.release_cli import parse_domain
from dpopt.specs import parse_workload
from dpopt.union_strategy import UnionKronMatrix
from dpopt.workloads import Kron, Marginals, Stack

# Dense reference: pinv of a strategy with condition number kappa <= 1e3 on n <= 60 cells is accurate to
# about n kappa eps = 1.3e-11 relative; RTOL leaves two orders of magnitude above that.
RTOL = 1e-9


@pytest.fixture(scope="module")
def dom() -> Domain:
    return Domain([IntegerRange("a", 0, 2), IntegerRange("b", 0, 3), IntegerRange("c", 0, 4)])


def _workloads(dom: Domain) -> dict[str, object]:
    return {
        "marginals": marginals_workload(dom, 2),
        "range": range_workload(dom, "c"),
        "marginal": marginal_workload(dom, ["a", "c"]),
        "union": stack_workloads([marginal_workload(dom, ["a", "b"]), range_workload(dom, "c")]),
        "predicates": predicate_workload(dom, [Equals("a", 1), Between("c", 1, 3) & Equals("b", 2)]),
    }


def test_builders_keep_structure_labels_and_domain(dom: Domain) -> None:
    ws = _workloads(dom)
    assert isinstance(ws["marginals"], Marginals)
    assert isinstance(ws["range"], Kron) and isinstance(ws["marginal"], Kron)
    assert isinstance(ws["union"], Stack) and all(isinstance(p, Kron) for p in ws["union"].parts)
    for w in ws.values():
        assert w.domain == dom
        assert len(w.row_labels()) == w.m
    assert ws["marginal"].row_labels()[:2] == ["a=0 & c=0", "a=0 & c=1"]
    assert ws["predicates"].row_labels() == ["a=1", "1 <= c <= 3 & b=2"]
    # the rows are the indicator rows of the conditions, in the domain's cell order
    cells = np.array(np.unravel_index(np.arange(dom.size), (3, 4, 5))).T
    W = ws["predicates"].sparse().toarray()
    np.testing.assert_array_equal(W[0], (cells[:, 0] == 1).astype(float))
    np.testing.assert_array_equal(W[1], ((cells[:, 1] == 2) & (cells[:, 2] >= 1) & (cells[:, 2] <= 3)).astype(float))


@pytest.mark.parametrize("name", ["marginals", "range", "marginal", "union", "predicates"])
@pytest.mark.parametrize("delta", [0.0, 1e-6])
def test_hdmm_query_variances_match_the_dense_computation(dom: Domain, name: str, delta: float) -> None:
    W = _workloads(dom)[name]
    mech = make_mechanism("hdmm").fit(W, Privacy(1.0, delta))
    unit = mech.query_unit_variances()
    s = mech.strategy_
    # the variances add up to the total error, computed by the independent trace formula
    total = mech.expected_error_.total / (mech.privacy_.variance_factor * s.sensitivity(mech.privacy_.norm) ** 2)
    assert unit.sum() == pytest.approx(total, rel=RTOL)
    # least squares on A (a union answers each term from its own part instead): diag(W A^+ A^+T W^T), dense
    if not isinstance(s.A, UnionKronMatrix):
        A = np.asarray(s.to_dense().A.todense() if hasattr(s.to_dense().A, "todense") else s.to_dense().A)
        B = W.sparse().toarray() @ np.linalg.pinv(A)
        np.testing.assert_allclose(unit, np.einsum("ij,ij->i", B, B), rtol=RTOL)


@pytest.mark.parametrize("name", ["marginals", "union", "range"])
def test_release_through_structure_states_its_noise(dom: Domain, name: str) -> None:
    # 300 independent releases: each query's mean error within 5 standard errors of 0, and its
    # mean squared error / stated variance within the chi-square(300)/300 band at 1e-7 per side
    # (Gaussian noise: release draws Gaussian measurements, and the answers are linear in them).
    from scipy import stats

    W = _workloads(dom)[name]
    rng = np.random.default_rng(7)
    x = rng.integers(0, 20, size=dom.size).astype(float)
    truth = W.sparse() @ x
    mech = make_mechanism("hdmm").fit(W, Privacy(1.0, 1e-6))
    n_rel = 300
    led = PrivacyLedger(1.0 * n_rel, 1e-6 * n_rel)
    outs = [release(mech, x, led, domain=dom) for _ in range(n_rel)]
    assert outs[0]["query"].tolist() == W.row_labels()
    err = np.array([o["answer"].to_numpy() - truth for o in outs])
    std = outs[0]["std"].to_numpy()
    assert np.all(np.abs(err.mean(axis=0)) < 5 * std / np.sqrt(n_rel))
    ratio = (err**2).mean(axis=0) / std**2
    lo, hi = stats.chi2.ppf([1e-7, 1 - 1e-7], n_rel) / n_rel
    assert np.all((ratio > lo) & (ratio < hi)), (ratio.min(), ratio.max())
    # the same check rejects a std off by a factor 2 either way
    assert np.all((err**2).mean(axis=0) / (2 * std) ** 2 < lo)
    assert np.all((err**2).mean(axis=0) / (std / 2) ** 2 > hi)


def test_fair_full_domain_two_way_marginals_release_in_structure() -> None:
    # all 2-way marginals over the full Fair domain (1,088,640 cells): hdmm's marginal strategy, released
    # through marginal tables. At eps = 1e4 every answer lies within 6 stated std of the true count
    # (Gaussian: P(|z| > 6) = 2e-9 per query, 923 queries).
    dom = parse_domain("fair")
    assert dom.size == 1_088_640
    W = parse_workload("marginals:2", dom)
    assert isinstance(W, Marginals) and W.m == 923
    x, _ = histogram(load_fair(), dom)
    mech = make_mechanism("hdmm").fit(W, Privacy(1e4, 1e-6))
    out = release(mech, x, PrivacyLedger(1e4, 1e-6), domain=dom)
    assert out["query"].tolist() == W.row_labels()
    sizes = [a.size for a in dom.attributes]
    codes = np.array(np.unravel_index(np.flatnonzero(x), sizes))
    counts = x[np.flatnonzero(x)]
    truth = []
    for i in range(len(sizes)):
        for j in range(i + 1, len(sizes)):
            t = np.zeros((sizes[i], sizes[j]))
            np.add.at(t, (codes[i], codes[j]), counts)
            truth.append(t.ravel())
    truth = np.concatenate(truth)
    assert truth.sum() == pytest.approx(len(sizes) * (len(sizes) - 1) / 2 * x.sum())
    assert np.all(np.abs(out["answer"].to_numpy() - truth) < 6 * out["std"].to_numpy())


def test_answer_cli_fair_marginals_hdmm(tmp_path) -> None:
    from dpopt.cli import main

    out = tmp_path / "a.csv"
    rc = main(["answer", "--domain", "fair", "--epsilon", "1", "--delta", "1e-6", "--workload", "marginals:2",
               "--mechanism", "hdmm", "--out", str(out), "--quiet"])
    assert rc == 0
    df = pd.read_csv(out)
    assert len(df) == 923 and (df["std"] > 0).all()


def test_records_tables_and_vector_agree_with_histogram(dom: Domain) -> None:
    rng = np.random.default_rng(3)
    df = pd.DataFrame({"a": rng.integers(0, 3, 200), "b": rng.integers(0, 4, 200), "c": rng.integers(0, 5, 200)})
    recs, _ = records(df, dom)
    x, _ = histogram(df, dom)
    np.testing.assert_array_equal(recs.vector(), x)
    T = x.reshape(3, 4, 5)
    np.testing.assert_array_equal(recs.table((0, 2)), T.sum(axis=1))
    np.testing.assert_array_equal(recs.table((1,)), T.sum(axis=(0, 2)))
    assert float(recs.table(())) == 200.0
    with pytest.raises(ValueError, match="more than max_cells=10"):
        recs.vector(max_cells=10)


def test_release_from_records_never_forms_the_data_vector() -> None:
    # 10 attributes of 100 levels: 1e20 cells, no data vector can exist; all 1-way marginals released
    # through hdmm's marginal strategy from 500 rows. At eps = 1e4 every answer lies within 6 stated std
    # of its true count (Gaussian: P(|z| > 6) = 2e-9 per query, 1000 queries).
    big = Domain([IntegerRange(f"v{i}", 0, 99) for i in range(10)])
    rng = np.random.default_rng(5)
    df = pd.DataFrame({f"v{i}": rng.integers(0, 100, 500) for i in range(10)})
    recs, _ = records(df, big)
    W = marginals_workload(big, 1)
    mech = make_mechanism("hdmm").fit(W, Privacy(1e4, 1e-6))
    out = release(mech, recs, PrivacyLedger(1e4, 1e-6))
    truth = np.concatenate([np.bincount(df[f"v{i}"], minlength=100) for i in range(10)])
    assert len(out) == 1000
    assert np.all(np.abs(out["answer"].to_numpy() - truth) < 6 * out["std"].to_numpy())
    # a Kronecker strategy that sums attributes out counts only the marginal it measures: ranges of v3
    R = range_workload(big, "v3")
    kron = make_mechanism("hdmm").fit(R, Privacy(1e4, 1e-6))
    out = release(kron, recs, PrivacyLedger(1e4, 1e-6))
    counts = np.bincount(df["v3"], minlength=100)
    lo, hi = np.triu_indices(100)
    truth = np.cumsum(np.r_[0, counts])[hi + 1] - np.cumsum(np.r_[0, counts])[lo]
    assert np.all(np.abs(out["answer"].to_numpy() - truth) < 6 * out["std"].to_numpy())
    # a union of Kronecker products: hdmm keeps the residual Kronecker family, whose parts each count one
    # marginal table of the records (1100 + 5050 queries, the same 6-std test)
    U = stack_workloads([marginal_workload(big, ["v0"]), range_workload(big, "v1")])
    union = make_mechanism("hdmm").fit(U, Privacy(1e4, 1e-6))
    assert union.strategy_.name == "residual-kron"
    out = release(union, recs, PrivacyLedger(1e4, 1e-6))
    c1 = np.bincount(df["v1"], minlength=100)
    lo, hi = np.triu_indices(100)
    truth = np.concatenate([np.bincount(df["v0"], minlength=100),
                            np.cumsum(np.r_[0, c1])[hi + 1] - np.cumsum(np.r_[0, c1])[lo]])
    assert np.all(np.abs(out["answer"].to_numpy() - truth) < 6 * out["std"].to_numpy())


@pytest.mark.slow
def test_answer_cli_adult_two_way_marginals(tmp_path) -> None:
    # all 2-way marginals of Adult (6.4e17 cells, 148,137 queries) released from the rows' codes
    from conftest import require_shared

    from dpopt.cli import main

    folder = require_shared("data/adult")
    out = tmp_path / "a.csv"
    rc = main(["answer", "--data", str(folder / "adult.csv"), "--domain", str(folder / "adult-domain.json"),
               "--workload", "marginals:2", "--mechanism", "hdmm", "--epsilon", "1", "--delta", "1e-6",
               "--out", str(out), "--quiet"])
    assert rc == 0
    df = pd.read_csv(out)
    assert len(df) == 148_137 and (df["std"] > 0).all()
