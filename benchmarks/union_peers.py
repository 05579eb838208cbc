"""One peer measurement for `benchmarks.bench_union`, run by the benchmark-only interpreter that has the peers.

Not part of dpopt and never imports it: it imports QuerySmasher (cmla-psu/QuerySmasherMatrixMechanism, modules
`query` and `smasher`) or ResidualPlanner+ (cmla-psu/ResidualPlannerPlus, package `resplan`) from the source
folder given by --src, builds the union (every K-way subset with a Prefix or AllRange factor on its attributes,
the total on the others), runs the tool's own optimiser (ResPlanMax's convex model with Clarabel, not the Gurobi its
cvxpy call would pick, whose size-limited licence refuses the larger rows) and prints one JSON line: the tool's own objective
value (its total or largest per-query variance at privacy cost 1, i.e. Gaussian sigma 1 per unit L2
sensitivity), CPU and wall seconds of the optimisation, and the process's peak resident memory. For ResPlanMax the
value is its plan scored as a mechanism (`rpp_max_plan`: its own variances at the exact privacy cost of the noise
they assume) and its own report is `claimed`: that report charges less than the plan's privacy cost (on one
attribute, prefix sums over 64 values, it reports 3.78, below the 4.458 that no strategy beats at privacy cost 1).

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
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    if objective == "max":
        value = {"claimed": value, **rpp_max_plan(system, sizes)}
    return value, cpu, wall


def plan_privacy_cost(noise: dict[tuple[int, ...], float], col_max: list[float]) -> float:
    """Exact privacy cost (squared L2 sensitivity) of independent Gaussian measurements, one per attribute subset S:
    (kron_{a in S} R_a kron_{a not in S} 1^T) x + N(0, noise[S] I). Column `cell` of measurement S has squared norm
    prod_{a in S} diag(R_a^T R_a)[cell_a], so the cost max_cell sum_S prod_{a in S} diag(R_a^T R_a)[cell_a] / noise[S]
    is a sum of non-negative terms each increasing in every diagonal entry: its maximum over cells takes every
    attribute's largest entry, col_max[a] = max diag(R_a^T R_a)."""
    return float(sum(np.prod([col_max[a] for a in S]) / v for S, v in noise.items()))


def rpp_max_plan(system, sizes: list[int]) -> dict[str, float]:
    """ResPlanMax's plan (prefix bases) scored as a mechanism. Its per-query variances (`var_res` = ||q R^+||^2, `var_sum`) are
    those of i.i.d. noise N(0, noise_level I) on each residual measurement R x, but it charges each R the privacy
    cost max diag(R^T (R R^T)^-1 R) of correlated noise N(0, noise_level R R^T) (the noise its `measure` adds),
    which is below R's true cost max diag(R^T R) unless R's rows are orthonormal. Here its variances are kept and
    the privacy cost of i.i.d. noise is charged exactly (`plan_privacy_cost`); variances at privacy cost 1 scale
    with the cost, so the plan's largest per-query variance at privacy cost 1 is max_query variance times it."""
    # the reading of its variances: i.i.d. noise on R x, answers through R^+. Both sides come from the same R (its
    # optimiser's own factor and our pseudo-inverse of it), so they differ by round-off only; 1e-6 is far above
    # that and far below the factor > 1.1 between the two noise models' variances
    for a, n in enumerate(sizes):
        iid = np.sum((factor_rows(n, "prefix") @ system.residual_pinv[n]) ** 2, axis=1)
        if not np.allclose(system.var_res[a], iid, rtol=1e-6, atol=1e-9 * float(iid.max())):
            raise SystemExit(f"ResPlanMax's variances on attribute {a} are not those of i.i.d. noise on R x")
    noise = {S: float(system.res_dict[S].noise_level) for S in system.res_index}
    col_max = [float(np.max(np.sum(system.residual_matrix[n] ** 2, axis=0))) for n in sizes]
    claimed_cost = float(sum(system.pcost_coeff[S] / v for S, v in noise.items()))
    _, A, _ = system.output_coeff()
    sigma2 = np.array([noise[system.id2res[i]] for i in range(system.num_of_res)])
    max_var = float(np.max(A @ sigma2))
    cost = plan_privacy_cost(noise, col_max)
    return {"value": max_var * cost / claimed_cost, "claimed_cost": claimed_cost, "plan_cost": cost,
            "claimed_max_var": max_var}


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
    extra = value if isinstance(value, dict) else {"value": value}
    out = {"tool": a.tool, **extra, "cpu": cpu, "wall": wall,
           "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
