"""The experiment subcommands of `dpopt`: sweep, reproduce, crossval (parsers and handlers)."""

from __future__ import annotations

import argparse
import sys

from dpopt.cli import time_limit_arg
from dpopt.validation import check_output_file, check_output_folder

SWEEP_EPILOG = """\
config file (TOML or JSON), e.g.:
  name = "ranges"
  workloads = ["allrange:{n}", "wrange:{m}x{n}"]   # workload specs with {size} fields
  mechanisms = ["identity", "wavelet", {name = "hierarchical", params = {branching = [2, 4]}}]
  solvers = ["default"]          # passed as solver= to mechanisms that take one
  epsilon = [0.1, 1.0]
  delta = [0.0, 1e-6]
  calibration = "classic"        # or "analytic"
  repetitions = 3                # random workloads get a fresh seed per repetition
  monte_carlo_trials = 0         # > 1 adds sampled errors
  data = "npy:PATH"              # optional data vector (merged to n cells) or "poisson:MEAN"
  shared_fits = false            # true: one fit per point serves every eps and delta
  time_limit = 60                # seconds per fit (optional; --time-limit overrides it)
  [sizes]
  n = [64, 128]
  m = [32]

Results: one row per task (CSV). With --cache DIR an interrupted sweep resumes where it stopped.
--out and --plot must name files in existing, writable folders (checked before any task runs).

exit status: 0 when at least one task finished; 1 when every task failed (status skipped, error or
unavailable; the table is still written); 2 bad input (one-line reason on stderr)."""


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v



def _add_executor_options(p: argparse.ArgumentParser) -> None:
    """The options sweep and reproduce share: where tasks run, their cache, progress and time budget."""
    p.add_argument("--workers", type=int, default=None,
                   help="local worker processes (default: one per core; 0 runs in this process)")
    p.add_argument("--scheduler", default=None, help="Dask scheduler address (e.g. tcp://host:8786)")
    p.add_argument("--cache", default=None, help="directory of per-task results (resume and reuse)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--time-limit", type=time_limit_arg, default=None, metavar="SECONDS",
                   help="wall-clock seconds per fit (a capped solver returns its best valid strategy, status "
                        "time_limit); default: the config's time_limit, else none")

def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register the sweep, reproduce and crossval subcommands on `dpopt`'s subparsers."""
    from dpopt.reproduce import EXPERIMENTS

    p = sub.add_parser(
        "sweep",
        help="run a parameter grid (workload x size x mechanism x solver x eps x delta x repetition)",
        description="Expand a sweep config into independent tasks, run them in local processes (default) or "
        "on a Dask cluster (--scheduler), and write one tidy table with a row per task.",
        epilog=SWEEP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("config", help="sweep config, .toml or .json")
    p.add_argument("--out", default=None,
                   help="write the results here (.csv in an existing folder; default: CSV on stdout)")
    p.add_argument("--plot", default=None,
                   help="also draw mean error per mechanism and workload to this PNG (in an existing folder)")
    _add_executor_options(p)
    p.set_defaults(func=_sweep)

    p = sub.add_parser(
        "reproduce",
        help="rerun a table or figure of the source papers and compare with the published values",
        description="Rerun a paper's experiment (default scale: minutes; --full: the paper's scale), write "
        "NAME.csv, NAME-summary.csv and NAME.png under --out, and print where our numbers differ.",
        epilog="experiments:\n" + "\n".join(f"  {e.name:18s} {e.title} ({e.source})" for e in EXPERIMENTS.values()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("name", choices=list(EXPERIMENTS), metavar="NAME", help="experiment name (see below)")
    p.add_argument("--full", action="store_true", help="the paper's parameter ranges and repetitions")
    p.add_argument("--scale", choices=["small", "default", "full"], default=None,
                   help="small (seconds), default (minutes) or full (= --full)")
    p.add_argument("--out", default="reproduce",
                   help="output folder (default ./reproduce); created if missing, inside an existing folder")
    p.add_argument("--plot", default=None, help="copy the figure to this PNG path as well (in an existing folder)")
    p.add_argument("--repetitions", type=_positive_int, default=None, help="override the repetitions")
    p.add_argument("--epsilon", default=None, metavar="E[,E...]",
                   help="override the privacy levels (pure-DP errors scale exactly as 1/eps^2)")
    p.add_argument("--max-cells", default=None, metavar="MECH=N[,MECH=N...]",
                   help="run MECH only up to n = N cells, at every scale (replaces the experiment's caps)")
    p.add_argument("--no-data", action="store_true",
                   help="leave out the experiment's data vector: errors are the noise terms only (relaxed LRM's "
                   "data-dependent bias is not added), and sizes beyond the data's cells run")
    p.add_argument("--x", default=None, metavar="X[,X...]", dest="xs",
                   help="run only the points at these x-axis values (e.g. --x 8192: one n of a figure)")
    _add_executor_options(p)
    p.set_defaults(func=_reproduce)

    p = sub.add_parser(
        "crossval",
        help="run every hand-written solver beside its CVXPY model and check that they agree",
        description="For each pair (hand-written solver, CVXPY model) and each installed conic solver, solve "
        "the same instances and print objectives, relative differences, times and statuses. Exits 1 if a "
        "convex pair differs by more than 1e-4 relative, or a non-convex solver (LRM) is more than 1% "
        "worse than its reference.",
    )
    p.add_argument("--quick", action="store_true", help="small instances only (under a minute)")
    p.add_argument("--pairs", default=None, help="comma-separated pair names (default: all)")
    p.add_argument("--solvers", default=None, help="comma-separated conic solvers (default: all installed)")
    p.add_argument("--format", "-f", choices=["table", "markdown", "csv", "json"], default="table")
    p.add_argument("--out", default=None, help="also write the table as CSV here (in an existing folder)")
    p.add_argument("--plot", default=None,
                   help="draw times and relative differences to this PNG (in an existing folder)")
    p.set_defaults(func=_crossval)


def _check_workers(workers: int | None) -> None:
    if workers is not None and workers < 0:
        raise ValueError(f"--workers must be >= 0, got {workers}")


def _check_outputs(args: argparse.Namespace, files: tuple[str, ...] = ("out", "plot")) -> None:
    """Refuse unusable output files (--out, --plot) before any work (`dpopt.validation.check_output_file`)."""
    for name in files:
        value = getattr(args, name, None)
        if value:
            check_output_file(value, f"--{name}")


def _sweep(args: argparse.Namespace) -> int:
    from dpopt.experiments import FAILED_STATUSES, load_config, plot_sweep, run_sweep

    _check_workers(args.workers)
    _check_outputs(args)
    cfg = load_config(args.config)
    if args.time_limit is not None:
        cfg.time_limit = args.time_limit
    df = run_sweep(cfg, max_workers=args.workers, scheduler=args.scheduler, cache=args.cache,
                   progress=not args.no_progress)
    counts = df["status"].astype(str).str.split(":").str[0].value_counts()
    summary = f"{len(df)} tasks ({', '.join(f'{k}: {v}' for k, v in counts.items())})"
    if args.out:
        df.to_csv(args.out, index=False)
        print(f"{summary}; wrote {args.out}")
    else:
        df.to_csv(sys.stdout, index=False)
    failed = df["status"].astype(str).str.startswith(FAILED_STATUSES)
    if failed.all():
        first = str(df["status"].iloc[0]) if len(df) else "no tasks"
        print(f"dpopt sweep: every task failed ({summary}); the first: {first}", file=sys.stderr)
        return 1
    if args.plot:
        plot_sweep(df, args.plot)
    return 0


def _numbers(text: str | None, flag: str) -> list[float] | None:
    """'1,0.1' -> [1.0, 0.1] for the option `flag` (the values are checked by the experiment)."""
    if text is None:
        return None
    try:
        return [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"{flag} must be a comma-separated list of numbers, got {text!r}") from None


def _xs(text: str | None) -> list[float] | None:
    """'4096,8192' -> [4096.0, 8192.0] (checked against the experiment's points)."""
    xs = _numbers(text, "--x")
    if xs == []:
        raise ValueError("--x needs at least one value")
    return xs


def _max_cells(text: str | None) -> dict[str, int] | None:
    """'mm-appendix-b=256,lrm=4096' -> {'mm-appendix-b': 256, 'lrm': 4096}."""
    if text is None:
        return None
    from dpopt.mechanisms import MECHANISMS

    caps: dict[str, int] = {}
    for term in (t.strip() for t in text.split(",") if t.strip()):
        name, _, value = term.partition("=")
        if name not in MECHANISMS or not value.isdigit() or int(value) < 1:
            raise ValueError(f"--max-cells terms are MECH=N with MECH in {', '.join(MECHANISMS)} and N >= 1; "
                             f"got {term!r}")
        caps[name] = int(value)
    return caps


def _reproduce(args: argparse.Namespace) -> int:
    import shutil

    from dpopt.reproduce import reproduce

    _check_workers(args.workers)
    check_output_folder(args.out, "--out")
    _check_outputs(args, ("plot",))
    res = reproduce(args.name, full=args.full, scale=args.scale, out=args.out, max_workers=args.workers,
                    scheduler=args.scheduler, cache=args.cache, repetitions=args.repetitions,
                    epsilons=_numbers(args.epsilon, "--epsilon"), max_cells=_max_cells(args.max_cells),
                    use_data=not args.no_data, xs=_xs(args.xs), progress=not args.no_progress,
                    time_limit=args.time_limit)
    if args.plot and "png" in res.files:
        shutil.copyfile(res.files["png"], args.plot)
    return 0


def _crossval(args: argparse.Namespace) -> int:
    from dpopt.crossval import main_crossval

    _check_outputs(args)
    pairs = [p.strip() for p in args.pairs.split(",") if p.strip()] if args.pairs else None
    solvers = [s.strip() for s in args.solvers.split(",") if s.strip()] if args.solvers else None
    return main_crossval(quick=args.quick, pairs=pairs, solvers=solvers, fmt=args.format, out=args.out,
                         plot=args.plot)
