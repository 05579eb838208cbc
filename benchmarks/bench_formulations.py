"""Where the conic reference stops: build time, solve time and peak memory of every formulation as n grows.

For each model of `formulations/` and each solver (Clarabel, SCS), domain sizes n = 8, 16, 32, 48, 64,
96, 128, ... are run in increasing order, each in its own subprocess (native solvers allocate outside
Python, so peak memory is the child's resource.getrusage maxrss, reported both as the peak and as the
growth over the child's baseline after imports and a warm-up solve). A run that exceeds the time budget
(`--budget`, default 600 s, wall clock including build) is stopped and ends that (model, solver) row; the
largest n solved within the budget is the "where it stops" line that hand-written solvers must pass.

Workloads: AllRange(n) for the total-error models (mm_approx, mm_pure with triangle cuts,
eigen_design, appendix_b); WRange(n, n) (m = n random ranges, seed 0) for per_query (bounds
c_i = ||w_i||^2 U(0.5, 1.5), seed 0; the model has one block per query) and for the LRM alternation
(gamma = 0.1 ||W||_F, at most 300 outer iterations). Solver tolerance `--tol` (default 1e-6) for
every model; BLAS limited to one thread. Times are medians of `--repeats` runs for runs under
`--repeat-below` seconds (one run otherwise); the table gives SCS / Clarabel ratios side by side.

    .venv/bin/python -m benchmarks.bench_formulations [--budget 600] [--quick] [--models ...] [--solvers ...]

writes benchmarks/results/formulations.csv and benchmarks/results/formulations.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ("mm_approx", "eigen_design", "appendix_b", "mm_pure", "per_query", "lrm")
SOLVERS = ("clarabel", "scs")
SIZES = (8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512)
QUICK_SIZES = (8, 16, 32, 48, 64)


def _maxrss_mb() -> float:
    # Linux reports ru_maxrss in kilobytes.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _workload(model: str, n: int):
    from dpopt.workloads import AllRange, WRange

    return WRange(n, n, seed=0) if model in ("per_query", "lrm") else AllRange(n)


def _build(model: str, n: int):
    from formulations import appendix_b, eigen_design, mm_approx, mm_pure, per_query

    w = _workload(model, n)
    if model == "per_query":
        W = w.matrix()
        c = np.einsum("ij,ij->i", W, W) * np.random.default_rng(0).uniform(0.5, 1.5, size=W.shape[0])
        return per_query.build(w, c)
    return {"mm_approx": mm_approx.build, "eigen_design": eigen_design.build,
            "appendix_b": appendix_b.build, "mm_pure": mm_pure.build}[model](w)


def child(model: str, solver: str, n: int, tol: float) -> dict:
    """One measured run (in a fresh process): returns the row as a dict."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)
    from dpopt.workloads import Prefix
    from formulations import lrm, mm_approx
    from formulations.solve import solve

    solve(mm_approx.build(Prefix(3)), solver, tol=tol)  # warm-up: load the solver's libraries
    base = _maxrss_mb()
    row: dict = {"model": model, "solver": solver, "n": n, "tol": tol, "baseline_mb": base}
    if model == "lrm":
        w = _workload(model, n)
        W = w.matrix()
        t0, c0 = time.perf_counter(), time.process_time()
        res = lrm.fit(w, gamma=0.1 * float(np.linalg.norm(W)), solver=solver, tol=tol, max_outer=300)
        row.update(
            status=res.status, objective=res.fun, iterations=res.nit, n_solves=res.extra["n_solves"],
            build_seconds=0.0, compile_seconds=np.nan, solver_seconds=np.nan,
            solve_seconds=time.perf_counter() - t0, solve_cpu_seconds=time.process_time() - c0,
        )
    else:
        model_obj = _build(model, n)
        res = solve(model_obj, solver, tol=tol, accept_inaccurate=True)
        row.update(
            status=res.status, objective=res.objective, iterations=res.iterations, n_solves=1,
            build_seconds=res.build_seconds, compile_seconds=res.compile_seconds,
            solver_seconds=res.solver_seconds, solve_seconds=res.solve_seconds,
            solve_cpu_seconds=res.solve_cpu_seconds,
        )
    row["peak_mb"] = _maxrss_mb()
    row["growth_mb"] = row["peak_mb"] - base
    return row


def run_once(model: str, solver: str, n: int, tol: float, budget: float) -> dict:
    """Run `child` in a subprocess with a wall-clock budget; a timeout or crash becomes a status."""
    cmd = [sys.executable, "-m", "benchmarks.bench_formulations", "--child", model, solver, str(n), str(tol)]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    t0 = time.perf_counter()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=budget, env=env,
                             cwd=Path(__file__).resolve().parents[1])
    except subprocess.TimeoutExpired:
        return {"model": model, "solver": solver, "n": n, "tol": tol, "status": "budget_exceeded",
                "wall_total": time.perf_counter() - t0}
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["?"])[-1]
        return {"model": model, "solver": solver, "n": n, "tol": tol, "status": f"error: {last[:120]}",
                "wall_total": time.perf_counter() - t0}
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row["wall_total"] = time.perf_counter() - t0
    return row


def measure(model: str, solver: str, n: int, tol: float, budget: float, repeats: int,
            repeat_below: float) -> dict:
    """Median over repeats of the timing fields (one run when the first is slower than repeat_below)."""
    first = run_once(model, solver, n, tol, budget)
    if "solve_seconds" not in first or first["solve_seconds"] > repeat_below or repeats <= 1:
        return {**first, "runs": 1}
    rows = [first] + [run_once(model, solver, n, tol, budget) for _ in range(repeats - 1)]
    rows = [r for r in rows if "solve_seconds" in r]
    med = dict(rows[0])
    for key in ("build_seconds", "compile_seconds", "solver_seconds", "solve_seconds",
                "solve_cpu_seconds", "peak_mb", "growth_mb", "wall_total"):
        med[key] = float(np.median([r[key] for r in rows]))
    med["runs"] = len(rows)
    return med


def _md(df: pd.DataFrame) -> str:
    """A pipe table (no optional dependency); floats with 3 significant digits."""

    def cell(v: object) -> str:
        if isinstance(v, float):
            return "" if np.isnan(v) else f"{v:.3g}"
        return "" if v is None else str(v)

    head = "| " + " | ".join(map(str, df.columns)) + " |"
    rule = "| " + " | ".join("---" for _ in df.columns) + " |"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def write_tables(df: pd.DataFrame, args: argparse.Namespace) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    df.to_csv(RESULTS / "formulations.csv", index=False)
    ok = df[df["status"].isin(["optimal", "optimal_inaccurate", "converged", "user_limit"])]
    lines = [
        "# Conic reference models: cost as n grows",
        "",
        f"Command: `.venv/bin/python -m benchmarks.bench_formulations {' '.join(sys.argv[1:])}`",
        f"Machine: {platform.platform()}, {os.cpu_count()} CPUs (shared), python {platform.python_version()}, "
        f"load average at start {args.load_at_start}; BLAS 1 thread; solver tolerance {args.tol:g}; "
        f"budget {args.budget:g} s per run.",
        "",
        "Workloads: AllRange(n) for mm_approx / mm_pure / eigen_design / appendix_b; WRange(n, n) for "
        "per_query and lrm (see the module docstring). Times in seconds (median of the runs), memory in MB "
        "(child maxrss: peak, and growth over the baseline after imports and a warm-up solve). The same "
        "`tol` means different things to the two solvers (SCS: eps_abs = eps_rel on its residuals; Clarabel: "
        "gap and feasibility tolerances); lrm times are the whole alternation (many solves).",
        "",
        "## Largest n solved within the budget",
        "",
    ]
    largest = []
    for (model, solver), g in df.groupby(["model", "solver"], sort=False):
        good = g[g["status"].isin(["optimal", "converged"])]
        stop = g[~g["status"].isin(["optimal", "converged"])]
        largest.append({
            "model": model, "solver": solver,
            "largest n": int(good["n"].max()) if len(good) else None,
            "stopped at": (f"n = {int(stop['n'].min())} ({stop.iloc[0]['status']})" if len(stop)
                           else "not reached (largest n tried)"),
        })
    lines += [_md(pd.DataFrame(largest)), "", "## Per run", ""]
    cols = ["model", "solver", "n", "status", "build_seconds", "solve_seconds", "solve_cpu_seconds",
            "solver_seconds", "iterations", "peak_mb", "growth_mb", "runs"]
    lines += [_md(ok[[c for c in cols if c in ok]]), ""]
    piv = ok.pivot_table(index=["model", "n"], columns="solver", values="solve_seconds")
    if {"clarabel", "scs"} <= set(piv.columns):
        piv["scs / clarabel"] = piv["scs"] / piv["clarabel"]
        lines += ["## Solve time side by side (wall seconds)", "", _md(piv.reset_index()), ""]
    (RESULTS / "formulations.md").write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", nargs=4, metavar=("MODEL", "SOLVER", "N", "TOL"), help=argparse.SUPPRESS)
    p.add_argument("--budget", type=float, default=600.0, help="seconds per run (default 600)")
    p.add_argument("--quick", action="store_true", help="small budget (20 s) and n <= 64")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--solvers", nargs="+", default=list(SOLVERS))
    p.add_argument("--sizes", nargs="+", type=int, default=None)
    p.add_argument("--tol", type=float, default=1e-6)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--repeat-below", type=float, default=5.0,
                   help="repeat only runs faster than this many seconds (default 5)")
    args = p.parse_args(argv)
    if args.child:
        model, solver, n, tol = args.child
        print(json.dumps(child(model, solver, int(n), float(tol)), default=float))
        return
    if args.quick:
        args.budget = min(args.budget, 20.0)
    sizes = args.sizes or (QUICK_SIZES if args.quick else SIZES)
    args.load_at_start = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    rows = []
    for model in args.models:
        for solver in args.solvers:
            for n in sizes:
                row = measure(model, solver, n, args.tol, args.budget, args.repeats, args.repeat_below)
                rows.append(row)
                print(f"{model:12s} {solver:8s} n={n:4d} {row['status']:18s} "
                      f"solve {row.get('solve_seconds', float('nan')):8.2f}s "
                      f"peak {row.get('peak_mb', float('nan')):7.0f} MB", flush=True)
                if row["status"] not in ("optimal", "converged"):
                    break
                write_tables(pd.DataFrame(rows), args)
    write_tables(pd.DataFrame(rows), args)


if __name__ == "__main__":
    main()
