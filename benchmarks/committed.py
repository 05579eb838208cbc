"""Regenerate the committed outputs: every table under benchmarks/results and every executed notebook.

Each entry is the command that produced the committed file, at its committed size (the command the table
names in its header where it names one, else the benchmark's defaults). Entries run one after another, each
in a child process with one BLAS thread and a wall-clock budget (killed at it and reported as not
regenerated), with a line of progress per entry. The budgets are generous allowances, not measurements;
the whole set is many hours on two cores.

    make outputs                                              # everything
    .venv/bin/python -m benchmarks.committed --list           # entries, their files and estimates
    .venv/bin/python -m benchmarks.committed --only quickstart,mechanisms

tests/test_committed_outputs.py recomputes the quality numbers (errors, ratios to the bound) of committed
files at their committed sizes and fails when the code no longer gives them: run this command then.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@dataclass(frozen=True)
class Output:
    """One committed output: the files it writes, the command (after `python`) and its wall-clock budget in hours."""

    name: str
    files: tuple[str, ...]
    argv: tuple[str, ...]
    budget_hours: float
    env: dict[str, str] = field(default_factory=dict)
    python_var: str = ""  # an environment variable naming another interpreter for this entry, when set


def _bench(name: str, files: tuple[str, ...], hours: float, *args: str, module: str | None = None,
           python_var: str = "") -> Output:
    return Output(name, tuple(f"benchmarks/results/{f}" for f in files),
                  ("-m", f"benchmarks.bench_{module or name}", *args), hours, python_var=python_var)


def _notebook(name: str, hours: float) -> Output:
    return Output(name, (f"notebooks/{name}.ipynb",), ("notebooks/build.py", "--execute", name), hours,
                  {"DPOPT_NB_SCALE": "full"})


OUTPUTS: tuple[Output, ...] = (
    _notebook("quickstart", 0.05),
    _notebook("range_queries", 0.1),
    _notebook("svd_bound_table2", 0.2),
    _notebook("solver_crossval", 0.5),
    _notebook("lrm_experiments", 2.0),
    _notebook("om_experiments", 2.0),
    _notebook("streaming", 0.2),
    _bench("mechanisms", ("mechanisms_summary.md", "mechanisms_lrm_vs_n.csv", "mechanisms_wtau.csv",
                          "mechanisms_ranges.csv"), 0.2),
    _bench("mechanisms_full", ("mechanisms_summary_full.md", "mechanisms_ranges_full.csv"), 4.0, "--full",
           module="mechanisms"),
    _bench("convex_dp", ("convex_dp.md", "convex_dp.csv"), 0.5),
    _bench("convex_dp_matched", ("convex_dp_matched.md", "convex_dp_matched.csv"), 1.0,
           "--sizes", "32,64", "--clarabel-max-n", "48"),
    _bench("convex_dp_scaling", ("convex_dp_scaling.md", "convex_dp_scaling.csv"), 3.0, "--conic-budget", "180"),
    _bench("convex_dp_scaling_prefix_width32",
           ("convex_dp_scaling_prefix_width32.md", "convex_dp_scaling_prefix_width32.csv"), 2.0,
           "--workloads", "prefix,width32", "--sizes", "128,256,512,1024", "--conic-sizes", "",
           "--out", "convex_dp_scaling_prefix_width32", module="convex_dp_scaling"),
    _bench("convex_dp_8192", ("convex_dp_8192.md", "convex_dp_8192.csv"), 4.5,
           "--large", "--sizes", "8192", "--threads", "2", "--workloads", "all-range,prefix,width32",
           "--budget", "1800", "--repeats", "3", "--out", "convex_dp_8192", module="convex_dp_scaling"),
    _bench("eigen_design", ("eigen_design.md", "eigen_design.csv"), 1.0),
    _bench("formulations", ("formulations.md", "formulations.csv"), 8.0, "--budget", "600"),
    _bench("implicit", ("implicit.md", "implicit.csv"), 1.0),
    _bench("l1ball", ("l1ball.md",), 0.1),
    _bench("lrm", ("lrm.md", "lrm.csv"), 1.0),
    _bench("lrm_quality", ("lrm_quality.md", "lrm_quality.csv"), 1.0, "--quality", "--paper-only", module="lrm"),
    _bench("minimax", ("minimax.md", "minimax.csv"), 1.0),
    _bench("orthogonal", ("orthogonal.md", "orthogonal.csv"), 1.0),
    _bench("kronecker", ("kronecker.md", "kronecker.csv"), 0.1),
    _bench("stream_families", ("stream_families.md", "stream_families.csv"), 1.0),
    # Ektelo's columns need an interpreter that imports it (DPOPT_BENCH_PYTHON) and DPOPT_EKTELO_PATH: see
    # benchmarks/dpbench_notes.md; without them the table is regenerated without those columns and says so
    _bench("dpbench", ("dpbench.md", "dpbench.csv"), 12.0, "--jobs", "2", "--two-d",
           python_var="DPOPT_BENCH_PYTHON"),
    # the solver targets at two BLAS threads, then the CPU rows at one thread into the same table (--append)
    _bench("streaming_optimal", ("streaming_optimal.md", "streaming_optimal.csv"), 6.0,
           "--rows", "targets", "--threads", "2", "--repeats", "3", "--budget", "3600"),
    _bench("streaming_optimal_cpu", ("streaming_optimal.md", "streaming_optimal.csv"), 4.0,
           "--rows", "cpu", "--threads", "1", "--repeats", "3", "--budget", "3600", "--append",
           module="streaming_optimal"),
    _bench("hdmm_opt0", ("hdmm_opt0.md", "hdmm_opt0.csv"), 4.0),
    # QuerySmasher and ResidualPlanner+ from $DPOPT_BENCH_PEERS (the benchmark's docstring says what it holds);
    # without it the peer columns are empty and the table says so
    _bench("union", ("union.md", "union.csv"), 1.0, "--dense-max-cells", "4096", "--budget", "1800"),
    _bench("hdmm_ladder", ("hdmm_ladder.md", "hdmm_ladder.csv"), 3.0),
    # the peer's venv from $DPOPT_JAX_PYTHON (the benchmark's docstring says how to make it); refused without it
    _bench("stream_peers", ("stream_peers.md", "stream_peers.csv"), 16.0, "--require-peer"),
)
# Not regenerated here: lrm_paper_scale.md and om_paper_scale.md (and their folders), the papers' figures at
# full size through `dpopt reproduce ... --full` (days of CPU); their headers give the commands.


def run(out: Output, budget: float) -> tuple[int | None, float]:
    """Run one entry in its own process group; (exit code or None when killed at the budget, wall seconds)."""
    env = dict(os.environ, **ONE_THREAD, **out.env)
    t0 = time.perf_counter()
    python = (os.environ.get(out.python_var) if out.python_var else None) or sys.executable
    proc = subprocess.Popen([python, *out.argv], cwd=ROOT, env=env, start_new_session=True)
    try:
        code: int | None = proc.wait(timeout=budget)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        code = None
    return code, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default=None, help="comma-separated entry names (default: all)")
    p.add_argument("--list", action="store_true", help="print the entries, their files and budgets")
    p.add_argument("--budget-factor", type=float, default=1.0,
                   help="scale every entry's wall-clock budget by this factor (default 1)")
    args = p.parse_args(argv)
    chosen = list(OUTPUTS)
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = sorted(set(names) - {o.name for o in OUTPUTS})
        if unknown:
            p.error(f"unknown output(s) {', '.join(unknown)}; choose from {', '.join(o.name for o in OUTPUTS)}")
        chosen = [o for o in OUTPUTS if o.name in names]
    if args.list:
        for o in chosen:
            print(f"{o.name:34s} budget {o.budget_hours:4.2f} h  python {' '.join(o.argv)}  -> {', '.join(o.files)}")
        return 0
    if args.budget_factor <= 0:
        p.error("--budget-factor must be positive")
    total = sum(o.budget_hours for o in chosen)
    print(f"regenerating {len(chosen)} committed output(s), budgets {total:.1f} h in all", file=sys.stderr, flush=True)
    failed = []
    for i, o in enumerate(chosen, 1):
        print(f"[{i}/{len(chosen)}] {o.name}: python {' '.join(o.argv)} (budget {o.budget_hours:.2f} h)",
              file=sys.stderr, flush=True)
        code, wall = run(o, args.budget_factor * o.budget_hours * 3600.0)
        status = "killed at its budget" if code is None else ("ok" if code == 0 else f"failed (exit {code})")
        print(f"[{i}/{len(chosen)}] {o.name}: {status} in {wall:.0f} s", file=sys.stderr, flush=True)
        if code != 0:
            failed.append(o.name)
    if failed:
        print(f"not regenerated: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
