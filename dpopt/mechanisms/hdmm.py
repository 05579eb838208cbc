"""HDMM (McKenna et al. 2018): a factored strategy for a structured workload of any size, usable by `dpopt compare`.

It selects a factored strategy (`dpopt.hdmm.select_strategy`) and never materialises W or A, so it cannot
hand a dense Strategy to the base class's fit; it keeps the base interface (fit / answer /
expected_error / record with the same keys) and computes everything through the factors.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

import numpy as np

from dpopt.hdmm import select_strategy
from dpopt.mechanisms.base import (
    DENSE_MAX_CELLS,
    FitInfo,
    Mechanism,
    MechanismError,
    Selection,
    current_budget,
)
from dpopt.privacy import Privacy
from dpopt.solvers.result import TIME_LIMIT
from dpopt.union_strategy import UnionKronMatrix
from dpopt.validation import count_text
from dpopt.workloads import (
    Kron,
    Marginals,
    Stack,
    Workload,
    kron_form,
)

# Largest domain on which hdmm also selects over all cells as one factor (see _one_factor_if_better).
ONE_FACTOR_MAX_CELLS = 1024


def _fit_status(status: str) -> str:
    """The selection's status as reported by fit: a capped selection is flagged like every capped solver."""
    return f"{TIME_LIMIT}: valid, not certified optimal" if status == TIME_LIMIT else status


class HDMMMechanism(Mechanism):
    """Factored strategy selection (Kronecker, union of Kronecker, marginals) for workloads of any size."""

    short_name: ClassVar[str] = "hdmm"

    def __init__(self, **options: Any) -> None:
        self.options = options

    def _budget_options(self, start: float) -> dict[str, Any]:
        """self.options with the current fit budget: a deadline `time_limit` s after `start`, and progress."""
        budget = current_budget()
        opts = dict(self.options)
        if budget.time_limit is not None and "factor_solver" not in opts:
            opts["deadline"] = start + budget.time_limit
        if budget.progress is not None and "factor_solver" not in opts:
            opts["progress"] = budget.progress
        return opts

    def _select(self, workload: Workload, privacy: Privacy) -> Selection:
        """The dense form of the selected strategy (small domains; `fit` never needs it)."""
        sel = select_strategy(workload, privacy, **self._budget_options(time.perf_counter()))
        if isinstance(sel.strategy.A, UnionKronMatrix):
            raise MechanismError(f"{self.short_name}: a union of Kronecker parts has no single dense A here")
        return Selection(strategy=sel.strategy.to_dense(), solver=sel.solver, status=_fit_status(sel.status))

    def fit(self, workload: Workload | np.ndarray, privacy: Privacy, *, time_limit: float | None = None,
            progress: Any = None) -> HDMMMechanism:
        """Select the factored strategy and its exact error through the factors (no dense matrices).

        time_limit (seconds, default: the enclosing `fit_budget`) bounds the selection: every L-BFGS
        run and factor solver stops at the deadline with its best iterate, later restarts and sweeps are
        skipped, and each factor is still the best of that iterate and its family's baselines (so the
        strategy is valid and never worse than identity); status 'time_limit: valid, not certified
        optimal', with the certified gap where the solver has one. progress: see FitBudget.
        """
        with self._budget_scope(time_limit, progress):
            return self._fit_factored(workload, privacy)

    def _fit_factored(self, workload: Workload | np.ndarray, privacy: Privacy) -> HDMMMechanism:
        """`fit` under the current budget."""
        start = time.perf_counter()
        if not isinstance(privacy, Privacy):
            raise MechanismError(f"{self.short_name}: privacy must be a dpopt.privacy.Privacy")
        if isinstance(workload, Workload) and (problem := self.size_problem(workload, privacy)) is not None:
            raise MechanismError(problem)
        try:
            w = kron_form(workload)
            sel: Selection = select_strategy(w, privacy, **self._budget_options(start))
            w, sel = self._one_factor_if_better(w, sel, privacy, start)
        except ValueError as exc:
            raise MechanismError(f"{self.short_name}: {exc}") from None
        self.workload_: Workload = w  # type: ignore[assignment]
        # the workload as given (e.g. bound to a data Domain, with row labels), for release mode
        self.input_workload_ = workload if isinstance(workload, Workload) else None
        self.privacy_ = privacy
        self.strategy_ = sel.strategy  # type: ignore[assignment]
        self.selection_ = sel
        self.expected_error_ = sel.error
        self.bound_ = sel.bound
        self.fit_info_ = FitInfo(
            solver=sel.solver,
            status=_fit_status(sel.status),
            iterations=sel.iterations,
            wall_seconds=sel.wall_seconds,
            cpu_seconds=sel.cpu_seconds,
            gap=sel.gap,
            message=sel.bound_kind,
            extra=sel.extra,
        )
        return self

    def _one_factor_if_better(
        self, w: Workload, sel: Selection, privacy: Privacy, start: float
    ) -> tuple[Workload, Selection]:
        """For a union of Kronecker products on a small domain, the one-factor selection too, if better.

        The union-of-products template is a restriction (each term answered by one product part): over
        the whole domain as one factor the selection is the (eps, delta) optimum, or p-Identity under
        eps-DP, which it may beat.
        """
        if not isinstance(w, Stack) or isinstance(w, Marginals) or w.n > ONE_FACTOR_MAX_CELLS:
            return w, sel
        budget = current_budget()
        if budget.time_limit is not None and time.perf_counter() - start >= budget.time_limit:
            return w, sel
        one = Kron([w], name=w.name)
        alt = select_strategy(one, privacy, **self._budget_options(start))
        if alt.error.total < sel.error.total:
            alt.extra["template"] = f"one factor over {w.n} cells (less error than the factored template)"
            return one, alt
        return w, sel

    def size_problem(self, workload: Workload, privacy: Privacy) -> str | None:
        """Why `fit` refuses `workload` for its size, before any fit, or None: each factor of its product domain is
        selected over as one dense matrix (marginals are selected in closed form over their tables, at any size)."""
        w = workload if isinstance(workload, Workload) else None
        if w is None or isinstance(w, Marginals):
            return None
        big = [n for n in w.domain_sizes if n > DENSE_MAX_CELLS]
        if not big:
            return None
        return (f"{self.short_name}: {w.name} has a factor of {count_text(big[0])} cells, too many for a dense strategy; "
                f"expected at most {DENSE_MAX_CELLS} cells per factor (a product domain, kron:SPEC,SPEC or "
                "marginals, is selected factor by factor)")

    def _comparison_bound(self) -> float:
        """P times the workload's own lower bound (`Workload.error_lower_bound`: SVDB for a Kronecker product or
        marginals, as every other mechanism reports; the selection's, where it computed it); the selection's
        certified bound is reported beside it."""
        return self._workload_bound()[0]

    def _workload_bound(self) -> tuple[float, str]:
        """(P times the workload's own lower bound, its kind as a record names it: "svd" for P * SVDB(W))."""
        sel = self.selection_
        known = sel.extra.get("svd_bound")
        if known is not None:  # a Kronecker selection's bound may be its certificate: P * SVDB is kept beside it
            return float(known), "svd"
        # otherwise the selection's bound is the workload's own (`selection_of`)
        return float(sel.bound), "svd" if sel.bound_kind.startswith("svd bound") else sel.bound_kind

    def record(self) -> dict[str, Any]:
        """The shared record keys, computed through the factors, plus the certified bound."""
        rec = super().record()
        rec["bound_kind"] = self._workload_bound()[1]
        rec["certified_bound"] = self.bound_
        rec["certified_bound_kind"] = self.fit_info_.message
        return rec
