"""The estimator-style interface every mechanism shares: fit(workload, privacy) selects a strategy; answer(x, rng)."""

from __future__ import annotations

import copy
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

from dpopt.baselines import baseline_strategies
from dpopt.bounds import svd_bound
from dpopt.data import Records
from dpopt.error import ErrorReport, expected_error
from dpopt.kron_strategy import KronMatrix
from dpopt.privacy import Perturb, Privacy, research_perturb
from dpopt.solvers.result import MIN_SOLVER_SECONDS, Selection
from dpopt.strategy import Strategy, StrategyError
from dpopt.validation import check_finite_vector, check_time_limit, count_text
from dpopt.workloads import (
    MAX_DENSE_ENTRIES,
    Kron,
    Stack,
    Total,
    Workload,
    WorkloadTooLargeError,
    as_workload,
)

# A baseline replaces the selected strategy only when its exact error is lower by more than this fraction:
# two evaluations of one error (the selected strategy is often a baseline itself, e.g. the workload's own
# rows or the identity) differ by the round-off of a trace of n-term sums, far below 1e-12 at dense sizes,
# so a tie is never decided by the BLAS kernel's summation order.
TIE_RTOL = 1e-12

# A strategy held through its factors: a Kronecker product, a union of Kronecker products, or marginals.


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


#: Most cells of one dense strategy selection: its n x n matrices within MAX_DENSE_ENTRIES entries.
DENSE_MAX_CELLS = math.isqrt(MAX_DENSE_ENTRIES)


def dense_size_hint(workload: Workload) -> str:
    """What fits a workload too large for one dense strategy: hdmm, when every factor of its product domain is
    small enough; else nothing here (a one-factor domain of more than DENSE_MAX_CELLS cells)."""
    sizes = workload.domain_sizes
    if len(sizes) > 1 and max(sizes) <= DENSE_MAX_CELLS:
        return "the factored mechanism 'hdmm' selects through its factors"
    return ""


def kronecker_factors(workload: Workload) -> Kron | None:
    """The workload as a Kronecker product of two or more 1-D factors, or None when it is not one (a factor
    with a scaled Gram, AllPredicate, has no factor form here)."""
    if isinstance(workload, Kron) and len(workload.factors) > 1 and workload.gram_log_scale == 0.0:
        return workload
    return None


def attribute_factors(workload: Workload) -> Kron | None:
    """One 1-D factor per attribute of a union of Kronecker products over d >= 2 attributes (a Stack of Kronecker
    parts on one product domain, marginals among them): on each attribute the first part's factor that is not the
    total (else the total), for a mechanism whose per-attribute strategy depends on the attribute's size only;
    None for any other workload."""
    if not isinstance(workload, Stack) or not workload.kron_parts or len(workload.domain_sizes) < 2:
        return None
    factors = []
    for i in range(len(workload.domain_sizes)):
        column = [part.factors[i] for part in workload.parts]
        factors.append(next((f for f in column if not isinstance(f, Total)), column[0]))
    return Kron(factors)


def combined_factor_gap(gaps: list[float | None]) -> float | None:
    """Certified relative gap of a product of per-factor optima: 1 - prod_i (1 - gap_i), None if one is unknown.

    With primal values p_i and dual bounds l_i = p_i (1 - gap_i), the product strategy's value is prod p_i
    and prod l_i is a lower bound on the product problem (see `Mechanism._fit_per_factor`).
    """
    if any(g is None for g in gaps):
        return None
    return 1.0 - math.prod(1.0 - float(g) for g in gaps)  # type: ignore[arg-type]


class Mechanism(ABC):
    """Base class: parameters in __init__, selection in fit, learned state in attributes ending in '_'."""

    short_name: ClassVar[str] = "mechanism"
    support_rtol: float = 1e-8
    #: On a union of Kronecker products too large for a dense strategy, the Kronecker product of the strategy
    #: on each attribute's size (`attribute_factors`): for mechanisms whose strategy per dimension is that.
    per_attribute_unions: ClassVar[bool] = False

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
        problem = self.size_problem(workload, privacy)
        if problem is not None:
            raise MechanismError(problem)
        kron, separable = self.factor_plan(workload, privacy)
        if kron is not None:
            return self._fit_per_factor(kron, workload, privacy, separable=separable)
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
        # the error computed during selection, if under this privacy (a shared selection may come from another eps)
        err = (sel.error if sel.error is not None and sel.privacy == privacy
               else expected_error(strategy, workload, privacy, rtol=self.support_rtol))
        info = FitInfo(solver=sel.solver, status=sel.status, iterations=sel.iterations, wall_seconds=wall,
                       cpu_seconds=cpu, gap=sel.gap, message=sel.message, extra=sel.extra)
        return self._adopt(workload, workload, privacy, strategy, err, info)

    def size_problem(self, workload: Workload, privacy: Privacy) -> str | None:
        """Why `fit` refuses `workload` for its size, known before any fit (one line naming what would fit), or None.

        A dense selection holds n x n matrices, so the cells it selects over (the whole domain, or each factor
        of a Kronecker workload fitted per factor, `factor_plan`) must number at most DENSE_MAX_CELLS.
        """
        kron, _ = self.factor_plan(workload, privacy)
        if kron is not None:
            big = [f for f in kron.factors if f.n > DENSE_MAX_CELLS]
            if not big:
                return None
            return (f"{self.short_name}: factor {big[0].name} of {workload.name} has {count_text(big[0].n)} cells, too many "
                    f"for a dense strategy; expected at most {DENSE_MAX_CELLS} cells per factor")
        if workload.n <= DENSE_MAX_CELLS:
            return None
        if kronecker_factors(workload) is not None:
            form = "a Kronecker workload, but this mechanism has no Kronecker form"
        else:
            form = "not a single Kronecker product"
        hint = dense_size_hint(workload)
        return (f"{self.short_name}: {count_text(workload.n)} cells are too many for a dense strategy ({workload.name} is "
                f"{form}); expected at most {DENSE_MAX_CELLS} cells" + (f"; {hint}" if hint else ""))

    def kronecker_policy(self, privacy: Privacy) -> str | None:
        """How a Kronecker workload W_1 (x) ... (x) W_d is fitted: None, only as one dense matrix; "large",
        per factor (`_fit_per_factor`) when the domain is too large for a dense strategy; "separable", always
        per factor, because the mechanism's optimum on the product is the product of the factors' optima."""
        return None

    def factor_plan(self, workload: Workload, privacy: Privacy) -> tuple[Kron | None, bool]:
        """(the Kronecker factors `fit` selects over one at a time, or None for one selection over all cells;
        whether the product of the factors' optima is the optimum), from `kronecker_policy`."""
        kron = kronecker_factors(workload)
        policy = None if kron is None else self.kronecker_policy(privacy)
        if policy == "separable" or (policy == "large" and workload.n**2 > MAX_DENSE_ENTRIES):
            return kron, policy == "separable"
        if kron is None and self.per_attribute_unions and workload.n**2 > MAX_DENSE_ENTRIES:
            return attribute_factors(workload), False
        return None, False

    def _fit_per_factor(self, kron: Kron, given: Workload, privacy: Privacy, separable: bool) -> Mechanism:
        """Fit each factor W_i alone and measure A = A_1 (x) ... (x) A_d (HDMM, McKenna et al. VLDB 2018, Kronecker strategies).

        Both sensitivities of a Kronecker product are the products of the factors' and
        ||W A^+||_F^2 = prod_i ||W_i A_i^+||_F^2, so the error is computed through the factors. When
        `separable`, the product problem's optimum is the product of the factors' optima: for the
        (eps, delta) problem min trace(G X^+) over diag(X) <= 1 the dual function at d = (x)_i d_i,
        (trace (D^1/2 G D^1/2)^1/2)^2 / sum(d), is the product of the factors' (square roots, traces and
        sums of Kronecker products factor), and so are the primal values; the factors' certificates
        therefore combine (`combined_factor_gap`). The time budget is shared out over the factors left. On a union
        of Kronecker products (`attribute_factors`) the factors are one per attribute and the error is the union's,
        sum_k a_k prod_i trace(G_ki X_i^+) (`KronMatrix.unit_error`).
        """
        budget = current_budget()
        t0, c0 = time.perf_counter(), time.process_time()
        subs: list[Mechanism] = []
        for i, factor in enumerate(kron.factors):
            share = None
            if budget.time_limit is not None:
                left = budget.time_limit - (time.perf_counter() - t0)
                share = max(left / (len(kron.factors) - i), MIN_SOLVER_SECONDS)
            sub = copy.copy(self)
            sub.__dict__ = {k: v for k, v in self.__dict__.items() if not k.endswith("_") or k.startswith("_")}
            with fit_budget(share, budget.progress):
                sub._fit(factor, privacy)
            subs.append(sub)
        names = ",".join(s.strategy_.name for s in subs)
        try:
            strategy = Strategy(KronMatrix([s.strategy_ for s in subs]), name=f"kron({names})")
        except ValueError as exc:
            raise MechanismError(f"{self.short_name}: no Kronecker form of the factors' strategies: {exc}") from None
        view = kron if kronecker_factors(given) is not None else given  # a union: its error, not the factors'
        try:
            err = strategy.expected_error(view, privacy, rtol=self.support_rtol)
        except StrategyError as exc:
            raise MechanismError(f"{self.short_name}: the per-factor strategy is refused: {exc}") from None
        infos = [s.fit_info_ for s in subs]
        statuses = [i.status for i in infos]
        status = statuses[0] if len(set(statuses)) == 1 else "; ".join(
            f"factor {k}: {st}" for k, st in enumerate(statuses))
        extra: dict[str, Any] = {"template": "Kronecker product of per-factor selections",
                                 "factors": [i.extra for i in infos]}
        lows = [i.extra.get("unit_lower_bound") for i in infos]
        if separable and all(isinstance(v, float) for v in lows):
            # in units of prod_i trace-Gram units, i.e. of kron.gram(): a lower bound on the product problem
            extra["unit_lower_bound"] = math.prod(lows)  # type: ignore[arg-type]
        # a union: the sum of its parts' SVD bounds (`Stack.error_lower_bound`; marginals: their exact SVD bound),
        # never through its n x n Gram
        bound, kind = None, "svd"
        if view is not kron:
            unit, what = view.error_lower_bound()
            bound, kind = privacy.variance_factor * unit, "svd" if what.startswith("svd bound") else what
        return self._adopt(view, given, privacy, strategy, err, FitInfo(
            solver=f"{infos[0].solver} per factor",
            status=status,
            iterations=sum(i.iterations for i in infos),
            wall_seconds=time.perf_counter() - t0,
            cpu_seconds=time.process_time() - c0,
            gap=combined_factor_gap([i.gap for i in infos]) if separable else None,
            message="; ".join(f"factor {k} ({f.name}): {i.message}" for k, (f, i) in
                              enumerate(zip(kron.factors, infos, strict=True)) if i.message),
            extra=extra,
        ), bound=bound, bound_kind=kind)

    def _adopt(self, view: Workload, given: Workload, privacy: Privacy, strategy: Strategy,
               err: ErrorReport, info: FitInfo, bound: float | None = None, bound_kind: str = "svd") -> Mechanism:
        """Keep a strategy selected for `view` (the workload, or its structured form), its exact error and P SVDB(W)
        (or `bound`, a lower bound the caller computed through the structure, named by `bound_kind`)."""
        self.workload_ = view
        self.input_workload_ = given  # as given (e.g. bound to a data Domain, with row labels), for release
        self.privacy_ = privacy
        self.strategy_ = strategy  # type: ignore[assignment]
        self.expected_error_ = err
        self.bound_ = lower_bound(view, privacy) if bound is None else bound
        self.bound_kind_ = bound_kind
        self.fit_info_ = info
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
        if getattr(self, "baselines", False) is True:  # the mechanism keeps a baseline with less error
            sel = self._least_error_selection(sel, workload, privacy)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if key is not None and _SHARED is not None:
            _SHARED[key] = (sel, wall, cpu)
        return sel, wall, cpu

    def _baseline_objective(self, report: ErrorReport) -> float:
        """The error by which the selected strategy and the baselines are ranked: the expected total squared error."""
        return float(report.total)

    def _least_error_selection(self, sel: Selection, workload: Workload, privacy: Privacy) -> Selection:
        """`sel`, or the baseline strategy with the least error when that is below sel's by more than TIE_RTOL."""
        # Every error is dpopt.error.expected_error, the function fit reports, so the returned strategy's
        # reported error is never above a baseline's.
        try:
            own_report = expected_error(sel.strategy, workload, privacy, rtol=self.support_rtol)
        except StrategyError:  # unsupported: fit refuses it and says why, rather than hide it behind a baseline
            return sel
        baselines = baseline_strategies(workload, gaussian=not privacy.is_pure)
        # the selected strategy's key is its name, kept apart from the baselines' should the two coincide
        own = sel.strategy.name if sel.strategy.name not in baselines else f"{self.short_name}:{sel.strategy.name}"
        own_err = self._baseline_objective(own_report)
        errors, reports = {own: own_err}, {own: own_report}
        best, best_err = own, own_err
        for name, strategy in baselines.items():
            try:
                reports[name] = expected_error(strategy, workload, privacy, rtol=self.support_rtol)
            except StrategyError:  # a baseline that cannot answer this workload is no candidate
                continue
            errors[name] = self._baseline_objective(reports[name])
            if errors[name] < best_err * (1.0 - TIE_RTOL):
                best, best_err = name, errors[name]
        extra = {**sel.extra, "baseline_errors": errors, "returned": best}
        if best == own:
            message = f"{sel.message}; its error {own_err:.6g} is at most every baseline's".lstrip("; ")
            return replace(sel, message=message, extra=extra, error=own_report, privacy=privacy)
        return replace(
            sel,
            error=reports[best],
            privacy=privacy,
            strategy=baselines[best],
            status=f"{sel.status}; {best} returned: lower error than {self.short_name}'s own strategy",
            message=(f"{sel.message}; {best}'s error {best_err:.6g} is below the error {own_err:.6g} of "
                     f"{self.short_name}'s own strategy, so {best} is returned").lstrip("; "),
            extra=extra,
        )

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

    def _workload_rows(self, workload: Workload, need: str) -> np.ndarray:
        """W as a dense (m, n) array for a selection that needs its rows (`need` says why), or MechanismError."""
        if not workload.has_rows:
            raise MechanismError(f"{self.short_name}: workload {workload.name} is known only through its Gram matrix "
                                 f"(or is too large to list); {need}")
        try:
            return workload.matrix()
        except WorkloadTooLargeError as exc:
            raise MechanismError(f"{self.short_name}: cannot materialise workload {workload.name}: {exc}") from None

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
        return self.answers_with(x, research_perturb(self.privacy_, rng))

    def answers_with(self, x: np.ndarray | Records, perturb: Perturb) -> np.ndarray:
        """Answers to every workload query (m,): B perturb(A x) through the strategy's own form (dense, Kronecker
        or marginal tables, from records or x), the noise drawn by `perturb` (research or release mode)."""
        self._check_fitted()
        return self.strategy_.answer(x, self.privacy_, None, self.workload_, perturb=perturb)

    def query_unit_variances(self) -> np.ndarray:
        """Variance of each workload query's answer per unit noise variance (m,), from the strategy."""
        self._check_fitted()
        return self.strategy_.query_unit_variances(self.workload_)

    def expected_error(self, workload: Workload | np.ndarray | None = None) -> ErrorReport:
        """Exact expected error of the fitted strategy on `workload` (default: the fitted workload)."""
        self._check_fitted()
        w = self.workload_ if workload is None else as_workload(workload)
        try:
            return self.strategy_.expected_error(w, self.privacy_, rtol=self.support_rtol)
        except StrategyError as exc:
            raise MechanismError(f"{self.short_name}: {exc}") from None

    def _comparison_bound(self) -> float:
        """The bound reported in comparison records: P * SVDB (the same for every mechanism)."""
        return self.bound_

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
            "strategy_rank": self.strategy_.rank,
            "sensitivity": err.sensitivity,
            "expected_total_error": err.total,
            "rmse": err.rmse,
            "bound": bound,
            # P * SVDB(W) (`lower_bound`) or, on a union fitted per attribute, the sum of its parts' SVD bounds;
            # compare may replace it by a tighter certified bound
            "bound_kind": getattr(self, "bound_kind_", "svd"),
            "ratio_to_bound": err.total / bound if bound > 0 and math.isfinite(bound) else math.nan,
            "fit_seconds": info.wall_seconds,
            "fit_cpu_seconds": info.cpu_seconds,
            "solver": info.solver,
            "status": info.status,
            "iterations": info.iterations,
            "gap": info.gap,
        }
