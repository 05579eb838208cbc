"""The specs marginals:SIZES:K[,K...][:prefix|:range] and union:SPEC|SPEC|... (sizes and over a data Domain): what
they build, what they refuse, and a release through them."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dpopt.data import Categorical, Domain, IntegerRange, records
from dpopt.mechanisms import make_mechanism
from dpopt.privacy import Privacy
from dpopt.release import PrivacyLedger, release
from dpopt.specs import SpecError, parse_workload
from dpopt.workloads import AllRange, Kron, Marginals, Prefix, Stack, Total


def test_prefix_and_range_marginals_are_unions_of_kronecker_products():
    W = parse_workload("marginals:4x3x2:1,2:prefix")
    assert isinstance(W, Stack) and not isinstance(W, Marginals) and W.kron_parts
    assert len(W.parts) == 3 + 3
    assert W.shape == (4 + 3 + 2 + 12 + 8 + 6, 24)
    first = W.parts[0]
    assert isinstance(first.factors[0], Prefix) and isinstance(first.factors[1], Total)
    dense = np.kron(np.kron(np.tril(np.ones((4, 4))), np.ones((1, 3))), np.ones((1, 2)))
    np.testing.assert_array_equal(first.matrix(), dense)
    R = parse_workload("marginals:4x5:2:range")
    assert len(R.parts) == 1 and all(isinstance(f, AllRange) for f in R.parts[0].factors)
    assert R.shape == (10 * 15, 20)


def test_orders_without_suffix_keep_marginals():
    W = parse_workload("marginals:3x4x5:1,2")
    assert isinstance(W, Marginals) and len(W.subsets) == 6
    assert parse_workload("marginals:3x4x5:2").subsets == Marginals([3, 4, 5], k=2).subsets


def test_union_flattens_its_parts():
    U = parse_workload("union:marginals:3x3x3:1:range|marginals:3x3x3:2:prefix|kron:total:3,total:3,total:3")
    assert isinstance(U, Stack) and U.kron_parts and len(U.parts) == 3 + 3 + 1
    assert U.shape == (3 * 6 + 3 * 9 + 1, 27)
    mixed = parse_workload("union:prefix:16|kron:prefix:4,prefix:4")
    assert mixed.shape == (32, 16) and not mixed.kron_parts
    np.testing.assert_array_equal(mixed.matrix(), np.vstack([Prefix(16).matrix(), Kron([Prefix(4), Prefix(4)]).matrix()]))


@pytest.mark.parametrize("spec, message", [
    ("marginals:8x8:prefix", "needs N1xN2x...:K"),
    ("marginals:8x8:1,1:prefix", "distinct"),
    ("marginals:8x8:3:prefix", "must lie in 1..2"),
    ("marginals:8x8:0,1:range", "must lie in 1..2"),
    ("marginals:8x8:1,x:range", "must be an integer"),
    ("marginals:8x8:1:prefix:x", "trailing parts"),
    ("marginals:8x8:1:foo", "trailing parts"),
    ("marginals:8x-8:1:prefix", "positive"),
    ("union:prefix:8", "two or more"),
    ("union:prefix:8|", "two or more"),
    ("union:prefix:8||total:8", "two or more"),
    ("union:prefix:8|prefix:9", "same number of cells"),
    ("union:prefix:8|nonsense:8", "unknown workload family"),
])
def test_refusals_name_what_is_wrong(spec, message):
    with pytest.raises(SpecError, match=message):
        parse_workload(spec)


def _domain() -> Domain:
    return Domain([IntegerRange("a", 0, 11), IntegerRange("b", 0, 11), IntegerRange("c", 0, 11)])


def test_domain_specs_label_their_ranges():
    W = parse_workload("marginals:1,2:prefix", _domain())
    assert W.shape == (3 * 12 + 3 * 144, 12**3)
    labels = W.row_labels()
    assert labels[0] == "a=0" and labels[1] == "0 <= a <= 1"
    assert labels[-1] == "0 <= b <= 11 & 0 <= c <= 11"
    R = parse_workload("marginals:2:range", _domain())
    assert R.shape == (3 * 78 * 78, 12**3)
    U = parse_workload("union:marginals:1:range|total", _domain())
    assert U.row_labels()[-1] == "total" and U.m == 3 * 78 + 1
    plain = parse_workload("marginals:1,2", _domain())
    assert isinstance(plain, Marginals) and plain.m == 36 + 3 * 144


def test_domain_specs_refuse_unordered_columns():
    d = Domain([IntegerRange("a", 0, 3), Categorical("sex", ["F", "M"])])
    with pytest.raises(SpecError, match="ordinal attributes; 'sex' is an unordered categorical"):
        parse_workload("marginals:1:prefix", d)
    with pytest.raises(SpecError, match="distinct"):
        parse_workload("marginals:1,1:range", d)
    with pytest.raises(SpecError, match="two or more"):
        parse_workload("union:total", d)


def test_release_through_the_residual_family_from_records():
    """hdmm on the prefix marginals of a 1728-cell domain keeps the residual family and releases from the rows'
    codes: at eps = 1e4 every answer lies within 6 stated std of its count (P(|z| > 6) = 2e-9 per query, 468
    queries)."""
    dom = _domain()
    rng = np.random.default_rng(7)
    df = pd.DataFrame({k: rng.integers(0, 12, 300) for k in "abc"})
    recs, _ = records(df, dom)
    W = parse_workload("marginals:1,2:prefix", dom)
    mech = make_mechanism("hdmm").fit(W, Privacy(1e4, 1e-6))
    assert mech.strategy_.name == "residual-kron"
    out = release(mech, recs, PrivacyLedger(1e4, 1e-6), domain=dom)
    T = np.zeros((12, 12, 12))
    np.add.at(T, (df["a"], df["b"], df["c"]), 1)
    truth = np.asarray(W.matrix() @ T.ravel()).ravel()
    assert len(out) == W.m
    assert np.all(np.abs(out["answer"].to_numpy() - truth) < 6 * out["std"].to_numpy())
