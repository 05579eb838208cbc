"""eps-DP hdmm against HDMM's OPT_0, side by side: the CPU hdmm needs to reach OPT_0's value, and where its budget ends.

For each workload (AllRange, Prefix, Width32 = WidthK(n, 32)) and size n, --repeats times with different seeds, each
run in its own child process at one BLAS thread (so its peak memory is its own):

- OPT_0: HDMM's OPT_0 as its authors run it (McKenna et al. 2018, Sec. 5, and their templates): p = n / 16, five
  L-BFGS-B runs from Theta uniform on [0, 1] with bounds Theta >= 0 and relative-decrease test 1e-4, the best
  kept (`optimize_pidentity(..., ftol=HDMM_FTOL)`, seeds 1000 + r), the Gram products dense as HDMM forms them;
- OPT_0 structured: the same runs with hdmm's Gram products through the workload's prefix sums
  (`Workload.gram_matvec`), which separates what the algebra saves from what the schedule does;
- hdmm: `laplace_factor` as `dpopt compare` runs it on a 1-D workload (the baselines scored first, then
  `search_pidentity`: OPT_0's restarts, polishing and further rounds until the deadline), seed r, with the
  compare default of --budget seconds of wall time.

Columns: OPT_0's value (trace(G (A^T A)^{-1}) at sens1 = 1, as the optimiser evaluated it) and CPU seconds; hdmm's
CPU seconds from its start to its first iterate at or below that value (`reach_cpu_s`, its baselines' scoring
included; inf when it never got there), `reach_ratio` = that / OPT_0's CPU; hdmm's final unit error after its budget
(`hdmm_error`, by Cholesky) over OPT_0's (`error_ratio`) and its CPU over OPT_0's (`cpu_ratio`). The markdown table
gives the medians over the repeats; the CSV every run, with wall seconds and peak RSS.

    .venv/bin/python -m benchmarks.bench_hdmm_opt0 [--sizes 256,1024,2048] [--repeats 3] [--budget 60] [--append]

writes benchmarks/results/hdmm_opt0.csv and benchmarks/results/hdmm_opt0.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.child import checkout_commit, run_module
from benchmarks.tables import pipe_table

RESULTS = Path(__file__).resolve().parent / "results"
WORKLOADS = ("all-range", "prefix", "width32")
OPT0_SEED = 1000


def make(name: str, n: int):
    """The workload of a row."""
    from dpopt.workloads import AllRange, Prefix, WidthK

    return {"all-range": AllRange, "prefix": Prefix, "width32": lambda k: WidthK(k, 32)}[name](n)


def one(name: str, n: int, rep: int, budget: float) -> dict:
    """One repeat, in this process: OPT_0 dense, OPT_0 structured, then hdmm's factor with its budget."""
    from threadpoolctl import threadpool_limits

    from dpopt.hdmm import default_p, laplace_factor
    from dpopt.solvers.pidentity import HDMM_FTOL, OPT0_RESTARTS, optimize_pidentity

    W = make(name, n)
    G = W.gram()
    p = default_p(n)
    with threadpool_limits(1):
        opt0 = optimize_pidentity(G, p, restarts=OPT0_RESTARTS, seed=OPT0_SEED + rep, ftol=HDMM_FTOL)
        fast = optimize_pidentity(G, p, restarts=OPT0_RESTARTS, seed=OPT0_SEED + rep, ftol=HDMM_FTOL,
                                  gram_matvec=W.gram_matvec)
        t0, c0 = time.perf_counter(), time.process_time()
        _, res = laplace_factor(G, seed=rep, deadline=t0 + budget, gram_matvec=W.gram_matvec)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    value = min(opt0.extra["losses"])  # as the optimiser saw it, the same form as hdmm's history
    offset = res.extra["scoring_cpu_seconds"]
    reach = next((offset + t for t, v, _ in res.extra["history"] if v <= value), math.inf)
    hdmm_error = res.extra["candidates"][res.extra["kept"]]
    return {
        "workload": name, "n": n, "p": p, "repeat": rep,
        "opt0_value": value, "opt0_error": opt0.fun, "opt0_cpu_s": opt0.cpu_seconds, "opt0_wall_s": opt0.wall_seconds,
        "opt0_structured_value": min(fast.extra["losses"]), "opt0_structured_cpu_s": fast.cpu_seconds,
        "reach_cpu_s": reach, "reach_ratio": reach / opt0.cpu_seconds,
        "reach_ratio_structured": reach / fast.cpu_seconds,
        "hdmm_opt0_value": res.extra["opt0"], "hdmm_error": hdmm_error, "error_ratio": hdmm_error / opt0.fun,
        "hdmm_kept": res.extra["kept"], "hdmm_rounds": res.extra["rounds"], "hdmm_status": res.status,
        "hdmm_cpu_s": cpu, "hdmm_wall_s": wall, "cpu_ratio": cpu / opt0.cpu_seconds, "budget_s": budget,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
    }


def load_average() -> str:
    """The 1-minute load average now (the machine's other work while the rows ran)."""
    return f"{os.getloadavg()[0]:.1f}"


def write(rows: list[dict], args: argparse.Namespace) -> None:
    """The CSV (every run) and the markdown table (medians over the repeats of each row)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    df = pd.DataFrame(rows)
    df.to_csv(RESULTS / f"{args.out}.csv", index=False)
    keys = ["workload", "n"]
    num = ["opt0_value", "opt0_cpu_s", "opt0_structured_cpu_s", "reach_cpu_s", "reach_ratio", "reach_ratio_structured",
           "hdmm_error", "error_ratio", "hdmm_cpu_s", "cpu_ratio", "peak_rss_mb", "load"]
    med = df.groupby(keys, sort=False)[num].median().reset_index()
    med["repeats"] = df.groupby(keys, sort=False).size().to_numpy()
    med["reached"] = df.assign(ok=df["reach_ratio"] <= 1.0).groupby(keys, sort=False)["ok"].sum().to_numpy()
    with open(RESULTS / f"{args.out}.md", "w") as f:
        f.write("# eps-DP hdmm against HDMM's OPT_0 (benchmarks/bench_hdmm_opt0.py)\n\n")
        f.write(f"At commit {checkout_commit()}. ")
        f.write(
            "OPT_0: p = n/16, five L-BFGS-B restarts from Theta uniform on [0, 1], relative-decrease test 1e-4, dense "
            "Gram products (HDMM's own); OPT_0 structured: the same runs through the workload's prefix sums. hdmm: "
            f"`laplace_factor` as `dpopt compare` runs it, budget {args.budget:g} s wall. reach: CPU seconds from hdmm's "
            "start to its first iterate at or below OPT_0's value; `reached` counts the repeats where that took no "
            "more CPU than OPT_0. Errors are unit errors trace(G (A^T A)^{-1}) at sens1 = 1. Medians of the repeats "
            "(each in its own process, one BLAS thread; seeds differ per repeat); `load` is the 1-minute load "
            "average when the row ended (the machine has two cores).\n\n")
        f.write(pipe_table(med, keys + ["repeats", "reached"] + num) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="256,1024,2048")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budget", type=float, default=60.0, help="hdmm's wall seconds (compare's default time limit)")
    ap.add_argument("--child-budget", type=float, default=3600.0, help="wall seconds before a repeat's process is killed")
    ap.add_argument("--quick", action="store_true", help="n = 64, Prefix, one repeat, a 5 s budget")
    ap.add_argument("--append", action="store_true", help="keep the rows already in results/OUT.csv")
    ap.add_argument("--out", default="hdmm_opt0")
    ap.add_argument("--one", nargs=3, metavar=("WORKLOAD", "N", "REPEAT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]), int(args.one[2]), args.budget)))
        return
    if args.quick:
        args.sizes, args.workloads, args.repeats, args.budget = "64", "prefix", 1, 5.0
    rows: list[dict] = []
    if args.append and (RESULTS / f"{args.out}.csv").exists():
        rows = pd.read_csv(RESULTS / f"{args.out}.csv").to_dict("records")
    failed = 0
    for n in (int(s) for s in args.sizes.split(",")):
        for name in args.workloads.split(","):
            for rep in range(args.repeats):
                run = run_module("benchmarks.bench_hdmm_opt0",
                                 ["--one", name, str(n), str(rep), "--budget", str(args.budget)], args.child_budget)
                if run.returncode != 0:
                    failed += 1
                    print(f"{name} n={n} repeat {rep}: failed ({run.last_error_line()})", flush=True)
                    continue
                row = json.loads(run.stdout.strip().splitlines()[-1])
                row["load"] = float(load_average())
                rows.append(row)
                print(f"{name} n={n} repeat {rep}: OPT_0 {row['opt0_value']:.6g} in {row['opt0_cpu_s']:.2f} CPU s; "
                      f"hdmm reached it at {row['reach_cpu_s']:.2f} s (ratio {row['reach_ratio']:.2f}), ended at "
                      f"{row['error_ratio']:.4f} x OPT_0 after {row['hdmm_cpu_s']:.1f} CPU s; load {row['load']}",
                      flush=True)
                write(rows, args)
    if not rows or failed:
        sys.exit(1)
    if not np.isfinite(pd.DataFrame(rows)["hdmm_error"]).all():
        sys.exit(1)


if __name__ == "__main__":
    main()
