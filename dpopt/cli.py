"""The `dpopt` command: compare, answer (and, as they land, crossval, reproduce, sweep)."""

from __future__ import annotations

import argparse
import decimal
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

from dpopt.specs import SPEC_HELP, SpecError, parse_workload
from dpopt.validation import parse_time_limit


class _Parser(argparse.ArgumentParser):
    """argparse that exits with status 2 and a one-line reason on bad input."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"dpopt: error: {message}\n")


def add_privacy_flags(p: argparse.ArgumentParser, epsilon_help: str | None = None) -> None:
    """--epsilon, --delta and --calibration, the same for every command (required --epsilon unless
    `epsilon_help` says when it may be left out)."""
    from dpopt.privacy import CALIBRATIONS, DEFAULT_CALIBRATION

    p.add_argument("--epsilon", "-e", type=real_arg, required=epsilon_help is None, default=None, metavar="E",
                   help=epsilon_help or "privacy parameter epsilon > 0")
    p.add_argument("--delta", "-d", type=real_arg, default=0.0, metavar="D",
                   help="delta in [0, 1); 0 (default) means eps-DP with Laplace noise")
    p.add_argument("--calibration", choices=CALIBRATIONS, default=DEFAULT_CALIBRATION,
                   help=f"Gaussian calibration of the error model when delta > 0: the seeds' classic sigma "
                        f"(default: {DEFAULT_CALIBRATION}) or the analytic Gaussian; a release (dpopt answer) "
                        "always draws the smallest sigma OpenDP certifies")


def real_arg(text: str) -> float:
    """A number flag (--epsilon, --delta) as a float; refused when its decimal value is not 0 but rounds to 0 in
    float64, which would change its meaning (--delta 1e-400 would silently be eps-DP)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value == 0.0:
        try:
            exact = decimal.Decimal(text.strip())
        except decimal.InvalidOperation:
            exact = decimal.Decimal(0)
        if exact.is_finite() and exact != 0:
            raise argparse.ArgumentTypeError(
                f"{text} rounds to 0 in double precision (below 5e-324); expected 0 or a number that float64 holds")
    return value


def privacy_from_flags(epsilon: float, delta: float, calibration: str) -> Any:
    """The Privacy of --epsilon, --delta and --calibration, refused in one line naming the flag when P(eps, delta)
    leaves float64 (`dpopt.privacy.check_privacy_range`): the one check of `compare` and `answer`."""
    from dpopt.privacy import Privacy, check_privacy_range

    privacy = Privacy(epsilon, delta, calibration=calibration)
    check_privacy_range(privacy, ("--epsilon", "--delta"))
    return privacy


def mechanism_names(text: str | None) -> list[str] | None:
    """-m/--mechanisms: the comma-separated names, or None (every mechanism) when the flag is absent."""
    if text is None:
        return None
    names = [m.strip() for m in text.split(",") if m.strip()]
    if not names:
        from dpopt.mechanisms.registry import MECHANISMS

        raise ValueError(f"-m/--mechanisms {text!r} names no mechanism; expected comma-separated names from "
                         f"{', '.join(MECHANISMS)} (leave -m out to run every one)")
    return names


def time_limit_arg(text: str) -> float | None:
    """--time-limit: seconds > 0, or 'none' for no limit."""
    try:
        return parse_time_limit(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds > 0 or 'none', got {text!r}") from None


def _paragraphs(text: str) -> str:
    """Text wrapped to 100 columns, blank-line separated paragraphs kept (the help keeps raw line breaks)."""
    return "\n\n".join(textwrap.fill(par, 100) for par in text.split("\n\n"))


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (subcommands register themselves here)."""
    from dpopt.compare import DEFAULT_TIME_LIMIT
    from dpopt.mechanisms.base import DENSE_MAX_CELLS
    from dpopt.mechanisms.registry import MECHANISMS

    parser = _Parser(prog="dpopt", description="Optimal strategies for linear counting queries under differential privacy.")
    parser.add_argument("--blas-threads", type=int, default=1, metavar="N",
                        help="BLAS/OpenMP threads for dense linear algebra (default 1: on small shared "
                             "machines more threads are often much slower)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser(
        "compare",
        help="fit every applicable mechanism on a workload and tabulate errors against the lower bound",
        description=_paragraphs("Fit mechanisms on a workload and print expected errors, RMSE and the ratio to the lower "
        "bound, sorted by error: P * SVD bound under (eps, delta); under eps-DP the tightest bound certified "
        "(bound_kind l2-optimum: P_eps times the certified optimum of trace(W^T W X^+) over diag(X) <= 1, "
        "valid as sens1 >= sens2). JSON records carry: mechanism, expected_total_error, rmse, "
        "max_query_std (the largest per-query standard deviation, computed through the strategy's structure), bound, "
        "ratio_to_bound, release_total_error (the error of the same strategy released by `dpopt answer`, "
        "whose Gaussian noise is the sigma OpenDP certifies, not the calibration's), fit_seconds, solver, "
        "status, note (why a number is missing, such as the max_query_std of a workload known only through W^T W; "
        "the table's footer lists the notes) and more; json and csv print every number to "
        "full double precision (it reads back to the same float).\n\n"
        "The classic Gaussian calibration sigma = sens2 sqrt(2 ln(2/delta))/eps is not (eps, delta)-DP at "
        "large eps (from about eps = 10 at delta = 1e-6): when the exact delta it achieves (Balle and Wang "
        "2018) exceeds --delta, compare still prints its numbers but warns on stderr and starts every row's "
        "status with 'classic-calibration-invalid: achieves delta=... > requested ...'; use --calibration "
        "analytic for a valid sigma. epsilon so small or large that P(eps, delta) overflows or underflows "
        "float64 is refused, as is a delta whose ln(2/delta) overflows or a non-zero value that rounds to 0 "
        "(--delta 1e-400 would be eps-DP).\n\n"
        f"A mechanism that cannot fit the workload's size (a dense strategy spans at most {DENSE_MAX_CELLS} cells, or "
        f"{DENSE_MAX_CELLS} per factor of a Kronecker workload fitted factor by factor) is skipped before any fit, its row "
        "saying why; when none of the mechanisms asked for can fit it, compare refuses (exit 2) and says "
        "what would fit.\n\n"
        "Mechanisms run fastest first, each within --time-limit; progress goes to stderr. The table format "
        "prints the privacy setting and what ratio_to_bound means, each row as it finishes, then the table "
        "sorted by error and the winner. Ctrl-C prints the rows that finished and exits with status 130."),
        epilog=SPEC_HELP + "\n\nmechanisms: " + ", ".join(MECHANISMS),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--workload", "-w", default="allrange:256", help="workload spec (default allrange:256)")
    add_privacy_flags(p)
    p.add_argument("--mechanisms", "-m", default=None,
                   help="comma-separated short names (default: all available; an empty list is refused)")
    p.add_argument("--format", "-f", choices=["table", "markdown", "csv", "json"], default="table")
    p.add_argument("--plot", default=None,
                   help="also draw the comparison as a bar chart to this PNG file (its folder must exist)")
    p.add_argument("--time-limit", type=time_limit_arg, default=DEFAULT_TIME_LIMIT, metavar="SECONDS",
                   help=f"wall-clock seconds for each mechanism's strategy selection (default {DEFAULT_TIME_LIMIT:g}; "
                        "'none' for no limit). An iterative solver that reaches it keeps its best valid strategy "
                        "(status time_limit, not certified optimal); a mechanism estimated to need more is "
                        "skipped with the estimate")
    p.add_argument("--objective", choices=["sum", "max"], default="sum",
                   help="what mm-optimal minimises: the total squared error (default) or the largest per-query "
                        "variance (certified minimax; refused when -m leaves out mm-optimal); every row reports "
                        "max_query_std")
    p.add_argument("--data", default=None, metavar="npy:PATH",
                   help="also answer this data in research mode and add data_error (DPBench's mean over samples and "
                        "trials of ||W x - W x_hat||_2 / m / sum(x)) and data_error_se to every record: a .npy file "
                        "holding one data vector of n counts or K x n samples")
    p.add_argument("--trials", type=int, default=1, metavar="K",
                   help="noise trials per data sample for data_error (default 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the research-mode noise for data_error (default 0)")
    p.set_defaults(func=_compare)

    from dpopt.release_cli import add_answer_parser

    add_answer_parser(sub)

    from dpopt.factorize_cli import add_factorize_parser

    add_factorize_parser(sub)

    from dpopt.cli_experiments import add_parsers as add_experiment_parsers

    add_experiment_parsers(sub)
    return parser


def _compare(args: argparse.Namespace) -> int:
    """Run `dpopt compare`; returns the exit status."""
    from dpopt.compare import check_fits_some, main_compare, mechanism_order

    mechs = mechanism_names(args.mechanisms)
    if args.objective == "max" and mechs is not None and "mm-optimal" not in mechs:
        raise ValueError(f"--objective max applies to mm-optimal only (its certified minimax); -m {args.mechanisms} "
                         "does not include it; expected mm-optimal among -m/--mechanisms")
    privacy = privacy_from_flags(args.epsilon, args.delta, args.calibration)
    workload = workload_from_flag(args.workload)
    check_fits_some(workload, privacy, mechanism_order(mechs), label=f"--workload {args.workload}")
    data = None if args.data is None else _data_runs(args, workload.n)
    return main_compare(workload, privacy, mechs, args.format, args.plot, time_limit=args.time_limit,
                        objective=args.objective, data=data)


def workload_from_flag(spec: str, domain: Any = None, flag: str = "--workload") -> Any:
    """The workload of a --workload SPEC; a spec error names the flag and the spec the user typed."""
    try:
        return parse_workload(spec, domain)
    except ValueError as exc:  # SpecError, or a workload refused by its builder (size, unknown column)
        raise SpecError(f"{flag} {spec!r}: {exc}") from None
    except MemoryError:
        raise SpecError(f"{flag} {spec!r}: not enough memory to build this workload; expected a smaller one") from None


def _data_runs(args: argparse.Namespace, n: int) -> object:
    """--data npy:PATH, --trials and --seed as `DataRuns`; a ValueError naming the flag and file otherwise."""
    import numpy as np

    from dpopt.compare import DataRuns
    from dpopt.error import data_samples

    kind, sep, path = str(args.data).partition(":")
    if not sep or kind != "npy" or not path:
        raise ValueError(f"--data {args.data!r}: expected npy:PATH (a .npy file of counts)")
    if args.trials < 1:
        raise ValueError(f"--trials {args.trials}: expected a positive number of noise trials per sample")
    try:
        X = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ValueError(f"--data {args.data}: cannot read {path}: {exc}") from None
    try:
        return DataRuns(data_samples(X, n, what=f"--data {args.data}"), args.trials, args.seed)
    except ValueError as exc:
        raise ValueError(str(exc)) from None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `dpopt` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.blas_threads < 1:
        parser.error(f"--blas-threads must be >= 1, got {args.blas_threads}")
    from threadpoolctl import threadpool_limits

    with threadpool_limits(args.blas_threads):
        try:
            return int(args.func(args))  # every subcommand sets its handler
        except (SpecError, ValueError) as exc:
            print(f"dpopt: error: {exc}", file=sys.stderr)
            return 2
        except MemoryError as exc:
            print(f"dpopt: error: out of memory ({str(exc).splitlines()[0] if str(exc) else 'MemoryError'}); "
                  "expected a smaller workload", file=sys.stderr)
            return 2


if __name__ == "__main__":
    sys.exit(main())
