"""The embedded Fair (1978) dataset and its documented domain (dpopt.datasets)."""

from __future__ import annotations

import numpy as np
import pytest

from dpopt.data import histogram
from dpopt.datasets import FAIR_ROWS, fair_domain, load_fair
from dpopt.queries import Between, marginal_workload, predicate_workload


@pytest.fixture(scope="module")
def fair():
    return load_fair()


def test_loads_offline_with_documented_shape(fair) -> None:
    assert fair.shape == (FAIR_ROWS, 9) == (6366, 9)
    assert list(fair.columns[:8]) == list(fair_domain().names)
    assert "affairs" in fair.columns


def test_documented_domain_covers_every_row(fair) -> None:
    dom = fair_domain()
    assert dom.shape == (5, 6, 7, 6, 4, 6, 6, 6) and dom.size == 1_088_640
    x, rep = histogram(fair, dom)  # on_invalid="error": every value is a documented level
    assert rep.n_counted == FAIR_ROWS and x.sum() == FAIR_ROWS
    assert dom["educ"].levels == (9.0, 12.0, 14.0, 16.0, 17.0, 20.0)
    assert dom["rate_marriage"].levels == (1, 2, 3, 4, 5)


def test_fair_queries_match_pandas(fair) -> None:
    dom = fair_domain(["religious", "age", "rate_marriage"])  # kept in table order
    assert dom.names == ("rate_marriage", "age", "religious")
    x, _ = histogram(fair, dom)
    M = marginal_workload(dom, ["religious"])
    # Counts are integers far below 2^53, so sums of them are exact in floating point: compared exactly.
    np.testing.assert_array_equal(
        M.sparse() @ x, fair.religious.value_counts().sort_index().to_numpy())
    assert M.row_labels() == ["religious=1", "religious=2", "religious=3", "religious=4"]
    P = predicate_workload(dom, [Between("age", 22, 32) & Between("rate_marriage", 4, 5)])
    assert P.row_labels() == ["22 <= age <= 32 & 4 <= rate_marriage <= 5"]
    assert (P.sparse() @ x)[0] == (fair.age.between(22, 32) & (fair.rate_marriage >= 4)).sum()
