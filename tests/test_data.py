"""Domains, cell order and the histogram x (dpopt.data)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import require_shared
from hypothesis import given, settings
from hypothesis import strategies as st

from dpopt.data import Categorical, Domain, IntegerRange, NumericBins, histogram


@pytest.fixture
def small() -> Domain:
    return Domain([
        Categorical("sex", ["F", "M"]),
        IntegerRange("age", 20, 29),
        NumericBins("income", [0, 10, 20, np.inf]),
        Categorical("race", [1, 2, 3]),
    ])


@pytest.fixture
def table() -> pd.DataFrame:
    return pd.DataFrame({
        "sex": ["F", "M", "F", "F"],
        "age": [20, 29.0, 25, 20],
        "income": [0.0, 10.0, 1e9, 9.99],
        "race": [1.0, 2, 3, 1],
        "ignored": ["a", "b", "c", "d"],
    })


def test_shape_size_and_c_order(small: Domain) -> None:
    assert small.shape == (2, 10, 3, 3)
    assert small.size == 180
    # Row-major: the last attribute varies fastest.
    assert small.cell_to_values(0) == {"sex": "F", "age": 20, "income": small["income"].levels[0],
                                       "race": 1}
    assert small.cell_to_values(1)["race"] == 2
    assert small.cell_to_values(3)["income"] == pd.Interval(10.0, 20.0, closed="left")
    assert small.cell_to_values(90)["sex"] == "M"
    assert small.values_to_cell(sex="M", age=21, income=15, race=3) == int(
        np.ravel_multi_index((1, 1, 1, 2), (2, 10, 3, 3)))


def test_cell_roundtrip_all_cells(small: Domain) -> None:
    for i in range(small.size):
        assert small.values_to_cell(small.cell_to_values(i)) == i
    labels = small.cell_labels()
    assert len(labels) == small.size
    assert labels[0] == "sex=F & age=20 & income=[0, 10) & race=1"
    assert labels[-1] == "sex=M & age=29 & income=[20, inf] & race=3"


def test_histogram_counts_cells(small: Domain, table: pd.DataFrame) -> None:
    x, rep = histogram(table, small)
    assert x.shape == (180,) and x.dtype == np.float64
    assert x.sum() == 4 and rep.n_counted == 4 and rep.n_rows == 4
    expected = np.zeros(180)
    expected[small.values_to_cell(sex="F", age=20, income=0, race=1)] += 2  # 0 and 9.99
    expected[small.values_to_cell(sex="M", age=29, income=10, race=2)] += 1  # left-closed bin
    expected[small.values_to_cell(sex="F", age=25, income=1e9, race=3)] += 1
    np.testing.assert_array_equal(x, expected)


def test_bins_edges() -> None:
    a = NumericBins("v", [0, 1, 2])
    codes, _ = a.encode([0, 0.999, 1, 2, 2.0001, -0.1])
    np.testing.assert_array_equal(codes, [0, 0, 1, 1, -1, -1])
    assert a.label(1) == "[1, 2]" and a.label(0) == "[0, 1)"
    with pytest.raises(ValueError, match="strictly increasing"):
        NumericBins("v", [0, 0, 1])


@pytest.mark.parametrize(
    ("column", "value", "pattern"),
    [
        ("sex", "X", r"column 'sex': unseen category 'X' at row 2 \(counted from 1; index 1\); expected one of \['F', 'M'\]"),
        ("age", 30, r"column 'age': value 30 is outside the domain .*integer in \[20, 29\]"),
        ("age", 25.5, r"column 'age': value 25.5 is outside the domain"),
        ("age", "abc", r"column 'age': value 'abc' is outside the domain"),
        ("income", -1.0, r"column 'income': value -1.0 is outside the domain .*\[0, inf\]"),
        ("race", np.nan, r"column 'race': missing value \(nan\) at row 2 \(counted from 1; index 1\); expected one of \[1, 2, 3\]"),
        ("sex", None, r"column 'sex': missing value \(None\)"),
    ],
)
def test_invalid_values_raise_with_column_value_domain(
    small: Domain, table: pd.DataFrame, column: str, value: object, pattern: str
) -> None:
    bad = table.astype(object)
    bad.loc[1, column] = value
    with pytest.raises(ValueError, match=pattern):
        histogram(bad, small)
    x, rep = histogram(bad, small, on_invalid="drop")
    assert x.sum() == 3 and rep.n_dropped == 1 and rep.n_counted == 3
    assert sum(rep.invalid[column].values()) == 1


def test_unknown_column(small: Domain, table: pd.DataFrame) -> None:
    with pytest.raises(ValueError, match=r"column\(s\) \['race'\] of the domain are not in"):
        histogram(table.drop(columns="race"), small)
    with pytest.raises(ValueError, match="unknown attribute 'height'"):
        small.attribute("height")
    with pytest.raises(ValueError, match="unknown attributes"):
        small.values_to_cell(sex="F", age=20, income=1, race=1, height=3)


def test_bucket_needs_and_uses_catch_all(table: pd.DataFrame) -> None:
    dom = Domain([Categorical("sex", ["F"], other="other"), IntegerRange("age", 20, 29)])
    assert dom.shape == (2, 10)
    x, rep = histogram(table, dom, on_invalid="bucket")
    assert rep.n_bucketed == 1 and rep.invalid == {"sex": {"unseen_category": 1}}
    assert x[dom.values_to_cell(sex="other", age=29)] == 1
    assert x.sum() == 4
    with pytest.raises(ValueError, match="declare the attribute with other="):
        histogram(table, Domain([Categorical("sex", ["F"])]), on_invalid="bucket")
    # The catch-all level is used only when asked for: the default still raises.
    with pytest.raises(ValueError, match="unseen category 'M'"):
        histogram(table, dom)


def test_drop_counts_rows_once(table: pd.DataFrame, small: Domain) -> None:
    bad = table.astype(object)
    bad.loc[0, "sex"] = "X"
    bad.loc[0, "age"] = 99
    bad.loc[2, "race"] = 7
    x, rep = histogram(bad, small, on_invalid="drop")
    assert rep.n_dropped == 2 and x.sum() == 2
    assert rep.invalid == {"sex": {"unseen_category": 1}, "age": {"outside_domain": 1},
                           "race": {"unseen_category": 1}}
    assert "2 dropped" in rep.summary()


def test_bad_arguments(small: Domain, table: pd.DataFrame) -> None:
    with pytest.raises(ValueError, match="on_invalid must be"):
        histogram(table, small, on_invalid="ignore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs a pandas DataFrame"):
        histogram(table.to_numpy(), small)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cell index 180 out of range"):
        small.cell_to_values(180)
    with pytest.raises(ValueError, match="distinct"):
        Domain([IntegerRange("a", 0, 1), IntegerRange("a", 0, 2)])
    with pytest.raises(ValueError, match="low <= high"):
        IntegerRange("a", 3, 1)
    with pytest.raises(ValueError, match="more than max_cells"):
        histogram(table, small, max_cells=100)


def test_from_json_dict_and_file(tmp_path: Path) -> None:
    spec = {"age": 85, "sex": 2}
    d = Domain.from_json(spec)
    assert d.names == ("age", "sex") and d.shape == (85, 2)
    assert d["age"] == IntegerRange("age", 0, 84)
    f = tmp_path / "dom.json"
    f.write_text(json.dumps(spec))
    assert Domain.from_json(f) == d
    with pytest.raises(ValueError, match="positive integer"):
        Domain.from_json({"age": 0})
    with pytest.raises(ValueError, match="positive integer"):
        Domain.from_json({"age": "85"})


def test_domain_equality_and_projection(small: Domain) -> None:
    p = small.project(["race", "sex"])
    assert p.names == ("sex", "race")  # kept in domain order
    assert p == Domain([Categorical("sex", ["F", "M"]), Categorical("race", [1, 2, 3])])
    assert p != Domain([Categorical("sex", ["F", "M"]), Categorical("race", [1, 2, 4])])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=4), st.data())
def test_values_cell_roundtrip_property(sizes: list[int], data: st.DataObject) -> None:
    dom = Domain([IntegerRange(f"a{i}", -2, k - 3) for i, k in enumerate(sizes)])
    i = data.draw(st.integers(0, dom.size - 1))
    vals = dom.cell_to_values(i)
    assert dom.values_to_cell(vals) == i
    assert [vals[n] + 2 for n in dom.names] == list(np.unravel_index(i, dom.shape))


def test_adult_histogram_matches_crosstab() -> None:
    csv = require_shared("data/adult/adult.csv")
    df = pd.read_csv(csv)
    full = Domain.from_json(require_shared("data/adult/adult-domain.json"))
    dom = full.project(["race", "sex", "income>50K"])
    x, rep = histogram(df, dom)
    assert rep.n_counted == len(df) == 48842
    counts = df.groupby(["race", "sex", "income>50K"]).size()
    expected = np.zeros(dom.shape)
    for (r, s, i), c in counts.items():
        expected[r, s, i] = c
    np.testing.assert_array_equal(x, expected.ravel())


# -- the shared folder: skipped on a clone without it, a failure under CI ------------------------------

_NEEDS_SHARED = [
    "tests/test_data.py::test_adult_histogram_matches_crosstab",
    "tests/test_convex_dp.py::test_matches_published_table_at_n128",
]


def _run_without_shared(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    """Run the tests that need the shared folder with DPOPT_SHARED pointing at a folder that does not exist."""
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["DPOPT_SHARED"] = str(tmp_path / "absent")
    if ci is not None:
        env["CI"] = ci
    cmd = [sys.executable, "-m", "pytest", "-q", "-rsf", "-p", "no:cacheprovider", *_NEEDS_SHARED]
    return subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True,
                          text=True, timeout=600)


def test_missing_shared_folder_skips_with_the_missing_path(tmp_path: Path) -> None:
    res = _run_without_shared(tmp_path, ci=None)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "2 skipped" in res.stdout and "failed" not in res.stdout
    for rel in ("data/adult/adult.csv", "reference/hdmm-oned.csv"):
        assert f"{tmp_path / 'absent' / rel} does not exist" in res.stdout, res.stdout


def test_missing_shared_folder_fails_under_ci(tmp_path: Path) -> None:
    res = _run_without_shared(tmp_path, ci="true")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "2 failed" in res.stdout and "skipped" not in res.stdout
    assert f"CI=true and 'reference/hdmm-oned.csv' in the shared folder not found: {tmp_path / 'absent'}" in res.stdout
