"""Where the conic reference stops: build time, solve time and peak memory of every formulation as n grows.

For each model of `formulations/` and each solver (Clarabel, SCS), domain sizes n = 8, 16, 32, 48, 64,
96, 128, ..., 1024 are run in increasing order (size by size across all pairs), each in its own
subprocess and process group (native solvers allocate outside Python, so peak memory is the child's
resource.getrusage maxrss, reported both as the peak and as the growth over the child's baseline after
imports and a warm-up solve). A run that exceeds the time budget (`--budget`, default 600 s, wall clock
including imports and build) is killed and ends that (model, solver) row, as does a run that exceeds the
address-space cap (`--mem-limit-gb`, default 10, protecting the shared machine) or crashes; the largest n
solved within the budget is the "where it stops" line that hand-written solvers must pass.

`--resume` keeps the rows of the existing CSV that remain valid (successes at the same tol; failures
measured with at least this budget) and runs only what is missing. `--deadline HH:MM` (UTC) bounds the
whole sweep: a run is given min(budget, time left), one stopped by the deadline is recorded as
"session_budget", and pairs not reached are recorded "not_run"; the table then says "not run past n = X:
session budget" for them instead of a largest n.

Workloads: AllRange(n) for the total-error models (mm_approx, mm_pure with triangle cuts,
eigen_design, appendix_b); WRange(n, n) (m = n random ranges, seed 0) for per_query (bounds
c_i = ||w_i||^2 U(0.5, 1.5), seed 0; the model has one block per query) and for the LRM alternation
(gamma = 0.1 ||W||_F, at most 300 outer iterations). Solver tolerance `--tol` (default 1e-6) for
every model; BLAS limited to one thread. Times are medians of `--repeats` runs for runs under
`--repeat-below` seconds (one run otherwise); the table gives SCS / Clarabel ratios side by side.

    .venv/bin/python -m benchmarks.bench_formulations [--budget 600] [--resume] [--deadline HH:MM]
        [--quick] [--models ...] [--solvers ...] [--sizes ...] [--mem-limit-gb 10]

writes benchmarks/results/formulations.csv and benchmarks/results/formulations.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.child import run_module

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ("mm_approx", "eigen_design", "appendix_b", "mm_pure", "per_query", "lrm")
SOLVERS = ("clarabel", "scs")
SIZES = (8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
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


def run_once(model: str, solver: str, n: int, tol: float, timeout: float, mem_limit_gb: float,
             session_capped: bool = False) -> dict:
    """Run `child` in its own process group with a wall-clock timeout and an address-space cap.

    Records wall_total and cpu_total (the child's CPU seconds, also for a killed run, so that a run
    stopped by the wall-clock budget on a loaded machine shows how much CPU it had received).
    timeout: seconds (wall, including imports and build); when it is reached the whole process group is
    killed (SIGKILL) and the row gets status "budget_exceeded", or "session_budget" when the timeout was
    shortened by the session deadline (`session_capped`), i.e. the run was stopped before its budget.
    A child that dies from the memory cap gets status "memory_limit"; any other crash "error: <last line>".
    """
    base = {"model": model, "solver": solver, "n": n, "tol": tol}
    run = run_module("benchmarks.bench_formulations", ["--child", model, solver, str(n), str(tol)], timeout,
                     int(mem_limit_gb * 2**30))
    times = {"wall_total": run.wall, "cpu_total": run.cpu}
    if run.timed_out:
        return {**base, "status": "session_budget" if session_capped else "budget_exceeded", **times}
    if run.returncode != 0:
        status = f"memory_limit ({mem_limit_gb:g} GB)" if run.out_of_memory else "error: " + run.last_error_line()
        return {**base, "status": status, **times}
    row = json.loads(run.stdout.strip().splitlines()[-1])
    row.update(times)
    return row


def measure(model: str, solver: str, n: int, tol: float, budget: float, repeats: int,
            repeat_below: float, mem_limit_gb: float, deadline: float | None) -> dict:
    """Median over repeats of the timing fields (one run when the first is slower than repeat_below).

    deadline: time.time() after which no run may continue (None: none); a run's timeout is
    min(budget, seconds left), and a run stopped by the deadline is marked "session_budget".
    """

    def once() -> dict:
        left = math.inf if deadline is None else deadline - time.time()
        return run_once(model, solver, n, tol, min(budget, left), mem_limit_gb, session_capped=left < budget)

    first = once()
    if "solve_seconds" not in first or first["solve_seconds"] > repeat_below or repeats <= 1:
        return {**first, "runs": 1}
    rows = [first] + [once() for _ in range(repeats - 1)]
    rows = [r for r in rows if "solve_seconds" in r]
    med = dict(rows[0])
    for key in ("build_seconds", "compile_seconds", "solver_seconds", "solve_seconds",
                "solve_cpu_seconds", "peak_mb", "growth_mb", "wall_total", "cpu_total"):
        med[key] = float(np.median([r[key] for r in rows]))
    med["runs"] = len(rows)
    return med


SUCCESS = ("optimal", "converged")


def resumable(path: Path, tol: float, budget: float) -> pd.DataFrame:
    """Rows of an earlier CSV that stay valid for this invocation (same tol).

    Kept: successes (a run that finished within a smaller budget also finishes within this one) and
    failures measured with a budget at least this large (or that are not budget-related, such as the
    memory cap or an error). Dropped, hence re-run: runs stopped by a smaller or unrecorded budget and
    runs stopped by a session deadline.
    """
    if not path.exists():
        return pd.DataFrame()
    old = pd.read_csv(path)
    if "budget" not in old:
        old["budget"] = np.nan
    if "measured" not in old:
        old["measured"] = "earlier run"
    old = old[np.isclose(old["tol"].astype(float), tol)]
    timed_out = old["status"].isin(["budget_exceeded", "session_budget"])
    stopped_early = timed_out & ~(old["budget"].astype(float) >= budget)
    return old[~stopped_early & ~(old["status"] == "not_run")].reset_index(drop=True)


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


def _largest(df: pd.DataFrame) -> pd.DataFrame:
    """Per (model, solver): largest n solved within the budget and why the sweep stopped."""
    out = []
    for (model, solver), g in df.groupby(["model", "solver"], sort=False):
        g = g.sort_values("n")
        good = g[g["status"].isin(SUCCESS)]
        stop = g[~g["status"].isin(SUCCESS)]
        last = int(good["n"].max()) if len(good) else None
        if not len(stop):
            why = "not reached (largest n of the grid)"
        else:
            first = stop.iloc[0]
            if first["status"] in ("session_budget", "not_run"):
                why = (f"not run past n = {last}: session budget" if last is not None
                       else "not run: session budget")
                if first["status"] == "session_budget":
                    why += f" (n = {int(first['n'])} stopped after {first['wall_total']:.0f} s)"
            else:
                why = f"n = {int(first['n'])} ({first['status']})"
                cpu = first.get("cpu_total", np.nan)
                if isinstance(cpu, float) and np.isfinite(cpu):
                    why += f" after {first['wall_total']:.0f} s wall, {cpu:.0f} s CPU"
        top = good[good["n"] == last].iloc[0] if last is not None else None
        out.append({"model": model, "solver": solver, "largest n": last,
                    "its solve s (wall)": None if top is None else float(top["solve_seconds"]),
                    "its solve s (CPU)": None if top is None else float(top["solve_cpu_seconds"]),
                    "stopped at": why})
    return pd.DataFrame(out)


def _commands(df: pd.DataFrame, args: argparse.Namespace) -> list[str]:
    """Argument strings of the invocations that measured the rows, in order of first appearance."""
    seen = [] if "command" not in df else list(dict.fromkeys(df.sort_values("measured")["command"].dropna()))
    here = " ".join(args.argv)
    return seen + ([here] if here not in seen and not args.tables_only else [])


def write_tables(df: pd.DataFrame, args: argparse.Namespace, final: bool = True) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    order = {m: i for i, m in enumerate(MODELS)}
    df = df.assign(_o=df["model"].map(order)).sort_values(["_o", "solver", "n"]).drop(columns="_o")
    df.to_csv(args.out.with_suffix(".csv"), index=False)
    ok = df[df["status"].isin(["optimal", "optimal_inaccurate", "converged", "user_limit"])]
    budgets = sorted({f"{b:g}" for b in df["budget"].dropna()})
    lines = [
        "# Conic reference models: cost as n grows",
        "",
        "Commands (each resuming the CSV the previous one wrote; column `command` of the CSV says which one "
        "measured a row): "
        + "; ".join(f"`.venv/bin/python -m benchmarks.bench_formulations {c}`" for c in _commands(df, args)),
        f"Machine: {platform.platform()}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs "
        f"(shared with other users), {_mem_total_gb():.0f} GB RAM, python {platform.python_version()}; "
        f"load average (1, 5, 15 min) at start {args.load_at_start}, at this write "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}; started {args.started_utc} UTC, "
        f"written {time.strftime('%H:%M', time.gmtime())} UTC.",
        f"One solve at a time, BLAS 1 thread; solver tolerance {args.tol:g}; budget {args.budget:g} s per run "
        f"(wall, including imports and build; a run over it is killed); address space capped at "
        f"{args.mem_limit_gb:g} GB per run"
        + (f"; session deadline {args.deadline} UTC" if args.deadline else "") + ".",
        f"Rows resumed from an earlier CSV have `measured` = 'earlier run' (their budget, when recorded, in "
        f"`budget`; budgets in this file: {', '.join(budgets) or 'none recorded'} s); successes carry over "
        "to a larger budget, runs stopped by a smaller budget were re-run.",
        "",
        "Workloads: AllRange(n) for mm_approx / mm_pure / eigen_design / appendix_b; WRange(n, n) for "
        "per_query and lrm (see the module docstring). Times in seconds (median of the runs), memory in MB "
        "(child maxrss: peak, and growth over the baseline after imports and a warm-up solve). The same "
        "`tol` means different things to the two solvers (SCS: eps_abs = eps_rel on its residuals; Clarabel: "
        "gap and feasibility tolerances); lrm times are the whole alternation (many solves).",
        "",
        f"## Largest n solved within {args.budget:g} s",
        "",
        _md(_largest(df)),
        "" if final else "\n(Sweep in progress: a pair marked 'not reached' may still grow.)\n",
        "## Per run",
        "",
    ]
    cols = ["model", "solver", "n", "status", "build_seconds", "solve_seconds", "solve_cpu_seconds",
            "solver_seconds", "iterations", "peak_mb", "growth_mb", "runs", "budget", "measured", "load_1min"]
    lines += [_md(ok[[c for c in cols if c in ok]]), ""]
    bad = df[~df["status"].isin(["optimal", "optimal_inaccurate", "converged", "user_limit"])]
    if len(bad):
        lines += ["## Stopped runs", "",
                  "wall_total / cpu_total: wall and CPU seconds of the child process until it ended or was killed.",
                  "", _md(bad[[c for c in ["model", "solver", "n", "status", "wall_total", "cpu_total",
                                           "budget", "measured", "load_1min"] if c in bad]]), ""]
    piv = ok.pivot_table(index=["model", "n"], columns="solver", values="solve_seconds")
    if {"clarabel", "scs"} <= set(piv.columns):
        piv["scs / clarabel"] = piv["scs"] / piv["clarabel"]
        lines += ["## Solve time side by side (wall seconds)", "", _md(piv.reset_index()), ""]
    args.out.with_suffix(".md").write_text("\n".join(lines))


def _mem_total_gb() -> float:
    try:
        with open("/proc/meminfo") as f:
            return int(f.readline().split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        return float("nan")


def _deadline(text: str | None) -> float | None:
    """'HH:MM' (UTC, today, or tomorrow if already past) -> time.time() value; None passes through."""
    if not text:
        return None
    try:
        hh, mm = (int(x) for x in text.split(":"))
    except ValueError:
        raise ValueError(f"--deadline must be HH:MM (UTC), got {text!r}") from None
    now = time.time()
    day = now - now % 86400
    t = day + hh * 3600 + mm * 60
    return t if t > now else t + 86400


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
    p.add_argument("--mem-limit-gb", type=float, default=10.0,
                   help="address-space cap per run in GB (default 10; 0 = none)")
    p.add_argument("--resume", action="store_true",
                   help="keep the valid rows of the existing CSV and run only what is missing")
    p.add_argument("--deadline", default=None,
                   help="HH:MM UTC: stop the sweep then; unfinished pairs are marked 'session budget'")
    p.add_argument("--tables-only", action="store_true",
                   help="run nothing: rewrite the markdown table from the existing CSV")
    p.add_argument("--out", type=Path, default=RESULTS / "formulations",
                   help="output stem (writes .csv and .md; default benchmarks/results/formulations)")
    args = p.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    if args.child:
        model, solver, n, tol = args.child
        print(json.dumps(child(model, solver, int(n), float(tol)), default=float))
        return
    if args.budget <= 0:
        raise ValueError(f"--budget must be positive seconds, got {args.budget}")
    if args.quick:
        args.budget = min(args.budget, 20.0)
    if args.tables_only:
        df = pd.read_csv(args.out.with_suffix(".csv"))
        args.load_at_start = "not recorded (tables rewritten from the CSV; per run: column load_1min)"
        args.started_utc = "-"
        write_tables(df, args)
        return
    sizes = sorted(args.sizes or (QUICK_SIZES if args.quick else SIZES))
    deadline = _deadline(args.deadline)
    args.load_at_start = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    args.started_utc = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    old = resumable(args.out.with_suffix(".csv"), args.tol, args.budget) if args.resume else pd.DataFrame()
    done = {(r["model"], r["solver"], int(r["n"])): r for r in old.to_dict("records")}
    pairs = [(m, s) for m in args.models for s in args.solvers]
    # Rows of pairs or sizes this invocation does not touch are carried over unchanged.
    rows = [r for k, r in done.items() if (k[0], k[1]) not in pairs or k[2] not in sizes]
    stopped: set[tuple[str, str]] = set()
    visited: set[tuple[str, str, int]] = set()

    def table() -> pd.DataFrame:
        # Resumed rows not reached yet stay in the files (valid data) unless their pair has stopped.
        pending = [r for k, r in done.items() if (k[0], k[1]) in pairs and k[2] in sizes
                   and k not in visited and (k[0], k[1]) not in stopped]
        return pd.DataFrame(rows + pending)

    # Size by size across all pairs, so that a session deadline leaves every pair at a comparable frontier.
    for n in sizes:
        for model, solver in pairs:
            if (model, solver) in stopped:
                continue
            visited.add((model, solver, n))
            if (model, solver, n) in done:
                row = done[(model, solver, n)]
            elif deadline is not None and deadline - time.time() < 1.0:
                row = {"model": model, "solver": solver, "n": n, "tol": args.tol, "status": "not_run",
                       "budget": args.budget, "measured": "not run"}
            else:
                row = measure(model, solver, n, args.tol, args.budget, args.repeats, args.repeat_below,
                              args.mem_limit_gb, deadline)
                row.update(budget=args.budget, measured=time.strftime("%H:%M UTC", time.gmtime()),
                           command=" ".join(args.argv), load_1min=os.getloadavg()[0])
                print(f"{model:12s} {solver:8s} n={n:4d} {row['status']:18s} "
                      f"solve {row.get('solve_seconds', float('nan')):8.2f}s "
                      f"wall {row.get('wall_total', float('nan')):8.1f}s "
                      f"peak {row.get('peak_mb', float('nan')):7.0f} MB", flush=True)
            rows.append(row)
            if row["status"] not in SUCCESS:
                stopped.add((model, solver))
            write_tables(table(), args, final=False)
    write_tables(table(), args)


if __name__ == "__main__":
    main()
