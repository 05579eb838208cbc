"""How a mechanism treats a solver that stopped before its stopping rule was met.

Policy (shared by every optimising mechanism):
- CONVERGED: the strategy is used; status "converged".
- MAX_ITER, TIME_LIMIT, STALLED: the iterate is still a strategy. If it supports the workload (the
  support check in `Mechanism.fit` runs before any answer), it is a valid but possibly suboptimal
  strategy: it is used, `fit_info_.status` says "<solver status>: valid, not certified optimal", and a
  `ConvergenceWarning` is issued. With `on_unconverged="raise"` the mechanism refuses it instead. If it
  does not support the workload, `fit` raises (never answers with it).
- FAILED (or any unknown status): `fit` raises `MechanismError`.
"""

from __future__ import annotations

import warnings

from dpopt.mechanisms.base import MechanismError
from dpopt.solvers.result import CONVERGED, FAILED, MAX_ITER, STALLED, TIME_LIMIT, SolverResult

UNCONVERGED_POLICIES = ("warn", "raise")
_USABLE = (MAX_ITER, TIME_LIMIT, STALLED)


class ConvergenceWarning(UserWarning):
    """A solver stopped at an iteration/time cap; its strategy is valid but not certified optimal."""


def check_policy(on_unconverged: str, owner: str) -> str:
    """Validate the on_unconverged parameter of a mechanism."""
    if on_unconverged not in UNCONVERGED_POLICIES:
        raise ValueError(
            f"{owner}: on_unconverged must be one of {UNCONVERGED_POLICIES}, got {on_unconverged!r}"
        )
    return on_unconverged


def solver_status(result: SolverResult, owner: str, on_unconverged: str) -> tuple[str, str]:
    """(status, message) for a mechanism's FitInfo; warns or raises according to the policy above."""
    if result.status == CONVERGED:
        return "converged", result.message
    if result.status in _USABLE:
        text = (
            f"{owner}: solver stopped with status {result.status!r} ({result.message}); "
            "its strategy is valid if it supports the workload, but not certified optimal"
        )
        if on_unconverged == "raise":
            raise MechanismError(text + "; refusing it because on_unconverged='raise'")
        warnings.warn(text, ConvergenceWarning, stacklevel=4)
        return f"{result.status}: valid, not certified optimal", result.message
    reason = "failed" if result.status == FAILED else f"unknown status {result.status!r}"
    raise MechanismError(f"{owner}: strategy solver {reason} ({result.message}); no strategy to use")
