"""The structured streaming families: their losses beside the certified optimum, and their scale.

Family table: prefix sums at n in --sizes and k in --epochs, each family's mean loss (sensitivity certified for
the scheme), and its ratio to the optimal family's loss where that family is in this build (it certifies a lower
bound over every factorization; without it the ratio column is empty). Scale table: Toeplitz and BLT at n = 10^6
and banded at n = 2^15 ("in under a minute"), each fitted to convergence (no time limit) --repeats times
in a fresh process with one BLAS thread: median wall and CPU seconds, peak resident memory, the load seen.

    .venv/bin/python -m benchmarks.bench_stream_families            # committed sizes (about 15 minutes)
    .venv/bin/python -m benchmarks.bench_stream_families --quick    # small sizes, one repeat

writes benchmarks/results/stream_families.md and stream_families.csv (both tables, column `table`).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import pandas as pd

from benchmarks.child import run_module
from benchmarks.tables import pipe_table

RESULTS = Path(__file__).resolve().parent / "results"
FAMILIES_QUALITY = ("sqrt", "toeplitz", "banded", "blt:4")
#: Bandwidth of the banded rows: the largest power of two <= min(b, 64), so that w <= b (exact sensitivity).
MAX_BAND = 64


def band_for(n: int, k: int) -> int:
    b = n // k
    w = 1
    while 2 * w <= min(b, MAX_BAND):
        w *= 2
    return w


def one(family: str, n: int, k: int, objective: str) -> dict:
    """In the child: one fit, its record, CPU seconds and peak memory, as a dict."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)
    from dpopt.streaming.families import FAMILIES
    from dpopt.streaming.participation import Participation
    from dpopt.workloads import Prefix

    name, _, arg = family.partition(":")
    opts = {"bandwidth": int(arg)} if name == "banded" else ({"buffers": int(arg)} if name == "blt" else {})
    c0 = time.process_time()
    f = FAMILIES[name](Prefix(n), Participation(n, k), objective=objective, **opts)
    rec = f.record()
    rec.update(family=family, cpu_seconds=time.process_time() - c0,
               peak_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return rec


def measure(family: str, n: int, k: int, objective: str, repeats: int, budget: float) -> dict:
    """Median of `repeats` child runs of one fit."""
    recs = []
    for _ in range(repeats):
        run = run_module("benchmarks.bench_stream_families", ["--one", family, str(n), str(k), objective], budget)
        if run.returncode != 0:
            return {"family": family, "n": n, "epochs": k, "objective": objective,
                    "status": "timeout" if run.timed_out else f"failed: {run.last_error_line()}"}
        recs.append(json.loads(run.stdout.strip().splitlines()[-1]))
    out = dict(recs[-1])
    for key in ("fit_seconds", "cpu_seconds", "peak_mb"):
        out[key] = statistics.median(r[key] for r in recs)
    out["runs"] = repeats
    return out


def available_optimal() -> bool:
    from dpopt.streaming.families import FAMILIES

    return FAMILIES.available("optimal")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="256,1024", help="n of the family table (default 256,1024)")
    ap.add_argument("--epochs", default="1,4,16", help="k of the family table (default 1,4,16)")
    ap.add_argument("--scale", default="toeplitz:1000000:1,toeplitz:1000000:4,blt:4:1000000:1,blt:4:1000000:4,"
                                       "banded:64:32768:1,banded:64:32768:4,sqrt:1000000:1",
                    help="FAMILY:N:K rows of the scale table")
    ap.add_argument("--repeats", type=int, default=3, help="runs per scale row (median; default 3)")
    ap.add_argument("--budget", type=float, default=900.0, help="wall seconds per child run (default 900)")
    ap.add_argument("--quick", action="store_true", help="n = 128, scale rows at n = 2^16, one repeat")
    ap.add_argument("--one", nargs=4, metavar=("FAMILY", "N", "K", "OBJECTIVE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        fam, n, k, obj = args.one
        print(json.dumps(one(fam, int(n), int(k), obj)))
        return
    if args.quick:
        args.sizes, args.repeats = "128", 1
        args.scale = "toeplitz:65536:4,blt:4:65536:4,banded:64:32768:4"
    sizes = [int(s) for s in args.sizes.split(",")]
    epochs = [int(s) for s in args.epochs.split(",")]
    optimal = available_optimal()
    rows = []
    for n in sizes:
        for k in epochs:
            if n % k:
                continue
            ref = measure("optimal", n, k, "mean", 1, args.budget) if optimal else None
            fams = [f"banded:{band_for(n, k)}" if f == "banded" else f for f in FAMILIES_QUALITY]
            for fam in fams:
                r = measure(fam, n, k, "mean", 1, args.budget)
                loss = r.get("mean_loss")
                r["optimum"] = None if ref is None else ref.get("lower_bound")
                r["ratio_to_optimum"] = None if (ref is None or loss is None) else loss / ref["mean_loss"]
                r["table"] = "family"
                rows.append(r)
                print(f"n={n} k={k} {fam}: mean_loss {loss} ratio {r['ratio_to_optimum']}", file=sys.stderr, flush=True)
            if ref is not None:
                ref.update(table="family", optimum=ref.get("lower_bound"), ratio_to_optimum=1.0)
                rows.append(ref)
    loads = []
    for item in args.scale.split(","):
        parts = item.split(":")
        fam = ":".join(parts[:-2])
        n, k = int(parts[-2]), int(parts[-1])
        loads.append(os.getloadavg()[0])
        r = measure(fam, n, k, "mean", args.repeats, args.budget)
        r["table"] = "scale"
        r["load_1min"] = loads[-1]
        rows.append(r)
        print(f"scale {fam} n={n} k={k}: {r.get('fit_seconds')} s wall, {r.get('cpu_seconds')} s CPU, "
              f"{r.get('peak_mb')} MB", file=sys.stderr, flush=True)
    df = pd.DataFrame(rows)
    RESULTS.mkdir(parents=True, exist_ok=True)
    df.to_csv(RESULTS / "stream_families.csv", index=False)
    fam_cols = ["n", "epochs", "family", "mean_loss", "max_loss", "sensitivity", "ratio_to_optimum", "status",
                "fit_seconds"]
    scale_cols = ["family", "n", "epochs", "mean_loss", "status", "fit_seconds", "cpu_seconds", "peak_mb", "runs",
                  "load_1min"]
    fam_df = df[df["table"] == "family"].reindex(columns=fam_cols)
    scale_df = df[df["table"] == "scale"].reindex(columns=scale_cols)
    note = ("" if optimal else "The optimal family is not in this build: ratio_to_optimum is empty "
            "until it lands; `make outputs` regenerates this table.\n\n")
    cmd = "python -m benchmarks.bench_stream_families" + (" --quick" if args.quick else "")
    text = (f"# Streaming families\n\n`{cmd}` (one BLAS thread, each fit in its own process).\n\n"
            f"Prefix sums, mean loss at unit noise, sens^2 certified for k epochs; banded:W with W <= b (exact "
            f"sensitivity). ratio_to_optimum = the family's mean loss over the optimal family's.\n\n{note}"
            f"{pipe_table(fam_df.fillna(''), fam_cols)}\n\n## Scale\n\nFitted to convergence (no time limit); "
            f"medians of `runs` fresh processes: fit_seconds is wall, cpu_seconds CPU, peak_mb the peak resident "
            f"memory; load_1min the machine's 1-minute load average before the row (2 cores).\n\n"
            f"{pipe_table(scale_df.fillna(''), scale_cols)}\n")
    (RESULTS / "stream_families.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
