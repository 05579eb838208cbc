"""Model: a built CVXPY problem with its named variables and the way back to a dpopt Strategy."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import cvxpy as cp

from dpopt.strategy import Strategy


@dataclass
class Model:
    """A strategy-selection problem stated declaratively.

    name: which problem (e.g. "mm_approx"); problem: the cvxpy.Problem; variables: its named variables.
    scale: the model's objective in the workload's units is scale * problem.value (models are solved on
        a rescaled Gram matrix so that the solver sees entries of order 1).
    recover: turns the solved model into a Strategy; None for bound-only models (their result carries
        strategy=None).
    build_seconds: wall time spent building the problem (before any solver is called).
    data: the inputs the model was built from (Gram matrix, kept cells, ...), for reports.
    """

    name: str
    problem: cp.Problem
    variables: dict[str, cp.Variable]
    scale: float = 1.0
    recover: Callable[[Model], Strategy] | None = None
    build_seconds: float = 0.0
    data: dict[str, Any] = field(default_factory=dict)

    def value(self, name: str) -> Any:
        """Value of the named variable after a solve (raises if the model has not been solved)."""
        v = self.variables[name].value
        if v is None:
            raise ValueError(f"variable {name} of model {self.name} has no value; solve the model first")
        return v

    def __repr__(self) -> str:
        sizes = ", ".join(f"{k}{tuple(v.shape)}" for k, v in self.variables.items())
        return f"<Model {self.name}: {sizes}>"
