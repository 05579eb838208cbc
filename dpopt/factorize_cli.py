"""`dpopt factorize`: a streaming factorization A = B C of prefix sums (or any lower-triangular A) under k epochs.

The command-line contract : the flags, the JSON keys of `Factorization.record`, `--out DIR`
(C.npy up to n = 8192, else params.json, and report.json), progress and --time-limit as in `dpopt compare`, and
bad input as one line and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from dpopt.specs import SpecError, parse_workload
from dpopt.streaming.base import RECORD_KEYS, Factorization, streaming_workload
from dpopt.streaming.families import FAMILIES
from dpopt.streaming.participation import Participation
from dpopt.streaming.toeplitz_loss import DENSE_MAX_STEPS, check_toeplitz_size
from dpopt.workloads import MomentumPrefix, Prefix, Workload, cooldown_schedule

#: family spec -> (family name, its size option, default size)
FAMILY_OPTIONS = {"banded": ("bandwidth", 8), "blt": ("buffers", 4)}

DESCRIPTION = """\
Factor a streaming workload A (n x n, lower triangular: prefix sums, or prefix sums with heavy-ball momentum)
as A = B C with C lower triangular, so that C x + z can be released step by step, under k epochs: a user
takes part once per epoch, at steps r, r + b, ..., r + (k-1) b (b = n / k). Losses at unit noise: mean_loss =
sens^2 ||B||_F^2 / n, max_loss = sens^2 max_t ||B_t||^2, where sensitivity (sens^2 at unit clipping) is a
certified upper bound for the scheme. lower_bound is over every factorization (only the optimal family
certifies one; null otherwise) and gap is relative. Amplification by sampling is not modelled.

families: optimal (certified optimum over every factorization), sqrt (C = A^(1/2), closed form), toeplitz
(lower-triangular Toeplitz C), banded:W (bandwidth W; with W <= b the sensitivity is exact), blt:K (buffered
linear Toeplitz with K buffers; streams its noise in O(K d) memory). Toeplitz-structured families work at any
n for prefix sums (with or without constant momentum) in O(n log n) per step; a workload with a learning-rate
schedule or from a file is dense (n <= 4096).

JSON keys: family, n, epochs, objective, mean_loss, max_loss, sensitivity, lower_bound, gap, status,
fit_seconds. Progress goes to stderr; Ctrl-C stops with status 130.

examples:
  dpopt factorize --workload prefix:1024 --epochs 4 --family sqrt
  dpopt factorize --workload prefix:4096 --momentum 0.9 --family blt:4 --format json
"""


def add_factorize_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the `factorize` subcommand; returns its parser."""
    from dpopt.cli import time_limit_arg
    from dpopt.compare import DEFAULT_TIME_LIMIT

    p = subparsers.add_parser("factorize", help="a streaming factorization A = B C under k epochs (DP-FTRL, "
                              "continual counting)", description=DESCRIPTION,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", "-w", default="prefix:1024", metavar="SPEC",
                   help="prefix:N (prefix sums over N steps) or npy:PATH (any lower-triangular n x n A saved with "
                        "numpy.save); default prefix:1024")
    p.add_argument("--momentum", type=float, default=0.0, metavar="BETA",
                   help="heavy-ball momentum beta in [0, 1) on prefix:N (A_tj = sum_{s=j..t} eta_s beta^(s-j)); "
                        "default 0")
    p.add_argument("--cooldown", action="store_true",
                   help="with prefix:N: the learning-rate cooldown of Choquette-Choo et al. 2023 (the last n/4 "
                        "rates fall linearly from 1 to 0.05); makes A dense")
    p.add_argument("--epochs", "-k", type=int, default=1, metavar="K", help="epochs k (k divides n); default 1")
    p.add_argument("--participation", default="epochs", metavar="SCHEME",
                   help="participation scheme: epochs (the default and the only one certified here; b-min-sep and "
                        "random batches are refused)")
    p.add_argument("--objective", choices=["mean", "max"], default="mean",
                   help="minimise the mean (default) or the largest per-step squared error")
    p.add_argument("--family", default="sqrt", metavar="FAMILY",
                   help="optimal, sqrt (default), toeplitz, banded:W or blt:K")
    p.add_argument("--time-limit", type=time_limit_arg, default=DEFAULT_TIME_LIMIT, metavar="SECONDS",
                   help=f"wall-clock seconds for the fit (default {DEFAULT_TIME_LIMIT:g}; 'none' for no limit); a "
                        "fit cut short keeps its best factorization with status time_limit")
    p.add_argument("--format", "-f", choices=["table", "json"], default="table")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="also write report.json, and C.npy (n <= 8192) or params.json, into DIR (created)")
    p.set_defaults(func=factorize_command)
    return p


def parse_family(text: str) -> tuple[str, dict[str, int]]:
    """'toeplitz' -> ('toeplitz', {}); 'banded:16' -> ('banded', {'bandwidth': 16}); ValueError naming --family."""
    name, sep, arg = text.strip().lower().partition(":")
    if name not in FAMILIES:
        raise ValueError(f"--family {text!r}: unknown family; expected one of optimal, sqrt, toeplitz, banded:W, blt:K")
    if name not in FAMILY_OPTIONS:
        if sep:
            raise ValueError(f"--family {text!r}: {name} takes no argument")
        return name, {}
    option, default = FAMILY_OPTIONS[name]
    if not sep:
        return name, {option: default}
    if not arg.isdigit() or int(arg) < 1:
        raise ValueError(f"--family {text!r}: {name}:{'W' if name == 'banded' else 'K'} needs a positive integer")
    return name, {option: int(arg)}


def build_workload(spec: str, momentum: float, cooldown: bool) -> Workload:
    """The workload of --workload/--momentum/--cooldown, through the one spec grammar (dpopt.specs)."""
    if not math.isfinite(momentum) or not 0.0 <= momentum < 1.0:
        raise ValueError(f"--momentum {momentum!r}: beta must lie in [0, 1)")
    try:
        W = parse_workload(spec)
    except SpecError as exc:
        raise ValueError(f"--workload {spec!r}: {exc}") from None
    if momentum or cooldown:
        if not isinstance(W, Prefix):
            raise ValueError(f"--momentum and --cooldown apply to --workload prefix:N, not {spec!r}")
        n = W.n
        return MomentumPrefix(n, momentum, cooldown_schedule(n) if cooldown else None)
    return W


def _json_value(v: Any) -> Any:
    if isinstance(v, (float, np.floating)):
        return float(v) if math.isfinite(v) else None
    if isinstance(v, (np.integer,)):
        return int(v)
    return v


def report_json(f: Factorization) -> str:
    """The record as JSON (full double precision; non-finite numbers as null)."""
    return json.dumps({k: _json_value(v) for k, v in f.record().items()}, indent=2)


def report_table(f: Factorization, workload: Workload) -> str:
    """The record as aligned key / value lines, after a line naming the problem."""
    rec = f.record()
    head = (f"{workload.name}, {f.n} steps, {f.epochs} epoch(s) (b = {f.n // f.epochs}), objective {f.objective}; "
            "losses at unit noise, sensitivity = sens^2 at unit clipping")
    width = max(len(k) for k in RECORD_KEYS)
    lines = []
    for k in RECORD_KEYS:
        v = rec[k]
        text = "null" if v is None else (f"{v:.6g}" if isinstance(v, float) else str(v))
        lines.append(f"{k:<{width}}  {text}")
    return head + "\n\n" + "\n".join(lines)


def write_outputs(f: Factorization, out: Path) -> list[Path]:
    """report.json, and C.npy when C is kept (n <= 8192) else params.json, into out."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "report.json"]
    (out / "report.json").write_text(report_json(f) + "\n")
    if f.C is not None:
        np.save(out / "C.npy", f.C)
        written.append(out / "C.npy")
    else:
        (out / "params.json").write_text(json.dumps({"family": f.family, **f.params}) + "\n")
        written.append(out / "params.json")
    return written


def factorize_command(args: argparse.Namespace) -> int:
    """Run `dpopt factorize`; returns the exit status (ValueError -> status 2 in dpopt.cli.main)."""
    from dpopt.compare import _Progress

    family, options = parse_family(args.family)
    W = build_workload(args.workload, args.momentum, args.cooldown)
    if args.epochs < 1 or W.n % args.epochs:
        raise ValueError(f"--epochs {args.epochs}: k must be a positive divisor of n = {W.n} (the steps of "
                         f"{args.workload})")
    if args.out is not None and Path(args.out).exists() and not Path(args.out).is_dir():
        raise ValueError(f"--out {args.out}: exists and is not a folder")
    try:
        p = Participation(W.n, args.epochs, scheme=args.participation)
    except ValueError as exc:
        raise ValueError(f"--participation {args.participation!r}: {exc}") from None
    if W.m != W.n:
        raise ValueError(f"--workload {args.workload!r}: a streaming workload is square (n steps x n steps); "
                         f"{W.name} is {W.m} x {W.n}")
    if family != "optimal":  # sizes first, before anything of size n is formed
        check_toeplitz_size(W.n)
        if W.toeplitz_column() is None and W.n > DENSE_MAX_STEPS:
            raise ValueError(f"--workload {args.workload!r}: not Toeplitz, so the {family} family forms B densely, "
                             f"n <= {DENSE_MAX_STEPS}; got n = {W.n}")
        check_toeplitz_size(W.n, p)
    try:
        streaming_workload(W)
    except ValueError as exc:
        raise ValueError(f"--workload {args.workload!r}: {exc}") from None
    progress = _Progress(sys.stderr, W, args.time_limit)
    progress.start(f"{args.family} (k = {args.epochs}, {args.objective})")
    try:
        f = FAMILIES[family](W, p, objective=args.objective, time_limit=args.time_limit, callback=progress.event,
                             **options)
    except KeyboardInterrupt:
        progress.finish()
        print("dpopt: interrupted; no factorization", file=sys.stderr)
        return 130
    finally:
        progress.finish()
    print(report_json(f) if args.format == "json" else report_table(f, W), flush=True)
    if args.out is not None:
        written = write_outputs(f, Path(args.out))
        print(f"wrote {', '.join(str(w) for w in written)}", file=sys.stderr)
    return 0
