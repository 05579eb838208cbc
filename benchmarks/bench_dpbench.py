"""The DPBench table (Hay et al. SIGMOD 2016): dpopt's mechanisms beside Ektelo's on the DPBench histograms.

Protocol (DPBench's): for each data set (../shared/data/dpbench/1D, 4096 cells; 2D, 256 x 256), scale N and
eps, K_s data samples x ~ Multinomial(N, shape / sum(shape)) (seeded), each answered `--trials` times in
research mode (seeded); the error of one run is ||W x - W x_hat||_2 / m / N (`dpopt.error.data_error`). 1-D
workloads: all prefix sums and 2000 random ranges (seeded); 2-D: 2000 random rectangles (seeded). Each row is
one (data set, scale, eps, workload, mechanism): the mean error over the K_s x trials runs and its standard
error; the summary gives medians over data sets and each 1-D row's ratios to Ektelo's DAWA and HB.

dpopt's mechanisms: identity, hierarchical (Qardaji et al.'s branching, no root: dpopt's HB), wavelet, and the
data-aware dawa-opt (DAWA's private partition, then hdmm on the buckets, least-squares answers), whose
NNLS answers and the rule's (NNLS when a tenth of the bucket estimates are negative) from the same runs are
reported too (dawa-opt:nnls, dawa-opt:auto) to measure the inference rule. The
best data-independent dpopt mechanism of a row is the least of identity, hierarchical and wavelet (mm-optimal
and hdmm at 4096 cells are left out: their eps-DP strategies took minutes per fit here, see the notes).

Ektelo (Identity, HB, Privelet, DAWA with ratio 0.25, AHP with eta 0.35 and ratio 0.85) runs in this process
when it imports: point DPOPT_EKTELO_PATH at a built checkout of the public ektelo repository (it is never part
of this project; the notes in the table say what its build needed). Without it the Ektelo columns are absent
and the table says so.

    python -m benchmarks.bench_dpbench                 # the full 1-D table (hours: see the notes) -> results/
    python -m benchmarks.bench_dpbench --quick         # 3 data sets merged to 512 cells, 2 scales, eps 1
    python -m benchmarks.bench_dpbench --two-d         # also the 2-D rectangles table

writes benchmarks/results/dpbench.csv and benchmarks/results/dpbench.md.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import zlib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from benchmarks.tables import pipe_table
from dpopt.error import data_error
from dpopt.mechanisms import make_mechanism
from dpopt.mechanisms.base import MechanismError
from dpopt.privacy import Privacy
from dpopt.workloads import ExplicitWorkload, Kron, Prefix, Workload, boxes, range_rows

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("DPOPT_SHARED", ROOT.parent / "shared")) / "data" / "dpbench"
RANGE_SEED = 20160626  # the 2000 random ranges and rectangles
SAMPLE_SEED = 2016  # data samples and noise
N_RANGES = 2000
DPOPT_FIXED = ("identity", "hierarchical", "wavelet")
EKTELO_1D = ("Identity", "HB", "Privelet", "DAWA", "AHP")
EKTELO_2D = ("Identity", "HB", "Privelet")
# Ektelo's parameters: DAWA's budget share as in DPBench; AHP's eta and ratio as in Ektelo's own examples.
DAWA_RATIO, AHP_ETA, AHP_RATIO = 0.25, 0.35, 0.85


def ektelo() -> Any | None:
    """Ektelo's standalone plans when importable (DPOPT_EKTELO_PATH: a built checkout), else None."""
    path = os.environ.get("DPOPT_EKTELO_PATH")
    if path:
        os.environ.setdefault("EKTELO_HOME", path)
        os.environ.setdefault("EKTELO_DATA", str(Path(path) / "data"))
        if path not in sys.path:
            sys.path.insert(0, path)
    try:
        from ektelo import matrix as ek_matrix
        from ektelo.plans import standalone
    except Exception:  # absent, or not built: the table says so
        return None
    return standalone, ek_matrix


def random_ranges(n: int, count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """`count` ranges [i, j] with i <= j drawn uniformly over n cells."""
    a, b = rng.integers(0, n, size=count), rng.integers(0, n, size=count)
    return np.minimum(a, b), np.maximum(a, b)


def workloads_1d(n: int) -> dict[str, Workload]:
    lo, hi = random_ranges(n, N_RANGES, np.random.default_rng(RANGE_SEED))
    return {"prefix": Prefix(n), "ranges": ExplicitWorkload(range_rows(n, lo, hi), name=f"{N_RANGES} ranges")}


def rectangles(n1: int, n2: int) -> Workload:
    """2000 random rectangles over an n1 x n2 grid (cells in row-major order), as a union of one-row Kronecker
    products (`dpopt.workloads.boxes`)."""
    rng = np.random.default_rng(RANGE_SEED)
    r0, r1 = random_ranges(n1, N_RANGES, rng)
    c0, c1 = random_ranges(n2, N_RANGES, rng)
    return boxes((n1, n2), (r0, c0), (r1, c1), name=f"{N_RANGES} rectangles")


def seed_of(*parts: object) -> int:
    """A stable seed from the parts' text (Python's hash of a string changes from process to process)."""
    return zlib.crc32(repr(parts).encode()) ^ SAMPLE_SEED


def load_1d(name: str, merge: int) -> np.ndarray:
    x = np.load(DATA / "1D" / f"{name}.npy").astype(float).ravel()
    return x.reshape(-1, merge).sum(axis=1) if merge > 1 else x


def samples(shape: np.ndarray, scale: int, k: int, seed: int) -> np.ndarray:
    """DPBench's data generation: k draws x ~ Multinomial(scale, shape / sum(shape))."""
    p = np.asarray(shape, dtype=float).ravel()
    return np.random.default_rng(seed).multinomial(int(scale), p / p.sum(), size=k).astype(float)


def _ek_answer(plan: Any, W: Any, Wsp: Any, shape: tuple[int, ...]) -> Any:
    """answer(x, rng) of an Ektelo plan: Run(W, x, eps, seed) gives x_hat; the answers are W x_hat."""
    def answer(x: np.ndarray, rng: np.random.Generator, eps: float) -> np.ndarray:
        xh = plan.Run(W, x.astype(np.int64).reshape(shape), eps, int(rng.integers(0, 2**31 - 1)))
        return np.asarray(Wsp @ np.asarray(xh, dtype=float).ravel()).ravel()
    return answer


# A^+ of each 1-D data-independent strategy, by (cells, mechanism): formed once in the parent before the
# worker processes fork (a 4096-cell pseudo-inverse takes seconds; the strategies do not depend on eps or W).
_PINV: dict[tuple[int, str], np.ndarray] = {}


def _pinv(n: int, mname: str, s: Any) -> np.ndarray | None:
    if s.factored:
        return None  # a Kronecker strategy estimates x through its factors
    if (n, mname) not in _PINV:
        _PINV[(n, mname)] = s.pinv()
    return _PINV[(n, mname)]


def _fixed_strategy(mname: str, W: Workload, grid: tuple[int, ...], eps: float) -> Any:
    """The strategy a data-independent dpopt mechanism selects (1-D: its `_select`, which computes no error;
    2-D: its per-factor Kronecker fit)."""
    if len(grid) == 1:
        return make_mechanism(mname)._select(W, Privacy(eps)).strategy
    return make_mechanism(mname).fit(Kron([Prefix(grid[0]), Prefix(grid[1])]), Privacy(eps)).strategy_


def _fixed_answer(s: Any, p: Privacy, Wsp: Any, pinv: np.ndarray | None) -> Any:
    """answer(x, rng) of a data-independent strategy: W x_hat with x_hat = A^+ (A x + z)."""

    def answer(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        y = s.measure(x, p, rng)
        xh = s.answers(y, None) if pinv is None else pinv @ y
        return np.asarray(Wsp @ np.asarray(xh, dtype=float).ravel()).ravel()
    return answer


def run_dataset(task: dict[str, Any]) -> list[dict[str, Any]]:
    """Every row of one data set at its scales: eps x workloads x mechanisms (one worker process), also written
    to task["part"] (a CSV) when the task names one, so an interrupted run keeps what finished."""
    with threadpool_limits(limits=1):
        rows = _run_dataset(task)
    if task.get("only"):  # --remeasure: the part keeps its other mechanisms' rows
        old = pd.read_csv(task["part"])
        keep = ~old["mechanism"].str.split(":").str[0].isin(task["only"])
        rows = old[keep].to_dict(orient="records") + rows
    if task.get("part"):
        pd.DataFrame(rows).to_csv(task["part"], index=False)
    return rows


def _row(base: dict[str, Any], mech: str, source: str, errs: tuple[float, float], secs: float, runs: int,
         **extra: Any) -> dict[str, Any]:
    return {**base, "mechanism": mech, "source": source, "error": errs[0], "error_se": errs[1], "runs": runs,
            "seconds_per_run": secs / runs, **extra}


def _run_dataset(task: dict[str, Any]) -> list[dict[str, Any]]:
    name, dim, merge = task["dataset"], task["dim"], task["merge"]
    ek = ektelo() if task["ektelo"] else None
    if dim == 1:
        shape = load_1d(name, merge)
        n = shape.size
        wls = workloads_1d(n)
        grid: tuple[int, ...] = (n,)
    else:
        shape = np.load(DATA / "2D" / f"{name}.npy").astype(float)
        grid = shape.shape
        n = shape.size
        wls = {"rectangles": rectangles(*grid)}
    rows: list[dict[str, Any]] = []
    only = task.get("only")
    fixed = [m for m in DPOPT_FIXED if only is None or m in only]
    fitted = {(wname, mname, eps): _fixed_strategy(mname, W, grid, eps)
              for wname, W in wls.items() for eps in task["eps"] for mname in fixed}
    for scale in task["scales"]:
        X = samples(shape, scale, task["samples"], seed_of(name, scale))
        for wname, W in wls.items():
            Wsp = W.sparse()
            ek_W = ek[1].EkteloMatrix(Wsp) if ek is not None else None
            for eps in task["eps"]:
                base = {"dataset": name, "dim": dim, "cells": n, "scale": scale, "epsilon": eps, "workload": wname}
                seed = seed_of(name, scale, wname, eps)
                for mname in fixed:
                    t0 = time.perf_counter()
                    s = fitted[(wname, mname, eps)]
                    errs = data_error(_fixed_answer(s, Privacy(eps), Wsp, _pinv(n, mname, s)), W, X, task["trials"],
                                      np.random.default_rng(seed))
                    rows.append(_row(base, mname, "dpopt", errs, time.perf_counter() - t0, len(X) * task["trials"],
                                     strategy=s.name))
                if only is None or "dawa-opt" in only:  # 2-D: cells in Hilbert-curve order (grid=)
                    rows.extend(_dawa_opt_rows(base, W, X, eps, task["trials"], seed, grid if dim == 2 else None))
                if ek is not None:
                    rows.extend(_ektelo_rows(base, ek[0], ek_W, Wsp, W, X, eps, task["trials"], seed, grid, only))
        print(f"{name} scale {scale:g}: done", file=sys.stderr, flush=True)
    return rows


def _dawa_opt_rows(base: dict[str, Any], W: Workload, X: np.ndarray, eps: float, trials: int,
                   seed: int, grid: tuple[int, ...] | None = None) -> list[dict[str, Any]]:
    """dawa-opt's answers by the rule ("auto", NNLS when a tenth or more of the bucket estimates are negative:
    reported as dawa-opt:auto), least squares (its default: dawa-opt) and NNLS (dawa-opt:nnls), all from the
    same runs."""
    mech = make_mechanism("dawa-opt", inference="both", grid=grid).fit(W, Privacy(eps))
    rng = np.random.default_rng(seed)
    errs: dict[str, list[float]] = {"auto": [], "ls": [], "nnls": []}
    buckets, negs, skipped, cells = [], [], [], []
    t0 = time.perf_counter()
    for x in X:
        truth = np.asarray(W.matvec(x), dtype=float)
        for _ in range(trials):
            try:
                out = mech.answer_variants(x, rng)
            except MechanismError as exc:  # e.g. more buckets than the second stage takes: the row says so
                return [_row(base, name, "dpopt", (math.nan, math.nan), time.perf_counter() - t0, 1,
                             strategy=f"failed: {exc}") for name in ("dawa-opt:auto", "dawa-opt", "dawa-opt:nnls")]
            for k in errs:  # no "nnls" where the strategy is held through its factors (a skipped 2-D partition)
                est = out.get(k)
                errs[k].append(math.nan if est is None else float(np.linalg.norm(truth - est)) / W.m / float(x.sum()))
            buckets.append(out["buckets"])
            negs.append(out["negative_fraction"])
            skipped.append(out["dense"])
            cells.append(out["cells_stage"])
    secs = time.perf_counter() - t0
    rows = []
    for k, name in (("auto", "dawa-opt:auto"), ("ls", "dawa-opt"), ("nnls", "dawa-opt:nnls")):
        e = np.array(errs[k])
        rows.append(_row(base, name, "dpopt", (float(e.mean()), float(e.std(ddof=1) / math.sqrt(e.size))), secs,
                         e.size, buckets=float(np.median(buckets)), negative_fraction=float(np.median(negs)),
                         partition_skipped=float(np.mean(skipped)), cells_stage=float(np.mean(cells))))
    return rows


def _ektelo_rows(base: dict[str, Any], standalone: Any, ek_W: Any, Wsp: Any, W: Workload, X: np.ndarray,
                 eps: float, trials: int, seed: int, grid: tuple[int, ...],
                 only: set[str] | None = None) -> list[dict[str, Any]]:
    plans = {"Identity": standalone.Identity(), "HB": standalone.HB(grid), "Privelet": standalone.Privelet(grid)}
    if len(grid) == 1:
        plans["DAWA"] = standalone.Dawa(grid, DAWA_RATIO, False)
        plans["AHP"] = standalone.Ahp(AHP_ETA, AHP_RATIO)
    rows = []
    for name, plan in plans.items():
        if only is not None and name not in only:
            continue
        answer = _ek_answer(plan, ek_W, Wsp, grid)
        t0 = time.perf_counter()
        errs = data_error(lambda x, rng, a=answer: a(x, rng, eps), W, X, trials, np.random.default_rng(seed))
        rows.append(_row(base, name, "ektelo", errs, time.perf_counter() - t0, len(X) * trials))
    return rows


def _runs_note(df: pd.DataFrame) -> str:
    """How many runs the table's rows hold (rows re-measured by --remeasure may hold more)."""
    runs = df["runs"].astype(int)
    if runs.min() == runs.max():
        return f"every row {runs.min()} runs"
    more = sorted(df.loc[runs > runs.min(), "mechanism"].unique())
    return (f"rows hold {runs.min()} to {runs.max()} runs: those of {', '.join(more)} were measured again with "
            "`--remeasure` and more trials (the CSV's runs column)")


def _expected_table(n: int) -> pd.DataFrame | None:
    """Exact expected total squared error (eps = 1, Laplace) of dpopt's hierarchical and of Ektelo's HB strategy
    on the 1-D workloads: both data-independent with least-squares inference, so 2 (||A||_1 / eps)^2
    tr(W^T W (A^T A)^-1) is their error on any data; a sampled ratio away from 1 is sampling noise."""
    ek = ektelo()
    if ek is None or n <= 0:
        return None
    import scipy.linalg as sla
    import scipy.sparse as sp
    from ektelo.client import selection as ek_selection

    A = sp.csr_matrix(ek_selection.HB((n,)).select().sparse_matrix())
    sens = float(abs(A).sum(axis=0).max())
    chol = sla.cho_factor((A.T @ A).toarray())
    rows = []
    for wname, W in workloads_1d(n).items():
        wtw = W.gram()
        wtw = wtw.toarray() if hasattr(wtw, "toarray") else np.asarray(wtw)
        hb = 2.0 * sens**2 * float(np.trace(sla.cho_solve(chol, wtw)))
        mech = make_mechanism("hierarchical").fit(W, Privacy(1.0))
        ours = float(mech.expected_error_.total)
        rows.append({"workload": wname, "cells": n, "dpopt_strategy": mech.strategy_.name,
                     "dpopt_hierarchical": ours, "ektelo_HB": hb, "ratio": ours / hb})
    return pd.DataFrame(rows)


def _expected_note(n: int) -> list[str]:
    return ["hierarchical and HB: see the exact expected errors below (equal strategies' errors are equal on any "
            "data; the sampled hierarchical/HB column differs from 1 by sampling noise and Ektelo's iterative "
            "least squares)."] if n and ektelo() is not None else []


def _ratio_sections(one: pd.DataFrame, label: str) -> list[str]:
    """Every row's ratios to the best fixed mechanism, DAWA and HB (where run), then their counts per scale."""
    out: list[str] = []
    keys = ["dataset", "scale", "epsilon", "workload"]
    piv = one.pivot_table(index=keys, columns="mechanism", values="error")
    # the standard errors on the same rows and columns (one run a row: every SE is NaN, and pivot_table drops them)
    se = (one.pivot_table(index=keys, columns="mechanism", values="error_se", dropna=False)
          .reindex(index=piv.index, columns=piv.columns).reset_index())
    piv = piv.reset_index()
    piv["best_fixed"] = piv[list(DPOPT_FIXED)].min(axis=1)
    best_se = se[list(DPOPT_FIXED)].to_numpy()[np.arange(len(piv)), np.argmin(piv[list(DPOPT_FIXED)].to_numpy(), 1)]
    ratios = piv[keys].copy()
    for col in ("dawa-opt", "dawa-opt:auto", "dawa-opt:nnls"):
        ratios[f"{col}/best_fixed"] = piv[col] / piv["best_fixed"]
    ratios["z(dawa-opt - best_fixed)"] = (piv["dawa-opt"] - piv["best_fixed"]) / np.hypot(se["dawa-opt"], best_se)
    ratios["auto/ls"] = piv["dawa-opt:auto"] / piv["dawa-opt"]
    ratios["nnls/ls"] = piv["dawa-opt:nnls"] / piv["dawa-opt"]
    if "DAWA" in piv:
        for col in ("dawa-opt", "dawa-opt:auto", "dawa-opt:nnls"):
            ratios[f"{col}/DAWA"] = piv[col] / piv["DAWA"]
        ratios["dawa-opt_se/DAWA"] = se["dawa-opt"] / piv["DAWA"]
        ratios["DAWA_se/DAWA"] = se["DAWA"] / piv["DAWA"]
        # the difference in standard errors of the two means (independent runs): above 2, dpopt's is higher
        # beyond what the rows' sampling explains
        ratios["z(dawa-opt - DAWA)"] = (piv["dawa-opt"] - piv["DAWA"]) / np.hypot(se["dawa-opt"], se["DAWA"])
    if "HB" in piv:
        ratios["dawa-opt/HB"] = piv["dawa-opt"] / piv["HB"]
        ratios["hierarchical/HB"] = piv["hierarchical"] / piv["HB"]
    out += [f"## Every {label} row: ratios (below 1: dpopt's is lower)", "",
            pipe_table(ratios, list(ratios.columns)), ""]
    counts = []
    zs = {"dawa-opt/DAWA": "z(dawa-opt - DAWA)", "dawa-opt/best_fixed": "z(dawa-opt - best_fixed)"}
    for scale in [*sorted(ratios["scale"].unique()), "all"]:  # each scale, then every row
        part = ratios if scale == "all" else ratios[ratios["scale"] == scale]
        for col in [c for c in ratios.columns if "/" in c and "_se" not in c and not c.startswith("z(")]:
            r, z = part[col], part.get(zs.get(col, ""))
            counts.append({"scale": scale, "ratio": col, "rows": int(r.notna().sum()),
                           "at_or_below_1": int((r <= 1).sum()),
                           "above_by_2_se": int((z > 2).sum()) if z is not None else "",
                           "median": float(r.median()), "max": float(r.max())})
    if counts:
        out += [f"## Ratio summary over the {label} rows (z: the difference of the two means in standard errors)", "",
                pipe_table(pd.DataFrame(counts), list(counts[0])), ""]
    return out


def summary(df: pd.DataFrame, notes: list[str], expected: pd.DataFrame | None = None) -> str:
    """The markdown report: notes, medians over data sets, and each row's ratios to DAWA and HB (1-D, then 2-D)."""
    out = ["# DPBench: dpopt beside Ektelo (benchmarks/bench_dpbench.py)", "", *notes, ""]
    if expected is not None:
        out += ["## hierarchical beside Ektelo's HB: exact expected total squared error at eps = 1", "",
                pipe_table(expected, list(expected.columns)), ""]
    med = (df.groupby(["dim", "scale", "epsilon", "workload", "mechanism"])["error"].median()
           .unstack("mechanism").reset_index())
    out += ["## Median error over data sets (||W x - W x_hat||_2 / m / scale; mean of each row's runs)", "",
            pipe_table(med, list(med.columns)), ""]
    for dim in (1, 2):
        if (df["dim"] == dim).any():
            out += _ratio_sections(df[df["dim"] == dim], f"{dim}-D")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 data sets merged to 512 cells, scales 1e3 and 1e5, eps 1")
    ap.add_argument("--two-d", action="store_true", help="also the 2-D data sets with 2000 rectangles")
    ap.add_argument("--samples", type=int, default=5, help="data samples per (data set, scale) (default 5)")
    ap.add_argument("--trials", type=int, default=1, help="noise trials per sample (default 1)")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes, one data set each at a time (default 2)")
    ap.add_argument("--datasets", default=None,
                    help="comma-separated 1-D data set names (default all 18; '' for none, e.g. with --two-d)")
    ap.add_argument("--scales", default=None, help="comma-separated scales (default 1e3,1e5,1e7)")
    ap.add_argument("--out", default="dpbench", help="file stem under benchmarks/results (default dpbench)")
    ap.add_argument("--resume", action="store_true",
                    help="keep the (data set, scale) parts an earlier run finished (results/OUT_parts/)")
    ap.add_argument("--remeasure", default=None,
                    help="with --resume: measure these mechanisms again (comma-separated, e.g. dawa-opt,DAWA) in the "
                         "kept parts, replacing their rows (each row keeps its own runs); runs no missing part")
    ap.add_argument("--parts-only", action="store_true",
                    help="with --resume: run nothing, write the table from the finished parts (it says how many)")
    args = ap.parse_args(argv)
    ek = ektelo()
    names = sorted(p.stem for p in (DATA / "1D").glob("*.npy"))
    scales, eps, merge = [10**3, 10**5, 10**7], [0.1, 1.0], 1
    if args.quick:
        names, scales, eps, merge = ["ADULTFRANK.n4096", "HEPTH.n4096", "INCOME.n4096"], [10**3, 10**5], [1.0], 8
        args.samples = min(args.samples, 2)
    if args.datasets is not None:  # '' with --two-d: the 2-D sets only
        names = [s.strip() for s in args.datasets.split(",") if s.strip()]
    if args.scales:
        scales = [int(float(s)) for s in args.scales.split(",") if s.strip()]
    parts = RESULTS / f"{args.out}_parts"
    parts.mkdir(parents=True, exist_ok=True)
    sets = [(d, 1) for d in names] + ([(p.stem, 2) for p in sorted((DATA / "2D").glob("*.npy"))] if args.two_d else [])
    # one task per (data set, scale), the smaller scales first; each finished task is kept in a part file
    tasks = [{"dataset": d, "dim": dim, "merge": merge if dim == 1 else 1, "scales": [sc], "eps": eps,
              "samples": args.samples, "trials": args.trials, "ektelo": ek is not None,
              "part": str(parts / f"{d}_{sc}.csv")} for sc in scales for d, dim in sets]
    done = [t for t in tasks if args.resume and Path(t["part"]).exists()]
    missing = [t for t in tasks if t not in done]
    tasks = [] if args.parts_only else missing
    if args.remeasure:
        only = {m.strip() for m in args.remeasure.split(",") if m.strip()}
        known = {*DPOPT_FIXED, "dawa-opt", *EKTELO_1D}
        if not args.resume or args.parts_only or not only or not only <= known:
            ap.error(f"--remeasure takes names among {sorted(known)} and needs --resume without --parts-only")
        tasks, done = [dict(t, only=only) for t in done], []
    t0 = time.perf_counter()
    with threadpool_limits(limits=1):  # the 1-D pseudo-inverses, shared with the workers by fork
        n1 = load_1d(names[0], merge).size if names and tasks else 0
        for mname in DPOPT_FIXED:
            if n1:
                _pinv(n1, mname, _fixed_strategy(mname, Prefix(n1), (n1,), 1.0))
    rows: list[dict[str, Any]] = []
    for t in done:
        part = pd.read_csv(t["part"])
        if (part["mechanism"] == "dawa-opt:ls").any():  # parts written before the default became least squares
            part["mechanism"] = part["mechanism"].replace({"dawa-opt": "dawa-opt:auto", "dawa-opt:ls": "dawa-opt"})
        rows.extend(part.to_dict(orient="records"))
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for part in pool.map(run_dataset, tasks):
            rows.extend(part)
    wall = time.perf_counter() - t0
    df = pd.DataFrame(rows)
    n_cells = int(df.loc[df["dim"] == 1, "cells"].max()) if (df["dim"] == 1).any() else 0
    RESULTS.mkdir(parents=True, exist_ok=True)
    df.to_csv(RESULTS / f"{args.out}.csv", index=False)
    cmd = "python -m benchmarks.bench_dpbench " + " ".join(argv if argv is not None else sys.argv[1:])
    notes = [
        f"Command: `{cmd.strip()}`; {len(sets)} data sets, scales {scales}, eps {eps}, {args.samples} samples x "
        f"{args.trials} trials per row run now ({_runs_note(df)}), cells merged {merge}:1; research-mode noise, "
        "seeded.",
        f"Runtime: {wall:.0f} s wall with {args.jobs} worker processes of one BLAS thread each for the "
        f"{len(tasks)} (data set, scale) parts run now ({len(done)} kept from an earlier run); seconds_per_run in "
        "the CSV is each mechanism's own wall time."
        + (f" PARTIAL TABLE: {len(missing)} of {len(missing) + len(done)} (data set, scale) parts were not run"
           "; `--resume` runs them." if (args.parts_only or args.remeasure) and missing else ""),
        "Ektelo: " + ("run from DPOPT_EKTELO_PATH (Identity, HB, Privelet, DAWA ratio 0.25 with the exact L1 "
                      "partition, AHP eta 0.35 ratio 0.85); see benchmarks/dpbench_notes.md for what its build "
                      "needed" if (df["source"] == "ektelo").any() else
                      "not importable here (set DPOPT_EKTELO_PATH to a built checkout): Ektelo columns absent"),
        "dawa-opt's partition noise has 1 to 2 times the scale of DAWA's (Delta_B + Delta_max over eps1 for a "
        "bucket B: the report-noisy-min argument in dpopt/partition.py; DAWA's (Delta_B + Delta_max) / (2 eps1) "
        "is not covered by it), over buckets of every length up to n / 4 to within 1/R with ends on a grid of 1/R "
        "of their length (`dpopt.partition.candidate_family`; DAWA's exact partition takes every interval); its "
        "second stage is hdmm (eps-DP's Laplace-error optimum) on the buckets up to 256 buckets, its "
        "p-Identity of size 16 (OPT_0 only) up to 2048, else the best of identity, hierarchical and wavelet. "
        "Its policy (`dpopt.mechanisms.data_aware`) spends 2% of "
        "eps on the noisy total and count changes: R = 4 where N eps / n < 1 (every 1,000-record row), else 16; "
        "at N eps / n >= 100 the partition is skipped when it would keep too many buckets to pay for its budget "
        "(the hierarchy model, then the second stage's exact error on that many equal buckets; column "
        "partition_skipped: the fraction of runs). On a 2-D grid the model is left out and the stage's SVD lower "
        "bound on that many equal buckets stands for its exact error; after a partition the second stage is the "
        "best of identity, hierarchical and wavelet on all cells at the stage's eps when its expected error is "
        "at most the bucket stage's, or when the partition kept more than 8192 buckets (column cells_stage: the "
        "fraction of runs; dawa-opt rows measured before it have no value there).",
        *_expected_note(n_cells),
        "Not run here: mm-optimal and hdmm on the 4096-cell domain (minutes per fit under eps-DP), and Ektelo's "
        "DAWA on 2-D data (its exact partition of 65,536 cells is quadratic); dawa-opt partitions 2-D data in "
        "Hilbert-curve order (`dpopt.partition.hilbert_order`, DAWA's own reduction).",
    ]
    (RESULTS / f"{args.out}.md").write_text(summary(df, notes, _expected_table(n_cells) if ek else None))
    print(f"wrote {RESULTS / (args.out + '.md')} in {wall:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
