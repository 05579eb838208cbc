"""benchmarks/bench_dpbench.py: `--remeasure` replaces only the named mechanisms' rows of a kept part, and the
summary's z column is the difference of two means in their standard errors."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from benchmarks import bench_dpbench as bench
from tests.conftest import require_shared


def test_remeasure_replaces_only_the_named_mechanisms(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "DATA", require_shared("data/dpbench"))
    part = tmp_path / "part.csv"
    task = {"dataset": "HEPTH.n4096", "dim": 1, "merge": 8, "scales": [1000], "eps": [1.0], "samples": 2,
            "trials": 1, "ektelo": False, "part": str(part)}
    first = pd.DataFrame(bench.run_dataset(task))
    assert set(first["mechanism"]) >= {"identity", "hierarchical", "wavelet", "dawa-opt", "dawa-opt:nnls"}
    again = pd.DataFrame(bench.run_dataset({**task, "trials": 3, "only": {"identity"}}))
    kept = pd.read_csv(part)
    assert len(again) == len(first) == len(kept)
    by = kept.set_index(["workload", "mechanism"])
    old = first.set_index(["workload", "mechanism"])
    for (wname, mech), row in by.iterrows():
        if mech == "identity":
            assert row["runs"] == 6  # measured again: 2 samples x 3 trials
        else:
            assert row["runs"] == 2 and row["error"] == old.loc[(wname, mech), "error"]


def test_summary_z_is_the_difference_in_standard_errors():
    rows = []
    for mech, err, se in (("DAWA", 1.0, 0.1), ("dawa-opt", 1.3, 0.1), ("HB", 2.0, 0.2), ("identity", 3.0, 0.1),
                          ("hierarchical", 2.0, 0.2), ("wavelet", 2.5, 0.1), ("dawa-opt:auto", 1.3, 0.1),
                          ("dawa-opt:nnls", 1.3, 0.1)):
        rows.append({"dataset": "d", "dim": 1, "cells": 8, "scale": 1000, "epsilon": 1.0, "workload": "prefix",
                     "mechanism": mech, "error": err, "error_se": se, "runs": 5})
    text = bench.summary(pd.DataFrame(rows), ["note"])
    line = next(x for x in text.splitlines() if x.startswith("| d |"))
    header = next(x for x in text.splitlines() if x.startswith("| dataset |"))
    cells = dict(zip([c.strip() for c in header.strip("|").split("|")],
                     [c.strip() for c in line.strip("|").split("|")], strict=True))
    # the table prints 4 significant digits: rel 1e-3 is its rounding
    assert float(cells["z(dawa-opt - DAWA)"]) == pytest.approx(0.3 / math.hypot(0.1, 0.1), rel=1e-3)
    # against the best fixed mechanism (hierarchical, 2.0 +- 0.2): the standard error of the one chosen
    assert float(cells["z(dawa-opt - best_fixed)"]) == pytest.approx(-0.7 / math.hypot(0.1, 0.2), rel=1e-3)
    for scale in ("1000", "all"):  # the summary per scale, then over every row
        summary_row = next(x for x in text.splitlines() if x.startswith(f"| {scale} | dawa-opt/DAWA |"))
        assert summary_row.split("|")[5].strip() == "1"  # above_by_2_se: z = 2.12 > 2
        fixed_row = next(x for x in text.splitlines() if x.startswith(f"| {scale} | dawa-opt/best_fixed |"))
        assert fixed_row.split("|")[5].strip() == "0"
    assert np.isclose(float(cells["dawa-opt/DAWA"]), 1.3, rtol=1e-3)
