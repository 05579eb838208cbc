"""Certified (eps, delta) strategy solver (seed 002) on HDMM's 1-D workloads, against HDMM's table.

For AllRange, Prefix and Width32 at n = 128, 256, 512, 1024 (and 2048 with --full) this runs
`solve_convex_dp` with each method ("dual": projected Newton-CG on the multipliers; "primal": the
seed's Newton-CG made convergent) to a certified relative gap --tol, and reports wall and CPU seconds
(median of 3 runs at n <= 512, 1 run above; a run that does not converge is not repeated; BLAS limited
to one thread), Newton iterations, CG products, the certified gap, and the per-query RMSE in
/work/shared/reference/README.md's convention (P = 1): RMSE = sqrt(fun / m), m = number of queries,
next to the YuanConvex and SVDB columns of HDMM's table (../shared/reference/hdmm-oned.csv relative
to the repository root) with the ratios RMSE / YuanConvex and RMSE / SVDB. The eigen-design weights
(seed 003) are solved once per row for comparison (RMSE plain and after Li & Miklau's completion).
The primal method gets a wall-clock limit (--primal-limit seconds; default 20 x the dual method's
wall time on the same row, clipped to [30, 300] s) because on singular G (Width32) it can only approach the optimum
through regularisation.

    .venv/bin/python -m benchmarks.bench_convex_dp [--full] [--methods dual,primal] [--tol 1e-6]

writes benchmarks/results/convex_dp.csv and benchmarks/results/convex_dp.md.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from dpopt.solvers.convex_dp import solve_convex_dp
from dpopt.solvers.eigen_design import solve_eigen_design
from dpopt.workloads import AllRange, Prefix, WidthK

RESULTS = Path(__file__).resolve().parent / "results"
REFERENCE = Path(__file__).resolve().parents[1] / ".." / "shared" / "reference" / "hdmm-oned.csv"
SIZES = (128, 256, 512, 1024)
FULL_SIZES = SIZES + (2048,)
WORKLOADS = ("all-range", "prefix", "width32")


def closed_form_gram(name: str, n: int) -> np.ndarray:
    """Gram matrices in closed form (0-indexed cells); WidthK from its rows."""
    i = np.arange(n)
    lo, hi = np.minimum.outer(i, i), np.maximum.outer(i, i)
    if name == "all-range":
        return ((lo + 1) * (n - hi)).astype(float)
    if name == "prefix":
        return (n - hi).astype(float)
    W = np.zeros((n - 31, n))
    for s in range(n - 31):
        W[s, s : s + 32] = 1.0
    return W.T @ W


def workload_gram(name: str, n: int) -> tuple[np.ndarray, int]:
    """(G, m) from dpopt.workloads, checked against the closed form."""
    w = {"all-range": AllRange(n), "prefix": Prefix(n), "width32": WidthK(n, 32)}[name]
    G = np.asarray(w.gram(), dtype=float)
    if not np.allclose(G, closed_form_gram(name, n), rtol=0, atol=1e-9):
        raise AssertionError(f"{name}({n}) Gram differs from its closed form")
    return G, w.shape[0]


def load_reference() -> pd.DataFrame | None:
    if not REFERENCE.exists():
        return None
    return pd.read_csv(REFERENCE).set_index(["domain", "workload"])


def timed_runs(G: np.ndarray, method: str, repeats: int, tol: float, time_limit: float | None) -> dict:
    walls, cpus, res = [], [], None
    for _ in range(repeats):
        res = solve_convex_dp(G, method=method, tol=tol, time_limit=time_limit)
        walls.append(res.wall_seconds)
        cpus.append(res.cpu_seconds)
        if not res.success:
            break
    return {
        "method": method,
        "status": res.status,
        "runs": len(walls),
        "wall_s": float(np.median(walls)),
        "cpu_s": float(np.median(cpus)),
        "nit": res.nit,
        "ninner": res.ninner,
        "gap": res.gap,
        "fun": res.fun,
        "dual_bound": res.dual_bound,
    }


def measure(
    name: str, n: int, methods: list[str], tol: float, primal_limit: float | None, ref: pd.DataFrame | None
) -> list[dict]:
    G, m = workload_gram(name, n)
    repeats = 3 if n <= 512 else 1
    t0 = time.process_time()
    eig = solve_eigen_design(G, tol=tol)
    eig_cpu = time.process_time() - t0
    yuan = svdb = np.nan
    if ref is not None and (n, name) in ref.index:
        yuan, svdb = float(ref.loc[(n, name), "YuanConvex"]), float(ref.loc[(n, name), "SVDB"])
    rows = []
    for method in methods:
        limit = None
        if method == "primal":
            dual_wall = [r["wall_s"] for r in rows if r["method"] == "dual"]
            if primal_limit is not None:
                limit = primal_limit
            else:
                limit = min(max(30.0, 20.0 * dual_wall[0]), 300.0) if dual_wall else 300.0
        row = timed_runs(G, method, repeats, tol, limit)
        rmse = float(np.sqrt(row["fun"] / m))
        row.update({
            "workload": name,
            "n": n,
            "m": m,
            "rmse": rmse,
            "rmse_dual_bound": float(np.sqrt(row["dual_bound"] / m)),
            "yuan_convex": yuan,
            "svdb_ref": svdb,
            "rmse_over_yuan": rmse / yuan,
            "rmse_over_svdb": rmse / svdb,
            "eigen_rmse": float(np.sqrt(eig.fun / m)),
            "eigen_completed_rmse": float(np.sqrt(eig.extra["completed_fun"] / m)),
            "eigen_cpu_s": eig_cpu,
        })
        rows.append(row)
        print(f"{name:9s} n={n:5d} {method:6s} {row['status']:9s} nit={row['nit']:3d} cg={row['ninner']:5d} "
              f"cpu={row['cpu_s']:8.2f}s wall={row['wall_s']:8.2f}s gap={row['gap']:.1e} rmse={rmse:.4f} "
              f"yuan={yuan:.4f} svdb={svdb:.4f}", flush=True)
    return rows


def to_markdown(df: pd.DataFrame, tol: float) -> str:
    lines = [
        "# Certified (eps, delta) strategy solver vs HDMM's 1-D table",
        "",
        f"Per-query RMSE = sqrt(trace(G X^-1) / m), P = 1, sens2 = 1; target certified gap {tol:g}. "
        "YuanConvex and SVDB from ../shared/reference/hdmm-oned.csv. Times: median of 3 runs at n <= 512, "
        "1 run above, BLAS 1 thread; the machine is shared, so CPU seconds are the stable measure.",
        "",
        "| workload | n | method | status | nit | CG | cpu s | wall s | gap | RMSE | YuanConvex | SVDB | RMSE/Yuan | RMSE/SVDB | eigen RMSE | eigen+compl. |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in df.itertuples():
        lines.append(
            f"| {r.workload} | {r.n} | {r.method} | {r.status} | {r.nit} | {r.ninner} | {r.cpu_s:.2f} | "
            f"{r.wall_s:.2f} | {r.gap:.1e} | {r.rmse:.4f} | {r.yuan_convex:.4f} | {r.svdb_ref:.4f} | "
            f"{r.rmse_over_yuan:.4f} | {r.rmse_over_svdb:.4f} | {r.eigen_rmse:.4f} | {r.eigen_completed_rmse:.4f} |"
        )
    if set(df["method"]) >= {"dual", "primal"}:
        pivot = df.pivot_table(index=["workload", "n"], columns="method", values="cpu_s")
        status = df.pivot_table(index=["workload", "n"], columns="method", values="status", aggfunc="first")
        lines += ["", "## CPU seconds to the target gap, side by side", "",
                  "| workload | n | dual cpu s | primal cpu s (status) | primal / dual |", "|---|---:|---:|---:|---:|"]
        for (w, n), r in pivot.iterrows():
            lines.append(f"| {w} | {n} | {r['dual']:.2f} | {r['primal']:.2f} ({status.loc[(w, n), 'primal']}) | "
                         f"{r['primal'] / r['dual']:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--full", action="store_true", help="also n = 2048")
    parser.add_argument("--methods", default="dual,primal", help="comma-separated: dual, primal")
    parser.add_argument("--tol", type=float, default=1e-6, help="certified relative gap target")
    parser.add_argument("--primal-limit", type=float, default=None,
                        help="wall-clock limit (s) per primal run; default 20 x dual wall in [30, 300]")
    parser.add_argument("--sizes", default=None, help="comma-separated n values (overrides --full)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else list(FULL_SIZES if args.full else SIZES)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    ref = load_reference()
    rows: list[dict] = []
    with threadpool_limits(1):
        for n in sizes:
            for name in WORKLOADS:
                rows += measure(name, n, methods, args.tol, args.primal_limit, ref)
    cols = ["workload", "n", "m", "method", "status", "runs", "nit", "ninner", "cpu_s", "wall_s", "gap", "fun",
            "dual_bound", "rmse", "rmse_dual_bound", "yuan_convex", "svdb_ref", "rmse_over_yuan", "rmse_over_svdb",
            "eigen_rmse", "eigen_completed_rmse", "eigen_cpu_s"]
    df = pd.DataFrame(rows)[cols]
    RESULTS.mkdir(parents=True, exist_ok=True)
    df.to_csv(RESULTS / "convex_dp.csv", index=False)
    (RESULTS / "convex_dp.md").write_text(to_markdown(df, args.tol))
    print(f"wrote {RESULTS / 'convex_dp.csv'} and {RESULTS / 'convex_dp.md'}")


if __name__ == "__main__":
    main()
