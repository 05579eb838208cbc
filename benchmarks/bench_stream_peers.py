"""dpopt's streaming families beside jax-privacy's strategy optimisers, in one run.

Prefix sums at n in --sizes, k epochs in --epochs (b = n / k), mean loss (and the max loss at --max-sizes).
Each row pairs one class of factorizations on both sides:

    class            jax-privacy 2.0.0 (its defaults)                              dpopt family
    dense            dense.optimize(n, epochs=k): X_ij = 0 within a pattern        optimal (every factorization)
    banded           banded.optimize(n, bands=w): column-normalised band           banded:w, structure general
    banded_toeplitz  toeplitz.optimize_banded_toeplitz(n, bands=w)                 banded:w (Toeplitz band)
    toeplitz         toeplitz.optimize_banded_toeplitz(n, bands=n) (its loss is    toeplitz
                     the single-participation one for every k)
    blt              buffered_toeplitz.optimize(min_sep=b, max_participations=k,   blt:K
                     min_buffers=K, max_buffers=K)

w is the largest power of two <= min(b, 64) (so w <= b: the banded sensitivity is exact); K = 4 buffers.
Normalisation: both sides' C are scored by the same code, dpopt's `dense_losses` (mean = sens^2 ||A C^-1||_F^2 / n,
max = sens^2 max_t ||(A C^-1)_t||^2, jax_privacy's convention at unit noise) with sens^2 dpopt's certified
k-epoch sensitivity of that C; both are invariant to the scale of C. The peer's own number (its
`fixed_epoch_sensitivity` and `per_query_error`) stands beside it. loss_ratio = ours / peer (<= 1: dpopt at or
below); cpu_ratio = peer / ours, the optimisers' CPU seconds (process time around the optimise call, so the
peer's JIT compilation counts, its import does not), both measured in this run, alternating, each in a fresh
process with one thread (BLAS, OpenMP and XLA: --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1);
medians of --repeats runs where one peer run takes under --repeat-below CPU seconds, else one run (column runs).
Every peer run has a CPU budget (--peer-cpu-cap): dense, banded and BLT stop at it through their callback and
keep the loss reached (peer_status cpu_cap); the Toeplitz optimiser takes no callback and is ended by RLIMIT_CPU
(peer_status killed); column peer_cap. With --cache a row's two sides may come from different invocations, and
--cached-only takes each row's peer run at the largest cap measured (a dense row whose peer stopped at its cap can be
measured again with a larger one: --classes dense --peer-cpu-cap 900). peer_above_bound: the peer's loss lies above
the optimal family's certified lower bound.

jax-privacy runs in its own venv (`--jax-python PATH`, or $DPOPT_JAX_PYTHON): e.g. `python -m venv /opt/jaxp &&
/opt/jaxp/bin/pip install jax-privacy==2.0.0 jax==0.10.2`. Without it the table has dpopt's side only and says so.

    .venv/bin/python -m benchmarks.bench_stream_peers --jax-python /opt/jaxp/bin/python     # committed grid
    .venv/bin/python -m benchmarks.bench_stream_peers --quick                                # n = 128, seconds

writes benchmarks/results/stream_peers.md and stream_peers.csv; --cache DIR keeps one JSON per finished row, so an
interrupted run resumes and the grid can be run in pieces (then once more whole, to write the table).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.bench_stream_families import band_for
from benchmarks.child import run_command, run_module
from benchmarks.tables import pipe_table

RESULTS = Path(__file__).resolve().parent / "results"
PEER_RUNNER = Path(__file__).resolve().parent / "peer_jax_privacy.py"
#: One thread for XLA as well as BLAS/OpenMP in the peer's process.
XLA_ONE_THREAD = {"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
                  "JAX_PLATFORMS": "cpu"}
CLASSES = ("dense", "banded", "banded_toeplitz", "toeplitz", "blt")
BUFFERS = 4
#: Two converged runs of one class reach the same optimum to about this relative accuracy (dpopt's L-BFGS stops at a
#: relative decrease of 1e-12 of the log loss, the peer at its own tests): a ratio up to 1 + AT_RTOL counts as "at".
AT_RTOL = 1e-9
#: CPU seconds the peer's process may spend past its optimiser's budget (its import, its own evaluation of C)
#: before RLIMIT_CPU ends it.
EVAL_GRACE = 300.0


def ours_family(cls: str, n: int, k: int) -> str:
    """The dpopt family spec paired with a class (module docstring)."""
    w = band_for(n, k)
    return {"dense": "optimal", "banded": f"banded:{w}:general", "banded_toeplitz": f"banded:{w}",
            "toeplitz": "toeplitz", "blt": f"blt:{BUFFERS}"}[cls]


def family_call(spec: str) -> tuple[str, dict]:
    """'banded:64:general' -> ('banded', {'bandwidth': 64, 'structure': 'general'}); 'blt:4' -> buffers."""
    name, *args = spec.split(":")
    if name == "banded":
        opts: dict = {"bandwidth": int(args[0])}
        if len(args) > 1:
            opts["structure"] = args[1]
        return name, opts
    if name == "blt":
        return name, {"buffers": int(args[0])}
    return name, {}


def one(spec: str, n: int, k: int, objective: str, time_limit: float) -> dict:
    """In the child: one dpopt fit with one BLAS thread; its record, CPU seconds of the fit and peak memory."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)
    from dpopt.streaming.families import FAMILIES
    from dpopt.streaming.participation import Participation
    from dpopt.workloads import Prefix

    name, opts = family_call(spec)
    c0 = time.process_time()
    f = FAMILIES[name](Prefix(n), Participation(n, k), objective=objective, time_limit=time_limit, **opts)
    cpu = time.process_time() - c0
    rec = f.record()
    rec.update(family=spec, loss=f.loss, cpu_seconds=cpu,
               peak_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return rec


def peer_available(python: str | None) -> tuple[bool, str]:
    """(True, versions) when `python` imports jax_privacy, else (False, why)."""
    if not python:
        return False, "no --jax-python given (nor DPOPT_JAX_PYTHON)"
    if shutil.which(python) is None and not Path(python).is_file():
        return False, f"--jax-python {python} does not exist"
    try:
        out = subprocess.run([python, "-c", "import jax, jax_privacy; print(jax.__version__, jax_privacy.__version__)"],
                             capture_output=True, text=True, timeout=300, env=dict(os.environ, **XLA_ONE_THREAD))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"--jax-python {python} did not start: {exc}"
    if out.returncode != 0:
        return False, f"--jax-python {python} cannot import jax_privacy: {(out.stderr.strip().splitlines() or ['?'])[-1]}"
    jax_v, jp_v = out.stdout.split()
    return True, f"jax-privacy {jp_v}, JAX {jax_v} on CPU"


def run_peer(python: str, cls: str, n: int, k: int, objective: str, cap: float, budget: float
             ) -> tuple[dict, np.ndarray | None]:
    """One peer optimisation in its own process: (its result.json plus child CPU/wall, its C or None)."""
    with tempfile.TemporaryDirectory(prefix="peer-") as tmp:
        job = Path(tmp) / "job.json"
        job.write_text(json.dumps({"optimiser": cls, "n": n, "epochs": k, "objective": objective,
                                   "bands": band_for(n, k), "buffers": BUFFERS, "cpu_budget": cap}))
        run = run_command([python, str(PEER_RUNNER), str(job)], budget, env=XLA_ONE_THREAD,
                          cpu_limit=cap + EVAL_GRACE)
        res_path = Path(tmp) / "result.json"
        if run.returncode == 0 and res_path.is_file():
            res = json.loads(res_path.read_text())
            res["child_cpu_seconds"], res["child_wall_seconds"] = run.cpu, run.wall
            return res, np.load(Path(tmp) / "C.npy")
    # ended by a signal (RLIMIT_CPU at the cap) or the wall budget: killed; an error of the optimiser: failed
    killed = run.timed_out or run.returncode is None or run.returncode < 0
    why = ("killed at the wall budget" if run.timed_out else f"exit {run.returncode}: {run.last_error_line()}")
    return {"status": "killed" if killed else "failed", "why": why, "cpu_seconds": run.cpu, "wall_seconds": run.wall,
            "child_cpu_seconds": run.cpu, "child_wall_seconds": run.wall}, None


def run_ours(spec: str, n: int, k: int, objective: str, time_limit: float, budget: float) -> dict:
    run = run_module("benchmarks.bench_stream_peers", ["--one", spec, str(n), str(k), objective, str(time_limit)],
                     budget)
    if run.returncode != 0:
        why = "killed at the wall budget" if run.timed_out else f"failed: {run.last_error_line()}"
        return {"status": why, "child_cpu_seconds": run.cpu}
    rec = json.loads(run.stdout.strip().splitlines()[-1])
    rec["child_cpu_seconds"] = run.cpu
    return rec


def score(C: np.ndarray, n: int, k: int, objective: str) -> tuple[float, float]:
    """(the loss of C on prefix sums by dpopt's exact sensitivity and dense loss, that sens^2)."""
    from dpopt.streaming.base import dense_losses
    from dpopt.streaming.participation import Participation
    from dpopt.workloads import Prefix

    mean_loss, max_loss, sens2 = dense_losses(Prefix(n), C, Participation(n, k))
    return (mean_loss if objective == "mean" else max_loss), sens2


def side_runs(cls: str, n: int, k: int, objective: str, args: argparse.Namespace, python: str | None,
              run_ours_side: bool) -> tuple[list[dict], list[dict], np.ndarray | None]:
    """The peer (when python is given) and dpopt alternately, --repeats rounds while every run is cheap:
    (peer runs, our runs, the peer's C)."""
    spec = ours_family(cls, n, k)
    peers: list[dict] = []
    ours: list[dict] = []
    C = None
    for _ in range(max(1, args.repeats)):
        if python is not None:
            res, C_r = run_peer(python, cls, n, k, objective, args.peer_cpu_cap, args.budget)
            peers.append(res)
            C = C_r if C_r is not None else C
        if run_ours_side:
            ours.append(run_ours(spec, n, k, objective, args.time_limit, args.budget))
        cheap = all(p.get("status") in ("converged", "returned", "max_steps") and p["cpu_seconds"] < args.repeat_below
                    for p in peers)
        if not (cheap and all(o.get("cpu_seconds", np.inf) < args.repeat_below for o in ours)):
            break
    return peers, ours, C


def peer_side(peers: list[dict], C: np.ndarray | None, n: int, k: int, objective: str) -> dict:
    """The peer's columns of a row: medians of its runs, and its C scored by dpopt."""
    last = peers[-1]
    out = {"peer": last.get("call"), "peer_status": last.get("status"), "peer_steps": last.get("steps"),
           "peer_own_loss": last.get("own_loss"), "peer_runs": len(peers),
           "peer_cpu": statistics.median(p["cpu_seconds"] for p in peers),
           "peer_wall": statistics.median(p.get("wall_seconds", np.nan) for p in peers),
           "peer_child_cpu": statistics.median(p["child_cpu_seconds"] for p in peers),
           "peer_peak_mb": statistics.median(p.get("peak_mb", np.nan) for p in peers),
           "peer_load_1min": os.getloadavg()[0]}
    if "why" in last:
        out["peer_why"] = last["why"]
    if C is not None:
        out["peer_loss"], out["peer_sens2"] = score(C, n, k, objective)
    return out


def ours_side(ours: list[dict]) -> dict:
    """dpopt's columns of a row: medians of its runs."""
    done = [o for o in ours if "loss" in o]
    if not done:
        return {"ours_status": ours[-1]["status"], "ours_runs": len(ours)}
    last = done[-1]
    return {"ours_loss": last["loss"], "ours_sens2": last["sensitivity"], "ours_status": last["status"],
            "lower_bound": last.get("lower_bound"), "gap": last.get("gap"), "ours_runs": len(done),
            "ours_cpu": statistics.median(o["cpu_seconds"] for o in done),
            "ours_wall": statistics.median(o["fit_seconds"] for o in done),
            "ours_child_cpu": statistics.median(o["child_cpu_seconds"] for o in done),
            "ours_peak_mb": statistics.median(o["peak_mb"] for o in done), "ours_load_1min": os.getloadavg()[0]}


def measure_row(cls: str, n: int, k: int, objective: str, args: argparse.Namespace, python: str | None,
                optimal_ok: bool) -> dict:
    """One row. With --cache, each side is kept once measured: a row's missing side is measured alone (the dense
    rows' dpopt side once the optimal family is in the build)."""
    spec = ours_family(cls, n, k)
    cache = args.cache
    key = f"{cls}-{n}-{k}-{objective}"
    peer_path = None if cache is None else cache / f"{key}-peer-cap{args.peer_cpu_cap:g}.json"
    ours_path = None if cache is None else cache / f"{key}-ours.json"
    if cache is not None and args.cached_only:  # the table: each row's peer run at the largest cap measured
        capped = sorted(cache.glob(f"{key}-peer-cap*.json"), key=lambda p: float(p.stem.rsplit("-cap", 1)[1]))
        peer_path = capped[-1] if capped else peer_path
    peer = json.loads(peer_path.read_text()) if peer_path is not None and peer_path.is_file() else None
    if peer is not None:
        peer["peer_cap"] = float(peer_path.stem.rsplit("-cap", 1)[1])
    ours = json.loads(ours_path.read_text()) if ours_path is not None and ours_path.is_file() else None
    can_ours = spec != "optimal" or optimal_ok
    if args.cached_only:  # a table from the finished rows only: a side not in the cache is marked, not run
        peers, runs, C = [], [], None
        peer = peer or ({"peer_status": "not run"} if python else None)
        ours = ours or ({"ours_status": "not run"} if can_ours else None)
    else:
        peers, runs, C = side_runs(cls, n, k, objective, args, python if peer is None else None,
                                   can_ours and ours is None)
    if peers:
        peer = {**peer_side(peers, C, n, k, objective), "peer_cap": args.peer_cpu_cap}
        if peer_path is not None and ("peer_loss" in peer or peer.get("peer_status") in ("failed", "killed")):
            peer_path.write_text(json.dumps(peer, default=float))  # an error, or no result within the cap, is one
    if runs:
        ours = ours_side(runs)
        if ours_path is not None and "ours_loss" in ours:
            ours_path.write_text(json.dumps(ours, default=float))
    row: dict = {"n": n, "epochs": k, "objective": objective, "class": cls, "ours": spec,
                 **(peer or {}), **(ours or ({} if can_ours else {"ours_status": "not in this build"}))}
    row["runs"] = max(row.get("peer_runs", 0), row.get("ours_runs", 0))
    if row.get("peer_loss") is not None and row.get("ours_loss") is not None:
        row["loss_ratio"] = row["ours_loss"] / row["peer_loss"]
    if row.get("peer_cpu") and row.get("ours_cpu") and row.get("peer_loss") is not None:
        row["cpu_ratio"] = row["peer_cpu"] / row["ours_cpu"]
    # the machine's load when the row was measured (the peer's side first), else now
    row["load_1min"] = row.get("peer_load_1min", row.get("ours_load_1min", os.getloadavg()[0]))
    return row


def bound_column(df: pd.DataFrame) -> pd.DataFrame:
    """Every row gets the optimal family's certified lower bound of its (n, k, objective), and whether the peer's
    loss lies above it."""
    df = df.copy()
    if "lower_bound" not in df:
        df["lower_bound"] = np.nan
    opt = df[(df["class"] == "dense")].set_index(["n", "epochs", "objective"])["lower_bound"]
    keys = list(zip(df["n"], df["epochs"], df["objective"], strict=True))
    df["bound"] = [opt.get(key, np.nan) for key in keys]
    above = []
    for peer_loss, bound in zip(df.get("peer_loss", pd.Series(np.nan, index=df.index)), df["bound"], strict=True):
        above.append(None if (pd.isna(peer_loss) or pd.isna(bound)) else bool(peer_loss >= bound))
    df["peer_above_bound"] = above
    return df


NUMERIC = ["peer_loss", "peer_own_loss", "ours_loss", "loss_ratio", "peer_cpu", "ours_cpu", "cpu_ratio", "bound",
           "peer_peak_mb", "ours_peak_mb", "peer_wall", "ours_wall", "peer_cap", "load_1min"]
COLUMNS = ["n", "epochs", "objective", "class", "ours", "peer_loss", "peer_own_loss", "ours_loss", "loss_ratio",
           "peer_cpu", "ours_cpu", "cpu_ratio", "peer_status", "peer_steps", "ours_status", "bound",
           "peer_above_bound", "peer_peak_mb", "ours_peak_mb", "peer_wall", "ours_wall", "runs", "peer_cap", "load_1min"]


def command_args(argv: list[str]) -> list[str]:
    """The arguments as given, the peer's interpreter shown as PATH and the cache folder left out."""
    out, skip = [], None
    for a in argv:
        if skip:
            out += ["PATH"] if skip == "--jax-python" else []
            skip = None
        elif a in ("--jax-python", "--cache"):
            skip = a
            out += [a] if a == "--jax-python" else []
        elif a.startswith(("--jax-python=", "--cache=")):
            out += ["--jax-python PATH"] if a.startswith("--jax-python") else []
        else:
            out.append(a)
    return out


def goals(df: pd.DataFrame) -> str:
    """The two goals, counted over the rows that have both sides."""
    both = df.dropna(subset=["loss_ratio"])
    above = both[both["loss_ratio"] > 1.0 + AT_RTOL]
    text = (f"Goal 1, every dpopt row at or below the peer's loss: {len(both) - len(above)} of {len(both)} rows with "
            f"both sides (at: within {AT_RTOL:g} relative)")
    if len(above):
        text += "; above in " + ", ".join(f"{r['class']} n={r['n']} k={r['epochs']} {r['objective']} "
                                          f"(ratio {r['loss_ratio']:.6g})" for r in above.to_dict("records"))
    dense = df[df["class"] == "dense"].dropna(subset=["cpu_ratio"])
    text += (f". Goal 2, >= 10x less CPU for the dense optimum: {int((dense['cpu_ratio'] >= 10).sum())} of "
             f"{len(dense)} dense rows with both sides.")
    return text


def write_tables(df: pd.DataFrame, args: argparse.Namespace, peer_note: str, optimal_ok: bool) -> str:
    RESULTS.mkdir(parents=True, exist_ok=True)
    df = df.reindex(columns=list(dict.fromkeys(COLUMNS + list(df.columns))))
    for col in NUMERIC:
        df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    df.to_csv(RESULTS / "stream_peers.csv", index=False)
    cmd = "python -m benchmarks.bench_stream_peers " + shlex.join(command_args(sys.argv[1:]))
    notes = [f"Peer: {peer_note}."]
    if not optimal_ok:
        notes.append("The optimal family is not in this build: the dense rows have no dpopt side and "
                     "`bound` is empty until it lands; `make outputs` regenerates this table.")
    notes.append(goals(df))
    if "peer_why" in df:
        failed = df[df["peer_why"].notna() & df["peer_loss"].isna()]
        notes += [f"Peer without a loss, {r['class']} n={r['n']} k={r['epochs']} {r['objective']}: "
                  f"{r['peer_status']} ({r['peer_why']})." for r in failed.to_dict("records")]
    shown = df.copy()
    shown["peer_steps"] = ["" if pd.isna(v) else str(int(v)) for v in pd.to_numeric(shown["peer_steps"], errors="coerce")]
    for col in NUMERIC:
        shown[col] = ["" if pd.isna(v) else f"{v:.4g}" for v in shown[col]]
    shown = shown.astype(object).where(shown.notna(), "")
    doc = __doc__.split("\n\n")
    text = (f"# Streaming factorizations beside jax-privacy\n\n`{cmd}`\n\n"
            f"{doc[1]}\n\n```\n{doc[2]}\n```\n\n{' '.join(doc[3].split())}\n\n{' '.join(doc[4].split())}\n\n"
            f"{' '.join(notes)}\n\n{pipe_table(shown, COLUMNS)}\n")
    (RESULTS / "stream_peers.md").write_text(text)
    return text


DEFAULT_CAP = 1800.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1024,2048,4096", help="n (default 1024,2048,4096)")
    ap.add_argument("--epochs", default="1,4,16", help="k (default 1,4,16)")
    ap.add_argument("--max-sizes", default="1024", help="n at which the max-loss rows run too (default 1024; '' none)")
    ap.add_argument("--objectives", default="mean,max", help="losses of the rows (default mean,max; max only at --max-sizes)")
    ap.add_argument("--classes", default=",".join(CLASSES), help=f"classes of the rows (default {','.join(CLASSES)})")
    ap.add_argument("--jax-python", default=os.environ.get("DPOPT_JAX_PYTHON"),
                    help="python of a venv with jax-privacy (default $DPOPT_JAX_PYTHON); without it, dpopt only")
    ap.add_argument("--require-peer", action="store_true",
                    help="exit 2 when jax-privacy cannot be run (a committed table is never written without it)")
    ap.add_argument("--peer-cpu-cap", type=float, default=DEFAULT_CAP,
                    help=f"CPU seconds of one peer optimisation (default {DEFAULT_CAP:g})")
    ap.add_argument("--time-limit", type=float, default=1800.0, help="dpopt's time limit per fit (wall s, default 1800)")
    ap.add_argument("--budget", type=float, default=6 * 3600.0, help="wall seconds per child process (default 6 h)")
    ap.add_argument("--repeats", type=int, default=3, help="rounds per row while cheap (median; default 3)")
    ap.add_argument("--repeat-below", type=float, default=120.0,
                    help="repeat a row only while every run took under this many CPU seconds (default 120)")
    ap.add_argument("--cache", type=Path, default=None, help="folder of finished rows (resume; run in pieces)")
    ap.add_argument("--cached-only", action="store_true",
                    help="with --cache: write the table from the rows in the cache, marking the others 'not run'")
    ap.add_argument("--quick", action="store_true", help="n = 128, k in {1, 4}, mean loss, one round, a 120 s peer cap")
    ap.add_argument("--one", nargs=5, metavar=("FAMILY", "N", "K", "OBJECTIVE", "TIME_LIMIT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        fam, n, k, obj, limit = args.one
        print(json.dumps(one(fam, int(n), int(k), obj, float(limit))))
        return
    if args.quick:
        args.sizes, args.epochs, args.max_sizes, args.repeats, args.peer_cpu_cap = "128", "1,4", "", 1, 120.0
    classes = [c.strip() for c in args.classes.split(",") if c.strip()]
    unknown = sorted(set(classes) - set(CLASSES))
    if unknown:
        ap.error(f"--classes: unknown {', '.join(unknown)}; choose from {', '.join(CLASSES)}")
    if args.peer_cpu_cap <= 0 or args.time_limit <= 0 or args.budget <= 0:
        ap.error("--peer-cpu-cap, --time-limit and --budget must be positive")
    if args.cached_only and args.cache is None:
        ap.error("--cached-only needs --cache DIR")
    if args.cache is not None:
        args.cache.mkdir(parents=True, exist_ok=True)
    ok, peer_note = peer_available(args.jax_python)
    python = args.jax_python if ok else None
    if not ok and args.require_peer:
        ap.error(f"--require-peer: jax-privacy cannot be run: {peer_note}")
    if not ok:
        print(f"jax-privacy not available ({peer_note}): running dpopt's side only", file=sys.stderr, flush=True)
        peer_note = f"not run ({peer_note}); dpopt's side only"
    from dpopt.streaming.families import FAMILIES

    optimal_ok = FAMILIES.available("optimal")
    sizes = [int(s) for s in args.sizes.split(",") if s]
    max_sizes = {int(s) for s in args.max_sizes.split(",") if s}
    objectives = {o.strip() for o in args.objectives.split(",") if o.strip()}
    if not objectives or objectives - {"mean", "max"}:
        ap.error(f"--objectives: expected mean and/or max, got {args.objectives!r}")
    rows = []
    for n in sizes:
        for k in (int(s) for s in args.epochs.split(",") if s):
            if n % k:
                continue
            for objective in [o for o in (("mean", "max") if n in max_sizes else ("mean",)) if o in objectives]:
                for cls in classes:
                    row = measure_row(cls, n, k, objective, args, python, optimal_ok)
                    rows.append(row)
                    print(f"n={n} k={k} {objective} {cls}: peer {row.get('peer_loss')} ({row.get('peer_status')}, "
                          f"{row.get('peer_cpu')} CPU s) ours {row.get('ours_loss')} ({row.get('ours_status')}, "
                          f"{row.get('ours_cpu')} CPU s)", file=sys.stderr, flush=True)
    df = bound_column(pd.DataFrame(rows))
    print(write_tables(df, args, peer_note, optimal_ok))


if __name__ == "__main__":
    main()
