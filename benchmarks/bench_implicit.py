"""Implicit workloads at scale: time and peak memory of strategy selection, exact error and release.

Cases (each run in its own subprocess so peak memory is that run's resource.getrusage maxrss, BLAS limited
to one thread, address space capped at 8 GB):
- adult-2way / adult-3way: all 2-way / 3-way marginals over the UCI Adult domain (14 attributes, 6.4e17
  cells) under (eps, delta) = (1, 1e-6) (ResidualPlanner, optimal) and eps = 1 (HDMM marginal template);
  selection, exact expected error, and a release on the real table from per-subset bincounts;
- allrange256^2: AllRange(256) x AllRange(256) (65,536 cells, 1.08e9 queries) under (eps, delta)
  (certified per-factor optimum) and eps-DP (Kronecker p-Identity, HDMM's README example);
- table2-64x32: Li and Miklau's ALLRANGE(64, 32) row (identity/hierarchical/wavelet ratios) through the
  implicit path and through the dense path, side by side.
Then, per optimiser, a ladder of growing domains until the next step is predicted (from the growth of
the last two steps) to exceed the time budget (default 600 s) or a step fails or exceeds 8 GB.

Errors are total expected squared error (Laplace variance 2 b^2, b = sens1/eps; Gaussian classic
sigma = sens2 sqrt(2 ln(2/delta))/eps); `hdmm_rmse` is HDMM's convention sqrt(sens^2 ||W A^+||_F^2 / m).
Each case reports medians over --repeats runs.

    .venv/bin/python -m benchmarks.bench_implicit [--quick] [--repeats 3] [--budget 600]

writes benchmarks/results/implicit.csv and benchmarks/results/implicit.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

RESULTS = Path(__file__).resolve().parent / "results"
DATA = Path("../shared/data")
MEMORY_CAP = 8 * 1024**3
HDMM_README = {"allrange256": 5.736437154199246, "allrange256^2": 32.692354993620214}
TABLE2_64x32 = {"svdb": 2.261e7, "identity": 12.11, "hierarchical": 2.996, "wavelet": 1.899}


# -- cases (run inside the child process) ---------------------------------------------------------------
def _timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - t0, time.process_time() - c0


def _privacy(noise: str) -> Any:
    from dpopt.privacy import Privacy

    return Privacy(1.0) if noise == "laplace" else Privacy(1.0, 1e-6)


def case_adult(k: int, noise: str) -> dict[str, Any]:
    from dpopt.data import Domain, records
    from dpopt.experiments import research_answers
    from dpopt.hdmm import hdmm_rmse, select_strategy
    from dpopt.specs import parse_workload

    priv = _privacy(noise)
    domain, csv = DATA / "adult" / "adult-domain.json", DATA / "adult" / "adult.csv"
    w = parse_workload(f"marginals:{domain}:{k}")
    sel, wall, cpu = _timed(lambda: select_strategy(w, priv))
    df, read_wall, _ = _timed(lambda: pd.read_csv(csv))
    tables = records(df, Domain.from_json(domain))[0].table
    (_, rel), rel_wall, rel_cpu = _timed(lambda: research_answers(sel.strategy, w, tables, priv,
                                                                  np.random.default_rng(0)))
    return {
        "log10_cells": math.log10(w.n), "queries": w.m, "strategy": sel.solver, "status": sel.status,
        "expected_total_error": sel.error.total, "rmse": sel.error.rmse, "hdmm_rmse": hdmm_rmse(sel, priv),
        "bound": sel.bound, "ratio_to_bound": sel.error.total / sel.bound,
        "select_wall_s": wall, "select_cpu_s": cpu, "release_wall_s": rel_wall + read_wall,
        "release_cpu_s": rel_cpu, "realised_over_expected": rel["realised_total_sq_error"] / sel.error.total,
    }


def case_kron_allrange(n: int, d: int, noise: str) -> dict[str, Any]:
    from dpopt.hdmm import hdmm_rmse, select_strategy
    from dpopt.workloads import AllRange, Kron

    priv = _privacy(noise)
    w = Kron([AllRange(n)] * d)
    sel, wall, cpu = _timed(lambda: select_strategy(w, priv))
    out = {
        "log10_cells": math.log10(w.n), "queries": w.m, "strategy": sel.solver, "status": sel.status,
        "expected_total_error": sel.error.total, "rmse": sel.error.rmse, "hdmm_rmse": hdmm_rmse(sel, priv),
        "bound": sel.bound, "ratio_to_bound": sel.error.total / sel.bound,
        "select_wall_s": wall, "select_cpu_s": cpu,
    }
    key = f"allrange{n}" + ("" if d == 1 else f"^{d}")
    if noise == "laplace" and key in HDMM_README:
        out["reference"] = HDMM_README[key]
        out["ratio_to_reference"] = out["hdmm_rmse"] / HDMM_README[key]
    return out


def case_table2(path: str) -> dict[str, Any]:
    from dpopt.baselines import (
        hierarchical_strategy,
        identity_strategy,
        kron_strategy,
        wavelet_strategy,
    )
    from dpopt.bounds import svd_bound
    from dpopt.error import unit_error
    from dpopt.kron_strategy import KronMatrix
    from dpopt.strategy import Strategy
    from dpopt.workloads import AllRange, Kron, all_range_nd

    makers = {"identity": identity_strategy, "hierarchical": hierarchical_strategy, "wavelet": wavelet_strategy}

    def run() -> dict[str, float]:
        res = {}
        if path == "implicit":
            w = Kron([AllRange(64), AllRange(32)])
            b = w.svd_bound()
            for name, mk in makers.items():
                S = Strategy(KronMatrix([mk(64), mk(32)]))
                res[name] = S.sens2**2 * S.unit_error(w) / b
        else:
            w = all_range_nd([64, 32])
            b = svd_bound(w)
            for name, mk in makers.items():
                D = kron_strategy([mk(64), mk(32)])
                res[name] = D.sens2**2 * unit_error(D, w) / b
        res["svdb"] = b
        return res

    res, wall, cpu = _timed(run)
    return {"log10_cells": math.log10(2048), "queries": 2080 * 528, "select_wall_s": wall, "select_cpu_s": cpu,
            "strategy": f"{path} path", "status": "ok", "bound": res["svdb"],
            "ratio_to_reference": max(abs(res[k] / v - 1) for k, v in TABLE2_64x32.items()) + 1,
            **{f"ratio_{k}": v for k, v in res.items() if k != "svdb"}}


def case_ladder(optimiser: str, size: int) -> dict[str, Any]:
    """One ladder step: `size` is the factor size (Kronecker) or the number of attributes (marginals)."""
    from dpopt.hdmm import select_strategy
    from dpopt.workloads import AllRange, Kron, Marginals

    if optimiser in ("kron-gaussian", "kron-laplace"):
        w: Any = Kron([AllRange(size), AllRange(size)])
        priv = _privacy("gaussian" if optimiser == "kron-gaussian" else "laplace")
        opts: dict[str, Any] = {}
    else:
        w = Marginals([10] * size, k=3)
        priv = _privacy("gaussian" if optimiser == "marginals-gaussian" else "laplace")
        opts = {"restarts": 1} if optimiser == "marginals-laplace" else {}
    sel, wall, cpu = _timed(lambda: select_strategy(w, priv, **opts))
    return {"log10_cells": math.log10(w.n), "queries": w.m, "strategy": sel.solver, "status": sel.status,
            "expected_total_error": sel.error.total, "rmse": sel.error.rmse, "bound": sel.bound,
            "ratio_to_bound": sel.error.total / sel.bound, "select_wall_s": wall, "select_cpu_s": cpu}


def child(spec: str) -> None:
    """Run one case (JSON args) and print its record with the peak resident memory."""
    from threadpoolctl import threadpool_limits

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))
    args = json.loads(spec)
    fn = {"adult": case_adult, "kron": case_kron_allrange, "table2": case_table2, "ladder": case_ladder}[
        args.pop("case")
    ]
    with threadpool_limits(1):
        out = fn(**args)
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps(out))


# -- parent: subprocesses, medians, tables ----------------------------------------------------------------
def run_child(args: dict[str, Any], timeout: float) -> dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.bench_implicit", "--child", json.dumps(args)],
            capture_output=True, text=True, timeout=timeout, env=env,
        )
    except subprocess.TimeoutExpired:
        return {"status": f"timeout > {timeout:.0f} s", "total_wall_s": time.perf_counter() - t0}
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"status": f"failed: {last[:120]}", "total_wall_s": wall}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["total_wall_s"] = wall
    return out


def median_record(args: dict[str, Any], repeats: int, timeout: float) -> dict[str, Any]:
    runs = [run_child(args, timeout) for _ in range(repeats)]
    ok = [r for r in runs if "select_wall_s" in r]
    if not ok:
        return runs[0]
    rec = dict(ok[0])
    for key in ("select_wall_s", "select_cpu_s", "release_wall_s", "release_cpu_s", "total_wall_s", "peak_rss_mb"):
        vals = [r[key] for r in ok if key in r]
        if vals:
            rec[key] = float(np.median(vals))
    rec["runs"] = len(ok)
    return rec


def ladder(optimiser: str, sizes: list[int], budget: float) -> list[dict[str, Any]]:
    """Grow the domain until a step fails, exceeds the budget, or is predicted to exceed it."""
    rows: list[dict[str, Any]] = []
    for size in sizes:
        if len(rows) >= 2 and all("select_wall_s" in r for r in rows[-2:]):
            t1, t2 = rows[-2]["select_wall_s"], rows[-1]["select_wall_s"]
            predicted = t2 * max(t2 / max(t1, 1e-3), 1.0)
            if predicted > budget:
                rows.append({"size": size, "status": f"skipped: predicted {predicted:.0f} s > budget"})
                break
        rec = run_child({"case": "ladder", "optimiser": optimiser, "size": size}, timeout=budget)
        rec["size"] = size
        rows.append(rec)
        print(f"  {optimiser} size {size}: {rec.get('status')} {rec.get('total_wall_s', 0):.1f} s", flush=True)
        if "select_wall_s" not in rec:
            break
    for r in rows:
        r["case"] = f"ladder:{optimiser}"
        r["privacy"] = "eps=1" if "laplace" in optimiser else "eps=1,delta=1e-6"
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one run each, 60 s budget")
    parser.add_argument("--repeats", type=int, default=3, help="runs per case (median reported)")
    parser.add_argument("--budget", type=float, default=600.0, help="seconds per ladder step")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    repeats = 1 if args.quick else args.repeats
    budget = min(args.budget, 60.0) if args.quick else args.budget
    have_adult = (DATA / "adult" / "adult.csv").is_file()
    cases: list[tuple[str, str, dict[str, Any]]] = []
    for k in ((2,) if args.quick else (2, 3)):
        for noise in ("gaussian", "laplace"):
            if have_adult:
                cases.append((f"adult-{k}way", noise, {"case": "adult", "k": k, "noise": noise}))
    n = 64 if args.quick else 256
    for noise in ("gaussian", "laplace"):
        cases.append((f"allrange{n}", noise, {"case": "kron", "n": n, "d": 1, "noise": noise}))
        cases.append((f"allrange{n}^2", noise, {"case": "kron", "n": n, "d": 2, "noise": noise}))
    if not args.quick:
        cases.append(("table2-64x32", "gaussian", {"case": "table2", "path": "implicit"}))
        cases.append(("table2-64x32", "gaussian", {"case": "table2", "path": "dense"}))
    rows = []
    for name, noise, spec in cases:
        print(f"{name} ({noise}) ...", flush=True)
        rec = median_record(spec, repeats, timeout=max(budget, 600.0))
        rec["case"], rec["privacy"] = name, "eps=1" if noise == "laplace" else "eps=1,delta=1e-6"
        rows.append(rec)
    ladders = {
        "kron-gaussian": [64, 128, 256, 512, 1024, 2048, 4096, 8192],
        "kron-laplace": [64, 128, 256, 512, 1024, 2048],
        "marginals-gaussian": [10, 20, 40, 80, 160, 320, 640],
        "marginals-laplace": [10, 20, 40, 80, 160, 320],
    }
    for opt, sizes in ladders.items():
        rows.extend(ladder(opt, sizes[:3] if args.quick else sizes, budget))
    df = pd.DataFrame(rows)
    cols = ["case", "privacy", "size", "log10_cells", "queries", "strategy", "status", "expected_total_error",
            "rmse", "hdmm_rmse", "reference", "ratio_to_reference", "bound", "ratio_to_bound",
            "realised_over_expected", "select_wall_s", "select_cpu_s", "release_wall_s", "total_wall_s",
            "peak_rss_mb", "ratio_identity", "ratio_hierarchical", "ratio_wavelet", "runs"]
    df = df[[c for c in cols if c in df.columns]]
    t2 = df[df["case"] == "table2-64x32"]
    if len(t2) == 2:
        dense_s = float(t2[t2["strategy"] == "dense path"]["select_wall_s"].iloc[0])
        imp_s = float(t2[t2["strategy"] == "implicit path"]["select_wall_s"].iloc[0])
        print(f"table 2 (64,32): dense / implicit time = {dense_s / imp_s:.1f}x")
    RESULTS.mkdir(exist_ok=True)
    suffix = ".quick" if args.quick else ""
    df.to_csv(RESULTS / f"implicit{suffix}.csv", index=False)
    with open(RESULTS / f"implicit{suffix}.md", "w") as fh:
        fh.write(f"# Implicit workloads at scale{' (quick)' if args.quick else ''}\n\n")
        fh.write(f"Medians of {repeats} run(s); one BLAS thread; 8 GB address-space cap; ladder budget "
                 f"{budget:.0f} s per step. `python -m benchmarks.bench_implicit{' --quick' if args.quick else ''}`\n\n")
        fh.write(df.to_markdown(index=False, floatfmt=".4g") if _has_tabulate() else df.to_string(index=False))
        fh.write("\n")
    print(df.to_string(index=False, float_format=lambda v: f"{v:.4g}"))


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()
