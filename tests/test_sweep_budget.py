"""The fit time budget reaches sweeps and reproductions (Task.time_limit, `--time-limit`)."""

from __future__ import annotations

import io
import json

import pandas as pd
import pytest

from dpopt.cli import main, time_limit_arg
from dpopt.experiments import SweepConfig, SweepError, Task, run_sweep


def test_a_capped_fit_keeps_a_valid_strategy_and_says_so() -> None:
    # hdmm's p-Identity on Prefix(256) under eps-DP runs for minutes (2 restarts x 2000 L-BFGS steps);
    # at a 1 s budget it stops with its best valid iterate and the status says so
    t = Task(workload="prefix:256", mechanism="hdmm", epsilon=1.0, time_limit=1.0)
    r = run_sweep([t], max_workers=0, progress=False).iloc[0]
    assert str(r["status"]).startswith("time_limit"), r["status"]
    assert r["time_limit"] == 1.0
    assert r["expected_total_error"] >= r["bound"]  # a valid strategy: never below the lower bound


def test_time_limit_is_part_of_the_task_only_when_set() -> None:
    base = Task(workload="prefix:8", mechanism="identity", epsilon=1.0)
    assert Task(workload="prefix:8", mechanism="identity", epsilon=1.0, time_limit=None).task_hash == base.task_hash
    assert Task(workload="prefix:8", mechanism="identity", epsilon=1.0, time_limit=5.0).task_hash != base.task_hash
    assert "time_limit" not in base.row()


@pytest.mark.parametrize("bad", [-1, 0, "soon", True, float("inf")])
def test_config_time_limit_is_validated(bad: object) -> None:
    with pytest.raises(SweepError, match="time_limit"):
        SweepConfig.from_mapping({"workloads": ["prefix:8"], "mechanisms": ["identity"], "time_limit": bad})


@pytest.mark.parametrize(("text", "seconds"), [("none", None), ("INF", None), (" 7 ", 7.0)])
def test_config_and_flag_read_the_same_time_limit_text(text: str, seconds: float | None) -> None:
    cfg = SweepConfig.from_mapping({"workloads": ["prefix:8"], "mechanisms": ["identity"], "time_limit": text})
    assert {t.time_limit for t in cfg.expand()} == {seconds}
    assert time_limit_arg(text) == seconds


def test_config_and_flag_set_every_task(tmp_path) -> None:
    cfg = SweepConfig.from_mapping({"workloads": ["prefix:{n}"], "mechanisms": ["identity", "wavelet"],
                                    "sizes": {"n": [8, 16]}, "time_limit": 30})
    assert {t.time_limit for t in cfg.expand()} == {30.0}
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"workloads": ["prefix:8"], "mechanisms": ["identity"]}))
    out = tmp_path / "r.csv"
    assert main(["sweep", str(path), "--workers", "0", "--no-progress", "--time-limit", "7", "--out", str(out)]) == 0
    assert pd.read_csv(out)["time_limit"].tolist() == [7.0]
    with pytest.raises(SystemExit):
        main(["sweep", str(path), "--time-limit", "-3"])


def test_reproduce_passes_the_budget() -> None:
    from dpopt.reproduce import make_table2, reproduce

    res = reproduce(make_table2(["ALLRANGE(2,...,2)"]), out=None, max_workers=0, progress=False, report=False,
                    time_limit=60.0, stream=io.StringIO())
    assert (res.results["time_limit"] == 60.0).all()
