"""Hand-written solvers for strategy selection, cross-validated against `formulations/`."""

from dpopt.solvers.result import CONVERGED, FAILED, MAX_ITER, STALLED, TIME_LIMIT, SolverResult

__all__ = ["SolverResult", "CONVERGED", "MAX_ITER", "TIME_LIMIT", "STALLED", "FAILED"]
