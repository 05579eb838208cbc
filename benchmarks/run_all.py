"""Run every benchmark at its quick setting, one after another, and print a summary table.

Each `benchmarks/bench_*.py` runs in its own subprocess and process group, with one BLAS/OpenMP thread
(environment and threadpoolctl), a wall-clock budget (`--budget` seconds each; at the budget the whole
group is killed) and its tables written under `benchmarks/results/quick/` instead of
`benchmarks/results/`, so the committed full-size tables are never overwritten. The child's stdout and
stderr go to `benchmarks/results/quick/NAME.log`. The summary (benchmark, exit code, wall and CPU
seconds of the child and its waited-for descendants, arguments) is printed and written to
`benchmarks/results/quick/summary.md`; the exit status is 1 when any benchmark failed or ran out of time.

    .venv/bin/python -m benchmarks.run_all                       # all of them (about an hour on 2 cores)
    .venv/bin/python -m benchmarks.run_all --only l1ball,lrm     # a few
    .venv/bin/python -m benchmarks.run_all --list                # names and quick arguments

A new `bench_NAME.py` is run with `--quick` unless QUICK_ARGS says otherwise; it must take its output
folder from a module-level `RESULTS` path (as all of them do) so the redirection applies.
"""

from __future__ import annotations

import argparse
import importlib
import os
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
QUICK_DIR = HERE / "results" / "quick"
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "VECLIB_MAXIMUM_THREADS": "1", "NUMEXPR_NUM_THREADS": "1"}

# The quick arguments of each benchmark, read from its argparse: --quick where it has one, small sizes,
# one repeat and shortened per-run budgets where it does not.
QUICK_ARGS: dict[str, list[str]] = {
    "convex_dp": ["--sizes", "128", "--primal-limit", "30"],
    "convex_dp_matched": ["--sizes", "32", "--workloads", "all-range", "--budget", "120"],
    "convex_dp_scaling": ["--quick", "--sizes", "128,256", "--conic-sizes", "16,32", "--budget", "120",
                          "--conic-budget", "60"],
    "eigen_design": ["--quick", "--sizes", "256", "--budget", "120", "--plain-limit", "60"],
    "formulations": ["--quick", "--repeats", "1"],
    "implicit": ["--quick"],
    "l1ball": ["--quick"],
    "lrm": ["--quick", "--repeats", "1"],
    # no --quick: the default sizes, "about five minutes" on a quiet machine (LRM on WRelated up to n = 2048)
    "mechanisms": ["--repeats", "1", "--budget", "5"],
    "orthogonal": ["--quick", "--seeds", "1", "--repeats", "1"],
    "dpbench": ["--quick", "--jobs", "1"],
    "streaming_optimal": ["--quick"],  # n = 256, mean k = 1, 4 and max k = 4, one run each (seconds)
}


# Wall-clock budget per benchmark (seconds) where DEFAULT_BUDGET is too short on a loaded 2-core machine.
DEFAULT_BUDGET = 900.0
BUDGETS: dict[str, float] = {"mechanisms": 1500.0}


def benchmark_names() -> list[str]:
    """NAME of every benchmarks/bench_NAME.py, sorted."""
    return sorted(p.stem[len("bench_"):] for p in HERE.glob("bench_*.py"))


def quick_args(name: str) -> list[str]:
    return list(QUICK_ARGS.get(name, ["--quick"]))


@dataclass
class Outcome:
    name: str
    returncode: int | None  # None: killed at the budget
    wall: float
    cpu: float
    args: list[str]

    @property
    def status(self) -> str:
        if self.returncode is None:
            return "timeout"
        return "ok" if self.returncode == 0 else "failed"


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_one(name: str, out_dir: Path, budget: float, extra: list[str] | None = None) -> Outcome:
    """Run bench_NAME at its quick arguments in a child process; its tables land in out_dir."""
    args = quick_args(name) + list(extra or [])
    cmd = [sys.executable, "-m", "benchmarks.run_all", "--inner", name, "--out", str(out_dir), "--", *args]
    env = dict(os.environ, **ONE_THREAD)
    log = out_dir / f"{name}.log"
    t0, cpu0 = time.perf_counter(), _children_cpu()
    with open(log, "w") as fh:
        fh.write(f"$ python -m benchmarks.bench_{name} {' '.join(args)}   (tables in {out_dir})\n")
        fh.flush()
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                start_new_session=True)
        try:
            code: int | None = proc.wait(timeout=budget)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            code = None
            fh.write(f"\n[killed at the {budget:.0f} s budget]\n")
    return Outcome(name, code, time.perf_counter() - t0, _children_cpu() - cpu0, args)


def inner(name: str, out_dir: Path, args: list[str]) -> None:
    """In the child: bench_NAME's main() with its RESULTS folder replaced by out_dir."""
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(1)
    except ImportError:  # pragma: no cover - threadpoolctl is a dependency
        pass
    module = importlib.import_module(f"benchmarks.bench_{name}")
    if not hasattr(module, "RESULTS"):
        raise SystemExit(f"benchmarks.bench_{name} has no RESULTS folder to redirect; not run")
    module.RESULTS = out_dir
    sys.argv = [str(HERE / f"bench_{name}.py"), *args]
    module.main()


def summary_table(outcomes: list[Outcome]) -> str:
    head = "| benchmark | status | exit code | wall s | CPU s | arguments |"
    lines = [head, "|---|---|---:|---:|---:|---|"]
    for o in outcomes:
        code = "killed" if o.returncode is None else str(o.returncode)
        lines.append(f"| {o.name} | {o.status} | {code} | {o.wall:.1f} | {o.cpu:.1f} | `{' '.join(o.args)}` |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default=None, help="comma-separated benchmark names (bench_NAME.py), default all")
    p.add_argument("--budget", type=float, default=None,
                   help=f"wall seconds per benchmark (default {DEFAULT_BUDGET:.0f}; mechanisms {BUDGETS['mechanisms']:.0f})")
    p.add_argument("--out", type=Path, default=QUICK_DIR, help="output folder (default benchmarks/results/quick)")
    p.add_argument("--list", action="store_true", help="print the benchmarks and their quick arguments")
    p.add_argument("--inner", default=None, help=argparse.SUPPRESS)
    p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    out_dir = args.out.resolve()
    if args.inner:
        rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
        inner(args.inner, out_dir, rest)
        return 0
    if args.rest:
        p.error(f"unexpected arguments: {' '.join(args.rest)}")
    names = benchmark_names()
    if args.list:
        for n in names:
            print(f"{n:20s} {' '.join(quick_args(n))}")
        return 0
    if args.only:
        chosen = [n.strip().removeprefix("bench_") for n in args.only.split(",") if n.strip()]
        unknown = sorted(set(chosen) - set(names))
        if unknown:
            p.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(names)}")
        names = [n for n in names if n in chosen]
    if args.budget is not None and args.budget <= 0:
        p.error("--budget must be positive")
    if out_dir == (HERE / "results").resolve():
        p.error("--out must not be benchmarks/results itself: the committed full-size tables live there")
    out_dir.mkdir(parents=True, exist_ok=True)
    if out_dir == QUICK_DIR.resolve():  # quick tables are for looking at, never for committing
        (out_dir / ".gitignore").write_text("*\n")
    outcomes = []
    for n in names:
        print(f"bench_{n} {' '.join(quick_args(n))} ...", flush=True)
        o = run_one(n, out_dir, args.budget or BUDGETS.get(n, DEFAULT_BUDGET))
        print(f"  {o.status} (exit {o.returncode}) in {o.wall:.1f} s wall, {o.cpu:.1f} s CPU; log {out_dir / (n + '.log')}",
              flush=True)
        outcomes.append(o)
    table = summary_table(outcomes)
    (out_dir / "summary.md").write_text(
        f"# Quick benchmark run\n\nOne BLAS thread, a wall-clock budget per benchmark; "
        f"`python -m benchmarks.run_all`\n\n{table}\n")
    print()
    print(table)
    return 0 if all(o.status == "ok" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
