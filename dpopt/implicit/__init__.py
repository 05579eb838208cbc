"""High-dimensional workloads without materialising W: implicit Kronecker, union and marginal workloads,
factored strategies, and their optimisers (HDMM-style templates; ResidualPlanner for marginals)."""

from dpopt.implicit.marginal_strategy import MarginalStrategy
from dpopt.implicit.optimize import ImplicitSelection, hdmm_rmse, select_strategy
from dpopt.implicit.specs import parse_implicit_spec
from dpopt.implicit.strategy import KronStrategy
from dpopt.implicit.workloads import (
    ImplicitWorkload,
    KronWorkload,
    MarginalsWorkload,
    UnionWorkload,
    as_implicit,
)

__all__ = [
    "ImplicitSelection",
    "ImplicitWorkload",
    "KronStrategy",
    "KronWorkload",
    "MarginalStrategy",
    "MarginalsWorkload",
    "UnionWorkload",
    "as_implicit",
    "hdmm_rmse",
    "parse_implicit_spec",
    "select_strategy",
]
