"""The AllRange / Prefix / Width32 ladder through `dpopt compare`, under eps-DP and (eps, delta): every fitted row reports.

For each workload and size (default n = 256, 512, 1024, 2048) and each privacy model (eps = 1; eps = 1 with
delta = 1e-6), one `compare` run of --mechanisms (default hdmm and the four baselines; `all` for every mechanism)
with compare's default time limit per mechanism, in its own child process at one BLAS thread. --extra adds eps-DP
rows of other specs (default prefix:4096 and wrange:2000x4096, 2000 seeded random ranges over 4096 cells).

Columns per mechanism row: expected total error, ratio to the bound and its kind, status, the fit's wall seconds;
per compare run: its wall and CPU seconds, peak RSS and the load average when it ended. `after_fit` counts rows
skipped with a reason other than a refusal before the fit (too many cells for a dense strategy, rows that cannot
be listed, an estimate above the time limit): a mechanism that fitted must report its row, so it must be 0.

    .venv/bin/python -m benchmarks.bench_hdmm_ladder [--sizes 256,512,1024,2048] [--mechanisms hdmm,...] [--append]

writes benchmarks/results/hdmm_ladder.csv and benchmarks/results/hdmm_ladder.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

import pandas as pd

from benchmarks.child import checkout_commit, run_module
from benchmarks.tables import pipe_table

RESULTS = Path(__file__).resolve().parent / "results"
FAMILIES = {"all-range": "allrange:{n}", "prefix": "prefix:{n}", "width32": "width:{n}:32"}
PRIVACY = {"eps": (1.0, 0.0), "eps-delta": (1.0, 1e-6)}
DEFAULT_MECHANISMS = "hdmm,identity,laplace,hierarchical,wavelet"
DEFAULT_EXTRA = "prefix:4096,wrange:2000x4096"
# Reasons a mechanism gives before it fits anything (the workload's size or the estimate of its cost).
BEFORE_FIT = ("too many for a dense strategy", "cannot be materialised", "cannot materialise", "would take about",
              "does not apply", "known only through its Gram")


def one(spec: str, privacy: str, mechanisms: str) -> list[dict]:
    """One compare run, in this process: its rows with the run's wall and CPU seconds and peak RSS."""
    from threadpoolctl import threadpool_limits

    from dpopt.compare import DEFAULT_TIME_LIMIT, compare
    from dpopt.privacy import Privacy
    from dpopt.specs import parse_workload

    eps, delta = PRIVACY[privacy]
    names = None if mechanisms == "all" else mechanisms.split(",")
    t0, c0 = time.perf_counter(), time.process_time()
    with threadpool_limits(1):
        df = compare(parse_workload(spec), Privacy(eps, delta), names, time_limit=DEFAULT_TIME_LIMIT)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    out = []
    for rec in df.to_dict("records"):
        status = str(rec.get("status"))
        skipped = status.startswith("skipped:")
        out.append({
            "spec": spec, "privacy": privacy, "mechanism": rec["mechanism"],
            "expected_total_error": rec.get("expected_total_error"), "ratio_to_bound": rec.get("ratio_to_bound"),
            "bound_kind": rec.get("bound_kind"), "fit_seconds": rec.get("fit_seconds"),
            "skipped": skipped, "after_fit": skipped and not any(r in status for r in BEFORE_FIT),
            "status": status[:160], "compare_wall_s": wall, "compare_cpu_s": cpu, "peak_rss_mb": peak,
        })
    return out


def specs(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(spec, privacy) of every compare run."""
    out = [(FAMILIES[f].format(n=n), priv) for n in (int(s) for s in args.sizes.split(",") if s)
           for f in args.workloads.split(",") for priv in args.privacy.split(",")]
    return out + [(s, "eps") for s in args.extra.split(",") if s]


def write(rows: list[dict], args: argparse.Namespace) -> None:
    """Every row to the CSV; the markdown table in the ladder's order."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    df = pd.DataFrame(rows)
    df.to_csv(RESULTS / f"{args.out}.csv", index=False)
    cols = ["spec", "privacy", "mechanism", "expected_total_error", "ratio_to_bound", "bound_kind", "fit_seconds",
            "after_fit", "status", "compare_wall_s", "compare_cpu_s", "peak_rss_mb", "load", "commit"]
    with open(RESULTS / f"{args.out}.md", "w") as f:
        f.write("# The hdmm ladder through `dpopt compare` (benchmarks/bench_hdmm_ladder.py)\n\n")
        f.write(f"Written at commit {checkout_commit()}; each row names the commit it was measured at (--append keeps "
                "earlier rows). ")
        f.write(
            f"Mechanisms {args.mechanisms}; compare's default time limit (60 s) per mechanism; eps = 1, and "
            "delta = 1e-6 for eps-delta. Each compare run in its own process at one BLAS thread; wall and CPU "
            "seconds and peak RSS are the whole run's (the eps-DP bound's certification included), `load` the "
            "1-minute load average when it ended (two cores). `after_fit`: a row skipped for a reason other than a "
            f"refusal before the fit ({sum(bool(v) for v in df['after_fit'])} here).\n\n")
        f.write(pipe_table(df, cols) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="256,512,1024,2048")
    ap.add_argument("--workloads", default=",".join(FAMILIES))
    ap.add_argument("--privacy", default="eps,eps-delta")
    ap.add_argument("--mechanisms", default=DEFAULT_MECHANISMS, help="comma-separated, or all")
    ap.add_argument("--extra", default=DEFAULT_EXTRA, help="eps-DP specs run after the ladder (comma-separated)")
    ap.add_argument("--child-budget", type=float, default=3600.0, help="wall seconds before a run's process is killed")
    ap.add_argument("--quick", action="store_true", help="n = 64 and 128, hdmm and wavelet, no extra rows")
    ap.add_argument("--append", action="store_true",
                    help="keep the rows already in results/OUT.csv that this run does not measure again")
    ap.add_argument("--out", default="hdmm_ladder")
    ap.add_argument("--one", nargs=2, metavar=("SPEC", "PRIVACY"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], args.one[1], args.mechanisms)))
        return
    if args.quick:
        args.sizes, args.mechanisms, args.extra = "64,128", "hdmm,wavelet", ""
    rows: list[dict] = []
    if args.append and (RESULTS / f"{args.out}.csv").exists():
        again = set(specs(args))  # rows measured again replace the earlier ones
        rows = [r for r in pd.read_csv(RESULTS / f"{args.out}.csv").to_dict("records")
                if (r["spec"], r["privacy"]) not in again]
    bad = 0
    for spec, priv in specs(args):
        run = run_module("benchmarks.bench_hdmm_ladder", ["--one", spec, priv, "--mechanisms", args.mechanisms],
                         args.child_budget)
        if run.returncode != 0:
            bad += 1
            print(f"{spec} {priv}: failed ({run.last_error_line()})", flush=True)
            continue
        new = json.loads(run.stdout.strip().splitlines()[-1])
        load = os.getloadavg()[0]
        for r in new:
            r["load"] = round(load, 1)
            r["commit"] = checkout_commit()
        rows.extend(new)
        hd = next((r for r in new if r["mechanism"] == "hdmm"), None)
        note = "" if hd is None else f"hdmm {hd['expected_total_error']:.6g} ({hd['status'][:40]}), "
        print(f"{spec} {priv}: {note}{sum(r['after_fit'] for r in new)} rows skipped after a fit; "
              f"{new[0]['compare_wall_s']:.0f} s wall, {new[0]['compare_cpu_s']:.0f} s CPU, load {load:.1f}", flush=True)
        bad += sum(bool(r["after_fit"]) for r in new)
        write(rows, args)
    sys.exit(1 if bad or not rows else 0)


if __name__ == "__main__":
    main()
