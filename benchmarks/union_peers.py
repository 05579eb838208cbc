"""One peer measurement for `benchmarks.bench_union`, run by the benchmark-only interpreter that has the peers.

Not part of dpopt and never imports it: it imports QuerySmasher (cmla-psu/QuerySmasherMatrixMechanism, modules
`query` and `smasher`) or ResidualPlanner+ (cmla-psu/ResidualPlannerPlus, package `resplan`) from the source
folder given by --src, builds the union (every K-way subset with a Prefix or AllRange factor on its attributes,
the total on the others), runs the tool's own optimiser (ResPlanMax's convex model with Clarabel, not the Gurobi its
cvxpy call would pick, whose size-limited licence refuses the larger rows) and prints one JSON line: the tool's own objective
value (its total or largest per-query variance at privacy cost 1, i.e. Gaussian sigma 1 per unit L2
sensitivity), CPU and wall seconds of the optimisation, and the process's peak resident memory.

    VENV/bin/python -m benchmarks.union_peers --tool qs-convex --src DIR --sizes 8x8x8 --orders 1,2 --factor prefix
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import resource
import sys
import time
from itertools import combinations

import numpy as np

TOOLS = ("qs-convex", "qs-fourier", "rpp-sum", "rpp-max")


def factor_rows(n: int, factor: str) -> np.ndarray:
    """Prefix (lower-triangular ones) or all ranges [i, j], i <= j, ordered by (i, j)."""
    if factor == "prefix":
        return np.tril(np.ones((n, n)))
    rows = []
    for i in range(n):
        for j in range(i, n):
            r = np.zeros(n)
            r[i:j + 1] = 1.0
            rows.append(r)
    return np.array(rows)


def run_qs(src: str, solver: str, sizes: list[int], subsets: list[tuple[int, ...]], factor: str) -> tuple[float, float, float]:
    """QuerySmasher's total variance (`Smasher.workload_variance`) with default solver `solver`, and the CPU and
    wall seconds from building its workload to that value (imports excluded)."""
    sys.path.insert(0, src)
    import torch
    from query import KronQuery, MatrixQuery
    from smasher import Smasher

    torch.set_num_threads(1)
    t0, c0 = time.perf_counter(), time.process_time()
    qs = Smasher(sizes, privacy_cost=1.0, default_solver=solver, noise=False, verbose=False)
    for S in subsets:
        Fs = [factor_rows(sizes[i], factor) for i in S]
        qs.add_queries_to_workload([MatrixQuery(sizes, S, Fs[0]) if len(S) == 1 else KronQuery(sizes, S, Fs)])
    qs.optimize()
    value = float(qs.workload_variance())
    return value, time.process_time() - c0, time.perf_counter() - t0


def run_rpp(src: str, objective: str, sizes: list[int], subsets: list[tuple[int, ...]],
            factor: str) -> tuple[float, float, float]:
    """ResidualPlanner+'s objective value: ResPlanSum's total or ResPlanMax's largest variance (bases P or R), and
    the CPU and wall seconds of building and solving it (imports excluded)."""
    sys.path.insert(0, src)
    sys.argv = sys.argv[:1]  # resplan.softmax parses the command line when ResPlanMax runs
    from resplan import ResPlanMax, ResPlanSum

    if objective == "max":  # ResPlanMax's cvxpy model would go to Gurobi, whose size-limited licence refuses
        import cvxpy as cp  # the larger rows; Clarabel (installed with cvxpy) solves the same model

        solve = cp.Problem.solve
        cp.Problem.solve = lambda self, *a, **k: solve(self, *a, **{"solver": cp.CLARABEL, **k})
    t0, c0 = time.perf_counter(), time.process_time()
    bases = ["P" if factor == "prefix" else "R"] * len(sizes)
    system = (ResPlanSum if objective == "sum" else ResPlanMax)(sizes, bases)
    for S in subsets:
        system.input_mech(S)
    value = float(system.get_noise_level())
    return value, time.process_time() - c0, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tool", choices=TOOLS, required=True)
    p.add_argument("--src", required=True, help="the tool's source folder (a checkout of its public repository)")
    p.add_argument("--sizes", required=True, help="N1xN2x...")
    p.add_argument("--orders", required=True, help="K,K,...")
    p.add_argument("--factor", choices=("prefix", "range"), required=True)
    a = p.parse_args(argv)
    sizes = [int(s) for s in a.sizes.split("x")]
    subsets = [S for k in sorted(int(k) for k in a.orders.split(",")) for S in combinations(range(len(sizes)), k)]
    with contextlib.redirect_stdout(io.StringIO()):  # the tools print progress; stdout carries the JSON line
        if a.tool.startswith("qs"):
            value, cpu, wall = run_qs(a.src, a.tool.split("-")[1], sizes, subsets, a.factor)
        else:
            value, cpu, wall = run_rpp(a.src, a.tool.split("-")[1], sizes, subsets, a.factor)
    out = {"tool": a.tool, "value": value, "cpu": cpu, "wall": wall,
           "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
