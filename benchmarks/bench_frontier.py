"""The eps-DP frontier: full-strategy L1 optimisation (`dpopt.solvers.l1_strategy`) against HDMM's OPT_0.

For AllRange(n) and Prefix(n) at each size:

- OPT_0: the best p-Identity strategy (`optimize_pidentity`, p = n / 16, --restarts seeded L-BFGS-B runs,
  as HDMM's OPT_0), with a wall budget of --opt0-limit seconds;
- frontier: `optimize_l1_strategy` over every entry of a signed strategy, started from OPT_0's strategy,
  hierarchical and the Haar wavelet (the baselines that have full column rank and are not a stationary
  point: identity is one), best of the runs, with a wall budget of --frontier-limit seconds;
- the tightest valid lower bound under eps-DP: the certified dual bound of the (eps, delta) problem
  min trace(G X^+) over diag(X) <= 1 (`certified_l2_bound`; sens1 >= sens2 makes it an eps-DP bound).

Errors are per unit of 2/eps^2 (sens1 = 1): trace(G (A^T A)^{-1}). The identity strategy's error trace(G)
is listed for scale. Each configuration runs once (the frontier runs for minutes and is deterministic
given its starts; CPU seconds are reported beside wall seconds, one BLAS thread).

    .venv/bin/python -m benchmarks.bench_frontier [--sizes 64,256,1024,2048] [--append] [--out frontier]

writes benchmarks/results/frontier.csv and benchmarks/results/frontier.md.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from dpopt.baselines import hierarchical_strategy, wavelet_strategy
from dpopt.bounds import certified_l2_bound
from dpopt.solvers.l1_strategy import optimize_l1_strategy
from dpopt.solvers.pidentity import optimize_pidentity, pidentity_matrix
from dpopt.workloads import AllRange, Prefix

RESULTS = Path(__file__).resolve().parent / "results"
MAKE = {"all-range": AllRange, "prefix": Prefix}
START_NAMES = ("OPT_0", "hierarchical", "wavelet")


def timed(fn, *args, **kwargs):
    """fn(*args, **kwargs) with its wall and CPU seconds."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0, time.process_time() - c0


def run(name: str, n: int, args: argparse.Namespace) -> dict:
    """One row: OPT_0, the frontier from its starts, and the certified bound, for workload `name` at n cells."""
    w = MAKE[name](n)
    G = w.gram()
    p = max(1, n // 16)
    opt0, opt0_wall, opt0_cpu = timed(optimize_pidentity, G, p, restarts=args.restarts, seed=0,
                                      deadline=time.perf_counter() + args.opt0_limit)
    starts = [pidentity_matrix(opt0.x), hierarchical_strategy(n).A.toarray(), wavelet_strategy(n).A.toarray()]
    limit = args.frontier_limit if n > 256 else min(args.frontier_limit, args.small_limit)
    fr, fr_wall, fr_cpu = timed(optimize_l1_strategy, G, starts, time_limit=limit)
    (bound, kind), b_wall, b_cpu = timed(certified_l2_bound, w, time_limit=args.bound_limit, max_cells=max(n, 1024))
    runs = fr.extra["run_errors"]
    best_start = START_NAMES[int(np.argmin(runs))]
    return {
        "workload": name, "n": n, "p": p, "restarts": args.restarts,
        "identity_error": float(np.trace(G)),
        "opt0_error": opt0.fun, "opt0_status": opt0.status, "opt0_restarts_run": opt0.extra["restarts_run"], "opt0_wall_s": opt0_wall, "opt0_cpu_s": opt0_cpu,
        "frontier_error": fr.fun, "frontier_status": fr.status, "frontier_wall_s": fr_wall, "frontier_cpu_s": fr_cpu,
        "frontier_runs": fr.extra["runs"], "best_start": best_start,
        **{f"from_{s}": (runs[i] if i < len(runs) else np.nan) for i, s in enumerate(START_NAMES)},
        "bound": bound, "bound_kind": kind, "bound_cpu_s": b_cpu,
        "frontier_over_opt0": fr.fun / opt0.fun,
        "opt0_over_bound": opt0.fun / bound, "frontier_over_bound": fr.fun / bound,
    }


def write(rows: list[dict], args: argparse.Namespace) -> None:
    """The CSV and a markdown table of the main columns."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    df = pd.DataFrame(rows)
    df.to_csv(RESULTS / f"{args.out}.csv", index=False)
    cols = ["workload", "n", "opt0_error", "opt0_status", "opt0_restarts_run", "opt0_cpu_s", "frontier_error", "frontier_status",
            "frontier_cpu_s", "best_start", "frontier_over_opt0", "bound", "bound_kind", "opt0_over_bound",
            "frontier_over_bound"]
    with open(RESULTS / f"{args.out}.md", "w") as f:
        f.write("# The eps-DP frontier: full-strategy L1 optimisation against OPT_0 (benchmarks/bench_frontier.py)\n\n")
        f.write(
            f"Errors per unit of 2/eps^2 (sens1 = 1). OPT_0: p-Identity, p = n/16, {args.restarts} restarts, "
            f"budget {args.opt0_limit:g} s. Frontier: `optimize_l1_strategy` from OPT_0, hierarchical and wavelet, "
            f"budget {args.small_limit:g} s at n <= 256 and {args.frontier_limit:g} s above. Bound: certified "
            "dual bound of min trace(G X^+) over diag(X) <= 1, valid under eps-DP. One BLAS thread, one run each; "
            "CPU seconds.\n\n")
        f.write(df[cols].to_markdown(index=False, floatfmt=".6g") + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="64,256,1024,2048")
    ap.add_argument("--workloads", default="all-range,prefix")
    ap.add_argument("--restarts", type=int, default=4)
    ap.add_argument("--opt0-limit", type=float, default=600.0, help="wall seconds for OPT_0's restarts")
    ap.add_argument("--frontier-limit", type=float, default=600.0, help="wall seconds for the frontier above n = 256")
    ap.add_argument("--small-limit", type=float, default=240.0, help="wall seconds for the frontier at n <= 256")
    ap.add_argument("--bound-limit", type=float, default=600.0, help="wall seconds for the certified bound's solver")
    ap.add_argument("--append", action="store_true", help="keep the rows already in results/OUT.csv")
    ap.add_argument("--out", default="frontier", help="results/OUT.csv and results/OUT.md (default frontier)")
    args = ap.parse_args()
    rows: list[dict] = []
    if args.append and (RESULTS / f"{args.out}.csv").exists():
        rows = pd.read_csv(RESULTS / f"{args.out}.csv").to_dict("records")
    with threadpool_limits(limits=1, user_api="blas"):
        for n in (int(s) for s in args.sizes.split(",")):
            for name in args.workloads.split(","):
                print(f"{name} n={n} ...", flush=True)
                rows.append(run(name, n, args))
                r = rows[-1]
                print(f"  OPT_0 {r['opt0_error']:.6g} ({r['opt0_cpu_s']:.0f} s CPU), frontier {r['frontier_error']:.6g} "
                      f"({r['frontier_cpu_s']:.0f} s CPU, {r['frontier_status']}, from {r['best_start']}), "
                      f"ratio {r['frontier_over_opt0']:.5f}, bound {r['bound']:.6g}", flush=True)
                write(rows, args)


if __name__ == "__main__":
    main()
