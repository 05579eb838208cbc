"""Unions of Kronecker products (every K-way attribute subset with a Prefix or AllRange factor on its attributes, the
total on the others): dpopt's residual Kronecker family beside QuerySmasher and ResidualPlanner+, with certified
lower bounds.

Normalisation: every number is a variance at privacy cost 1, i.e. Gaussian noise of standard deviation 1 per unit
L2 sensitivity (dpopt: P = 1, sens2(A)^2 trace(W^T W (A^T A)^+); the peers: their own objective at privacy cost 1,
ResidualPlanner's pcost = max diag(A^T Sigma^-1 A)). "sum" is the total variance over all queries, "max" the
largest per-query variance. Every value is the tool's own report; a value below the certified bound would mean
another normalisation, and the ratio column shows it.

Tools, each run in its own process with one BLAS thread (`benchmarks.child.run_module`), CPU and wall seconds
of the optimisation only (imports and workload construction excluded for dpopt; for the peers their workload
building is inside, as it is part of their optimiser's input), peak resident memory of that process:
- dpopt: `dpopt.solvers.residual_kron.optimize_residual_kron` (sum; its exact error at its exact or
  triangle-bound sensitivity) and `residual_kron_max.optimize_residual_kron_max` (max), what mm-optimal fits
  above 4096 cells and hdmm keeps when best;
- the certified bound of `dpopt.solvers.union_bound.union_lower_bound` (its CPU apart; the max rows use it
  divided by the number of queries), beside the baseline, the sum of the parts' SVD bounds;
- dense: the certified optimum over all strategies (`solve_convex_dp` on W^T W; `solve_minimax` for max) where
  the domain is small enough (--dense-max-cells);
- QuerySmasher (cmla-psu/QuerySmasherMatrixMechanism) with its convex and its Fourier solver, ResidualPlanner+
  (cmla-psu/ResidualPlannerPlus) ResPlanSum and ResPlanMax with bases P (prefix) or R (range), run by
  `benchmarks.union_peers` in a benchmark-only environment: --peers DIR (default $DPOPT_BENCH_PEERS) must
  hold venv/bin/python and src/QuerySmasherMatrixMechanism, src/ResidualPlannerPlus
  (checkouts of the public repositories; src/PROVENANCE.txt, when present, names their commits). Without it
  the peer columns are empty and the table says so. Nothing of the peers is part of dpopt.

CPU seconds are medians of --repeats runs (the values are deterministic and checked equal across runs).

    .venv/bin/python -m benchmarks.bench_union [--rows NAME,...] [--repeats 3] [--dense-max-cells 4096]

writes benchmarks/results/union.csv and benchmarks/results/union.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import pandas as pd

from benchmarks.child import checkout_commit, run_module
from benchmarks.tables import pipe_table

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_PEERS = os.environ.get("DPOPT_BENCH_PEERS", "")

#: name -> (factor, attribute sizes, orders)
ROWS: dict[str, tuple[str, list[int], list[int]]] = {
    "prefix 8^3": ("prefix", [8] * 3, [1, 2]),
    "prefix 16^3": ("prefix", [16] * 3, [1, 2]),
    "prefix 8^4": ("prefix", [8] * 4, [1, 2]),
    "prefix 32^3": ("prefix", [32] * 3, [1, 2]),
    "prefix 16^6": ("prefix", [16] * 6, [1, 2]),
    "range 8^3": ("range", [8] * 3, [1, 2]),
    "range 16^3": ("range", [16] * 3, [1, 2]),
    "range 32^3": ("range", [32] * 3, [1, 2]),
    "range 16^6": ("range", [16] * 6, [1, 2]),
    "prefix 4^8 1-3": ("prefix", [4] * 8, [1, 2, 3]),
    "range 4^8 1-3": ("range", [4] * 8, [1, 2, 3]),
    "prefix 16^4 1-3": ("prefix", [16] * 4, [1, 2, 3]),
    "range 8^5 1-3": ("range", [8] * 5, [1, 2, 3]),
    "prefix 64^3 1-3": ("prefix", [64] * 3, [1, 2, 3]),
    "range 16^4 1-3": ("range", [16] * 4, [1, 2, 3]),
    "range 64^3 1-3": ("range", [64] * 3, [1, 2, 3]),
    "prefix 64^4": ("prefix", [64] * 4, [1, 2]),
    "range 64^4": ("range", [64] * 4, [1, 2]),
    "prefix 10^8": ("prefix", [10] * 8, [1, 2]),
    "range 10^8": ("range", [10] * 8, [1, 2]),
    "prefix 10^8 1-3": ("prefix", [10] * 8, [1, 2, 3]),
}
QUICK_ROWS = ["prefix 8^3", "range 8^3"]


def _spec(factor: str, sizes: list[int], orders: list[int]) -> str:
    return f"marginals:{'x'.join(map(str, sizes))}:{','.join(map(str, orders))}:{factor}"


# -- children (this interpreter) ------------------------------------------------------------------
def child(mode: str, spec: str, time_limit: float | None) -> dict[str, object]:
    """One dpopt measurement (mode family, family-max, bound, dense, dense-max) of the workload `spec`."""
    from threadpoolctl import threadpool_limits

    from dpopt.solvers.residual_kron import UnionTerms, optimize_residual_kron
    from dpopt.solvers.residual_kron_max import optimize_residual_kron_max
    from dpopt.solvers.union_bound import union_lower_bound
    from dpopt.specs import parse_workload
    from dpopt.strategy import Strategy

    W = parse_workload(spec)
    out: dict[str, object] = {}
    with threadpool_limits(1):
        t0, c0 = time.perf_counter(), time.process_time()
        if mode in ("family", "family-max"):
            if mode == "family":
                M, res = optimize_residual_kron(W)
            else:
                M, res = optimize_residual_kron_max(W, bound=False)
            cpu, wall = time.process_time() - c0, time.perf_counter() - t0
            S = Strategy(M)
            sens2 = S.sens2
            value = S.unit_error(W) * sens2**2 if mode == "family" else res.fun * sens2**2
            out = {"value": value, "sens2": sens2, "sens_exact": M.sens_exact, "status": res.status,
                   "orthogonal": res.extra.get("orthogonal_fun"), "family_bound": res.extra.get("family_bound")}
        elif mode == "bound":
            deadline = None if time_limit is None else t0 + time_limit
            value, info = union_lower_bound(UnionTerms.of(W), deadline=deadline)
            cpu, wall = time.process_time() - c0, time.perf_counter() - t0
            parts_svd = sum(float(w) ** 2 * p.svd_bound() for w, p in zip(W.weights, W.parts, strict=True))
            out = {"value": value, "kind": info["kind"], "parts": info["parts"], "svd": info.get("svd_bound"),
                   "parts_svd": parts_svd, "m": int(W.m)}
        elif mode == "dense":
            from dpopt.solvers.convex_dp import solve_convex_dp

            res = solve_convex_dp(W.gram(), tol=1e-8, time_limit=time_limit)
            cpu, wall = time.process_time() - c0, time.perf_counter() - t0
            out = {"value": res.fun, "dual": res.dual_bound, "status": res.status}
        elif mode == "dense-max":
            from dpopt.solvers.minimax import solve_minimax

            res = solve_minimax(W, 1.0, tol=1e-6, time_limit=time_limit)
            cpu, wall = time.process_time() - c0, time.perf_counter() - t0
            out = {"value": res.fun, "dual": res.dual_bound, "status": res.status}
        else:
            raise SystemExit(f"unknown child mode {mode!r}")
    out.update(cpu=cpu, wall=wall, peak_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)
    return out


# -- the table ------------------------------------------------------------------------------------
def _run(args: list[str], budget: float, python: str | None = None, module: str = "benchmarks.bench_union"
         ) -> dict[str, object]:
    run = run_module(module, args, budget, python=python)
    if run.timed_out:
        return {"error": f"no result within {budget:.0f} s"}
    if run.returncode != 0:
        return {"error": run.last_error_line(100)}
    return json.loads(run.stdout.strip().splitlines()[-1])


def _repeated(args: list[str], budget: float, repeats: int, python: str | None = None,
              module: str = "benchmarks.bench_union") -> dict[str, object]:
    """Median CPU and wall over `repeats` runs; the value of the first (all runs must agree to 1e-9 relative)."""
    runs = [_run(args, budget, python, module) for _ in range(repeats)]
    good = [r for r in runs if "error" not in r]
    if not good:
        return runs[0]
    values = [float(r["value"]) for r in good]  # type: ignore[arg-type]
    if max(values) - min(values) > 1e-9 * abs(values[0]):
        return {"error": f"values differ across runs: {values}"}
    out = dict(good[0])
    out["cpu"] = statistics.median(float(r["cpu"]) for r in good)  # type: ignore[arg-type]
    out["wall"] = statistics.median(float(r["wall"]) for r in good)  # type: ignore[arg-type]
    out["peak_mb"] = max(float(r["peak_mb"]) for r in good)  # type: ignore[arg-type]
    out["runs"] = len(good)
    return out


def peers(folder: Path | None) -> tuple[str | None, dict[str, Path], str]:
    """The benchmark-only interpreter, the peers' source folders found in `folder`, and how they were found."""
    if folder is None:
        return None, {}, "no benchmark-only environment given (--peers or $DPOPT_BENCH_PEERS; peer columns empty)"
    python = folder / "venv" / "bin" / "python"
    found = {name: folder / "src" / repo for name, repo in
             (("qs", "QuerySmasherMatrixMechanism"), ("rpp", "ResidualPlannerPlus")) if (folder / "src" / repo).is_dir()}
    if not python.is_file() or not found:
        return None, {}, f"no benchmark-only environment with the peers at {folder} (peer columns empty)"
    prov = folder / "src" / "PROVENANCE.txt"
    how = f"peers run by {python}, imported from " + ", ".join(str(p) for p in found.values())
    if prov.is_file():
        how += "; " + "; ".join(line.strip() for line in prov.read_text().splitlines() if line.strip())
    return str(python), found, how


def measure(name: str, repeats: int, budget: float, dense_max_cells: int, peer_python: str | None,
            peer_src: dict[str, Path], bound_limit: float) -> dict[str, object]:
    factor, sizes, orders = ROWS[name]
    spec = _spec(factor, sizes, orders)
    cells = math.prod(sizes)
    print(f"{name}: {spec} ({cells} cells)", flush=True)
    row: dict[str, object] = {"workload": name, "spec": spec, "cells": cells}
    fam = _repeated(["--child", "family", spec], budget, repeats)
    famx = _repeated(["--child", "family-max", spec], budget, repeats)
    bnd = _run(["--child", "bound", spec, "--time-limit", str(bound_limit)], budget + bound_limit)
    row.update(dpopt_sum=fam.get("value"), dpopt_cpu=fam.get("cpu"), dpopt_mb=fam.get("peak_mb"),
               dpopt_orthogonal=fam.get("orthogonal"), dpopt_sens_exact=fam.get("sens_exact"),
               dpopt_max=famx.get("value"), dpopt_max_cpu=famx.get("cpu"), dpopt_max_mb=famx.get("peak_mb"),
               bound=bnd.get("value"), bound_kind=bnd.get("kind"), bound_cpu=bnd.get("cpu"),
               bound_mb=bnd.get("peak_mb"), parts_svd=bnd.get("parts_svd"), m=bnd.get("m"),
               errors="; ".join(f"{k}: {v['error']}" for k, v in (("family", fam), ("family-max", famx),
                                                                  ("bound", bnd)) if "error" in v))
    if bnd.get("value") is not None and bnd.get("m"):
        row["bound_max"] = float(bnd["value"]) / float(bnd["m"])  # type: ignore[arg-type]
    if cells <= dense_max_cells:
        dense = _run(["--child", "dense", spec, "--time-limit", str(budget)], 2 * budget)
        row.update(dense_sum=dense.get("value"), dense_dual=dense.get("dual"), dense_cpu=dense.get("cpu"))
    if cells <= min(dense_max_cells, 512):
        dmax = _run(["--child", "dense-max", spec, "--time-limit", str(budget)], 2 * budget)
        row.update(dense_max=dmax.get("value"), dense_max_dual=dmax.get("dual"), dense_max_cpu=dmax.get("cpu"))
    if peer_python is not None:
        row.update(measure_peers(name, PEER_TOOLS, repeats, budget, peer_python, peer_src))
    return row


PEER_TOOLS = ("qs-convex", "qs-fourier", "rpp-sum", "rpp-max")


def measure_peers(name: str, tools: tuple[str, ...], repeats: int, budget: float, peer_python: str,
                  peer_src: dict[str, Path]) -> dict[str, object]:
    """The peer columns of row `name` for `tools`: value, CPU, peak memory (and ResPlanMax's own claim beside its
    plan's value, `union_peers.rpp_max_plan`)."""
    factor, sizes, orders = ROWS[name]
    common = ["--sizes", "x".join(map(str, sizes)), "--orders", ",".join(map(str, orders)), "--factor", factor]
    row: dict[str, object] = {}
    for tool in tools:
        key = tool.split("-")[0]
        if key not in peer_src:
            continue
        r = _repeated(["--tool", tool, "--src", str(peer_src[key]), *common], budget, repeats, peer_python,
                      "benchmarks.union_peers")
        col = tool.replace("-", "_")
        row[col] = r.get("value")
        row[f"{col}_cpu"] = r.get("cpu")
        row[f"{col}_mb"] = r.get("peak_mb")
        row[f"{col}_error"] = r.get("error")
        if tool == "rpp-max":
            row["rpp_max_claimed"] = r.get("claimed")
            row["rpp_max_plan_cost"] = r.get("plan_cost")
    return row


def _ratio(a: object, b: object) -> float:
    try:
        return float(a) / float(b)  # type: ignore[arg-type]
    except (TypeError, ValueError, ZeroDivisionError):
        return math.nan


def tables(df: pd.DataFrame, how: str, args: argparse.Namespace) -> str:
    """The markdown report: the sum table, the max table and the CPU and memory table."""
    d = df.copy()
    for c in d.columns:  # columns written by --remeasure hold Python objects: numbers again where all are numbers
        if d[c].dtype == object:
            num = pd.to_numeric(d[c], errors="coerce")
            if int(num.notna().sum()) == int(d[c].notna().sum()):
                d[c] = num
    for c in ("qs_convex", "qs_fourier", "rpp_sum", "rpp_max", "dense_sum", "dense_max", "qs_convex_cpu", "bound_max"):
        if c not in d:
            d[c] = math.nan
    d["qs_best"] = d[["qs_convex", "qs_fourier"]].min(axis=1)
    d["dpopt/QS"] = [_ratio(a, b) for a, b in zip(d.dpopt_sum, d.qs_best, strict=True)]
    d["dpopt/RP+"] = [_ratio(a, b) for a, b in zip(d.dpopt_sum, d.rpp_sum, strict=True)]
    for c in ("dpopt_sum", "qs_convex", "qs_fourier", "rpp_sum", "dense_sum", "parts_svd"):
        d[f"{c}/bound"] = [_ratio(a, b) for a, b in zip(d[c], d.bound, strict=True)]
    d["parts_svd/bound"] = [_ratio(b, a) for a, b in zip(d.parts_svd, d.bound, strict=True)]
    d["cpu dpopt/QS convex"] = [_ratio(a, b) for a, b in zip(d.dpopt_cpu, d.qs_convex_cpu,
                                                              strict=True)]
    d["max dpopt/RP+"] = [_ratio(a, b) for a, b in zip(d.dpopt_max, d.rpp_max, strict=True)]
    for c in ("dpopt_max", "rpp_max", "dense_max"):
        d[f"{c}/bound"] = [_ratio(a, b) for a, b in zip(d[c], d.bound_max, strict=True)]
    sum_cols = ["workload", "cells", "dpopt_sum", "qs_convex", "qs_fourier", "rpp_sum", "dense_sum", "bound",
                "dpopt/QS", "dpopt/RP+", "dpopt_sum/bound", "qs_convex/bound", "qs_fourier/bound", "rpp_sum/bound",
                "dense_sum/bound", "parts_svd/bound", "bound_kind"]
    d["rpp_max_claimed/bound"] = [_ratio(a, b) for a, b in zip(d.get("rpp_max_claimed", pd.Series(math.nan,
                                                                                               index=d.index)),
                                                                d.bound_max, strict=True)]
    max_cols = ["workload", "dpopt_max", "rpp_max", "rpp_max_claimed", "dense_max", "bound_max", "max dpopt/RP+",
                "dpopt_max/bound", "rpp_max/bound", "rpp_max_claimed/bound", "dense_max/bound"]
    cpu_cols = ["workload", "commit", "runs", "dpopt_cpu", "qs_convex_cpu", "qs_fourier_cpu", "rpp_sum_cpu", "cpu dpopt/QS convex",
                "dpopt_max_cpu", "rpp_max_cpu", "bound_cpu", "dense_cpu", "dpopt_mb", "qs_convex_mb", "rpp_sum_mb",
                "bound_mb"]
    for c in cpu_cols + max_cols:
        if c not in d:
            d[c] = math.nan
    notes = [f"- {r.workload}: {r.errors}" for r in d.itertuples() if isinstance(r.errors, str) and r.errors]
    for c in [c for c in d.columns if c.endswith("_error")]:
        notes += [f"- {w}: {c[:-6]}: {e}" for w, e in zip(d.workload, d[c], strict=True) if isinstance(e, str)]
    return "\n".join([
        "# Unions of Kronecker products: dpopt's residual Kronecker family, QuerySmasher, ResidualPlanner+",
        "",
        f"`python -m benchmarks.bench_union {' '.join(sys.argv[1:])}` at commit {checkout_commit()} (with --append, rows of earlier runs are kept: each row's `commit` and `runs`)",
        "",
        "Variances at privacy cost 1 (Gaussian sigma 1 per unit L2 sensitivity); sum = total over all queries,",
        "max = largest per-query variance. bound: the certified lower bound on every strategy's value",
        "(`dpopt.solvers.union_bound`; max rows: the sum bound / m). QS: QuerySmasher (convex, Fourier); RP+:",
        "ResidualPlanner+ (ResPlanSum, ResPlanMax). parts_svd/bound: the sum of the parts' SVD bounds over the",
        "certified bound (the baseline it replaces). A ratio to the bound below 1 means the tool reports a value",
        "no strategy reaches at privacy cost 1: its variance model is not that of its mechanism. CPU seconds:",
        "medians of each row's `runs` runs, one BLAS thread, optimisation only.",
        "rpp_max is ResPlanMax's plan scored as a mechanism (`benchmarks.union_peers.rpp_max_plan`): its own",
        "per-query variances, which are those of i.i.d. noise on each residual measurement R x, at the exact privacy",
        "cost of that noise (max diag R^T R per attribute); rpp_max_claimed is its own report, which charges R the",
        "cost max diag R^T (R R^T)^-1 R of correlated noise instead. The claim is not reachable: on one attribute,",
        "prefix sums over 64 values, ResPlanMax claims 3.78 where no strategy is below 4.458 (`solve_minimax`,",
        "certified), and its plan's value is 7.53. QuerySmasher optimises the total only (no max rows).",
        f"{how}.",
        "",
        "## Total variance (sum)",
        "",
        pipe_table(d, sum_cols),
        "",
        "## Largest per-query variance (max)",
        "",
        pipe_table(d, max_cols),
        "",
        "## CPU seconds and peak memory (MB)",
        "",
        pipe_table(d, cpu_cols),
        "",
        *(["## Runs without a value", "", *notes, ""] if notes else []),
    ])


def remeasure(a: argparse.Namespace, names: list[str], repeats: int, python: str | None, src: dict[str, Path],
              how: str) -> int:
    """Re-run the peer tools of --remeasure in the named rows of results/OUT.csv; every other column is kept."""
    tools = tuple(t.strip() for t in a.remeasure.split(",") if t.strip())
    bad = [t for t in tools if t not in PEER_TOOLS]
    if bad or not tools:
        raise SystemExit(f"--remeasure: unknown tools {bad}; expected some of {', '.join(PEER_TOOLS)}")
    path = RESULTS / f"{a.out}.csv"
    if python is None or not path.is_file():
        raise SystemExit(f"--remeasure needs the peers' environment and {path}: {how}")
    df = pd.read_csv(path)
    missing = [n for n in names if n not in set(df.workload)]
    if missing:
        raise SystemExit(f"--remeasure: rows {missing} are not in {path}; measure them first")
    for name in names:
        print(f"{name}: {', '.join(tools)}", flush=True)
        for col, value in {**measure_peers(name, tools, repeats, a.budget, python, src),
                           f"{'_'.join(tools).replace('-', '_')}_commit": checkout_commit()}.items():
            if col not in df:
                df[col] = None
            df[col] = df[col].astype(object)
            df.loc[df.workload == name, col] = value
        df.to_csv(path, index=False)
        (RESULTS / f"{a.out}.md").write_text(tables(df, how, a) + "\n")
    print((RESULTS / f"{a.out}.md").read_text())
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", nargs=2, metavar=("MODE", "SPEC"), help=argparse.SUPPRESS)
    p.add_argument("--time-limit", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--rows", default=",".join(ROWS), help="comma-separated row names (default all)")
    p.add_argument("--quick", action="store_true", help=f"rows {', '.join(QUICK_ROWS)}, one run each")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--budget", type=float, default=900.0, help="seconds per child run")
    p.add_argument("--bound-limit", type=float, default=600.0, help="seconds for each certified bound")
    p.add_argument("--dense-max-cells", type=int, default=512, help="largest domain for the dense optimum")
    p.add_argument("--peers", type=Path, default=Path(DEFAULT_PEERS) if DEFAULT_PEERS else None)
    p.add_argument("--out", default="union")
    p.add_argument("--append", action="store_true", help="keep the rows of results/OUT.csv that this run does not measure")
    p.add_argument("--remeasure", default=None, metavar="TOOLS",
                   help=f"only re-run these peer tools (some of {','.join(PEER_TOOLS)}) in the --rows of results/OUT.csv, "
                        "keeping the rest of each row")
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child[0], a.child[1], a.time_limit)))
        return 0
    names = QUICK_ROWS if a.quick else [r.strip() for r in a.rows.split(",") if r.strip()]
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        raise SystemExit(f"--rows: unknown rows {unknown}; expected some of {', '.join(ROWS)}")
    repeats = 1 if a.quick else a.repeats
    python, src, how = peers(a.peers)
    print(how, flush=True)
    if a.remeasure is not None:
        return remeasure(a, names, repeats, python, src, how)
    kept = pd.DataFrame()
    if a.append and (RESULTS / f"{a.out}.csv").is_file():
        kept = pd.read_csv(RESULTS / f"{a.out}.csv")
        kept = kept[~kept.workload.isin(names)]
    rows = []
    for name in names:
        rows.append({**measure(name, repeats, a.budget, a.dense_max_cells, python, src, a.bound_limit),
                     "commit": checkout_commit(), "runs": repeats})
        df = pd.concat([kept, pd.DataFrame(rows)], ignore_index=True)
        order = {n: i for i, n in enumerate(ROWS)}
        df = df.sort_values("workload", key=lambda c: c.map(order), kind="stable").reset_index(drop=True)
        RESULTS.mkdir(parents=True, exist_ok=True)
        df.to_csv(RESULTS / f"{a.out}.csv", index=False)
        (RESULTS / f"{a.out}.md").write_text(tables(df, how, a) + "\n")
    print((RESULTS / f"{a.out}.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
