"""`dpopt answer`: private answers to counting queries on a CSV file (or the embedded dataset).

``add_answer_parser(subparsers)`` adds the subcommand to an argparse parser and ``answer_command``
runs it; ``main(argv)`` runs it on its own (``python -m dpopt.release_cli ...``).  The steps:
read the table -> Domain -> records (codes) -> workload from the spec -> fit the mechanism -> release
through OpenDP charged to a privacy ledger -> CSV of labelled answers.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dpopt.data import (
    Attribute,
    Categorical,
    Domain,
    IntegerRange,
    InvalidValueError,
    NumericBins,
    records,
)
from dpopt.queries import MAX_LABELLED_QUERIES
from dpopt.specs import DOMAIN_SPEC_HELP, SpecError, split_names
from dpopt.workloads import MAX_DENSE_ENTRIES

DEFAULT_FAIR_DOMAIN = "fair:rate_marriage,religious,children"

# Exit statuses (documented in --help).
EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_BUDGET = 3
EXIT_UNAVAILABLE = 4
EXIT_INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, as shells report it

DESCRIPTION = """\
Answer a batch of counting queries on a table with differential privacy and write the noisy,
labelled answers to a CSV file.  Noise is drawn by OpenDP's secure samplers (release mode) and the
privacy cost is charged to a budget ledger; a release that would overspend is refused.

Without --data the embedded Fair (1978) survey (6,366 rows, shipped with statsmodels) is used.
"""

EPILOG = f"""\
domain SPEC (which columns, and which values each may take):
  FILE.json                 Adult-style sizes {{"age": 85, "sex": 2}}: integer codes 0..k-1
  FILE.json:age,sex         the same, keeping only the listed columns, in the order listed
  fair[:col,...]            the embedded dataset's documented domain (default {DEFAULT_FAIR_DOMAIN}),
                            columns in the order listed (the order of the cells and of the answers)
  inline, ';'-separated     age=int:17..90;sex=cat:Female|Male;income=bins:0|10000|50000|inf
                            (int: inclusive integer range; cat: categories; bins: edges, the last
                            bin closed, inf allowed)

{DOMAIN_SPEC_HELP}
  (at most {MAX_LABELLED_QUERIES:,} queries: each is labelled and answered; a mechanism that cannot fit the
  workload's size is refused before the fit, saying what would fit)

output CSV columns: query, answer, std (noise std of that answer), noise (laplace|gaussian),
noise_scale (per measurement: b = sens1/eps, or the smallest sigma OpenDP certifies at
(eps, delta)), mode (=release), mechanism, strategy (what the mechanism selected: a baseline's
name such as identity when it kept a baseline with less error), epsilon, delta.

privacy: --delta 0 (default) gives eps-DP with Laplace noise; --delta > 0 gives (eps, delta)-DP with
Gaussian noise.  An (eps, delta) refused by compare (P(eps, delta) outside float64, a non-zero delta that
rounds to 0) is refused here too, as is a pair for which OpenDP certifies no Gaussian noise; all before
the fit and before any charge.  What is charged is what OpenDP certifies for the noise drawn, never less than
asked.  Without --ledger the release is not tracked across runs: nothing records it, each run
spends its (eps, delta) again, and stderr says so (even with --quiet).  --ledger FILE keeps the
budget across runs: created with --budget-epsilon/--budget-delta/--accounting (default: this
release's eps, delta; basic), charged on every release, never overspent; those three options need
--ledger.  Concurrent runs on one machine take turns (a lock on the folder of FILE; a symbolic
link is followed to the real file, a FILE with several hard links is refused); each charge is
written to FILE before any noise is drawn; a corrupt, inconsistent or non-UTF-8 FILE is refused,
never replaced.  --out is checked before anything is charged (its folder must take a new file; it
may not be the --ledger, --data, --domain or --target-std file) and the answers file appears whole
or not at all (temp file, fsync, rename); --out - (standard output) is written as it goes.

exit status: {EXIT_OK} answers written; {EXIT_BAD_INPUT} bad input (one-line reason on stderr);
{EXIT_BUDGET} privacy budget exceeded (nothing released); {EXIT_UNAVAILABLE} OpenDP unavailable;
{EXIT_INTERRUPTED} interrupted (Ctrl-C; one line on stderr says what was charged and whether answers were written).

example (the embedded Fair survey; add --data FILE.csv --domain FILE.json:col,... for your own table):
  dpopt answer --domain fair:rate_marriage,religious,children \\
      --workload "marginal:religious,children;range:rate_marriage" --epsilon 1 --mechanism hierarchical --out ans.csv
"""


# Bad command-line input, reported as one line with exit status 2 (a workload spec error is one too).
CliError = SpecError


# -- specs ----------------------------------------------------------------------------------------
def _inline_attribute(term: str) -> Attribute:
    if "=" not in term or ":" not in term.split("=", 1)[1]:
        raise CliError(f"domain term {term!r} must look like name=int:LO..HI, name=cat:A|B or "
                       "name=bins:E0|E1|...")
    name, rest = term.split("=", 1)
    kind, body = rest.split(":", 1)
    name, kind = name.strip(), kind.strip()
    try:
        if kind == "int":
            lo, hi = body.split("..")
            return IntegerRange(name, int(lo), int(hi))
        if kind == "cat":
            return Categorical(name, [v.strip() for v in body.split("|")])
        if kind == "bins":
            return NumericBins(name, [float(v) for v in body.split("|")])
    except ValueError as exc:
        raise CliError(f"domain term {term!r}: {exc}") from None
    raise CliError(f"domain term {term!r}: kind must be int, cat or bins, got {kind!r}")


def _columns(dom: Domain, text: str) -> Domain:
    """The columns listed in `text` (comma-separated), in the order typed: the order of the cells and answers."""
    names = split_names(text)
    dom.project(names)  # refuses unknown or repeated names, listing the domain's
    return Domain([dom.attribute(name) for name in names])


def parse_domain(spec: str) -> Domain:
    """Domain from a SPEC string (see ``dpopt answer --help``)."""
    spec = spec.strip()
    if spec == "fair" or spec.startswith("fair:"):
        from dpopt.datasets import fair_domain

        return fair_domain() if spec == "fair" else _columns(fair_domain(), spec[5:])
    path, _, cols = spec.partition(".json")
    if _:
        file = path + ".json"
        if Path(file).is_dir():
            raise CliError(f"domain file {file!r} is a folder; expected a JSON file {{column: size}}")
        if not Path(file).is_file():
            raise CliError(f"domain file {file!r} not found")
        dom = Domain.from_json(file)
        if cols:
            if not cols.startswith(":"):
                raise CliError(f"domain spec {spec!r}: expected FILE.json or FILE.json:col1,col2")
            dom = _columns(dom, cols[1:])
        return dom
    return Domain([_inline_attribute(t) for t in spec.split(";") if t.strip()])


# -- the subcommand -------------------------------------------------------------------------------
def add_answer_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the `answer` subcommand to an argparse subparsers object; returns its parser."""
    p = subparsers.add_parser(
        "answer", help="private answers to counting queries on a CSV (release mode)",
        description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", metavar="FILE.csv",
                   help="input table (header row; one record per row); default: embedded 'fair'")
    p.add_argument("--domain", metavar="SPEC",
                   help=f"columns and their values (see below); default with no --data: "
                        f"{DEFAULT_FAIR_DOMAIN}")
    p.add_argument("--workload", metavar="SPEC", default="marginals:1",
                   help="queries to answer (see below); default: marginals:1")
    from dpopt.cli import add_privacy_flags, time_limit_arg
    from dpopt.compare import DEFAULT_TIME_LIMIT

    add_privacy_flags(p, epsilon_help="privacy parameter epsilon > 0 of this release (required unless "
                                      "--target-std asks for the epsilon needed)")
    p.add_argument("--time-limit", type=time_limit_arg, default=DEFAULT_TIME_LIMIT, metavar="SECONDS",
                   help=f"wall-clock seconds for the strategy selection (default {DEFAULT_TIME_LIMIT:g}, as in "
                        "compare; 'none' for no limit). A solver that reaches it keeps its best valid strategy "
                        "(status time_limit, not certified optimal), which the release and --target-std use")
    p.add_argument("--mechanism", metavar="NAME", default="identity",
                   help="strategy selection: a name from dpopt's mechanism registry "
                        "(default: identity)")
    p.add_argument("--out", metavar="answers.csv", default="-",
                   help="output CSV ('-' for standard output, the default); checked before anything is "
                        "charged, written whole or not at all")
    p.add_argument("--on-invalid", choices=("error", "drop"), default="error",
                   help="rows with missing or out-of-domain values: stop at the first, naming its data row "
                        "(counted from 1 after the header) and column (default), or drop them")
    p.add_argument("--ledger", metavar="FILE.json",
                   help="privacy budget file kept across runs (created if absent); without it "
                        "the release is not tracked across runs")
    p.add_argument("--budget-epsilon", type=float, metavar="E",
                   help="total epsilon of a new ledger (default: --epsilon)")
    p.add_argument("--budget-delta", type=float, metavar="D",
                   help="total delta of a new ledger (default: --delta)")
    p.add_argument("--accounting", choices=("basic", "zcdp"), default=None,
                   help="composition rule of a new ledger (default: basic); an existing ledger "
                        "keeps its own")
    p.add_argument("--quiet", action="store_true",
                   help="no progress messages on stderr (the not-tracked warning stays)")
    p.add_argument("--target-std", metavar="S|FILE.csv", default=None,
                   help="accuracy every answer must have: one standard deviation S for all queries, or a "
                        "CSV with a target_std column (one row per query, in workload order, or matched by "
                        "a query column). Selects the minimax strategy (mm-optimal, objective max; needs "
                        "--delta > 0). Without --epsilon: prints the least epsilon at which a release "
                        "meets every target and releases nothing; with --epsilon: releases if every target "
                        "is met at that budget, else refuses and says which query misses by how much")
    p.set_defaults(func=answer_command)
    return p


def _say(args: argparse.Namespace, msg: str) -> None:
    if not getattr(args, "quiet", False):
        print(f"dpopt answer: {msg}", file=sys.stderr, flush=True)


def _fit(args: argparse.Namespace, mech: Any, workload: Any, privacy: Any) -> Any:
    """mech.fit within --time-limit, reporting the solver's iteration and certified gap every 5 s; a workload too
    large for the mechanism is refused before the fit."""
    problem = mech.size_problem(workload, privacy)
    if problem is not None:
        raise CliError(f"--mechanism {args.mechanism} on --workload {args.workload!r}: {problem}")
    last = [time.perf_counter()]

    def progress(info: dict[str, Any]) -> None:
        if time.perf_counter() - last[0] >= 5.0:
            last[0] = time.perf_counter()
            gap = info.get("gap")
            _say(args, f"  iteration {info.get('iteration')}" + ("" if gap is None else f", certified gap {gap:.2g}"))
    return mech.fit(workload, privacy, time_limit=args.time_limit, progress=progress)


def _load_table(args: argparse.Namespace) -> tuple[pd.DataFrame, Domain]:
    if args.data is None:
        from dpopt.datasets import load_fair

        _say(args, "no --data: using the embedded Fair (1978) survey from statsmodels")
        df = load_fair()
        dom = _domain_from_flag(args.domain or DEFAULT_FAIR_DOMAIN)
        return df, dom
    if args.domain is None:
        raise CliError("--domain SPEC is required with --data (which columns and values to use)")
    if Path(args.data).is_dir():
        raise CliError(f"data file {args.data!r} is a folder; expected a CSV file with a header row")
    if not Path(args.data).is_file():
        raise CliError(f"data file {args.data!r} not found")
    dom = _domain_from_flag(args.domain)
    _check_header(args.data, dom)
    # Strings keep category labels intact; numeric attributes convert them themselves.
    df = pd.read_csv(args.data, dtype=str)
    return df, dom


def _domain_from_flag(spec: str) -> Domain:
    """`parse_domain` of the --domain SPEC; an error names the flag and the spec typed."""
    try:
        return parse_domain(spec)
    except ValueError as exc:
        raise CliError(f"--domain {spec!r}: {exc}") from None


def _check_header(path: str, dom: Domain) -> None:
    """Refuse a CSV whose header names a domain column twice (pandas would rename one and count the other)."""
    with open(path, newline="", encoding="utf-8", errors="replace") as fh:
        header = next(csv.reader(fh), [])
    names = [h.strip() for h in header]
    for name in dom.names:
        where = [i + 1 for i, h in enumerate(names) if h == name]
        if len(where) > 1:
            raise CliError(f"--data {path!r}: column {name!r} appears {len(where)} times in the header (columns "
                           f"{', '.join(map(str, where))}); expected each --domain column once")


def _ledger_expect(args: argparse.Namespace) -> dict[str, Any]:
    """Totals and accounting the user gave explicitly (None where not given)."""
    return {"total_epsilon": args.budget_epsilon, "total_delta": args.budget_delta,
            "accounting": args.accounting}


def _ledger_create(args: argparse.Namespace) -> tuple[float, float, Any]:
    """(total_epsilon, total_delta, accounting) of a ledger started by this run."""
    eps = args.budget_epsilon if args.budget_epsilon is not None else args.epsilon
    delta = args.budget_delta if args.budget_delta is not None else args.delta
    return eps, delta, args.accounting or "basic"


def _check_ledger_early(args: argparse.Namespace) -> None:
    """Refuse a bad --ledger (directory, corrupt, other totals) before the fit; read-only.

    Without --ledger, refuse the options that describe a ledger: nothing would keep that budget.
    """
    from dpopt.release import PrivacyLedger, read_ledger

    if args.ledger is None:
        given = [flag for flag, value in (("--budget-epsilon", args.budget_epsilon),
                                          ("--budget-delta", args.budget_delta),
                                          ("--accounting", args.accounting)) if value is not None]
        if given:
            raise CliError(f"{', '.join(given)} need{'s' if len(given) == 1 else ''} --ledger "
                           "FILE: the budget they set lives in that file (without --ledger "
                           "nothing is tracked across runs)")
        return
    if read_ledger(args.ledger, _ledger_expect(args)) is None:
        PrivacyLedger(*_ledger_create(args))  # validates the totals of the ledger to be created


@dataclass
class _Run:
    """What a run of `dpopt answer` has done so far: the ledger it charged, where its answers went."""

    ledger_path: str | None  # --ledger as typed
    out: str  # --out as typed
    ledger: Any = None  # the PrivacyLedger charged (a FileLedger for --ledger)
    charges_before: int = 0  # its history's length before this release
    answers: str = "none"  # "none", "partial" (standard output being written) or "whole"

    def spent(self) -> str | None:
        """This release's charges, summed, as text (None if nothing was charged); a data-dependent mechanism
        (dawa-opt) charges once per step, two or three times."""
        if self.ledger is None or len(self.ledger.history) <= self.charges_before:
            return None
        mine = self.ledger.history[self.charges_before:]
        text = (f"eps={sum(c.epsilon for c in mine):.6g}, delta={sum(c.delta for c in mine):.3g} "
                f"(rho={sum(c.rho for c in mine):.6g})")
        return text + (f" in {len(mine)} charges" if len(mine) > 1 else "")

    def charged(self) -> str:
        """Whether and how much the ledger was charged (the ledger is only named if there is one)."""
        spent = self.spent()
        if self.ledger_path is None:
            released = spent is not None and self.answers != "none"
            return (f"this release spent {spent} and is not tracked across runs" if released
                    else "nothing was released")
        return (f"the ledger {self.ledger_path!r} was not charged" if spent is None
                else f"the ledger {self.ledger_path!r} was charged {spent}")

    def interrupted(self) -> str:
        """The one line printed on Ctrl-C."""
        written = {"none": "no answers were written",
                   "partial": "the answers on standard output may be incomplete",
                   "whole": f"the answers were written to {self.out!r}" if self.out != "-"
                            else "the answers were written to standard output"}[self.answers]
        return f"interrupted: {self.charged()}; {written}"


def _release(args: argparse.Namespace, mech: Any, x: Any, dom: Domain, run: _Run) -> pd.DataFrame:
    """Release through the ledger (the locked --ledger file, else a ledger for this run only)."""
    from dpopt.release import PrivacyLedger, ledger_file, release

    def answer(ledger: Any) -> pd.DataFrame:
        # a data-dependent mechanism (dawa-opt) releases in charged steps of its own (statistics, partition, second stage)
        if getattr(mech, "data_dependent", False):
            return mech.release(x, ledger, domain=dom)
        return release(mech, x, ledger, domain=dom)

    if args.ledger is None:
        run.ledger = PrivacyLedger(*_ledger_create(args))
        return answer(run.ledger)
    with ledger_file(args.ledger, create=_ledger_create(args),
                     expect=_ledger_expect(args)) as ledger:
        run.ledger, run.charges_before = ledger, len(ledger.history)
        return answer(ledger)


def _input_files(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(flag, path) of the files this run reads or keeps: answers must never overwrite them."""
    files = [("--ledger", args.ledger), ("--data", args.data)]
    if args.target_std is not None and Path(args.target_std).is_file():  # else a number
        files.append(("--target-std", args.target_std))
    if args.domain is not None and ".json" in args.domain:  # FILE.json or FILE.json:columns
        files.append(("--domain", args.domain.partition(".json")[0] + ".json"))
    return [(flag, path) for flag, path in files if path is not None]


def _same_file(real: Path, other: str) -> bool:
    """True if ``other`` (through any links) is the file at ``real``, or would be once created."""
    other_real = Path(os.path.realpath(other))
    if other_real == real:
        return True
    try:
        return os.path.samefile(real, other_real)
    except OSError:  # one of them does not exist
        return False


def _out_target(args: argparse.Namespace) -> Path | None:
    """The real file --out names (symbolic links resolved; None for standard output).

    Refused (CliError, exit 2) before anything is charged: a folder, a path in a folder that does not
    exist or under a file, a device or pipe, and any file the run reads or keeps (_input_files).
    """
    if args.out == "-":
        return None
    real = Path(os.path.realpath(args.out))
    if real.is_dir():
        raise CliError(f"--out {args.out!r} is a folder; expected the path of a CSV file to write "
                       "(or - for standard output)")
    if not real.parent.exists():
        raise CliError(f"--out {args.out!r}: folder {str(real.parent)!r} does not exist")
    if not real.parent.is_dir():
        raise CliError(f"--out {args.out!r}: {str(real.parent)!r} is not a folder")
    if real.exists() and not real.is_file():
        raise CliError(f"--out {args.out!r} is not a regular file (a device or a pipe?); use --out - "
                       "for standard output")
    for flag, path in _input_files(args):
        if _same_file(real, path):
            raise CliError(f"--out {args.out!r} is the {flag} file; the answers would overwrite it: "
                           "choose another --out")
    return real


def _open_answers(args: argparse.Namespace) -> Any:
    """The answers' AtomicFile, its temp file already created (None for standard output); run just
    before the charge, so a folder that takes no new file is refused with nothing charged."""
    from dpopt.release import AtomicFile

    target = _out_target(args)
    if target is None:
        return None
    try:
        mode = target.stat().st_mode & 0o7777 if target.exists() else 0o644
        return AtomicFile.beside(target, mode)
    except OSError as exc:
        raise CliError(f"--out {args.out!r}: cannot write a file in folder {str(target.parent)!r}: "
                       f"{exc.strerror or exc}") from None


def _write_answers(answers: pd.DataFrame, sink: Any, run: _Run) -> None:
    """Write the CSV: to the AtomicFile (fsync, then rename under sigint_deferred), or to stdout."""
    from dpopt.release import _pause_point, sigint_deferred

    if sink is None:
        run.answers = "partial"
        answers.to_csv(sys.stdout, index=False)
        sys.stdout.flush()
        run.answers = "whole"
        return
    with sink.text() as fh:
        answers.to_csv(fh, index=False)
    sink.flush()
    _pause_point("answers-temp-written")
    with sigint_deferred():
        sink.replace()
        run.answers = "whole"


def _load_rows(args: argparse.Namespace) -> tuple[Any, Domain]:
    """The table's rows as codes over the domain (the data vector is formed only by strategies that need it)."""
    df, dom = _load_table(args)
    if len(df) == 0:
        raise CliError(f"data file {args.data!r} has no rows (only a header); expected at least "
                       "one record")
    try:
        x, report = records(df, dom, on_invalid=args.on_invalid)
    except InvalidValueError as exc:
        source = f"--data {args.data!r}" if args.data else "the embedded Fair survey"
        raise CliError(f"{source}: column {exc.column!r}: {exc.what} in data row {exc.position + 1} (line "
                       f"{exc.position + 2}, after the header); expected {exc.expected}; pass --on-invalid drop "
                       "to leave such rows out") from None
    _say(args, f"domain {dom!r} ({dom.size} cells); {report.summary()}")
    if report.n_counted == 0:
        raise CliError(f"no row of {args.data!r} was counted ({report.summary()}); expected at "
                       "least one record in the domain")
    return x, dom


# Strategies with more measurements than this get an estimate of OpenDP's sampling time first.
NOISE_ESTIMATE_ROWS = 100_000
#: Most noisy measurements one release draws: MAX_DENSE_ENTRIES float64 values (2 GB; about 7 hours of OpenDP's
#: secure samplers at 1e4 a second). A strategy measuring more is refused before anything is charged.
MAX_RELEASE_ROWS = MAX_DENSE_ENTRIES


def _target_variances(args: argparse.Namespace, workload: Any) -> np.ndarray:
    """Per-query target variances S_i^2 (m,) from --target-std (a number, or a CSV column target_std)."""
    text = args.target_std
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is not None:
        if not (math.isfinite(value) and value > 0):
            raise CliError(f"--target-std must be a standard deviation > 0, got {text!r}")
        return np.full(workload.m, value**2)
    if not Path(text).is_file():
        raise CliError(f"--target-std {text!r} is neither a number nor a CSV file")
    df = pd.read_csv(text)
    if "target_std" not in df:
        raise CliError(f"{text}: expected a column target_std, found {list(df.columns)}")
    if "query" in df:
        labels = workload.row_labels()
        table = dict(zip(df["query"].astype(str), df["target_std"], strict=True))
        missing = [q for q in labels if q not in table]
        if missing:
            raise CliError(f"{text}: no target_std for query {missing[0]!r} (and {len(missing) - 1} more)")
        std = np.array([table[q] for q in labels], dtype=float)
    else:
        std = df["target_std"].to_numpy(dtype=float)
        if std.size != workload.m:
            raise CliError(f"{text}: {std.size} targets for {workload.m} queries (add a query column to match by label)")
    if not np.all(np.isfinite(std)) or np.any(std <= 0):
        raise CliError(f"{text}: every target_std must be a number > 0")
    return std**2


def _fitness_for_use(args: argparse.Namespace, workload: Any, privacy: Any) -> tuple[Any, float | None]:
    """--target-std: the minimax strategy for the targets, and the least epsilon meeting every target.

    Returns (fitted mechanism, None) when --epsilon meets every target, (None, epsilon needed) without
    --epsilon; refuses (CliError) when --epsilon is too small, naming the query that misses most.
    """
    from dpopt.mechanisms import make_mechanism
    from dpopt.release import certified_gaussian_sigma, least_certified_epsilon

    if privacy.is_pure:
        raise CliError("--target-std needs --delta > 0: the minimax strategy is calibrated with Gaussian noise")
    if args.mechanism not in ("identity", "mm-optimal"):
        raise CliError(f"--target-std selects the minimax strategy (mm-optimal, objective max); it cannot "
                       f"be combined with --mechanism {args.mechanism}")
    target = _target_variances(args, workload)
    mech = _fit(args, make_mechanism("mm-optimal", objective="max", targets=target), workload, privacy)
    unit = np.asarray(mech.query_unit_variances(), dtype=float)
    sens2 = float(mech.strategy_.sens2)
    sigma_max = float(np.min(np.sqrt(target / unit)))  # Var_i = sigma^2 unit_i <= S_i^2 for every query
    needed = least_certified_epsilon(sigma_max, sens2, privacy.delta)
    _say(args, f"minimax strategy: status {mech.fit_info_.status} (certified gap {mech.fit_info_.gap:.2g}); "
               f"every target is met at eps >= {needed:.6g} (delta={privacy.delta:g}, OpenDP's certified sigma)")
    if args.epsilon is None:
        return None, needed
    sigma = certified_gaussian_sigma(sens2, args.epsilon, privacy.delta)
    std = sigma * np.sqrt(unit)
    worst = int(np.argmax(std**2 / target))
    if std[worst] ** 2 > target[worst]:
        label = workload.row_labels()[worst]
        raise CliError(f"the targets cannot be met at eps={args.epsilon:g}, delta={privacy.delta:g}: query "
                       f"{label!r} would have std {std[worst]:.6g} > its target {math.sqrt(target[worst]):.6g} "
                       f"({std[worst] / math.sqrt(target[worst]) - 1:.2%} over); the least epsilon meeting "
                       f"every target is {needed:.6g}; nothing released")
    return mech, None


def check_release_privacy(privacy: Any) -> None:
    """Refuse, before the fit, an (eps, delta) for which OpenDP certifies no Gaussian noise (one line naming
    --epsilon and --delta); Laplace noise of scale sens1/eps is drawn wherever `check_privacy_range` passes."""
    from dpopt.release import ReleaseUnavailableError, certified_gaussian_sigma

    if privacy.is_pure:
        return
    try:
        certified_gaussian_sigma(1.0, privacy.epsilon, privacy.delta)
    except (ReleaseUnavailableError, ArithmeticError) as exc:
        raise CliError(f"--epsilon {privacy.epsilon!r} with --delta {privacy.delta!r}: a release cannot draw "
                       f"Gaussian noise for this pair ({exc}); expected an epsilon and delta for which OpenDP "
                       "certifies a noise scale (for delta from 1e-300 to 0.5, epsilon from 1e-12 to 1e40)") from None


def answer_command(args: argparse.Namespace) -> int:
    """Run `dpopt answer`; returns the exit status (0 ok, 2 bad input, 3 budget, 4 no OpenDP, 130 Ctrl-C).

    Ctrl-C at any point ends the run with one line on stderr saying whether the ledger was charged
    (and how much) and whether the answers were written; never a traceback.
    """
    run = _Run(args.ledger, args.out)
    try:
        return _answer(args, run)
    except KeyboardInterrupt:
        print(f"dpopt answer: {run.interrupted()}", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED


def _answer(args: argparse.Namespace, run: _Run) -> int:
    """The steps of `dpopt answer`: check the inputs and --out, fit, open --out's temp file, charge and
    release, write; ``run`` records what was charged and written."""
    from dpopt.cli import privacy_from_flags, workload_from_flag
    from dpopt.mechanisms import make_mechanism
    from dpopt.release import (
        BudgetExceededError,
        ReleaseUnavailableError,
        _pause_point,
        noise_seconds,
        require_opendp,
    )

    sink = None
    try:
        try:
            if args.epsilon is None and args.target_std is None:
                raise CliError("--epsilon is required (or --target-std, to ask for the epsilon needed)")
            privacy = privacy_from_flags(1.0 if args.epsilon is None else args.epsilon, args.delta,
                                         args.calibration)
            mech = make_mechanism(args.mechanism)
            require_opendp()  # fail before the (possibly long) fit, not after it
            if args.epsilon is not None:
                check_release_privacy(privacy)
                _check_ledger_early(args)
                _out_target(args)  # a bad --out is refused before the fit
            x, dom = _load_rows(args)
            workload = workload_from_flag(args.workload, dom)
            m, n = workload.shape
            t0 = time.perf_counter()
            if args.target_std is not None:
                _say(args, f"fitting the minimax strategy for the targets on {m} queries x {n} cells ...")
                fitted, needed = _fitness_for_use(args, workload, privacy)
                if fitted is None:
                    print(f"epsilon needed: {needed!r} (delta={args.delta!r}); nothing released", flush=True)
                    return EXIT_OK
                mech = fitted
            else:
                _say(args, f"fitting {args.mechanism} on {m} queries x {n} cells ...")
                _fit(args, mech, workload, privacy)
            info = getattr(mech, "fit_info_", None)
            status = f", {info.status}" if info is not None else ""
            _say(args, f"fitted in {time.perf_counter() - t0:.2f} s{status}")
            r = 0 if mech.strategy_ is None else int(mech.strategy_.shape[0])  # None: chosen with the data
            if r > NOISE_ESTIMATE_ROWS:  # OpenDP's secure samplers draw about 1e4 values a second
                secs = noise_seconds(r, privacy.delta > 0)
                if r > MAX_RELEASE_ROWS:
                    raise ValueError(f"{mech.short_name}'s strategy measures {r} rows, more than the "
                                     f"{MAX_RELEASE_ROWS} noisy measurements one release draws (about {secs:.3g} s "
                                     "with OpenDP); expected a smaller --domain or a mechanism that measures the "
                                     "workload's parts (hdmm, mm-optimal); nothing was released")
                _say(args, f"drawing {r} noisy measurements with OpenDP: about {secs:.0f} s")
            sink = _open_answers(args)  # before the charge: nothing is spent on answers that cannot be written
            answers = _release(args, mech, x, dom, run)
        except (BudgetExceededError, ReleaseUnavailableError) as exc:
            print(f"dpopt answer: {exc}", file=sys.stderr)
            return EXIT_BUDGET if isinstance(exc, BudgetExceededError) else EXIT_UNAVAILABLE
        except (ValueError, OSError, KeyError) as exc:
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            print(f"dpopt answer: error: {msg}", file=sys.stderr)
            return EXIT_BAD_INPUT
        except MemoryError as exc:
            print(f"dpopt answer: error: out of memory ({str(exc).splitlines()[0] if str(exc) else 'MemoryError'}); "
                  f"expected a smaller --domain or --workload; {run.charged()}", file=sys.stderr)
            return EXIT_BAD_INPUT
        try:
            _write_answers(answers, sink, run)
        except BrokenPipeError:  # e.g. piped into `head`; the release itself is complete
            return EXIT_OK
        except OSError as exc:
            print(f"dpopt answer: error: cannot write --out {args.out!r}: {exc.strerror or exc}; "
                  f"{run.charged()}", file=sys.stderr)
            return EXIT_BAD_INPUT
    finally:
        if sink is not None:
            sink.discard()  # removes the temp file unless it was renamed into place
    _pause_point("answers-written")
    spent = run.spent()
    if args.ledger is None:
        _say(args, f"released {len(answers)} answers (mode=release) to {args.out}")
        print(f"dpopt answer: this release spent {spent} and is not tracked across runs: nothing "
              "records it, and running again spends again; pass --ledger FILE to keep a privacy "
              "budget across runs", file=sys.stderr, flush=True)
        return EXIT_OK
    rem = run.ledger.remaining()
    _say(args, f"released {len(answers)} answers (mode=release) to {args.out}; charged {spent} "
               f"to {args.ledger}; budget left: eps={rem['epsilon']:.6g}, delta={rem['delta']:.3g}"
               + (f" (rho={rem['rho']:.6g})" if math.isfinite(rem["rho"]) else ""))
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry point: ``python -m dpopt.release_cli answer ...``."""
    from dpopt.cli import _Parser

    parser = _Parser(prog="dpopt")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    add_answer_parser(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
