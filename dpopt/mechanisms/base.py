"""The estimator-style interface every mechanism shares: fit(workload, privacy) selects a strategy; answer(x, rng)."""

from __future__ import annotations

import functools
import hashlib
import inspect
import math
import numbers
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from dpopt.bounds import svd_bound
from dpopt.data import Records, data_vector
from dpopt.error import ErrorReport, _row_sq_norms, answers_through, expected_error, noisy_answers
from dpopt.privacy import Perturb, Privacy
from dpopt.solvers.result import MIN_SOLVER_SECONDS
from dpopt.strategy import Strategy
from dpopt.validation import check_finite_vector
from dpopt.workloads import MAX_DENSE_ENTRIES, Workload, as_workload


class MechanismError(ValueError):
    """A mechanism cannot handle the workload or privacy setting it was given."""


@dataclass
class FitInfo:
    """How a strategy was selected: solver, status, iterations, time, and solver-specific extras."""

    solver: str
    status: str
    iterations: int = 0
    wall_seconds: float = 0.0
    cpu_seconds: float = 0.0
    gap: float | None = None
    message: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Selection:
    """What a mechanism's `_select` returns: the strategy and how it was found."""

    strategy: Strategy
    solver: str = "closed-form"
    status: str = "optimal"
    iterations: int = 0
    gap: float | None = None
    message: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


ProgressSink = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class FitBudget:
    """What one fit may spend: wall-clock seconds for the strategy selection, and where progress goes.

    time_limit counts from the start of the strategy selection; None means no limit. progress, when set, is
    called after each iteration of an iterative solver with a dict holding `iteration` and, when the
    solver reports them, `gap` (certified relative duality gap), `residual` (relative) and `stage`.
    """

    time_limit: float | None = None
    progress: ProgressSink | None = None


# The budget of the fits running in this context (see `fit_budget`).
_BUDGET: ContextVar[FitBudget] = ContextVar("dpopt_fit_budget", default=FitBudget())  # noqa: B039 (frozen)


def check_time_limit(time_limit: Any) -> float | None:
    """time_limit as a float of seconds > 0, or None; anything else raises ValueError."""
    if time_limit is None:
        return None
    if isinstance(time_limit, bool) or not isinstance(time_limit, numbers.Real) or not (
        math.isfinite(time_limit) and time_limit > 0
    ):
        raise ValueError(f"time_limit must be None or a finite number of seconds > 0; got {time_limit!r}")
    return float(time_limit)


@contextmanager
def fit_budget(time_limit: float | None = None, progress: ProgressSink | None = None) -> Iterator[FitBudget]:
    """Within the block, every `Mechanism.fit` gets `time_limit` seconds and reports to `progress`.

    A mechanism whose fit overrides `Mechanism.fit` and calls it (or one registered without the
    time_limit keyword) is budgeted through this context, so the budget reaches every mechanism.
    """
    budget = FitBudget(check_time_limit(time_limit), progress)
    token = _BUDGET.set(budget)
    try:
        yield budget
    finally:
        _BUDGET.reset(token)


def current_budget() -> FitBudget:
    """The budget of fits in the current context (no limit, no progress outside `fit_budget`)."""
    return _BUDGET.get()


def _progress_event(info: dict[str, Any]) -> dict[str, Any]:
    """A solver callback's dict reduced to the solver-independent progress keys (see FitBudget)."""
    out: dict[str, Any] = {}
    it = info.get("nit", info.get("k"))
    if isinstance(it, numbers.Integral):
        out["iteration"] = int(it)
    for key, name in (("gap", "gap"), ("rel_residual", "residual")):
        val = info.get(key)
        if isinstance(val, numbers.Real) and not isinstance(val, bool):
            out[name] = float(val)
    if isinstance(info.get("start"), str):
        out["stage"] = info["start"]
    return out


def _solver_callback(progress: ProgressSink, user: Callable[[dict[str, Any]], Any] | None) -> Callable[[dict[str, Any]], Any]:
    """A solver callback that reports progress and then defers to the caller's own callback (if any)."""

    def callback(info: dict[str, Any]) -> Any:
        progress(_progress_event(info))
        return None if user is None else user(info)

    return callback


def lower_bound(workload: Workload, privacy: Privacy) -> float:
    """P * SVDB(W): a lower bound on every exact factorisation mechanism's total squared error.

    Under (eps, delta) it is Li and Miklau's Thm. 4.2 with P = the Gaussian variance factor. Under eps-DP,
    sens1(A) >= sens2(A) and the least-squares B = W A^+ has the smallest ||B||_F among all B with
    B A = W, so 2/eps^2 * SVDB(W) bounds the Laplace error of every exact factorisation (seed 004 Sec. 4.3).
    """
    return privacy.variance_factor * svd_bound(workload)


# Selections kept by `shared_selections()`: key -> (selection, wall s, cpu s); None outside such a block.
_SHARED: dict[tuple[Any, ...], tuple[Selection, float, float]] | None = None


@contextmanager
def shared_selections() -> Iterator[None]:
    """Within the block, a fit reuses the selection of an identical earlier fit that differs only in eps or delta.

    `_select` reads privacy only through `is_pure` and the noise norm (the strategy is chosen for the shape
    of the error, which eps and delta only scale), so the strategy selected at one eps is the one selected
    at every eps; the key holds both. Errors, bounds and records are still computed for each fit's own
    privacy. Mechanisms whose parameters have no stable fingerprint (a Generator seed) are never shared.
    """
    global _SHARED
    outer = _SHARED
    if outer is None:
        _SHARED = {}
    try:
        yield
    finally:
        _SHARED = outer


def _fingerprint(value: Any) -> str | None:
    """A stable text for a parameter value, or None when it has none (then the fit is not shared)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    if isinstance(value, np.ndarray):
        return f"ndarray{value.shape}{value.dtype}:" + hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()
    if isinstance(value, (list, tuple)):
        parts = [_fingerprint(v) for v in value]
        return None if None in parts else f"{type(value).__name__}({','.join(parts)})"  # type: ignore[arg-type]
    if isinstance(value, dict):
        items = [(repr(k), _fingerprint(v)) for k, v in sorted(value.items(), key=lambda kv: repr(kv[0]))]
        return None if any(v is None for _, v in items) else "{" + ",".join(f"{k}:{v}" for k, v in items) + "}"
    return None


def _selection_key(mech: Mechanism, workload: Workload, privacy: Privacy) -> tuple[Any, ...] | None:
    """What a selection depends on: class, public parameters, the workload's entries, is_pure and the norm."""
    params = []
    for name, value in sorted(vars(mech).items()):
        if name.startswith("_") or name.endswith("_"):
            continue
        fp = _fingerprint(value)
        if fp is None:
            return None
        params.append((name, fp))
    if workload.has_rows:
        if workload.m * workload.n > MAX_DENSE_ENTRIES:
            return None  # rows too many to fingerprint: fit afresh
        entries = workload.matrix()
    else:
        entries = workload.gram()
    return (type(mech).__module__, type(mech).__qualname__, tuple(params), workload.name, workload.shape,
            _fingerprint(np.asarray(entries, dtype=float)), privacy.is_pure, privacy.norm)


class Mechanism(ABC):
    """Base class: parameters in __init__, selection in fit, learned state in attributes ending in '_'."""

    short_name: ClassVar[str] = "mechanism"
    support_rtol: float = 1e-8

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass `fit` without the budget keywords accepts them too: they reach it through `fit_budget`."""
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("fit")
        if own is None or "time_limit" in inspect.signature(own).parameters:
            return

        @functools.wraps(own)
        def fit(self: Mechanism, workload: Any, privacy: Any, *, time_limit: float | None = None,
                progress: ProgressSink | None = None) -> Mechanism:
            with self._budget_scope(time_limit, progress):
                return own(self, workload, privacy)

        sig = inspect.signature(own)
        extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=ann)
                 for name, ann in (("time_limit", "float | None"), ("progress", "ProgressSink | None"))]
        fit.__signature__ = sig.replace(parameters=[*sig.parameters.values(), *extra])  # type: ignore[attr-defined]
        cls.fit = fit  # type: ignore[method-assign]

    @staticmethod
    def _budget_scope(time_limit: float | None, progress: ProgressSink | None) -> Any:
        """fit_budget(...) for explicit keywords (inheriting what is not given), else the current budget."""
        if time_limit is None and progress is None:
            return nullcontext(current_budget())
        outer = current_budget()
        return fit_budget(outer.time_limit if time_limit is None else time_limit,
                          outer.progress if progress is None else progress)

    def fit(self, workload: Workload | np.ndarray, privacy: Privacy, *, time_limit: float | None = None,
            progress: ProgressSink | None = None) -> Mechanism:
        """Select the strategy for `workload` under `privacy`; checks support before returning.

        time_limit: wall-clock seconds for the selection (default: the enclosing `fit_budget`, else none).
        An iterative solver that reaches it stops with its best iterate; the mechanism uses it if it
        supports the workload (status 'time_limit: valid, not certified optimal', gap in `fit_info_`
        when the solver certifies one) and raises MechanismError otherwise. progress: see FitBudget.
        """
        with self._budget_scope(time_limit, progress):
            return self._fit(workload, privacy)

    def _fit(self, workload: Workload | np.ndarray, privacy: Privacy) -> Mechanism:
        """`fit` under the current budget."""
        workload = as_workload(workload)
        if not isinstance(privacy, Privacy):
            raise MechanismError(f"{self.short_name}: privacy must be a dpopt.privacy.Privacy")
        if workload.n**2 > MAX_DENSE_ENTRIES:
            raise MechanismError(
                f"{self.short_name}: {workload.n:.3g} cells are too many for a dense strategy; "
                "use the implicit mechanism 'hdmm'"
            )
        sel, wall, cpu = self._timed_select(workload, privacy)
        strategy = sel.strategy
        if not strategy.supports(workload, self.support_rtol):
            if strategy.gamma > 0 and strategy.B is not None:  # relaxed: the test is ||W - B A||_F <= gamma
                why = f"||W - B A||_F = {strategy.residual(workload):.3g} > gamma = {strategy.gamma:g}"
            else:
                why = f"relative residual {strategy.unsupported_fraction(workload):.3g} > {self.support_rtol:g}"
            raise MechanismError(
                f"{self.short_name}: selected strategy does not support workload {workload.name} "
                f"({why}; solver {sel.solver} status {sel.status.partition(':')[0]}: {sel.message[:200]}); "
                "refusing to answer with it"
            )
        self.workload_ = workload
        self.privacy_ = privacy
        self.strategy_ = strategy
        self._reconstruction = None  # B, computed on the first answer() and reused
        self.expected_error_ = expected_error(strategy, workload, privacy, rtol=self.support_rtol)
        self.bound_ = lower_bound(workload, privacy)
        self.fit_info_ = FitInfo(
            solver=sel.solver,
            status=sel.status,
            iterations=sel.iterations,
            wall_seconds=wall,
            cpu_seconds=cpu,
            gap=sel.gap,
            message=sel.message,
            extra=sel.extra,
        )
        return self

    def _timed_select(self, workload: Workload, privacy: Privacy) -> tuple[Selection, float, float]:
        """`_select` with its wall and CPU seconds; inside `shared_selections()`, reused when already made."""
        budget = current_budget()
        key = _selection_key(self, workload, privacy) if _SHARED is not None else None
        if key is not None:
            key = (*key, budget.time_limit)
        if key is not None and key in _SHARED:  # type: ignore[operator]
            sel, wall, cpu = _SHARED[key]  # type: ignore[index]
            return replace(sel, extra={**sel.extra, "selection_reused": True}), wall, cpu
        t0, c0 = time.perf_counter(), time.process_time()
        options = getattr(self, "solver_options", None)
        if isinstance(options, dict) and (budget.time_limit is not None or budget.progress is not None):
            self.solver_options = self._budgeted_options(options, budget, t0)
        try:
            sel = self._select(workload, privacy)
        finally:
            if isinstance(options, dict):
                self.solver_options = options
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if key is not None and _SHARED is not None:
            _SHARED[key] = (sel, wall, cpu)
        return sel, wall, cpu

    def _budgeted_options(self, options: dict[str, Any], budget: FitBudget, t0: float) -> dict[str, Any]:
        """`solver_options` with the budget added: how the budget reaches an optimising mechanism's solver.

        A mechanism that keeps its solver's keywords in a `solver_options` dict and passes them to the
        solver in `_select` (the matrix mechanisms, LRM) gets time_limit = the seconds left of the fit's
        budget (at least MIN_SOLVER_SECONDS; a smaller time_limit of its own is kept), which every
        solver here and CVXPY accept, and, unless `solver` names a CVXPY solver, a `callback` that
        reports progress and then calls the caller's own callback.
        """
        out = dict(options)
        if budget.time_limit is not None:
            left = max(budget.time_limit - (time.perf_counter() - t0), MIN_SOLVER_SECONDS)
            own = options.get("time_limit")
            out["time_limit"] = left if own is None else min(float(own), left)
        if budget.progress is not None and not str(getattr(self, "solver", "")).startswith("cvxpy"):
            out["callback"] = _solver_callback(budget.progress, options.get("callback"))
        return out

    @abstractmethod
    def _select(self, workload: Workload, privacy: Privacy) -> Selection:
        """Choose the strategy (A, and B for factorisation mechanisms)."""

    def _check_fitted(self) -> None:
        if not hasattr(self, "strategy_"):
            raise MechanismError(f"{self.short_name}: call fit(workload, privacy) before using the mechanism")

    def answer(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Research mode: noisy answers to every workload query, B (A x + z), z drawn from `rng` (m,)."""
        self._check_fitted()
        if not isinstance(rng, np.random.Generator):
            raise MechanismError(f"{self.short_name}: rng must be a numpy.random.Generator (research mode)")
        x = check_finite_vector(x, "data vector x", self.workload_.n)
        return noisy_answers(self.strategy_, self.workload_, self.privacy_, x, rng, 1, B=self._B())[0]

    def _B(self) -> Any:
        """The reconstruction B (given, or W A^+), computed on first use and kept."""
        if getattr(self, "_reconstruction", None) is None:
            self._reconstruction = self.strategy_.reconstruct(self.workload_)
        return self._reconstruction

    def answers_with(self, x: np.ndarray | Records, perturb: Perturb) -> np.ndarray:
        """Answers to every workload query (m,): B perturb(A x), the noise drawn by `perturb` (release mode)."""
        self._check_fitted()
        x = data_vector(x, self.workload_.n)
        return answers_through(self.strategy_, self._B(), x, perturb, self.strategy_.sensitivity(self.privacy_.norm))

    def query_unit_variances(self) -> np.ndarray:
        """Variance of each workload query's answer per unit noise variance: squared row norms of B (m,)."""
        self._check_fitted()
        return _row_sq_norms(self._B())

    def expected_error(self, workload: Workload | np.ndarray | None = None) -> ErrorReport:
        """Exact expected error of the fitted strategy on `workload` (default: the fitted workload)."""
        self._check_fitted()
        w = self.workload_ if workload is None else as_workload(workload)
        return expected_error(self.strategy_, w, self.privacy_, rtol=self.support_rtol)

    def _comparison_bound(self) -> float:
        """The bound reported in comparison records: P * SVDB (the same for every mechanism)."""
        return self.bound_

    def _strategy_rank(self) -> int:
        """Rank of the fitted strategy, for comparison records."""
        return self.strategy_.rank

    def record(self) -> dict[str, Any]:
        """One flat record for comparison tables and JSON (keys documented in `dpopt compare --help`)."""
        self._check_fitted()
        err, info = self.expected_error_, self.fit_info_
        bound = self._comparison_bound()
        return {
            "mechanism": self.short_name,
            "workload": self.workload_.name,
            "epsilon": self.privacy_.epsilon,
            "delta": self.privacy_.delta,
            "noise": self.privacy_.noise,
            "calibration": self.privacy_.convention,
            "strategy_rows": self.strategy_.shape[0],
            "strategy_rank": self._strategy_rank(),
            "sensitivity": err.sensitivity,
            "expected_total_error": err.total,
            "rmse": err.rmse,
            "bound": bound,
            "ratio_to_bound": err.total / bound if bound > 0 and math.isfinite(bound) else math.nan,
            "fit_seconds": info.wall_seconds,
            "fit_cpu_seconds": info.cpu_seconds,
            "solver": info.solver,
            "status": info.status,
            "iterations": info.iterations,
            "gap": info.gap,
        }
