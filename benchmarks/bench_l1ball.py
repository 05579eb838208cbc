"""Column-wise L1-ball projection: Michelot's pivot iteration against the sort-based rule.

`dpopt.solvers.l1ball.project_l1_ball_columns` is called in every Nesterov step of LRM's L-step
(seed 000, Algorithm 2) on an r x n matrix. This times both methods on the shapes LRM meets
(r = 1.2 m for m = 52..1024 queries, n = 1024 or 4096 cells) and three kinds of input:

- gaussian: N(0, 1) entries, columns far outside the unit ball;
- near_sphere: Gaussian columns rescaled to L1 norm 1.01 (a small step off the sphere);
- lrm_like: columns on the unit sphere supported on 30% of the rows, plus N(0, (0.5 / r)^2) noise,
  a stand-in for S - grad / omega late in an LRM run.

Every timing is the median of `--repeats` runs (the two methods interleaved), BLAS limited to one
thread; wall = time.perf_counter, CPU = time.process_time. speedup = sort / michelot (CPU).
max_diff is the largest entry-wise difference between the two results.

With --lrm it also runs `solve_lrm(WRange(128, 512, seed=0).matrix(), seed=0)` once per method (the
projection inside dpopt.solvers.lrm switched by patching its module name; about a minute of CPU
each) and reports CPU, the CPU spent in the projection, and the final objective. The objectives
need not agree: LRM is a non-convex method and rounding-level differences in thousands of
L-steps can lead it to a different stationary point.

    .venv/bin/python -m benchmarks.bench_l1ball [--repeats 7] [--quick] [--lrm]

writes benchmarks/results/l1ball.md.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from unittest import mock

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

import dpopt.solvers.lrm as lrm_module
from benchmarks.tables import pipe_table
from dpopt.solvers.l1ball import METHODS, project_l1_ball_columns
from dpopt.workloads import WRange

RESULTS = Path(__file__).resolve().parent / "results"
SHAPES = ((62, 1024), (308, 1024), (308, 4096), (1229, 1024))
KINDS = ("gaussian", "near_sphere", "lrm_like")


def make_input(kind: str, r: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """An (r, n) input of the given kind (see the module docstring)."""
    V = rng.normal(size=(r, n))
    if kind == "gaussian":
        return V
    if kind == "near_sphere":
        return V * (1.01 / np.abs(V).sum(axis=0))
    if kind == "lrm_like":
        V *= rng.random((r, n)) < 0.3
        V /= np.maximum(np.abs(V).sum(axis=0), 1e-300)
        return V + rng.normal(scale=0.5 / r, size=(r, n))
    raise ValueError(f"kind must be one of {KINDS}; got {kind!r}")


def time_methods(V: np.ndarray, repeats: int) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) seconds of each method on V over `repeats` interleaved runs."""
    walls: dict[str, list[float]] = {"sort": [], "michelot": []}
    cpus: dict[str, list[float]] = {"sort": [], "michelot": []}
    for _ in range(repeats):
        for method in walls:
            t0, c0 = time.perf_counter(), time.process_time()
            project_l1_ball_columns(V, method=method)
            walls[method].append(time.perf_counter() - t0)
            cpus[method].append(time.process_time() - c0)
    return {m: (float(np.median(walls[m])), float(np.median(cpus[m]))) for m in walls}


def run(repeats: int, quick: bool) -> pd.DataFrame:
    shapes = SHAPES[:2] if quick else SHAPES
    rows = []
    with threadpool_limits(1):
        for r, n in shapes:
            for kind in KINDS:
                V = make_input(kind, r, n, np.random.default_rng([r, n, KINDS.index(kind)]))
                P = project_l1_ball_columns(V, method="michelot")
                S = project_l1_ball_columns(V, method="sort")
                t = time_methods(V, repeats)
                rows.append({
                    "r": r, "n": n, "input": kind,
                    "outside_frac": float(np.mean(np.abs(V).sum(axis=0) > 1.0)),
                    "sort_wall_ms": 1e3 * t["sort"][0], "michelot_wall_ms": 1e3 * t["michelot"][0],
                    "sort_cpu_ms": 1e3 * t["sort"][1], "michelot_cpu_ms": 1e3 * t["michelot"][1],
                    "speedup_wall": t["sort"][0] / t["michelot"][0],
                    "speedup_cpu": t["sort"][1] / t["michelot"][1],
                    "max_diff": float(np.abs(P - S).max()),
                })
    return pd.DataFrame(rows)


def run_lrm(m: int = 128, n: int = 512) -> pd.DataFrame:
    """solve_lrm on WRange(m, n, seed=0) once per projection method: CPU, projection CPU, objective."""
    W = WRange(m, n, seed=0).matrix()
    rows = []
    for method in METHODS:
        spent = [0.0, 0]

        def timed(V: np.ndarray, radius: float = 1.0, _method: str = method, _spent: list = spent) -> np.ndarray:
            c0 = time.process_time()
            out = project_l1_ball_columns(V, radius, method=_method)
            _spent[0] += time.process_time() - c0
            _spent[1] += 1
            return out

        with threadpool_limits(1), mock.patch.object(lrm_module, "project_l1_ball_columns", timed):
            t0, c0 = time.perf_counter(), time.process_time()
            res = lrm_module.solve_lrm(W, seed=0)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        rows.append({"workload": f"WRange({m},{n},seed=0)", "method": method, "lrm_wall_s": wall,
                     "lrm_cpu_s": cpu, "projection_cpu_s": spent[0], "projection_calls": spent[1],
                     "status": res.status, "nit": res.nit, "fun": res.fun})
    return pd.DataFrame(rows)


def write(table: pd.DataFrame, repeats: int, lrm_table: pd.DataFrame | None = None) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    lines = [
        "# Column-wise L1-ball projection: Michelot pivot vs sort-based (Duchi et al. 2008)",
        "",
        f"Median of {repeats} interleaved runs per cell, BLAS 1 thread, radius 1. speedup = sort / michelot;",
        "max_diff = max |michelot - sort| over all entries. Inputs: see benchmarks/bench_l1ball.py.",
        "",
        pipe_table(table, list(table.columns)),
        "",
    ]
    if lrm_table is not None:
        lines += [
            "## End to end: solve_lrm(WRange(128, 512, seed=0).matrix(), seed=0), one run per method",
            "",
            pipe_table(lrm_table, list(lrm_table.columns)),
            "",
        ]
    (RESULTS / "l1ball.md").write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per method and input")
    parser.add_argument("--quick", action="store_true", help="only the two smallest shapes")
    parser.add_argument("--lrm", action="store_true", help="also time solve_lrm end to end (minutes)")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    table = run(args.repeats, args.quick)
    write(table, args.repeats, run_lrm() if args.lrm else None)
    print((RESULTS / "l1ball.md").read_text())


if __name__ == "__main__":
    main()
