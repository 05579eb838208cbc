"""Fit every applicable mechanism on one workload and tabulate expected errors against the lower bound."""

from __future__ import annotations

import functools
import json
import math
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np
import pandas as pd

from dpopt.bounds import L2_BOUND_MAX_CELLS, certified_l2_bound
from dpopt.error import data_error
from dpopt.mechanisms.base import MechanismError
from dpopt.mechanisms.convergence import ConvergenceWarning
from dpopt.mechanisms.registry import (
    BASELINE_CHECK_EIGHS,
    FIXED_COST_EIGHS,
    MECHANISMS,
    available_mechanisms,
    by_cost,
    make_mechanism,
)
from dpopt.plotting import saved_figure
from dpopt.privacy import Privacy, check_privacy_range
from dpopt.strategy import StrategyError
from dpopt.validation import check_output_file, check_time_limit, count_text
from dpopt.workloads import MAX_DENSE_ENTRIES, GramWorkload, Workload, WorkloadTooLargeError

COLUMNS = [
    "mechanism",
    "strategy_rank",
    "sensitivity",
    "expected_total_error",
    "rmse",
    "max_query_std",
    "bound",
    "ratio_to_bound",
    "bound_kind",
    "release_total_error",
    "fit_seconds",
    "solver",
    "status",
]


# Added to COLUMNS when compare is given data (`--data`): DPBench's scaled error and its standard error.
DATA_COLUMNS = ["data_error", "data_error_se"]


def shown_columns(df: pd.DataFrame) -> list[str]:
    """The columns a table shows: COLUMNS, and DATA_COLUMNS after expected_total_error when measured on data."""
    if "data_error" not in df:
        return list(COLUMNS)
    i = COLUMNS.index("expected_total_error") + 1
    return [*COLUMNS[:i], *DATA_COLUMNS, *COLUMNS[i:]]


# Relative slack on the delta check: the Balle-Wang delta is computed to about 1e-12 relative.
DELTA_RTOL = 1e-9


def calibration_problem(privacy: Privacy) -> str | None:
    """Why the classic Gaussian sigma is not (eps, delta)-DP here (Balle-Wang delta > requested), or None."""
    if privacy.is_pure or privacy.calibration != "classic":
        return None
    achieved = privacy.achieved_delta()
    if achieved <= privacy.delta * (1 + DELTA_RTOL):
        return None
    return (
        f"classic-calibration-invalid: achieves delta={achieved!r} > requested {privacy.delta!r} "
        f"at eps={privacy.epsilon!r} (use --calibration analytic)"
    )


# Wall-clock seconds each mechanism's strategy selection may take in `dpopt compare` (--time-limit).
# At n = 256 every mechanism but LRM and the Appendix B solver finishes well inside it, so a default
# comparison takes about two of these budgets plus a few seconds. Under eps-DP hdmm improves on HDMM's OPT_0
# until this limit or until its rounds of restarts stop gaining (`dpopt.solvers.pidentity.search_pidentity`).
DEFAULT_TIME_LIMIT = 60.0
# Size of the eigendecomposition timed to calibrate the cost model (`estimated_fixed_seconds`); larger
# domains are scaled by (n / PROBE_CELLS)^3.
PROBE_CELLS = 512
PROBE_REPEATS = 3


class CompareInterrupted(KeyboardInterrupt):
    """Ctrl-C during `compare`: `partial` holds the rows that finished, `interrupted` the names that did not."""

    def __init__(self, partial: pd.DataFrame, interrupted: list[str]) -> None:
        super().__init__(f"interrupted; not finished: {', '.join(interrupted)}")
        self.partial = partial
        self.interrupted = interrupted


def eigh_seconds(n: int, rng: np.random.Generator | None = None) -> float:
    """Wall seconds of one dense symmetric eigendecomposition of n x n here and now (the fastest of
    PROBE_REPEATS probes at min(n, PROBE_CELLS) cells, so one scheduling hiccup does not count, scaled by
    the cube of the size ratio): the unit of FIXED_COST_EIGHS."""
    k = max(1, min(int(n), PROBE_CELLS))
    rng = np.random.default_rng(0) if rng is None else rng
    X = rng.standard_normal((k, k))
    X = X + X.T
    best = math.inf
    for _ in range(PROBE_REPEATS):
        t0 = time.perf_counter()
        np.linalg.eigh(X)
        best = min(best, time.perf_counter() - t0)
    return best * (n / k) ** 3


def estimated_fixed_seconds(name: str, workload: Workload, privacy: Privacy,
                            eigh: Callable[[int], float] = eigh_seconds) -> float | None:
    """Seconds a budgeted fit of `name` spends beyond the reach of its time limit, or None when unknown.

    eigh(n): seconds of one n x n eigendecomposition (`eigh_seconds`). The matrix mechanisms' costs are
    FIXED_COST_EIGHS eigendecompositions of every problem they solve (the whole domain, or each factor
    of a Kronecker workload they select over per factor); LRM checks its own (it needs one SVD of W
    first), the other mechanisms have no iterations to cut.
    """
    eighs = FIXED_COST_EIGHS.get(name)
    if eighs is None:
        return None
    mech = make_mechanism(name)
    kron, _ = mech.factor_plan(workload, privacy)
    if kron is None and workload.n**2 > MAX_DENSE_ENTRIES:
        return None  # the fit refuses at once, saying why
    if getattr(mech, "baselines", False):
        eighs += BASELINE_CHECK_EIGHS
    sizes = [workload.n] if kron is None else [f.n for f in kron.factors]
    return eighs * sum(eigh(n) for n in sizes)


class _Progress:
    """Progress of a comparison on `stream`: a live line (mechanism, m x n, elapsed, iteration, gap) on a
    terminal, else one line per mechanism as it starts."""

    def __init__(self, stream: TextIO, workload: Workload, time_limit: float | None) -> None:
        self.stream = stream
        self.workload = workload
        self.time_limit = time_limit
        isatty = getattr(stream, "isatty", None)
        self.live = bool(isatty and isatty())
        self.bar: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last = -math.inf

    def start(self, name: str) -> None:
        m, n = self.workload.shape
        limit = "" if self.time_limit is None else f", time limit {self.time_limit:g} s"
        if not self.live:
            print(f"fitting {name} on {self.workload.name} ({m} x {n}{limit}) ...", file=self.stream, flush=True)
            return
        from tqdm import tqdm

        self.bar = tqdm(total=None, desc=f"{name} ({m} x {n}{limit})", file=self.stream, leave=False,
                        bar_format="{desc}: {elapsed}{postfix}", dynamic_ncols=True)
        self._stop.clear()
        self._thread = threading.Thread(target=self._tick, daemon=True)
        self._thread.start()

    def note(self, text: str) -> None:
        """One line for a mechanism that does not start (skipped before fitting)."""
        print(text, file=self.stream, flush=True)

    def _tick(self) -> None:
        """Keep the elapsed time moving while a solver step runs without reporting."""
        while not self._stop.wait(1.0):
            bar = self.bar
            if bar is not None:
                bar.refresh()

    def event(self, info: dict[str, Any]) -> None:
        """A solver's per-iteration report (see dpopt.mechanisms.base.FitBudget), shown at most 5 times a second."""
        if self.bar is None or time.perf_counter() - self._last < 0.2:
            return
        self._last = time.perf_counter()
        parts = []
        if "stage" in info:
            parts.append(str(info["stage"]))
        if "iteration" in info:
            parts.append(f"iteration {info['iteration']}")
        if "gap" in info:
            parts.append(f"gap {info['gap']:.2e}")
        if "residual" in info:
            parts.append(f"residual {info['residual']:.2e}")
        self.bar.set_postfix_str(", ".join(parts))

    def finish(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def about_seconds(seconds: float) -> str:
    """An estimate in whole seconds from 10 s up, else to two significant digits."""
    return f"{math.ceil(seconds)}" if seconds >= 10 else f"{seconds:.2g}"


def _skipped_row(name: str, workload: Workload, why: str) -> dict[str, Any]:
    return {"mechanism": name, "workload": workload.name, "expected_total_error": math.nan, "rmse": math.nan,
            "status": f"skipped: {why}"}


# max_query_std is computed from a dense strategy's per-query variances (w_i^T X^+ w_i over the rows of W) when that
# takes at most this many multiply-adds (about 10 s); range families and factored strategies need far fewer.
MAX_QUERY_VARIANCE_OPS = 20_000_000_000


def _dense_variance_ops(strategy: Any, workload: Workload) -> float:
    """Multiply-adds of the per-query variances of a dense least-squares strategy: nnz(W) n through W's rows,
    (n^2 + m) for a range family; 0 when the strategy's structure or given B computes them another way."""
    if strategy.factored or strategy.B is not None:
        return 0.0
    if workload.range_bounds() is not None:
        return float(workload.n) ** 2 + float(workload.m)
    W = workload.stored()
    return float(W.nnz if hasattr(W, "nnz") else W.size) * workload.n


def max_query_std(mech: Any) -> tuple[float, str | None]:
    """(sqrt(max_i Var(q_i)), None): the largest per-query standard deviation of a fitted mechanism's error model,
    through the strategy's structure (`Strategy.max_query_unit_variance`); or (NaN, why it is not reported)."""
    w, strategy = mech.workload_, mech.strategy_
    dense_least_squares = not strategy.factored and strategy.B is None
    if dense_least_squares and not w.has_rows and w.range_bounds() is None:
        if isinstance(w, GramWorkload):
            return math.nan, f"max_query_std: {w.name} is known only through its Gram matrix W^T W, not its queries"
        return math.nan, (f"max_query_std: the {count_text(w.m)} queries of {w.name} cannot be listed, so the largest "
                          "of their variances is not computed")
    ops = _dense_variance_ops(strategy, w)
    if ops > MAX_QUERY_VARIANCE_OPS:
        return math.nan, (f"max_query_std: the per-query variances of this dense strategy on {w.name} would take "
                          f"about {ops:.2g} operations (more than {MAX_QUERY_VARIANCE_OPS:.0e})")
    try:
        unit = strategy.max_query_unit_variance(w)
    except (WorkloadTooLargeError, StrategyError, MemoryError) as exc:
        return math.nan, f"max_query_std: {exc}"
    err = mech.expected_error_
    var = mech.privacy_.variance_factor * err.sensitivity**2
    return math.sqrt(var * unit), None


def size_problems(workload: Workload, privacy: Privacy, names: Sequence[str]) -> dict[str, str]:
    """{mechanism: why it cannot fit `workload` at its size} for the named mechanisms that cannot, before any fit."""
    out = {}
    for name in names:
        problem = make_mechanism(name).size_problem(workload, privacy)
        if problem is not None:
            out[name] = problem
    return out


def check_fits_some(workload: Workload, privacy: Privacy, names: Sequence[str], label: str | None = None) -> None:
    """Refuse (ValueError, one line) a workload that none of the named mechanisms can fit at its size, naming
    what would fit; a comparison where some fit runs, the others' rows say why they were skipped. `label`
    names the workload as the user gave it (default its name)."""
    problems = size_problems(workload, privacy, list(dict.fromkeys(names)))
    if len(problems) < len(set(names)):
        return
    first, why = next(iter(problems.items()))
    others = f" (and likewise {', '.join(n for n in problems if n != first)})" if len(problems) > 1 else ""
    raise ValueError(f"no mechanism can fit {label or workload.name} ({count_text(workload.n)} cells): {why}{others}")


@dataclass(frozen=True)
class DataRuns:
    """Data for `compare`'s data_error: K_s x n samples (`dpopt.error.data_samples`), noise trials per sample,
    and the seed of each mechanism's research-mode noise (the same seed for every mechanism)."""

    samples: np.ndarray
    trials: int = 1
    seed: int = 0


def _fit_row(name: str, workload: Workload, privacy: Privacy, time_limit: float | None,
             eigh: Callable[[int], float], progress: _Progress | None, objective: str = "sum",
             data: DataRuns | None = None) -> dict[str, Any]:
    """One mechanism's record (with data_error and data_error_se when given data), or a 'skipped: why' row."""
    problem = make_mechanism(name).size_problem(workload, privacy)
    if problem is not None:
        if progress is not None:
            progress.note(f"skipping {name} on {workload.name}: {problem}")
        return _skipped_row(name, workload, problem)
    if time_limit is not None:
        est = estimated_fixed_seconds(name, workload, privacy, eigh)
        if est is not None and est > time_limit:
            if progress is not None:
                progress.note(f"skipping {name} on {workload.name}: estimated {about_seconds(est)} s")
            return _skipped_row(name, workload, f"would take about {about_seconds(est)} s, more than the time "
                                f"limit of {time_limit:g} s (use --time-limit)")
    if progress is not None:
        progress.start(name)
    try:
        with warnings.catch_warnings():
            # a capped solver's strategy is flagged in its row's status; the warning would repeat it
            warnings.simplefilter("ignore", ConvergenceWarning)
            params = {"objective": objective} if objective != "sum" and name == "mm-optimal" else {}
            mech = make_mechanism(name, **params).fit(workload, privacy, time_limit=time_limit,
                                                      progress=None if progress is None else progress.event)
        rec = mech.record()
        # a data-dependent mechanism has no data-independent error model (its record says so)
        if getattr(mech, "data_dependent", False):
            rec["max_query_std"] = math.nan
        else:
            rec["max_query_std"], note = max_query_std(mech)
            if note is not None:
                rec["note"] = note
        if data is not None:
            runs = (len(data.samples) if np.ndim(data.samples) == 2 else 1) * data.trials  # data_error checks X
            done = [0]

            def answer(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
                out = mech.answer(x, rng)
                done[0] += 1
                if progress is not None:  # a data-dependent mechanism chooses its strategy in every run
                    progress.event({"stage": f"data run {done[0]} of {runs}"})
                return out

            rec["data_error"], rec["data_error_se"] = data_error(
                answer, mech.workload_, data.samples, data.trials, np.random.default_rng(data.seed))
        return rec
    except (MechanismError, StrategyError, WorkloadTooLargeError, MemoryError) as exc:
        return _skipped_row(name, workload, str(exc))
    finally:
        if progress is not None:
            progress.finish()


def eps_dp_bound(workload: Workload, privacy: Privacy, time_limit: float | None,
                 progress: _Progress | None = None) -> tuple[float, str] | None:
    """Under eps-DP, (P_eps times the certified L2-optimum bound, its kind) where it runs, else None.

    sens1(A) >= sens2(A), so P_eps min trace(W^T W X^+) over diag(X) <= 1 bounds every eps-DP strategy's
    error; its certified dual bound (`certified_l2_bound`) is tighter than P_eps SVDB(W). Under (eps, delta)
    the bound stays P SVDB(W), the papers' convention.
    """
    if not privacy.is_pure or workload.gram_log_scale != 0.0 or workload.n > L2_BOUND_MAX_CELLS:
        return None
    if progress is not None:
        progress.note(f"certifying the eps-DP lower bound on {workload.name} ...")
    try:
        value, kind = certified_l2_bound(workload, time_limit)
    except (WorkloadTooLargeError, MemoryError):
        return None
    relaxed = pure_relaxation_bound(workload)
    if relaxed is not None and relaxed > value:
        value, kind = relaxed, "pure-relaxation"
    return privacy.variance_factor * value, kind


# The eps-DP relaxation with triangle cuts (formulations.mm_pure, 4 C(n, 3) cuts) runs where n is at most this
# (0.9 s at n = 16 with Clarabel); its dual objective is shrunk by RELAXATION_SHRINK for the conic solver's
# feasibility tolerance (1e-8 relative), so it only loosens.
PURE_RELAXATION_MAX_CELLS = 16
RELAXATION_SHRINK = 1e-6


def pure_relaxation_bound(workload: Workload) -> float | None:
    """min trace(W^T W X^+) over the L1-Gram relaxation with triangle cuts (seed 002 Sec. 1.2; `formulations.mm_pure`),
    a lower bound on every eps-DP strategy's unit error, at most PURE_RELAXATION_MAX_CELLS cells; else None."""
    if workload.n > PURE_RELAXATION_MAX_CELLS or workload.gram_log_scale != 0.0:
        return None
    try:
        from formulations import mm_pure
        from formulations.solve import FormulationError, solve
    except ImportError:
        return None
    try:
        res = solve(mm_pure.build(workload, zero_columns="drop"), "clarabel")
    except (FormulationError, ValueError):
        return None
    value = res.dual_objective
    return None if value is None or not value > 0 else float(value) * (1.0 - RELAXATION_SHRINK)


def _use_bound(row: dict[str, Any], tightest: tuple[float, str] | None) -> None:
    """Set the row's bound to the tightest valid one (never lowering it) and name its kind."""
    row.setdefault("bound_kind", "svd")
    if tightest is None or not _finite(row.get("expected_total_error")):
        return
    value, kind = tightest
    if value > row.get("bound", 0.0) or not _finite(row.get("bound")):
        row["bound"], row["bound_kind"] = value, kind
        row["ratio_to_bound"] = row["expected_total_error"] / value


def release_noise_ratio(sensitivity: float, privacy: Privacy) -> float:
    """(sigma a release draws / sigma of the error model)^2: OpenDP's certified Gaussian sigma against the
    calibration's (1 for Laplace, whose release scale b = sens1/eps is the model's)."""
    if privacy.is_pure or not (math.isfinite(sensitivity) and sensitivity > 0):
        return 1.0
    from dpopt.release import certified_gaussian_sigma

    return (certified_gaussian_sigma(sensitivity, privacy.epsilon, privacy.delta)
            / privacy.noise_scale(sensitivity)) ** 2


def release_total_error(row: dict[str, Any], privacy: Privacy) -> float:
    """Expected total squared error of the same strategy released by `dpopt answer` (OpenDP's noise)."""
    total, sens = row.get("expected_total_error"), row.get("sensitivity")
    if not (_finite(total) and _finite(sens)):
        return math.nan
    try:
        return float(total) * release_noise_ratio(float(sens), privacy)
    except ImportError:  # OpenDP not installed: release mode is unavailable, so is its error
        return math.nan


def _frame(rows: list[dict[str, Any]], data: bool = False) -> pd.DataFrame:
    """The rows as a table sorted by error: data_error when measured on data, else expected_total_error."""
    df = pd.DataFrame(rows)
    for col in COLUMNS + (DATA_COLUMNS if data else []):
        if col not in df:
            df[col] = math.nan
    key = "data_error" if data else "expected_total_error"
    return df.sort_values(key, na_position="last").reset_index(drop=True)


def mechanism_order(mechanisms: Sequence[str] | None) -> list[str]:
    """The mechanisms to run (default: every available one), once each, in COST_ORDER; unknown names raise."""
    names = list(mechanisms) if mechanisms else available_mechanisms()
    unknown = [n for n in names if n not in MECHANISMS]
    if unknown:
        raise ValueError(f"unknown mechanism(s) {', '.join(unknown)}; expected some of {', '.join(MECHANISMS)}")
    return by_cost(list(dict.fromkeys(names)))


def compare(
    workload: Workload,
    privacy: Privacy,
    mechanisms: Sequence[str] | None = None,
    progress: TextIO | None = None,
    *,
    time_limit: float | None = DEFAULT_TIME_LIMIT,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    objective: str = "sum",
    data: DataRuns | None = None,
) -> pd.DataFrame:
    """One row per mechanism, sorted by expected total error; a mechanism that cannot run gets status 'skipped: why'.

    Mechanisms run in `COST_ORDER` (fastest first), each with `time_limit` wall-clock seconds for its
    strategy selection (None: no limit). An iterative solver that reaches the limit returns its best
    valid strategy (status 'time_limit: valid, not certified optimal'; its certified gap in `gap` when
    it has one); a mechanism whose work beyond the limit's reach is estimated above the limit is
    skipped with 'skipped: would take about N s ...'. on_row(record) is called as each row finishes;
    progress (a stream) gets a live line on a terminal, else one line per mechanism. Ctrl-C raises
    CompareInterrupted carrying the finished rows. objective "max" makes mm-optimal minimise the largest
    per-query variance (`solve_minimax`) instead of the total; every row reports max_query_std.

    Under the classic Gaussian calibration at an eps where it is not (eps, delta)-DP, every row keeps its
    numbers and its status starts with 'classic-calibration-invalid: achieves delta=... > requested ...'.

    data (`DataRuns`): each fitted mechanism also answers every sample `trials` times in research mode and
    its row gets data_error (DPBench's mean ||W x - W x_hat||_2 / m / sum(x), `dpopt.error.data_error`)
    and data_error_se; the rows are then sorted by data_error.
    """
    names = mechanism_order(mechanisms)
    time_limit = check_time_limit(time_limit)
    display = None if progress is None else _Progress(progress, workload, time_limit)
    problem = calibration_problem(privacy)
    rows: list[dict[str, Any]] = []
    try:
        tightest = eps_dp_bound(workload, privacy, time_limit, display)
        eigh = functools.cache(eigh_seconds)  # probed once per size, and only when an estimate needs it
        for name in names:
            row = _fit_row(name, workload, privacy, time_limit, eigh, display, objective, data)
            row["release_total_error"] = release_total_error(row, privacy)
            _use_bound(row, tightest)
            if problem is not None:
                row["status"] = f"{problem}; solver status: {row.get('status')}"
            rows.append(row)
            if on_row is not None:
                on_row(row)
    except KeyboardInterrupt:
        raise CompareInterrupted(_frame(rows, data is not None), names[len(rows):]) from None
    return _frame(rows, data is not None)


def format_table(df: pd.DataFrame, fmt: str) -> str:
    """Render a comparison as 'table' (aligned text), 'markdown', 'csv' or 'json' (list of records)."""
    if fmt == "json":
        records = df.to_dict(orient="records")
        return json.dumps([{str(k): _json_value(v) for k, v in r.items()} for r in records], indent=2)
    if fmt == "csv":
        return df.to_csv(index=False)
    view = df[shown_columns(df)].copy()
    if fmt == "markdown":
        return view.to_markdown(index=False)
    if fmt == "table":
        return _aligned(view)
    raise ValueError(f"unknown format {fmt!r}; expected table, markdown, csv or json")


# Longest status shown in the aligned table (the footer and the row lines give skipped rows' reasons in full).
TABLE_STATUS_CHARS = 80


# A skipped row's status in the aligned table: its reason was printed in full on the row's own line.
SKIPPED_IN_TABLE = "skipped (reason above)"


def _aligned(view: pd.DataFrame, reasons_above: bool = False) -> str:
    """The aligned text table: numbers at their display precision, long statuses cut to TABLE_STATUS_CHARS;
    reasons_above: each skipped row's reason was printed on its own line (`row_line`), so the table does not repeat it."""
    view = view.copy()
    status = view["status"].astype(str)
    if reasons_above:
        status = status.where(~status.str.startswith("skipped:"), SKIPPED_IN_TABLE)
    long = status.str.len() > TABLE_STATUS_CHARS
    view["status"] = status.where(~long, status.str.slice(0, TABLE_STATUS_CHARS - 3) + "...")
    return view.to_string(
        index=False,
        formatters={
            "strategy_rank": "{:.0f}".format,
            "sensitivity": "{:.4g}".format,
            "expected_total_error": "{:.6g}".format,
            "data_error": "{:.4g}".format,
            "data_error_se": "{:.2g}".format,
            "rmse": "{:.5g}".format,
            "max_query_std": "{:.5g}".format,
            "bound": "{:.6g}".format,
            "ratio_to_bound": "{:.4f}".format,
            "release_total_error": "{:.6g}".format,
            "fit_seconds": "{:.3f}".format,
        },
    )


def table_header(workload: Workload, privacy: Privacy, time_limit: float | None) -> str:
    """What the table's columns mean: the workload, privacy setting and calibration, the bound, the budget."""
    m, n = workload.shape
    sens = "L1 sensitivity" if privacy.is_pure else "L2 sensitivity"
    limit = "none" if time_limit is None else f"{time_limit:g} s per mechanism"
    queries = (f"{m} queries" if workload.queries_known else
               "an unknown number of queries (W^T W does not show it; gram-npy:PATH:m=M gives it, else rmse is NaN)")
    return "\n".join([
        f"workload: {workload.name}, {queries} x {n} cells",
        f"privacy: eps={privacy.epsilon:g}, delta={privacy.delta:g}, {privacy.noise} noise on {sens}; "
        f"calibration: {privacy.convention}; P(eps,delta) = {privacy.variance_factor:.6g}",
        "ratio_to_bound = expected_total_error / bound; bound: a lower bound for every strategy, named by bound_kind: "
        + ("'l2-optimum' = P(eps) * the certified optimum of trace(W^T W X^+) over diag(X) <= 1 (valid as "
           "sens1 >= sens2), or 'svd' = P(eps) * SVDB(W) where that is larger or the optimum cannot be solved"
           if privacy.is_pure else "'svd' = P(eps,delta) * SVDB(W)"),
        "release_total_error: the same strategy released by `dpopt answer`, whose "
        + ("Laplace noise is the model's" if privacy.is_pure else
           "Gaussian sigma is the smallest OpenDP certifies, not the calibration's"),
        f"time limit: {limit} (--time-limit)",
    ])


def table_footer(df: pd.DataFrame, interrupted: Sequence[str] = ()) -> str:
    """The winner (least expected total error), then what was cut short, skipped (named only: each reason is on the
    row's own line) or interrupted."""
    lines = []
    done = df[df["expected_total_error"].notna()]
    if len(done):
        best = done.loc[done["expected_total_error"].idxmin()]
        lines.append(f"best: {best['mechanism']} (ratio {best['ratio_to_bound']:.4f})")
    else:
        lines.append("best: none (no mechanism finished)")
    if "data_error" in df and df["data_error"].notna().any():
        top = df.loc[df["data_error"].idxmin()]
        se = f" +- {top['data_error_se']:.2g}" if _finite(top.get("data_error_se")) else ""
        lines.append(f"least data_error (mean ||W x - W x_hat||_2 / m / sum(x) on the data): {top['mechanism']} "
                     f"({top['data_error']:.4g}{se})")
    status = df["status"].astype(str)
    capped = df[status.str.contains("time_limit", regex=False) & df["expected_total_error"].notna()]
    if len(capped):
        parts = []
        for _, row in capped.iterrows():
            gap = row.get("gap")
            parts.append(f"{row['mechanism']}" + (f" (certified gap {gap:.2g})" if _finite(gap) else ""))
        lines.append("cut short at the time limit (valid strategy, not certified optimal): " + ", ".join(parts))
    skipped = df[status.str.startswith("skipped:")]["mechanism"].astype(str).tolist()
    if skipped:  # each reason was printed once, on the row's own line
        lines.append(f"skipped (reasons above): {', '.join(skipped)}")
    if "note" in df:
        notes: dict[str, list[str]] = {}
        for name, note in zip(df["mechanism"], df["note"], strict=True):
            if isinstance(note, str):
                notes.setdefault(note, []).append(str(name))
        lines.extend(f"{note} ({', '.join(names)})" for note, names in notes.items())
    ratios = (df["release_total_error"] / df["expected_total_error"]).dropna() if "release_total_error" in df else []
    if len(ratios) and (float(np.max(ratios)) != 1.0 or float(np.min(ratios)) != 1.0):
        lo, hi = float(np.min(ratios)), float(np.max(ratios))
        span = f"{lo:.4g}" if math.isclose(lo, hi, rel_tol=1e-9) else f"{lo:.4g}-{hi:.4g}"
        lines.append(f"release mode (dpopt answer) draws OpenDP's certified Gaussian sigma, not this calibration's: "
                     f"its error is release_total_error = {span} x expected_total_error")
    if interrupted:
        lines.append(f"interrupted (Ctrl-C) before finishing: {', '.join(interrupted)}")
    return "\n".join(lines)


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float, np.floating)) and not isinstance(v, bool) and math.isfinite(v)


def row_line(row: dict[str, Any]) -> str:
    """One finished row as a line (printed as it completes, before the sorted table)."""
    err, ratio = row.get("expected_total_error"), row.get("ratio_to_bound")
    secs = row.get("fit_seconds")
    nums = (f"expected_total_error {err:.6g}, ratio_to_bound {ratio:.4f}, {secs:.1f} s"
            if _finite(err) and _finite(ratio) and _finite(secs) else "")
    return f"finished {row['mechanism']}: " + "; ".join(x for x in (nums, str(row.get("status"))) if x)


def _json_value(v: Any) -> Any:
    """A JSON value with a float's full precision (repr round-trip); NaN and infinities become null."""
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v) if math.isfinite(v) else None
    if v is None or isinstance(v, str):
        return v
    return str(v)


def check_plot_path(path: str) -> None:
    """Refuse a --plot path whose folder is missing, not a folder or not writable, before any fitting."""
    check_output_file(path, "--plot")


def plot_comparison(df: pd.DataFrame, path: str) -> None:
    """Bar chart of expected total error per mechanism (log scale) with the lower bound as a line."""
    ok = df[df["expected_total_error"].notna()]
    try:
        with saved_figure(path, figsize=(7, 3.5), dpi=120) as (_, ax):
            ax.bar(ok["mechanism"], ok["expected_total_error"], color="tab:blue")
            bound = ok["bound"].dropna()
            if len(bound):
                ax.axhline(float(bound.iloc[0]), color="tab:red", linestyle="--", label="lower bound")
                ax.legend()
            ax.set_yscale("log")
            ax.set_ylabel("expected total squared error")
            ax.set_title(str(df["workload"].iloc[0]) if "workload" in df else "")
    except OSError as exc:
        raise ValueError(f"cannot write plot {path}: {exc.strerror or exc}") from None


def main_compare(workload: Workload, privacy: Privacy, mechanisms: Sequence[str] | None,
                 fmt: str, plot: str | None, out: TextIO | None = None,
                 time_limit: float | None = DEFAULT_TIME_LIMIT, objective: str = "sum",
                 data: DataRuns | None = None) -> int:
    """Run a comparison and print it; returns the process exit status (130 after Ctrl-C).

    In the table format the header is printed first, each row as a line as it finishes, then the table
    sorted by error and the footer; the other formats print everything at the end. After Ctrl-C the
    finished rows are printed the same way, with a note naming the mechanisms that did not finish.
    """
    check_privacy_range(privacy)
    time_limit = check_time_limit(time_limit)
    mechanisms = mechanism_order(mechanisms)  # refuse unknown names before printing anything
    check_fits_some(workload, privacy, mechanisms)
    if plot:
        check_plot_path(plot)
    out = out if out is not None else sys.stdout
    problem = calibration_problem(privacy)
    if problem is not None:
        print(f"dpopt: warning: {problem}; the numbers below use the classic sigma anyway", file=sys.stderr)
    on_row = None
    if fmt == "table":
        print(table_header(workload, privacy, time_limit) + "\n", file=out, flush=True)

        def on_row(row: dict[str, Any]) -> None:
            print(row_line(row), file=out, flush=True)

    interrupted: list[str] = []
    try:
        df = compare(workload, privacy, mechanisms, progress=sys.stderr, time_limit=time_limit, on_row=on_row,
                     objective=objective, data=data)
    except CompareInterrupted as stop:
        df, interrupted = stop.partial, stop.interrupted
        print(f"dpopt: interrupted; printing the {len(df)} finished row(s); not finished: "
              f"{', '.join(interrupted)}", file=sys.stderr)
    if fmt == "table":
        body = _aligned(df[shown_columns(df)], reasons_above=True) if len(df) else "(no mechanism finished)"
        print(f"\n{body}\n\n{table_footer(df, interrupted)}", file=out, flush=True)
    else:
        print(format_table(df, fmt), file=out, flush=True)
    if plot and len(df):
        plot_comparison(df, plot)
    return 130 if interrupted else 0
