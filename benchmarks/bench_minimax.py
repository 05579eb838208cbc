"""Certified minimax per-query variance (`dpopt.solvers.minimax`) against the sum optimum and the conic model.

Part 1: `solve_minimax` (unit targets) on AllRange, Prefix, Width32 (WidthK(n, 32), rank n - 31), a
random WRange(n / 4, n) (seed 0) and all 2-way marginals of a 4-attribute domain with n cells
(`marginal_domain`), at certified relative gap --tol for n <= 256 and --tol-large above. Each run gets
a wall-clock budget (--budget seconds, --budget-large above n = 256); a run that reaches it stops with
status time_limit and reports the certified gap it reached. Wall and CPU seconds are medians of --runs runs (3 by default; 1 run
when the budget ran out: repeating it would only repeat the budget). Beside it, the sum-optimal
strategy (`solve_convex_dp`, gap 1e-10) and what each pays under unit noise (P = 1): the largest
per-query standard deviation sqrt(max_i Var_i) and the total squared error sum_i Var_i.

Part 2: the conic minimax model (`formulations.minimax`, SCS at eps --scs-tol, limit --scs-limit s) on
the --scs rows (AllRange in the model's sparse prefix basis, Prefix in its whitened basis U), with its
CPU seconds over `solve_minimax`'s on the same row and its value's relative distance above the
certified upper bound (SCS's eps bounds residuals, not the objective: on AllRange(64) eps 1e-4 left
the value 5e-4 high, eps 1e-5 1.5e-6).

Part 3: the --direct rows solved again with `transpose=False` (the problem as given, not its transposed
form; the `forms` column says which forms the default run used), same tolerance, budget and runs, with
the CPU ratio of the two medians measured in the same invocation.

BLAS is limited to one thread (threadpoolctl).

    .venv/bin/python -m benchmarks.bench_minimax [--budget 60] [--tol 1e-6] [--tol-large 1e-4]

writes benchmarks/results/minimax.csv and benchmarks/results/minimax.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from dpopt.solvers.convex_dp import solve_convex_dp
from dpopt.solvers.minimax import (
    factor_variances,
    query_rows,
    row_space_basis,
    solve_minimax,
    strategy_factor,
)
from dpopt.workloads import AllRange, Marginals, Prefix, WidthK, WRange
from formulations import minimax as minimax_model
from formulations.solve import solve

RESULTS = Path(__file__).resolve().parent / "results"


def marginal_domain(n: int) -> list[int]:
    """Four attribute sizes, powers of two as equal as possible, with product n (a power of two >= 16)."""
    e = int(round(np.log2(n)))
    if 2**e != n or e < 4:
        raise ValueError(f"marginals2 needs n a power of two >= 16; got {n}")
    return [2 ** (e // 4 + (i < e % 4)) for i in range(4)]


MAKE = {
    "all-range": AllRange,
    "prefix": Prefix,
    "width32": lambda n: WidthK(n, 32),
    "wrange": lambda n: WRange(n // 4, n, seed=0),
    "marginals2": lambda n: Marginals(marginal_domain(n), k=2),
}


def progress(name: str, n: int, run: int) -> Callable[[dict], None]:
    """solve_minimax callback: one stderr line per outer iteration of each level (certified bounds, gap, elapsed time)."""
    t0 = time.perf_counter()

    def show(r: dict) -> None:
        print(f"{name}({r['n']}) run {run} it {r['nit']}: upper {r['fun']:.8g} lower {r['dual_bound']:.8g} "
              f"gap {r['gap']:.2e} at {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return show


def run_minimax(name: str, n: int, tol: float, budget: float, runs: int, transpose: bool = True) -> dict:
    w = MAKE[name](n)
    walls, cpus, res = [], [], None
    for run in range(runs):
        res = solve_minimax(w, tol=tol, time_limit=budget, callback=progress(name, n, run), transpose=transpose)
        walls.append(res.wall_seconds)
        cpus.append(res.cpu_seconds)
        if res.status != "converged":
            break
    rows = query_rows(w)
    ones = np.ones(rows.m)
    U = row_space_basis(rows, ones)
    var_mm = res.extra["variances"]
    t0 = time.process_time()
    s = solve_convex_dp(rows.gram(ones), tol=1e-10)
    sum_cpu = time.process_time() - t0
    # Same evaluation as solve_minimax's: the strategy factor in the row-space basis, diag(X) <= 1.
    var_sum = factor_variances(rows, strategy_factor(s, U), U)
    return {
        "workload": name,
        "n": n,
        "m": rows.m,
        "status": res.status,
        "forms": "+".join(res.extra["forms"]),
        "runs": len(walls),
        "wall_s": statistics.median(walls),
        "cpu_s": statistics.median(cpus),
        "outer_iters": res.nit,
        "inner_solves": res.extra["inner_solves"],
        "upper": res.fun,
        "lower": res.dual_bound,
        "gap": res.gap,
        "minimax_max_std": float(np.sqrt(var_mm.max())),
        "minimax_total": float(var_mm.sum()),
        "sum_opt_max_std": float(np.sqrt(var_sum.max())),
        "sum_opt_total": float(var_sum.sum()),
        "sum_opt_gap": s.gap,
        "sum_opt_cpu_s": sum_cpu,
    }


def write(rows: list[dict], conic: list[dict], args: argparse.Namespace) -> None:
    """Write the csv and md tables (after every row, so an interrupted run keeps what it measured)."""
    counts = ("n", "m", "runs", "outer_iters", "inner_solves", "scs_iterations")
    df, dc = (pd.DataFrame(t) for t in (rows, conic))
    df, dc = (t.astype({k: "Int64" for k in counts if k in t}) for t in (df, dc))
    order = {name: i for i, name in enumerate(MAKE)}  # rows by workload family, then n
    df = df.sort_values(["workload", "n"], key=lambda k: k.map(order) if k.name == "workload" else k,
                        kind="stable", ignore_index=True) if len(df) else df
    out = pd.concat([df.assign(part="minimax"), dc.assign(part="conic")], ignore_index=True)
    out.to_csv(RESULTS / "minimax.csv", index=False)
    with open(RESULTS / "minimax.md", "w") as f:
        f.write("# Certified minimax per-query variance (benchmarks/bench_minimax.py)\n\n")
        f.write(
            f"One BLAS thread; solve_minimax at certified gap {args.tol:g} (n <= 256) or {args.tol_large:g} (larger n) "
            f"with a {args.budget:g} s (n <= 256) or {args.budget_large:g} s wall budget per "
            "run (status time_limit: the gap reached is reported); seconds are medians of `runs` runs. "
            "wrange is WRange(n/4, n, seed 0); marginals2 all 2-way marginals of a 4-attribute domain of n cells. "
            "Unit noise (P = 1): max std = sqrt(max_i Var_i), total = sum_i Var_i, for the minimax "
            "strategy and for the sum-optimal one (solve_convex_dp, gap 1e-10).\n\n"
        )
        cols = ["workload", "n", "m", "tol", "forms", "status", "runs", "wall_s", "cpu_s", "outer_iters", "inner_solves",
                "lower", "upper", "gap", "minimax_max_std", "sum_opt_max_std", "minimax_total", "sum_opt_total"]
        f.write(df[[k for k in cols if k in df]].to_markdown(index=False, floatfmt=".4g") + "\n\n")
        direct = [k for k in df if k.startswith(("direct_", "cpu_ratio_direct"))]
        if direct:
            f.write("## The same rows solved as given (transpose=False), side by side in one invocation\n\n")
            f.write(df.dropna(subset=direct)[["workload", "n", "forms", "status", "cpu_s", "gap", *direct]]
                    .to_markdown(index=False, floatfmt=".4g") + "\n\n")
        if len(dc):
            f.write(
                "## Conic model (formulations.minimax, SCS at each row's scs_eps; limits in the notes) "
                "against solve_minimax (CPU seconds)\n\n"
            )
            f.write(dc.drop(columns="part", errors="ignore").to_markdown(index=False, floatfmt=".4g") + "\n")
        notes = RESULTS.parent / "minimax_notes.md"  # by hand: which commit and load made each row
        if notes.exists():
            f.write("\n" + notes.read_text())



def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=60.0, help="wall seconds per solve_minimax run")
    ap.add_argument("--tol", type=float, default=1e-6, help="certified gap for n <= 256")
    ap.add_argument("--tol-large", type=float, default=1e-4, help="certified gap for n > 256")
    ap.add_argument("--budget-large", type=float, default=1500.0, help="wall seconds per run for n > 256")
    ap.add_argument("--scs", default=None,
                    help="workload:n rows also solved by the conic model (default "
                         "prefix:64,prefix:128,prefix:256,prefix:512,all-range:64; --quick: prefix:64)")
    ap.add_argument("--scs-tol", type=float, default=1e-6)
    ap.add_argument("--scs-limit", type=float, default=120.0)
    ap.add_argument("--direct", default="",
                    help="workload:n rows also solved as given (transpose=False), side by side with the default")
    ap.add_argument("--runs", type=int, default=None, help="runs per row (the median is reported; default 3, --quick 1)")
    ap.add_argument("--workloads", default="all-range,prefix,width32,wrange,marginals2")
    ap.add_argument("--sizes", default=None, help="n values (default 64,256,1024; --quick 64)")
    ap.add_argument("--append", action="store_true",
                    help="keep the rows already in results/minimax.csv (a row run again replaces its old one)")
    ap.add_argument("--quick", action="store_true",
                    help="every workload at n = 64, one run, the conic model on prefix:64 (about a minute; "
                         "what `make bench` runs)")
    args = ap.parse_args()
    if args.sizes is None:
        args.sizes = "64" if args.quick else "64,256,1024"
    if args.runs is None:
        args.runs = 1 if args.quick else 3
    if args.scs is None:
        args.scs = "prefix:64" if args.quick else "prefix:64,prefix:128,prefix:256,prefix:512,all-range:64"
    RESULTS.mkdir(exist_ok=True)
    rows: list[dict] = []
    conic: list[dict] = []
    if args.append and (RESULTS / "minimax.csv").exists():
        old = pd.read_csv(RESULTS / "minimax.csv")
        rows = [{k: v for k, v in r.items() if pd.notna(v)} for r in old[old.part == "minimax"].to_dict("records")]
        conic = [{k: v for k, v in r.items() if pd.notna(v)} for r in old[old.part == "conic"].to_dict("records")]
    with threadpool_limits(limits=1, user_api="blas"):
        for name in args.workloads.split(","):
            for n in (int(v) for v in args.sizes.split(",")):
                small = n <= 256
                tol = args.tol if small else args.tol_large
                r = run_minimax(name, n, tol, args.budget if small else args.budget_large, args.runs)
                r["tol"] = tol
                r["part"] = "minimax"
                rows = [q for q in rows if (q["workload"], q["n"]) != (name, n)] + [r]  # a re-run replaces
                print({k: r[k] for k in ("workload", "n", "status", "wall_s", "cpu_s", "gap")}, flush=True)
                write(rows, conic, args)
                if f"{name}:{n}" in args.scs.split(","):
                    w = MAKE[name](n)
                    ref = solve(
                        minimax_model.build(w, 1.0), "scs", tol=args.scs_tol, time_limit=args.scs_limit,
                        accept_inaccurate=True,
                    )
                    c = {
                        "workload": name,
                        "n": n,
                        "scs_eps": args.scs_tol,
                        "scs_status": ref.status,
                        "scs_objective": ref.objective,
                        "scs_iterations": ref.iterations,
                        "scs_wall_s": ref.solve_seconds,
                        "scs_cpu_s": ref.solve_cpu_seconds,
                        "minimax_upper": r["upper"],
                        "minimax_lower": r["lower"],
                        "minimax_cpu_s": r["cpu_s"],
                        "cpu_ratio_scs_over_minimax": ref.solve_cpu_seconds / r["cpu_s"],
                        "scs_rel_diff": (ref.objective - r["upper"]) / r["upper"],
                    }
                    conic = [q for q in conic if (q["workload"], q["n"]) != (name, n)] + [c]
                    print(c, flush=True)
                    write(rows, conic, args)
                if f"{name}:{n}" in args.direct.split(","):
                    d = run_minimax(name, n, tol, args.budget if small else args.budget_large, args.runs, False)
                    r.update({f"direct_{k}": d[k] for k in ("status", "runs", "cpu_s", "gap")},
                             cpu_ratio_direct_over_default=d["cpu_s"] / r["cpu_s"])
                    print({k: v for k, v in r.items() if k.startswith(("direct", "cpu_ratio"))}, flush=True)
                    write(rows, conic, args)


if __name__ == "__main__":
    main()
