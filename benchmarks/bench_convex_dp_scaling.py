"""Scaling of the certified (eps, delta) solver against seed 002's own program and the conic SDP.

Three solvers of  min trace(G X^{-1}) s.t. diag(X) = 1  (seed 002), G = W^T W:

- ``ours``: `solve_convex_dp(G, method="dual", tol=--tol)` (certified relative gap, default 1e-6);
- ``paper``: `solve_convex_dp_paper(G)`, seed 002's Matlab ConvexDP as printed (30-iteration cap),
  with its gap certified after the fact at d = diag(X^{-1} G X^{-1});
- ``clarabel`` / ``scs``: the CVXPY Schur-complement SDP `formulations.mm_approx` (Clarabel at its
  default tolerance 1e-8, SCS at eps = 1e-6), at n = 16, 32, 48, 64 only, against ``ours`` at tol 1e-8.

Every run is a fresh subprocess (BLAS limited to --threads threads, default one, by threadpoolctl and
the environment) that reports wall and CPU seconds of the solve, the certified gap, the objective, the
eigen-decompositions and SVDs the solve made, and the peak resident memory (getrusage maxrss), also as
growth over the process's maxrss after imports and building G, in units of n^2 doubles. Median of 3 runs at n <= 512, 1 run above; every run has a wall-clock budget
(--budget seconds; the paper baseline and the conic solvers are skipped at sizes where the previous
size already exceeded the budget or a projection of it does).

    .venv/bin/python -m benchmarks.bench_convex_dp_scaling [--quick] [--workloads all-range,prefix,width32]

writes benchmarks/results/convex_dp_scaling.csv and benchmarks/results/convex_dp_scaling.md. With --large,
ours only (no paper baseline, no conic solvers) in one compact table, e.g. the n = 8192 table:

    .venv/bin/python -m benchmarks.bench_convex_dp_scaling --large --sizes 8192 --threads 2 \
        --workloads all-range,prefix,width32 --budget 1800 --out convex_dp_8192
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.child import run_module

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]
SIZES = (128, 256, 512, 1024, 2048, 4096)
QUICK_SIZES = (128, 256, 512, 1024)
CONIC_SIZES = (16, 32, 48, 64)
REPEAT_MAX_N = 512


def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def feasible_objective(G: np.ndarray, X: np.ndarray | None, support_rtol: float = 1e-6) -> float:
    """Error trace(G X^+) of the strategy a conic X defines, made feasible (nan if W is unsupported).

    X is symmetrised, its negative eigenvalues (solver tolerance) clipped to 0, and it is scaled so that
    max diag X <= 1; the strategy A = X^{1/2} answers W iff range(G) lies in range(X), checked as
    ||G - P G||_F <= support_rtol ||G||_F with P the projector onto range(X).
    """
    if X is None:
        return float("nan")
    X = np.asarray(X, dtype=float)
    lam, V = np.linalg.eigh((X + X.T) / 2)
    lam = np.clip(lam, 0.0, None)
    keep = lam > 1e-12 * lam.max()
    V, lam = V[:, keep], lam[keep]
    scale = max(1.0, float(np.max((V**2) @ lam)))
    lam = lam / scale
    GV = G @ V
    if np.linalg.norm(G - V @ (V.T @ G)) > support_rtol * np.linalg.norm(G):
        return float("nan")
    return float(np.einsum("ij,ij->j", V, GV) @ (1.0 / lam))


def child(solver: str, workload: str, n: int, tol: float, threads: int = 1) -> dict:
    """One measured solve in this (fresh) process with `threads` BLAS threads; returns the row."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(threads)
    from benchmarks.bench_convex_dp import closed_form_gram
    from dpopt.solvers.convex_dp import convex_dp_objective, solve_convex_dp
    from dpopt.solvers.convex_dp_paper import solve_convex_dp_paper

    G = closed_form_gram(workload, n)
    row: dict = {"solver": solver, "workload": workload, "n": n, "tol": tol}
    if solver in ("clarabel", "scs"):
        from formulations import mm_approx
        from formulations.solve import solve

        solve(mm_approx.build(closed_form_gram("prefix", 3)), solver, tol=1e-6)  # load native libraries
        base = _maxrss_mb()
        model = mm_approx.build(G)
        t0, c0 = time.perf_counter(), time.process_time()
        res = solve(model, solver, tol=tol, accept_inaccurate=True)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        row.update(status=res.status, fun=res.objective, gap=res.gap, nit=res.iterations)
        try:
            X = np.asarray(model.value("X"), dtype=float)
            Xs = (X + X.T) / 2 / max(1.0, float(np.max(np.diag(X))))
            row["fun_recomputed"] = convex_dp_objective(G, Xs + 1e-12 * np.eye(n))
        except (ValueError, TypeError, AttributeError):
            row["fun_recomputed"] = float("nan")
        row["fun_feasible"] = feasible_objective(G, model.value("X"))
    else:
        solve_convex_dp(closed_form_gram("prefix", 8), tol=1e-6)  # warm-up
        base = _maxrss_mb()
        t0, c0 = time.perf_counter(), time.process_time()
        if solver == "ours":
            res = solve_convex_dp(G, method="dual", tol=tol, callback=_progress(t0, f"{workload} n={n} threads={threads}"))
        else:
            res = solve_convex_dp_paper(G)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        row.update(status=res.status, fun=res.fun, gap=res.gap, nit=res.nit, ninner=res.ninner)
        decompositions = res.extra.get("decompositions", {})
        row.update(eigh=decompositions.get("eigh"), svd=decompositions.get("svd"),
                   certificate=res.extra.get("certificate"))
    peak = _maxrss_mb()
    row.update(threads=threads, wall_s=wall, cpu_s=cpu, peak_mb=peak, base_mb=base,
               growth_n2=(peak - base) * 2**20 / (8.0 * n * n))
    return row


#: Children append one line per Newton iteration here (their stdout carries only the result row).
PROGRESS = Path(tempfile.gettempdir()) / "bench_convex_dp_scaling.progress"


def _progress(t0: float, label: str):
    """Solver callback appending one line per Newton iteration to PROGRESS (follow it with tail -f)."""

    def report(info: dict) -> None:
        with PROGRESS.open("a") as fh:
            fh.write(f"{label}: nit {info['nit']} gap {info['gap']:.2e} at {time.perf_counter() - t0:.0f} s\n")

    return report


def _exec_with_threads(threads: int, argv: list[str]) -> None:
    """Re-run this child with the BLAS thread variables set to `threads` (the parent's runner fixes them at 1,
    and OpenBLAS sizes its pool from them when it loads); exec keeps the pid, so the budget still applies."""
    names = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
    if threads > 1 and any(os.environ.get(k) != str(threads) for k in names):
        env = dict(os.environ, **{k: str(threads) for k in names})
        os.execve(sys.executable, [sys.executable, "-m", "benchmarks.bench_convex_dp_scaling", *argv], env)


def run_once(solver: str, workload: str, n: int, tol: float, budget: float, threads: int = 1) -> dict:
    """`child` in a subprocess with a wall-clock budget; a timeout or crash becomes the status."""
    base = {"solver": solver, "workload": workload, "n": n, "tol": tol, "threads": threads}
    args = ["--child", solver, workload, str(n), str(tol), "--threads", str(threads)]
    run = run_module("benchmarks.bench_convex_dp_scaling", args, budget)
    if run.timed_out:
        return {**base, "status": f"budget_exceeded ({budget:.0f} s)", "wall_s": float("nan")}
    if run.returncode != 0:
        return {**base, "status": f"error: {run.last_error_line(100)}"}
    row = json.loads(run.stdout.strip().splitlines()[-1])
    row["process_wall_s"] = run.wall
    return row


def measure(solver: str, workload: str, n: int, tol: float, budget: float, threads: int = 1,
            repeats: int | None = None) -> dict:
    """Median of `repeats` runs (default 3 at n <= REPEAT_MAX_N, 1 above; 1 when the first run failed)."""
    first = run_once(solver, workload, n, tol, budget, threads)
    repeats = (3 if n <= REPEAT_MAX_N else 1) if repeats is None else repeats
    repeats = repeats if "cpu_s" in first else 1
    rows = [first] + [run_once(solver, workload, n, tol, budget, threads) for _ in range(repeats - 1)]
    rows = [r for r in rows if "cpu_s" in r] or [first]
    med = dict(rows[0])
    for key in ("wall_s", "cpu_s", "peak_mb", "growth_n2"):
        if key in med:
            med[key] = float(np.median([r[key] for r in rows]))
            med[f"{key}_runs"] = " ".join(f"{r[key]:.0f}" for r in rows)
    med["runs"] = len(rows)
    print(json.dumps({k: med.get(k) for k in ("solver", "workload", "n", "threads", "status", "wall_s", "cpu_s",
                                                "gap", "fun", "peak_mb", "eigh", "svd")}), flush=True)
    return med


def _fmt(x: object, spec: str) -> str:
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return "-"
    return format(x, spec)


def scaling_table(df: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """ours vs paper side by side per (workload, n), with the targets as columns."""
    lines = ["| workload | n | ours status | ours cpu s | ours wall s | ours gap | ours peak MB | ours growth / n^2 doubles "
             "| paper status | paper nit | paper cpu s | paper wall s | paper gap | paper fun / ours fun - 1 "
             "| cpu ratio paper / ours | target n=1024: ours <= paper/10 | target n=2048: gap <= 1e-4 in 600 s "
             "| target n=4096 completes |",
             "|---|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---|---|"]
    out = []
    for (w, n), g in df[df.solver.isin(["ours", "paper"])].groupby(["workload", "n"], sort=False):
        o = g[g.solver == "ours"].iloc[0].to_dict() if (g.solver == "ours").any() else {}
        p = g[g.solver == "paper"].iloc[0].to_dict() if (g.solver == "paper").any() else {}
        ratio = p.get("cpu_s", np.nan) / o.get("cpu_s", np.nan) if o.get("cpu_s") and p.get("cpu_s") else np.nan
        excess = p.get("fun", np.nan) / o.get("fun", np.nan) - 1 if o.get("fun") and p.get("fun") else np.nan
        t1024 = t2048 = t4096 = ""
        ok = o.get("gap") is not None and np.isfinite(o.get("gap", np.nan))
        if n == 1024:
            t1024 = ("yes" if ratio >= 10 and ok and o["gap"] <= 1e-6 else "no") if np.isfinite(ratio) else "paper not run"
        if n == 2048:
            t2048 = "yes" if ok and o["gap"] <= 1e-4 and o.get("wall_s", np.inf) <= 600 else "no"
        if n == 4096:
            t4096 = "yes" if ok else "no"
        rec = {"workload": w, "n": n, "cpu_ratio_paper_over_ours": ratio, "paper_excess": excess}
        out.append(rec)
        lines.append(
            f"| {w} | {n} | {o.get('status', 'not run')} | {_fmt(o.get('cpu_s'), '.2f')} | {_fmt(o.get('wall_s'), '.2f')} "
            f"| {_fmt(o.get('gap'), '.1e')} | {_fmt(o.get('peak_mb'), '.0f')} | {_fmt(o.get('growth_n2'), '.1f')} "
            f"| {p.get('status', 'not run')} | {_fmt(p.get('nit'), '.0f')} | {_fmt(p.get('cpu_s'), '.2f')} "
            f"| {_fmt(p.get('wall_s'), '.2f')} | {_fmt(p.get('gap'), '.1e')} | {_fmt(excess, '.2e')} "
            f"| {_fmt(ratio, '.1f')} | {t1024} | {t2048} | {t4096} |")
    return pd.DataFrame(out), lines


def conic_table(df: pd.DataFrame) -> list[str]:
    """Conic SDP vs ours (tol 1e-8) at small n: objective agreement and time ratio conic / ours."""
    lines = ["| workload | n | solver | status | nit | cpu s | wall s | peak MB | fun | |fun / ours - 1| "
             "| ours cpu s | ours wall s | cpu ratio conic / ours | wall ratio conic / ours | target n=64: >= 1000x |",
             "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    small = df[df.n.isin(CONIC_SIZES)]
    for (w, n), g in small.groupby(["workload", "n"], sort=False):
        o = g[g.solver == "ours"].iloc[0].to_dict() if (g.solver == "ours").any() else {}
        for _, r in g[g.solver.isin(["clarabel", "scs"])].iterrows():
            r = r.to_dict()
            agree = abs(r.get("fun", np.nan) / o.get("fun", np.nan) - 1) if o.get("fun") else np.nan
            rc = r.get("cpu_s", np.nan) / o.get("cpu_s", np.nan) if o.get("cpu_s") else np.nan
            rw = r.get("wall_s", np.nan) / o.get("wall_s", np.nan) if o.get("wall_s") else np.nan
            target = ""
            if n == 64:
                target = (("yes" if rw >= 1000 else "no") if np.isfinite(rw)
                          else f"conic did not finish: ratio > {r.get('budget', 0) / o.get('wall_s', np.nan):.0f}")
            lines.append(
                f"| {w} | {n} | {r['solver']} | {r.get('status')} | {_fmt(r.get('nit'), '.0f')} "
                f"| {_fmt(r.get('cpu_s'), '.2f')} | {_fmt(r.get('wall_s'), '.2f')} | {_fmt(r.get('peak_mb'), '.0f')} "
                f"| {_fmt(r.get('fun'), '.6g')} | {_fmt(agree, '.1e')} | {_fmt(o.get('cpu_s'), '.4f')} "
                f"| {_fmt(o.get('wall_s'), '.4f')} | {_fmt(rc, '.0f')} | {_fmt(rw, '.0f')} | {target} |")
    return lines


def large_table(df: pd.DataFrame) -> list[str]:
    """ours only: status, certified gap, wall and CPU seconds, peak memory and decompositions per (workload, n)."""
    lines = ["| workload | n | threads | status | gap | wall s | cpu s | peak MB | growth / n^2 doubles | eigh | svd "
             "| nit | CG steps | certificate | runs | wall s of each run |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|"]
    for _, r in df.iterrows():
        r = r.to_dict()
        lines.append(
            f"| {r['workload']} | {r['n']} | {r.get('threads', 1)} | {r.get('status')} | {_fmt(r.get('gap'), '.1e')} "
            f"| {_fmt(r.get('wall_s'), '.0f')} | {_fmt(r.get('cpu_s'), '.0f')} | {_fmt(r.get('peak_mb'), '.0f')} "
            f"| {_fmt(r.get('growth_n2'), '.1f')} | {_fmt(r.get('eigh'), '.0f')} | {_fmt(r.get('svd'), '.0f')} "
            f"| {_fmt(r.get('nit'), '.0f')} | {_fmt(r.get('ninner'), '.0f')} | {r.get('certificate', '-')} "
            f"| {_fmt(r.get('runs'), '.0f')} | {r.get('wall_s_runs', '-')} |")
    return lines


def large_run(workloads: list[str], sizes: list[int], args: argparse.Namespace, argv: list[str] | None) -> None:
    """--large: ours at each (workload, n), written as benchmarks/results/<out>.{csv,md} with `large_table`."""
    print(f"per-iteration progress of each run: tail -f {PROGRESS}", flush=True)
    rows = [measure("ours", w, n, args.tol, args.budget, args.threads, args.repeats)
            for w in workloads for n in sizes]
    df = pd.DataFrame(rows)
    stem = args.out or "convex_dp_large"
    RESULTS.mkdir(parents=True, exist_ok=True)
    df.to_csv(RESULTS / f"{stem}.csv", index=False)
    runs = (f"median of {args.repeats} runs each" if args.repeats else
            "median of 3 runs at n <= 512, 1 run above" if min(sizes) <= REPEAT_MAX_N else "one run each")
    md = [
        "# (eps, delta) solver at large n: certified dual Newton", "",
        f"Command: `.venv/bin/python -m benchmarks.bench_convex_dp_scaling {' '.join(argv or sys.argv[1:])}`. "
        f"One fresh subprocess per run, BLAS {args.threads} thread(s) (threadpoolctl and environment), {runs}; "
        f"budget {args.budget:.0f} wall seconds per run. solve_convex_dp(method='dual', tol={args.tol:g}); gap = "
        "certified relative gap (fun - dual bound) / fun. Peak MB = maxrss of the run's process (G built by the "
        "benchmark included); growth / n^2 doubles = (peak - maxrss after imports and building G) / (8 n^2 bytes). "
        "eigh / svd = symmetric eigen-decompositions (of G once, then of V D V^T per evaluated point) and SVDs "
        "the solve made; CG steps = Hessian products. The machine (2 cores, 24 GB) is shared: wall seconds "
        f"include waiting for other load. {args.note}".rstrip(), "",
        *large_table(df), "",
    ]
    (RESULTS / f"{stem}.md").write_text("\n".join(md))
    print("\n".join(md))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="n up to 1024, AllRange only, conic up to 48")
    ap.add_argument("--workloads", default="all-range", help="comma list of all-range, prefix, width32")
    ap.add_argument("--sizes", default=None, help="comma list of n for ours/paper (default 128..4096)")
    ap.add_argument("--conic-sizes", default=None, help="comma list of n for the SDP (default 16,32,48,64)")
    ap.add_argument("--tol", type=float, default=1e-6, help="certified gap for ours at n >= 128")
    ap.add_argument("--budget", type=float, default=600.0, help="wall seconds per run")
    ap.add_argument("--paper-max-n", type=int, default=1024, help="largest n for the paper baseline")
    ap.add_argument("--conic-budget", type=float, default=240.0, help="wall seconds per conic run")
    ap.add_argument("--out", default=None, help="output stem under benchmarks/results/ (default "
                    "convex_dp_scaling, or convex_dp_scaling_quick with --quick)")
    ap.add_argument("--threads", type=int, default=1, help="BLAS threads per run (threadpoolctl and environment)")
    ap.add_argument("--large", action="store_true", help="ours only, one compact table (no paper, no conic)")
    ap.add_argument("--repeats", type=int, default=None, help="runs per (workload, n) with --large, median "
                    "reported (default 3 at n <= 512, 1 above)")
    ap.add_argument("--note", default="", help="sentence added to the table header (e.g. other load on the machine)")
    ap.add_argument("--child", nargs=4, metavar=("SOLVER", "WORKLOAD", "N", "TOL"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {args.repeats}")
    if args.child:
        _exec_with_threads(args.threads, sys.argv[1:] if argv is None else argv)
        s, w, n, tol = args.child
        print(json.dumps(child(s, w, int(n), float(tol), args.threads)))
        return
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    for w in workloads:
        if w not in ("all-range", "prefix", "width32"):
            raise ValueError(f"unknown workload {w!r}; expected all-range, prefix or width32")
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else list(QUICK_SIZES if args.quick else SIZES)
    conic = ([int(s) for s in args.conic_sizes.split(",") if s.strip()] if args.conic_sizes is not None
             else list(CONIC_SIZES[:3] if args.quick else CONIC_SIZES))
    if args.large:
        large_run(workloads, sizes, args, argv)
        return
    rows = []
    for w in workloads:
        for n in conic:
            rows.append(measure("ours", w, n, 1e-8, args.budget))
            for solver, tol in (("clarabel", 1e-8), ("scs", 1e-6)):
                r = measure(solver, w, n, tol, args.conic_budget)
                r["budget"] = args.conic_budget
                rows.append(r)
        for n in sizes:
            rows.append(measure("ours", w, n, args.tol, args.budget))
            if n <= args.paper_max_n:
                rows.append(measure("paper", w, n, 0.0, args.budget))
    df = pd.DataFrame(rows)
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = args.out or ("convex_dp_scaling_quick" if args.quick else "convex_dp_scaling")
    df.to_csv(RESULTS / f"{stem}.csv", index=False)
    _, lines = scaling_table(df[df.n.isin(sizes)])
    md = [
        "# (eps, delta) solver scaling: certified dual Newton vs seed 002's program vs the conic SDP", "",
        f"Command: `.venv/bin/python -m benchmarks.bench_convex_dp_scaling {' '.join(argv or sys.argv[1:])}`. "
        "One fresh subprocess per run, BLAS 1 thread; median of 3 runs at n <= 512, 1 run above; the machine "
        "(2 cores) is shared, so CPU seconds are the stable measure. ours = solve_convex_dp(method='dual', "
        f"tol={args.tol:g}); paper = seed 002's Matlab ConvexDP as printed (30-iteration cap), gap certified after "
        "the fact at d = diag(X^-1 G X^-1). Peak MB = maxrss of the run's process; growth / n^2 doubles = "
        "(peak - maxrss after imports and building G) / (8 n^2 bytes).", "",
        "## ours vs the paper baseline", "", *lines, "",
        "## Conic SDP (formulations.mm_approx) vs ours at tol 1e-8", "",
        "Clarabel at its default tolerance 1e-8, SCS at eps 1e-6; a run past its budget is stopped and "
        "recorded as budget_exceeded.", "", *conic_table(df), "",
    ]
    (RESULTS / f"{stem}.md").write_text("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
