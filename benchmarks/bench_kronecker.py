"""mm-optimal on a Kronecker workload: per factor (the product of the factors' optima) against one dense solve.

On W = W_1 (x) W_2 the (eps, delta) optimum is the product of the factors' optima (Mechanism._fit_per_factor);
the dense path solves the same problem over all n_1 n_2 cells from the Gram. Both run side by side in this
process with one BLAS thread; seconds are medians of --runs fits (CPU by time.process_time, wall by
time.perf_counter), the CPU ratio is dense over per factor, and the two optima are compared within their
certified gaps.

    .venv/bin/python -m benchmarks.bench_kronecker [--specs kron:allrange:64,allrange:32] [--runs 3] [--quick]

writes benchmarks/results/kronecker.csv and benchmarks/results/kronecker.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import pandas as pd
from threadpoolctl import threadpool_limits

from dpopt.mechanisms import make_mechanism
from dpopt.privacy import Privacy
from dpopt.specs import parse_workload
from dpopt.workloads import GramWorkload

RESULTS = Path(__file__).resolve().parent / "results"


def fit_times(workload, privacy: Privacy, runs: int):
    """The last fitted mm-optimal and the median wall and CPU seconds of `runs` fits."""
    walls, cpus, mech = [], [], None
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        mech = make_mechanism("mm-optimal").fit(workload, privacy)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return mech, statistics.median(walls), statistics.median(cpus)


def run(spec: str, privacy: Privacy, runs: int) -> dict:
    """One row: per-factor and dense mm-optimal on `spec`, their errors, gaps and median seconds."""
    w = parse_workload(spec)
    fac, fac_wall, fac_cpu = fit_times(w, privacy, runs)
    dense_w = GramWorkload(w.gram(), name=f"dense {w.name}", m=w.m)
    dense, dense_wall, dense_cpu = fit_times(dense_w, privacy, runs)
    e_f, e_d = fac.expected_error_.total, dense.expected_error_.total
    return {
        "workload": spec, "cells": w.n, "runs": runs,
        "factor_error": e_f, "factor_gap": fac.fit_info_.gap, "factor_wall_s": fac_wall, "factor_cpu_s": fac_cpu,
        "dense_error": e_d, "dense_gap": dense.fit_info_.gap, "dense_wall_s": dense_wall, "dense_cpu_s": dense_cpu,
        "cpu_ratio_dense_over_factor": dense_cpu / fac_cpu, "rel_diff": e_f / e_d - 1.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--specs", default=None,
                    help="Kronecker workload specs separated by ';' (default "
                         "kron:allrange:64,allrange:32;kron:prefix:32,allrange:32; --quick kron:allrange:16,allrange:8)")
    ap.add_argument("--runs", type=int, default=None, help="fits per row, the median reported (default 3, --quick 1)")
    ap.add_argument("--quick", action="store_true", help="one small workload, one fit (seconds; what `make bench` runs)")
    args = ap.parse_args()
    if args.specs is None:
        args.specs = ("kron:allrange:16,allrange:8" if args.quick
                      else "kron:allrange:64,allrange:32;kron:prefix:32,allrange:32")
    if args.runs is None:
        args.runs = 1 if args.quick else 3
    privacy = Privacy(1.0, 1e-6)
    rows = []
    with threadpool_limits(limits=1, user_api="blas"):
        for spec in args.specs.split(";"):
            rows.append(run(spec, privacy, args.runs))
            print(rows[-1], flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    df = pd.DataFrame(rows)
    df.to_csv(RESULTS / "kronecker.csv", index=False)
    with open(RESULTS / "kronecker.md", "w") as f:
        f.write("# mm-optimal per factor against one dense solve (benchmarks/bench_kronecker.py)\n\n")
        f.write(f"(eps, delta) = (1, 1e-6); one BLAS thread; seconds are medians of {args.runs} fits side by side; "
                "gaps are the certified relative gaps (per factor: 1 - prod(1 - gap_i)).\n\n")
        f.write(df.to_markdown(index=False, floatfmt=".4g") + "\n")


if __name__ == "__main__":
    main()
