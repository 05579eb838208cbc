"""The estimator-style interface every mechanism shares: fit(workload, privacy) selects a strategy; answer(x, rng)."""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from dpopt.bounds import svd_bound
from dpopt.error import ErrorReport, expected_error, noisy_answers
from dpopt.privacy import Privacy
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


def lower_bound(workload: Workload, privacy: Privacy) -> float:
    """P * SVDB(W): a lower bound on every exact factorisation mechanism's total squared error.

    Under (eps, delta) it is Li and Miklau's Thm. 4.2 with P = the Gaussian variance factor. Under eps-DP,
    sens1(A) >= sens2(A) and the least-squares B = W A^+ has the smallest ||B||_F among all B with
    B A = W, so 2/eps^2 * SVDB(W) bounds the Laplace error of every exact factorisation (seed 004 Sec. 4.3).
    """
    return privacy.variance_factor * svd_bound(workload)


class Mechanism(ABC):
    """Base class: parameters in __init__, selection in fit, learned state in attributes ending in '_'."""

    short_name: ClassVar[str] = "mechanism"
    support_rtol: float = 1e-8

    def fit(self, workload: Workload | np.ndarray, privacy: Privacy) -> Mechanism:
        """Select the strategy for `workload` under `privacy`; checks support before returning."""
        workload = as_workload(workload)
        if not isinstance(privacy, Privacy):
            raise MechanismError(f"{self.short_name}: privacy must be a dpopt.privacy.Privacy")
        if workload.n**2 > MAX_DENSE_ENTRIES:
            raise MechanismError(
                f"{self.short_name}: {workload.n:.3g} cells are too many for a dense strategy; "
                "use the implicit mechanism 'hdmm'"
            )
        t0, c0 = time.perf_counter(), time.process_time()
        sel = self._select(workload, privacy)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        strategy = sel.strategy
        if not strategy.supports(workload, self.support_rtol):
            frac = strategy.unsupported_fraction(workload)
            raise MechanismError(
                f"{self.short_name}: selected strategy does not support workload {workload.name} "
                f"(relative residual {frac:.3g} > {self.support_rtol:g}); refusing to answer with it"
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
        if getattr(self, "_reconstruction", None) is None:
            self._reconstruction = self.strategy_.reconstruct(self.workload_)
        return noisy_answers(self.strategy_, self.workload_, self.privacy_, x, rng, 1, B=self._reconstruction)[0]

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
