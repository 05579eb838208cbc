"""Predicate queries -> labelled workloads bound to a Domain (dpopt.queries)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from conftest import require_shared

from dpopt.data import Categorical, Domain, IntegerRange, NumericBins, histogram
from dpopt.queries import (
    And,
    Between,
    DomainMismatchError,
    Equals,
    In,
    check_domain,
    identity_workload,
    marginal_workload,
    marginals_workload,
    predicate_workload,
    range_workload,
    stack_workloads,
    total_workload,
)


@pytest.fixture
def dom() -> Domain:
    return Domain([
        Categorical("state", ["NJ", "NY", "PA"]),
        IntegerRange("age", 18, 40),
        NumericBins("income", [0, 10, 20, 50]),
        Categorical("sex", ["F", "M"]),
    ])


@pytest.fixture
def people(dom: Domain) -> pd.DataFrame:
    rng = np.random.default_rng(7)
    n = 500
    return pd.DataFrame({
        "state": rng.choice(["NJ", "NY", "PA"], n),
        "age": rng.integers(18, 41, n),
        "income": rng.uniform(0, 50, n),
        "sex": rng.choice(["F", "M"], n),
    })


def test_predicates_count_what_pandas_counts(dom: Domain, people: pd.DataFrame) -> None:
    x, _ = histogram(people, dom)
    conds = [
        In("state", {"NY", "NJ"}),
        Between("age", 20, 29),
        Equals("sex", "F") & Between("age", 30, 40),
        And(In("state", ["PA"]), Between("income", 10, 50), Equals("sex", "M")),
        Between("age", 25, 35) & Between("age", 30, 39),  # same attribute: intersection 30..35
    ]
    W = predicate_workload(dom, conds)
    got = W.sparse() @ x
    p = people
    expected = [
        p.state.isin(["NY", "NJ"]).sum(),
        p.age.between(20, 29).sum(),
        ((p.sex == "F") & p.age.between(30, 40)).sum(),
        ((p.state == "PA") & (p.income >= 10) & (p.sex == "M")).sum(),
        p.age.between(30, 35).sum(),
    ]
    np.testing.assert_array_equal(got, expected)
    assert W.row_labels() == [
        "state in {NJ, NY}",
        "20 <= age <= 29",
        "sex=F & 30 <= age <= 40",
        "state=PA & income in [10, 50] & sex=M",
        "25 <= age <= 35 & 30 <= age <= 39",
    ]
    assert W.domain == dom and W.shape == (5, dom.size)


def test_mapping_gives_labels(dom: Domain) -> None:
    W = predicate_workload(dom, {"young": Between("age", 18, 24), "all": In("sex", ["F", "M"])})
    assert W.row_labels() == ["young", "all"]
    np.testing.assert_array_equal(W.sparse().sum(axis=1).A1, [3 * 7 * 3 * 2, dom.size])


def test_marginal_rows_match_groupby(dom: Domain, people: pd.DataFrame) -> None:
    x, _ = histogram(people, dom)
    W = marginal_workload(dom, ["sex", "state"])  # listed out of order: domain order is kept
    assert W.row_labels()[:2] == ["state=NJ & sex=F", "state=NJ & sex=M"]
    counts = people.groupby(["state", "sex"]).size().reindex(
        pd.MultiIndex.from_product([["NJ", "NY", "PA"], ["F", "M"]]), fill_value=0)
    np.testing.assert_array_equal(W.sparse() @ x, counts.to_numpy())
    one_way = marginals_workload(dom, 1)
    assert one_way.shape == (3 + 23 + 3 + 2, dom.size)
    expected = np.concatenate([
        people.state.value_counts().reindex(["NJ", "NY", "PA"]),
        people.age.value_counts().reindex(range(18, 41), fill_value=0),
        pd.cut(people.income, [0, 10, 20, 50], right=False).value_counts(sort=False),
        people.sex.value_counts().reindex(["F", "M"]),
    ])
    np.testing.assert_array_equal(one_way.sparse() @ x, expected)


def test_range_workload_all_ranges(dom: Domain, people: pd.DataFrame) -> None:
    x, _ = histogram(people, dom)
    W = range_workload(dom, "age")
    k = 23
    assert W.shape == (k * (k + 1) // 2, dom.size)
    labels = W.row_labels()
    assert labels[0] == "age=18" and labels[1] == "18 <= age <= 19" and labels[-1] == "age=40"
    i = labels.index("20 <= age <= 29")
    assert (W.sparse() @ x)[i] == people.age.between(20, 29).sum()
    assert range_workload(dom, "income").row_labels() == [
        "income in [0, 10)", "income in [0, 20)", "income in [0, 50]",
        "income in [10, 20)", "income in [10, 50]", "income in [20, 50]"]
    with pytest.raises(ValueError, match="'state' is an unordered categorical"):
        range_workload(dom, "state")


def test_identity_total_stack(dom: Domain, people: pd.DataFrame) -> None:
    x, _ = histogram(people, dom)
    I = identity_workload(dom)
    np.testing.assert_array_equal(I.sparse() @ x, x)
    assert I.row_labels()[0] == "state=NJ & age=18 & income=[0, 10) & sex=F"
    T = total_workload(dom)
    assert (T.sparse() @ x)[0] == len(people) and T.row_labels() == ["total"]
    S = stack_workloads([T, marginal_workload(dom, ["sex"])])
    assert S.row_labels() == ["total", "sex=F", "sex=M"] and S.domain == dom
    assert marginal_workload(dom, []).row_labels() == ["total"]


@pytest.mark.parametrize(
    ("make", "pattern"),
    [
        (lambda d: Equals("height", 3).row(d), "unknown attribute 'height'"),
        (lambda d: Equals("state", "CA").row(d), r"value 'CA' is not in the domain.*NJ"),
        (lambda d: Between("age", 10, 20).row(d), r"value 10 is not in the domain.*\[18, 40\]"),
        (lambda d: Between("age", 30, 20).row(d), "need low <= high"),
        (lambda d: Between("state", "NJ", "PA").row(d), "'state' is an unordered categorical"),
        (lambda d: Between("income", 5, 20).row(d), r"cuts bin\(s\) \['\[0, 10\)'\]"),
        (lambda d: (Equals("age", 20) & Equals("age", 21)).row(d), "selects no cell"),
        (lambda d: In("state", "NY").row(d), "use Equals for one value"),
        (lambda d: In("state", []).row(d), "at least one value"),
        (lambda d: predicate_workload(d, []), "at least one condition"),
        (lambda d: predicate_workload(d, [np.ones(3)]), "expected Condition objects"),
        (lambda d: marginals_workload(d, 5), r"k must be an integer in 0..4"),
    ],
)
def test_bad_queries_raise(dom: Domain, make, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        make(dom)


def test_workload_over_other_domain_detected(dom: Domain) -> None:
    W = marginal_workload(dom, ["sex"])
    other = Domain([Categorical("state", ["NJ", "NY", "PA"]), IntegerRange("age", 18, 40),
                    NumericBins("income", [0, 10, 25, 50]), Categorical("sex", ["F", "M"])])
    assert other.size == dom.size  # same n: only the binding can tell them apart
    check_domain(W, dom)
    with pytest.raises(DomainMismatchError, match="is over Domain.*but the data are over"):
        check_domain(W, other)
    with pytest.raises(DomainMismatchError, match="different|is over"):
        stack_workloads([W, marginal_workload(other, ["sex"])])


def test_adult_predicates_match_pandas() -> None:
    csv = require_shared("data/adult/adult.csv")
    df = pd.read_csv(csv)
    dom = Domain.from_json(require_shared("data/adult/adult-domain.json")).project(["age", "race", "sex"])
    x, _ = histogram(df, dom)
    W = predicate_workload(dom, [Between("age", 20, 29) & Equals("sex", 1), In("race", [0, 2])])
    np.testing.assert_array_equal(
        W.sparse() @ x,
        [(df.age.between(20, 29) & (df.sex == 1)).sum(), df.race.isin([0, 2]).sum()])


def test_domain_mismatch_names_what_differs():
    """Two domains of the same size and repr: the error must say which attribute's range differs."""
    a = Domain([IntegerRange("age", 0, 9), Categorical("sex", ["F", "M"])])
    b = Domain([IntegerRange("age", 1, 10), Categorical("sex", ["F", "M"])])
    assert repr(a) == repr(b)  # the old message printed these two, identical, side by side
    w = marginal_workload(a, ["age"])
    with pytest.raises(DomainMismatchError, match=r"age.*0.*1.*9.*10"):
        check_domain(w, b)
    with pytest.raises(DomainMismatchError, match=r"age"):
        stack_workloads([w, marginal_workload(b, ["sex"])])
