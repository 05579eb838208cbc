"""Eigen-design weights (seed 003) at n = 256 ... 4096: the certified dual Newton-CG against the CVXPY model.

For AllRange, Prefix and Width32 at n = 256, 512, 1024, 2048, 4096 this runs
`solve_eigen_design` (tolerance --tol on the certified relative gap, completion off so the time is the
weights' own) in two forms:

- "newton-cg": the solver as shipped (reflection-adapted eigen-decomposition, one multiplier per
  distinct constraint row);
- "newton-cg, all cells": the same ascent over all n cell multipliers (merge=False);
- "newton-cg, full eigh": one full eigh instead of the reflection split (reflect=False), so mirrored
  cells agree only approximately and are not merged: the solver as it was before both changes;

the last two once per row with a wall-clock limit (--plain-limit seconds);

and the CVXPY model `formulations/eigen_design.py` under Clarabel and SCS (tolerance --cvxpy-tol), each in
its own subprocess and process group, killed after --budget seconds of wall time (imports and build
included). A (workload, solver) pair stops at the first n that exceeds the budget, and an n whose cubic
extrapolation from the previous size (wall * (n / n_prev)^3) exceeds the budget is recorded as skipped
without being run. A CVXPY run longer than a tenth of the budget is not repeated.

Reported per row: status, Newton iterations, CG products, CPU and wall seconds (median of 3 runs at
n <= 1024, 1 run above; BLAS limited to one thread; the machine is shared, so CPU seconds are the stable
measure), the relative duality gap (ours: the Lagrange certificate; CVXPY: the solver's dual objective),
the objective as a ratio to the SVD bound, and the relative difference from our converged objective. A
second table puts the CPU seconds side by side with the ratios to ours.

    .venv/bin/python -m benchmarks.bench_eigen_design [--sizes 256,512,...] [--budget 300] [--quick]
        [--cvxpy-from benchmarks/results/eigen_design.csv]

writes benchmarks/results/eigen_design.csv and benchmarks/results/eigen_design.md.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from benchmarks.child import run_module
from dpopt.solvers.eigen_design import solve_eigen_design
from dpopt.workloads import AllRange, Prefix, WidthK, Workload

RESULTS = Path(__file__).resolve().parent / "results"
SIZES = (256, 512, 1024, 2048, 4096)
QUICK_SIZES = (256, 512)
WORKLOADS = ("allrange", "prefix", "width32")
CVXPY_SOLVERS = ("clarabel", "scs")
REPEAT_MAX_N = 1024
REPEATS = 3


def workload(name: str, n: int) -> Workload:
    return {"allrange": AllRange, "prefix": Prefix, "width32": lambda k: WidthK(k, 32)}[name](n)


def svdb(lam: np.ndarray, n: int) -> float:
    """SVD bound (seed 004, Def. 4.1) from the eigenvalues of W^T W."""
    return float(np.sqrt(np.clip(lam, 0.0, None)).sum() ** 2 / n)


def run_ours(G: np.ndarray, repeats: int, tol: float, time_limit: float | None, **options: bool) -> dict:
    walls, cpus, res = [], [], None
    for _ in range(repeats):
        res = solve_eigen_design(G, tol=tol, complete=False, time_limit=time_limit, **options)
        walls.append(res.wall_seconds)
        cpus.append(res.cpu_seconds)
        if not res.success:
            break
    assert res is not None
    return {
        "status": res.status,
        "nit": res.nit,
        "cg": res.ninner,
        "cpu_s": statistics.median(cpus),
        "wall_s": statistics.median(walls),
        "runs": len(walls),
        "gap": res.gap,
        "fun": res.fun,
        "groups": res.extra["groups"],
        "lam": res.extra["eigenvalues"],
    }


def child(name: str, n: int, solver: str, tol: float) -> dict:
    """One CVXPY solve in this process (called through --child by `run_cvxpy`)."""
    from formulations import eigen_design
    from formulations.solve import solve

    with threadpool_limits(1):
        c0, t0 = time.process_time(), time.perf_counter()
        res = solve(eigen_design.build(workload(name, n)), solver, tol=tol)
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    dual = res.dual_objective
    gap = None if dual is None else (res.objective - dual) / abs(res.objective)
    return {"status": res.status, "nit": res.iterations, "cpu_s": cpu, "wall_s": wall, "fun": res.objective,
            "gap": gap, "solver_s": res.solver_seconds}


def run_cvxpy(name: str, n: int, solver: str, tol: float, budget: float) -> dict:
    """`child` in its own process group, killed (SIGKILL to the group) after `budget` wall seconds."""
    run = run_module("benchmarks.bench_eigen_design", ["--child", name, str(n), solver, str(tol)], budget)
    if run.timed_out:
        return {"status": f"budget {budget:g} s exceeded", "wall_total": run.wall}
    if run.returncode != 0:
        return {"status": "error: " + run.last_error_line(10**6).split("model eigen_design: ")[-1][:100],
                "wall_total": run.wall}
    row = json.loads(run.stdout.strip().splitlines()[-1])
    row["wall_total"] = run.wall
    return row


def measure(args: argparse.Namespace) -> pd.DataFrame:
    rows: list[dict] = []
    reused = pd.read_csv(args.cvxpy_from) if args.cvxpy_from else None
    stopped: dict[tuple[str, str], str] = {}
    last_wall: dict[tuple[str, str], tuple[int, float]] = {}
    for n in args.sizes:
        for name in WORKLOADS:
            G = workload(name, n).gram()
            base = {"workload": name, "n": n}
            with threadpool_limits(1):
                ours = run_ours(G, REPEATS if n <= REPEAT_MAX_N else 1, args.tol, None)
                lam = ours.pop("lam")
                bound = svdb(lam, n)
                plain = run_ours(G, 1, args.tol, args.plain_limit, merge=False)
                plain.pop("lam")
                before = run_ours(G, 1, args.tol, args.plain_limit, reflect=False)
                before.pop("lam")
            ref = ours["fun"]
            for method, r in (("newton-cg", ours), ("newton-cg, all cells", plain),
                              ("newton-cg, full eigh", before)):
                rows.append({**base, "method": method, **r, "fun/svdb": r["fun"] / bound,
                             "rel_diff": r["fun"] / ref - 1.0})
                print(rows[-1], flush=True)
            for solver in args.cvxpy:
                key = (name, solver)
                method = f"cvxpy {solver}"
                if reused is not None:
                    old = reused[(reused["workload"] == name) & (reused["n"] == n) & (reused["method"] == method)]
                    if len(old):
                        r = old.iloc[0].to_dict()
                        rows.append({**r, "fun/svdb": r["fun"] / bound if not pd.isna(r.get("fun")) else None,
                                     "rel_diff": r["fun"] / ref - 1.0 if not pd.isna(r.get("fun")) else None})
                    continue
                if key in stopped:
                    rows.append({**base, "method": method, "status": stopped[key]})
                    continue
                if key in last_wall:
                    n0, w0 = last_wall[key]
                    predicted = w0 * (n / n0) ** 3
                    if predicted > args.budget:
                        stopped[key] = f"skipped: {predicted:.0f} s predicted from n = {n0}"
                        rows.append({**base, "method": method, "status": stopped[key]})
                        continue
                walls, cpus, r = [], [], {}
                for _ in range(REPEATS if n <= REPEAT_MAX_N else 1):
                    r = run_cvxpy(name, n, solver, args.cvxpy_tol, args.budget)
                    if "wall_s" not in r:
                        break
                    walls.append(r["wall_s"])
                    cpus.append(r["cpu_s"])
                    if r["wall_total"] > args.budget / 10:  # a long run is not repeated
                        break
                if not walls:
                    stopped[key] = f"not run: n = {n} {r['status']}"
                    rows.append({**base, "method": method, "status": r["status"]})
                    continue
                last_wall[key] = (n, float(r["wall_total"]))
                rows.append({**base, "method": method, "status": r["status"], "nit": r["nit"],
                             "cpu_s": statistics.median(cpus), "wall_s": statistics.median(walls),
                             "runs": len(walls), "gap": r["gap"], "fun": r["fun"],
                             "fun/svdb": r["fun"] / bound, "rel_diff": r["fun"] / ref - 1.0})
                print(rows[-1], flush=True)
    return pd.DataFrame(rows)


def _fmt(v: object, col: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if col in ("gap", "rel_diff"):
        return f"{v:.1e}"
    if col in ("cpu_s", "wall_s"):
        return f"{v:.3g}"
    if col == "fun/svdb":
        return f"{v:.6f}"
    if col in ("nit", "cg", "runs", "groups", "n"):
        return str(int(v))  # type: ignore[call-overload]
    return str(v)


def markdown(df: pd.DataFrame, args: argparse.Namespace) -> str:
    cols = ["workload", "n", "method", "status", "nit", "cg", "groups", "cpu_s", "wall_s", "runs", "gap",
            "fun/svdb", "rel_diff"]
    cols = [c for c in cols if c in df.columns]
    lines = [
        "# Eigen-design weights: certified dual Newton-CG vs the CVXPY model",
        "",
        f"`solve_eigen_design(G, tol={args.tol:g}, complete=False)`; CVXPY model `formulations/eigen_design.py` "
        f"at tol {args.cvxpy_tol:g}, each solve in a subprocess killed after {args.budget:g} s (wall, imports "
        "and build included); a size whose cubic extrapolation from the previous one exceeds that budget is "
        f"skipped; a CVXPY run longer than a tenth of the budget is not repeated. Times: median of {REPEATS} runs at n <= {REPEAT_MAX_N}, 1 run above, BLAS 1 thread, on a "
        "shared 2-core machine (CPU seconds are the stable measure; CVXPY times include the model build). "
        "gap: relative duality gap (ours: the Lagrange certificate recomputed on the full program; CVXPY: "
        "the solver's dual objective). fun/svdb: eigen-design error / SVD bound (P = 1, sens2 = 1); "
        "rel_diff: objective / ours - 1. groups: distinct constraint rows the dual runs over. "
        f"\"newton-cg, all cells\": the ascent over all n multipliers (merge=False); \"newton-cg, full eigh\": "
        f"one full eigh, no merging (reflect=False), the solver before both changes; both limited to "
        f"{args.plain_limit:g} s." + (f" CVXPY rows reused from {Path(args.cvxpy_from).name}." if args.cvxpy_from else ""),
        "",
        "| " + " | ".join(cols) + " |",
        "|" + "|".join("---:" if c not in ("workload", "method", "status") else "---" for c in cols) + "|",
    ]
    for _, row in df.iterrows():
        lines.append("| " + " | ".join(_fmt(row.get(c), c) for c in cols) + " |")
    lines += ["", "## CPU seconds side by side (ratio to newton-cg)", ""]
    methods = list(dict.fromkeys(df["method"]))
    others = [m for m in methods if m != "newton-cg"]
    lines.append("| workload | n | newton-cg | " + " | ".join(f"{m} (ratio)" for m in others) + " |")
    lines.append("|---|---:|---:|" + "---:|" * len(others))
    for (name, n), grp in df.groupby(["workload", "n"], sort=False):
        by = grp.set_index("method")
        ours = float(by.loc["newton-cg", "cpu_s"])
        cells = []
        for m in others:
            if m in by.index and not pd.isna(by.loc[m].get("cpu_s")):
                c = float(by.loc[m, "cpu_s"])
                ok = "" if by.loc[m, "status"] in ("converged", "optimal") else f", {by.loc[m, 'status']}"
                cells.append(f"{c:.3g} ({c / ours:.3g}x{ok})")
            elif m in by.index:
                cells.append(str(by.loc[m, "status"]))
            else:
                cells.append("")
        lines.append(f"| {name} | {n} | {ours:.3g} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "--child":
        name, n, solver, tol = argv[1], int(argv[2]), argv[3], float(argv[4])
        print(json.dumps(child(name, n, solver, tol)))
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=lambda s: tuple(int(x) for x in s.split(",")), default=SIZES)
    p.add_argument("--quick", action="store_true", help=f"sizes {QUICK_SIZES}")
    p.add_argument("--tol", type=float, default=1e-8)
    p.add_argument("--cvxpy-tol", type=float, default=1e-8)
    p.add_argument("--budget", type=float, default=300.0)
    p.add_argument("--plain-limit", type=float, default=120.0)
    p.add_argument("--cvxpy", type=lambda s: tuple(x for x in s.split(",") if x), default=CVXPY_SOLVERS)
    p.add_argument("--out", default="eigen_design")
    p.add_argument("--cvxpy-from", default=None,
                   help="CSV of an earlier run whose CVXPY rows are reused instead of solved again")
    args = p.parse_args(argv)
    if args.quick:
        args.sizes = QUICK_SIZES
    df = measure(args)
    RESULTS.mkdir(exist_ok=True)
    df.to_csv(RESULTS / f"{args.out}.csv", index=False)
    (RESULTS / f"{args.out}.md").write_text(markdown(df, args))
    print(markdown(df, args))


if __name__ == "__main__":
    main()
