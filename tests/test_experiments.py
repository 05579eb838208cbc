"""Sweeps: task expansion and hashing, seeds, local and Dask executors, cache resume, the sweep command."""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pandas as pd
import pytest

from dpopt import experiments as ex
from dpopt.cli import main
from dpopt.experiments import SweepConfig, SweepError, Task, comparable, load_config, run_sweep

GRID = {
    "name": "test-grid",
    "workloads": ["allrange:{n}", "prefix:{n}", "wrange:{m}x{n}"],
    "sizes": {"n": [8, 16], "m": [6]},
    "mechanisms": ["identity", "laplace", "wavelet", {"name": "hierarchical", "params": {"branching": [2, 4]}}],
    "epsilon": [0.5, 1.0],
    "delta": [0.0, 1e-6],
    "repetitions": 2,
}


def grid() -> SweepConfig:
    return SweepConfig.from_mapping(GRID)


def test_expansion_counts_and_order():
    tasks = grid().expand()
    # 3 templates x 2 sizes x 5 mechanism settings x 2 eps x 2 delta x 2 repetitions
    assert len(tasks) == 3 * 2 * 5 * 2 * 2 * 2 == 240
    assert [t.index for t in tasks] == list(range(240))
    assert len({t.task_hash for t in tasks}) == 240
    assert tasks[0].workload == "allrange:8" and tasks[0].mechanism == "identity"
    # Unused size names add no duplicates: 'allrange:{n}' ignores m.
    assert sum(t.template == "allrange:{n}" for t in tasks) == 80


def test_task_hash_is_stable_and_ignores_index():
    t = Task(workload="prefix:8", mechanism="identity", epsilon=1.0)
    # Pinned: changing the hashing silently would orphan every cache directory.
    assert t.task_hash == Task(workload="prefix:8", mechanism="identity", epsilon=1.0, index=7).task_hash
    assert t.task_hash == "8057e398fa1b7398b4c34d39"
    fields = {"v": 1, "workload": "prefix:8", "mechanism": "identity", "epsilon": 1.0, "delta": 0.0,
              "calibration": "classic", "solver": None, "params": [], "repetition": 0, "template": "",
              "sizes": [], "data": None, "monte_carlo_trials": 0}
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    assert t.task_hash == hashlib.sha256(text.encode()).hexdigest()[:24]
    assert t.task_hash != Task(workload="prefix:8", mechanism="identity", epsilon=1.0, repetition=1).task_hash


def test_seeds_derive_from_repetition_and_setting():
    tasks = grid().expand()
    wr = [t for t in tasks if t.template.startswith("wrange")]
    rep0 = {t.workload for t in wr if t.repetition == 0 and "x8" in t.workload}
    rep1 = {t.workload for t in wr if t.repetition == 1 and "x8" in t.workload}
    # One random workload per (size, repetition), shared by every mechanism and privacy setting ...
    assert len(rep0) == 1 and len(rep1) == 1 and rep0 != rep1
    spec = rep0.pop()
    assert spec.startswith("wrange:6x8:seed=")
    # ... equal to the SeedSequence derivation, reduced to 32 bits.
    assert spec == f"wrange:6x8:seed={ex.instance_seed('wrange:{m}x{n}', {'m': 6, 'n': 8}, 0) % 2**32}"
    # An explicit seed is kept.
    assert ex.resolve_workload("wrange:6x8:seed=3", {}, 5) == "wrange:6x8:seed=3"
    # Task seeds: equal settings give equal seeds, repetitions differ; no global state involved.
    np.random.seed(123)
    a = Task(workload="prefix:8", mechanism="identity", epsilon=1.0)
    np.random.seed(999)
    assert a.seed == Task(workload="prefix:8", mechanism="identity", epsilon=1.0, index=5).seed
    assert a.seed != Task(workload="prefix:8", mechanism="identity", epsilon=1.0, repetition=1).seed


def test_rows_match_independent_error_formulas():
    tasks = [
        Task(workload="allrange:16", mechanism="identity", epsilon=1.0, index=0),
        Task(workload="prefix:8", mechanism="identity", epsilon=0.5, delta=1e-6, index=1),
    ]
    df = run_sweep(tasks, max_workers=0, progress=False)
    # Closed forms against the library's few float operations on the same inputs: a few ulps (1e-12).
    # Identity under Laplace: 2/eps^2 * ||W||_F^2, and AllRange(16) has n(n+1)(n+2)/6 = 816 ones.
    assert df.loc[0, "expected_total_error"] == pytest.approx(2 * 816, rel=1e-12)
    # Identity under classic Gaussian: 2 ln(2/delta)/eps^2 * ||W||_F^2, Prefix(8) has 36 ones.
    assert df.loc[1, "expected_total_error"] == pytest.approx(2 * math.log(2e6) / 0.25 * 36, rel=1e-12)
    assert df.loc[1, "avg_squared_error"] == pytest.approx(df.loc[1, "expected_total_error"] / 8, rel=1e-15)
    assert list(df["status"]) == ["optimal", "optimal"]


def test_refusals_become_rows_not_crashes():
    tasks = [
        Task(workload="prefix:8", mechanism="no-such-mechanism", epsilon=1.0, index=0),
        Task(workload="prefix:8", mechanism="identity", epsilon=1.0, solver="clarabel", index=1),
        Task(workload="nonsense:8", mechanism="identity", epsilon=1.0, index=2),
        Task(workload="prefix:8", mechanism="identity", epsilon=1.0, index=3),
    ]
    df = run_sweep(tasks, max_workers=0, progress=False)
    assert df["status"].str.startswith("skipped").tolist() == [True, True, True, False]
    assert "no solver choice" in df.loc[1, "status"]


def test_monte_carlo_agrees_with_expected_error():
    t = Task(workload="prefix:8", mechanism="hierarchical", epsilon=1.0, monte_carlo_trials=4000)
    df = run_sweep([t], max_workers=0, progress=False)
    r = df.iloc[0]
    assert abs(r["mc_total_mean"] - r["expected_total_error"]) < 5 * r["mc_total_se"]
    # Same task, same seed, same sample.
    again = run_sweep([t], max_workers=0, progress=False).iloc[0]
    assert again["mc_total_mean"] == r["mc_total_mean"]


def test_local_processes_and_dask_give_identical_frames():
    distributed = pytest.importorskip("distributed")
    tasks = grid().expand()[:120]
    assert len(tasks) >= 100
    # plus one group of shared fits (three eps, one selection), which Dask runs as one function call
    tasks += [Task(**{**t.key_fields(), "index": 120 + i}) for i, t in enumerate(_shared_tasks("om", "wtau:6x12:tau=0.4:seed=2"))]
    local = run_sweep(tasks, max_workers=2, progress=False)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        # By address, as `dpopt sweep --scheduler` does (the sweep opens and closes its own client).
        remote = run_sweep(list(reversed(tasks)), scheduler=cluster.scheduler_address, progress=False)
    assert len(local) == 123 and local["status"].iloc[:120].eq("optimal").all()
    pd.testing.assert_frame_equal(comparable(local), comparable(remote))
    assert list(local["index"]) == list(range(123))
    assert sorted(remote["selection_reused"].iloc[120:]) == [False, True, True]


def test_cache_resumes_without_recomputing(tmp_path, monkeypatch):
    tasks = grid().expand()[:40]
    calls: list[str] = []
    real = ex.run_task

    def counting(task: Task) -> dict:
        calls.append(task.task_hash)
        return real(task)

    monkeypatch.setattr(ex, "run_task", counting)
    cache = tmp_path / "cache"
    first = run_sweep(tasks[:15], max_workers=0, cache=cache, progress=False)  # the "interrupted" run
    assert len(calls) == 15 and len(list(cache.glob("*.json"))) == 15
    full = run_sweep(tasks, max_workers=0, cache=cache, progress=False)
    assert len(calls) == 40  # only the 25 missing tasks ran
    # Cached rows carry the first run's timings: proof they were read back, not recomputed.
    assert full["task_seconds"].iloc[:15].tolist() == first["task_seconds"].tolist()
    fresh = run_sweep(tasks, max_workers=0, progress=False)
    pd.testing.assert_frame_equal(comparable(full), comparable(fresh))
    # A third run reads everything from the cache.
    run_sweep(tasks, max_workers=0, cache=cache, progress=False)
    assert len(calls) == 40 + 40  # `fresh` had no cache


def test_cache_ignores_corrupt_files_and_retries_errors(tmp_path):
    t = Task(workload="prefix:8", mechanism="identity", epsilon=1.0)
    store = ex.ResultCache(tmp_path)
    store.path(t).write_text("{not json")
    assert store.get(t) is None
    assert not ex.cacheable({"status": "error: boom"}) and ex.cacheable({"status": "skipped: no"})
    run_sweep([t], max_workers=0, cache=tmp_path, progress=False)
    assert store.get(t)["status"] == "optimal"


def test_config_files_and_validation(tmp_path):
    toml = tmp_path / "s.toml"
    toml.write_text(
        'workloads = ["prefix:{n}"]\nmechanisms = ["identity"]\nepsilon = [1.0]\n[sizes]\nn = [4, 8]\n'
    )
    assert len(load_config(toml).expand()) == 2
    js = tmp_path / "s.json"
    js.write_text(json.dumps(GRID))
    assert len(load_config(js).expand()) == 240
    with pytest.raises(SweepError, match="unknown config keys"):
        SweepConfig.from_mapping({**GRID, "epsilons": [1.0]})
    with pytest.raises(SweepError, match="does not give"):
        SweepConfig.from_mapping({"workloads": ["wrange:{m}x{n}"], "mechanisms": ["identity"], "sizes": {"n": [4]}})
    with pytest.raises(ValueError, match="epsilon"):
        SweepConfig.from_mapping({**GRID, "epsilon": [0.0]})
    with pytest.raises(SweepError, match="monte_carlo_trials"):
        SweepConfig.from_mapping({**GRID, "monte_carlo_trials": 1})


def test_sweep_command(tmp_path, capsys):
    cfg = tmp_path / "s.toml"
    cfg.write_text('name = "cli"\nworkloads = ["prefix:{n}", "allrange:{n}"]\n'
                   'mechanisms = ["identity", "wavelet"]\nepsilon = [1.0]\n[sizes]\nn = [8]\n')
    out = tmp_path / "r.csv"
    png = tmp_path / "r.png"
    code = main(["sweep", str(cfg), "--workers", "0", "--out", str(out), "--cache", str(tmp_path / "c"),
                 "--plot", str(png), "--no-progress"])
    assert code == 0
    df = pd.read_csv(out)
    assert len(df) == 4 and set(df["mechanism"]) == {"identity", "wavelet"}
    assert png.stat().st_size > 1000
    assert "4 tasks (optimal: 4)" in capsys.readouterr().out
    assert main(["sweep", str(tmp_path / "missing.toml")]) == 2
    bad = tmp_path / "bad.toml"
    bad.write_text('workloads = ["prefix:8"]\nmechanisms = []\n')
    assert main(["sweep", str(bad)]) == 2


# -- fits shared across eps ----------------------------------------------------------------------------

EPS3 = (0.5, 1.0, 2.0)


def _shared_tasks(mechanism: str, workload: str, shared: bool = True) -> list[Task]:
    return [Task(workload=workload, mechanism=mechanism, epsilon=e, shared_fit=shared, index=i)
            for i, e in enumerate(EPS3)]


def test_unshared_tasks_keep_their_hash_and_seed():
    t = Task(workload="prefix:8", mechanism="identity", epsilon=1.0)
    assert t.task_hash == "8057e398fa1b7398b4c34d39"  # as pinned above: caches stay valid
    s = Task(workload="prefix:8", mechanism="identity", epsilon=1.0, shared_fit=True)
    assert s.task_hash != t.task_hash and s.row()["shared_fit"] is True
    # Unshared: the mechanism seed comes from the task (so from eps); shared: not from eps, delta or calibration.
    assert t.mechanism_seed != Task(workload="prefix:8", mechanism="identity", epsilon=2.0).mechanism_seed
    others = [Task(workload="prefix:8", mechanism="identity", epsilon=e, delta=d, shared_fit=True)
              for e, d in ((2.0, 0.0), (1.0, 1e-6))]
    assert {s.mechanism_seed} == {o.mechanism_seed for o in others}
    assert {s.fit_key} == {o.fit_key for o in others}
    assert s.mechanism_seed != Task(workload="prefix:8", mechanism="identity", epsilon=1.0, shared_fit=True,
                                    repetition=1).mechanism_seed
    # ... while the Monte Carlo stream stays the task's own.
    assert not np.array_equal(s.monte_carlo_seed.generate_state(2), others[0].monte_carlo_seed.generate_state(2))


@pytest.mark.parametrize("mechanism,workload", [("lrm", "wrange:6x12:seed=3"), ("om", "wtau:6x12:tau=0.4:seed=2"),
                                                ("mm-appendix-b", "prefix:12")])
def test_shared_fits_select_once_and_equal_separate_fits(mechanism, workload, monkeypatch):
    from dpopt.mechanisms.registry import _load

    cls = _load(mechanism)
    calls: list[int] = []
    real = cls._select

    def counting(self, w, p):  # noqa: ANN001, ANN202
        calls.append(1)
        return real(self, w, p)

    monkeypatch.setattr(cls, "_select", counting)
    tasks = _shared_tasks(mechanism, workload)
    df = run_sweep(tasks, max_workers=0, progress=False)
    assert len(calls) == 1, "one selection serves the three eps"
    assert df["status"].nunique() == 1 and not df.loc[0, "status"].startswith(("skipped", "error")), df["status"].tolist()
    assert sorted(df["selection_reused"]) == [False, True, True]
    # Pure DP: every error is the eps = 1 error times 1/eps^2 (the same strategy; only the variance factor
    # 2/eps^2 differs, a few ulps); the fit record is the shared one.
    base = df.loc[1, "expected_total_error"]
    for i, e in enumerate(EPS3):
        assert df.loc[i, "expected_total_error"] == pytest.approx(base / e**2, rel=1e-12)
    assert df["iterations"].nunique() == 1 and df["fit_cpu_seconds"].nunique() == 1
    # The same tasks run one by one (no sharing possible) give the same rows: the same deterministic
    # computations (seeded) in one process, so compared exactly.
    alone = pd.concat([run_sweep([t], max_workers=0, progress=False) for t in tasks], ignore_index=True)
    assert len(calls) == 4
    cols = ["expected_total_error", "sensitivity", "bound", "strategy_rows", "status"]
    pd.testing.assert_frame_equal(df[cols], alone[cols], check_exact=True)


def test_shared_groups_run_together_in_worker_processes():
    tasks = [*_shared_tasks("om", "wtau:6x12:tau=0.4:seed=2"), *_shared_tasks("om", "wtau:6x12:tau=0.8:seed=2")]
    tasks = [Task(**{**t.key_fields(), "index": i}) for i, t in enumerate(tasks)]
    assert len(ex._groups(tasks)) == 2
    df = run_sweep(tasks, max_workers=2, progress=False)
    assert sorted(df["selection_reused"]) == [False] * 2 + [True] * 4
    serial = run_sweep(tasks, max_workers=0, progress=False)
    pd.testing.assert_frame_equal(comparable(df), comparable(serial))


def test_shared_fits_option_in_configs():
    cfg = SweepConfig.from_mapping({**GRID, "shared_fits": True})
    tasks = cfg.expand()
    assert all(t.shared_fit for t in tasks)
    # eps x delta of one point, mechanism setting and repetition form one group: 240 tasks / 4.
    assert len(ex._groups(tasks)) == 60
    assert not any(t.shared_fit for t in grid().expand())
    with pytest.raises(SweepError, match="shared_fits"):
        SweepConfig.from_mapping({**GRID, "shared_fits": "yes"})


@pytest.mark.parametrize("name", [m for m in __import__("dpopt.mechanisms.registry", fromlist=["x"]).MECHANISMS
                                  if m != "hdmm"])
def test_every_mechanism_selects_the_same_strategy_at_every_eps(name):
    """What sharing rests on: _select reads privacy only through is_pure and the norm (hdmm has its own fit)."""
    from dpopt.mechanisms.base import MechanismError
    from dpopt.mechanisms.registry import make_mechanism
    from dpopt.privacy import Privacy
    from dpopt.specs import parse_workload

    w = parse_workload("wrange:6x16:seed=3")
    for a, b in ((Privacy(0.5), Privacy(2.0)), (Privacy(0.5, 1e-6), Privacy(2.0, 1e-9))):
        kw = {"seed": 7} if name in ("lrm", "om") else {}
        try:
            sa = make_mechanism(name, **kw)._select(w, a)
        except MechanismError:
            with pytest.raises(MechanismError):
                make_mechanism(name, **kw)._select(w, b)
            continue
        sb = make_mechanism(name, **kw)._select(w, b)
        np.testing.assert_array_equal(_dense(sa.strategy.A), _dense(sb.strategy.A))


def _dense(A: object) -> np.ndarray:
    return A.toarray() if hasattr(A, "toarray") else np.asarray(A)


def test_data_too_small_for_n_skips_before_fitting(tmp_path, monkeypatch):
    from dpopt.mechanisms.baselines import WaveletMechanism

    path = tmp_path / "x.npy"
    np.save(path, np.arange(8.0))
    monkeypatch.setattr(WaveletMechanism, "_select", lambda *a: pytest.fail("fitted before checking the data"))
    t = Task(workload="prefix:16", mechanism="wavelet", epsilon=1.0, data=f"npy:{path}")
    df = run_sweep([t], max_workers=0, progress=False)
    assert df.loc[0, "status"].startswith("skipped") and "8 cells, fewer than the workload's n = 16" in df.loc[0, "status"]
    # with enough cells the data is merged into n bins and the bias column is filled
    ok = run_sweep([Task(workload="prefix:4", mechanism="identity", epsilon=1.0, data=f"npy:{path}")],
                   max_workers=0, progress=False)
    assert ok.loc[0, "status"] == "optimal" and ok.loc[0, "bias_sq"] == 0.0
