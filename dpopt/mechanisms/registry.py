"""Stable short names for every mechanism (used by `dpopt compare` and sweeps)."""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module

from dpopt.mechanisms.base import Mechanism

# short name -> "module:Class"; modules are imported on first use so a mechanism whose module is
# missing is reported as unavailable instead of breaking the others.
MECHANISMS: dict[str, str] = {
    "laplace": "dpopt.mechanisms.baselines:LaplaceMechanism",
    "identity": "dpopt.mechanisms.baselines:IdentityMechanism",
    "hierarchical": "dpopt.mechanisms.baselines:HierarchicalMechanism",
    "wavelet": "dpopt.mechanisms.baselines:WaveletMechanism",
    "eigen": "dpopt.mechanisms.matrix:EigenDesignMechanism",
    "mm-optimal": "dpopt.mechanisms.matrix:ConvexOptimumMechanism",
    "mm-appendix-b": "dpopt.mechanisms.matrix:AppendixBMechanism",
    "lrm": "dpopt.mechanisms.lowrank:LowRankMechanism",
    "om": "dpopt.mechanisms.orthogonal:OrthogonalMechanism",
    "hdmm": "dpopt.mechanisms.hdmm:HDMMMechanism",
    "dawa-opt": "dpopt.mechanisms.data_aware:DataAwareMechanism",
}

# Mechanisms whose strategy depends on the data (a private partition first): they have no data-independent
# expected error or lower bound, and their records leave both null (compare them by data_error).
DATA_DEPENDENT: tuple[str, ...] = ("dawa-opt",)

# The order in which `dpopt compare` runs mechanisms, fastest first: the closed-form baselines, then the
# convex and factored selections, then OM, LRM and the Appendix B solver.
COST_ORDER: tuple[str, ...] = (
    "laplace", "identity", "hierarchical", "wavelet", "eigen", "mm-optimal", "hdmm", "dawa-opt", "om", "lrm",
    "mm-appendix-b",
)

# Work of a budgeted matrix-mechanism fit that its time limit does not cut (eigendecompositions and
# factorisations of n x n matrices before the first iteration and after the last, the support check and
# the exact error), in units of one dense symmetric eigendecomposition of n x n. Measured with 1 BLAS
# thread at time_limit=1e-3: eigen 15 (n = 1024) and 11 (n = 2048); mm-optimal 31 (n = 1024; its whole
# converged fit took 12 at n = 2048); mm-appendix-b 55 (n = 1024) and 50 (n = 2048). LRM estimates its
# own from one SVD of W (`dpopt.mechanisms.lowrank.FIXED_COST_SVDS`).
FIXED_COST_EIGHS: dict[str, float] = {"eigen": 15.0, "mm-optimal": 31.0, "mm-appendix-b": 55.0}
# The baseline check of a mechanism with baselines=True (the exact errors of identity, laplace, hierarchical
# and wavelet, and of the selected strategy once more): measured 1.5-2.4 eigendecompositions at n = 1024-2048
# with one BLAS thread; counted as 3 in the estimate.
BASELINE_CHECK_EIGHS = 3.0


def by_cost(names: list[str]) -> list[str]:
    """`names` in COST_ORDER (names it does not list keep their order, after the listed ones)."""
    rank = {name: i for i, name in enumerate(COST_ORDER)}
    return sorted(names, key=lambda name: rank.get(name, len(COST_ORDER)))


def _load(name: str) -> Callable[..., Mechanism]:
    module, cls = MECHANISMS[name].split(":")
    return getattr(import_module(module), cls)


def available_mechanisms() -> list[str]:
    """Short names whose implementation imports on this installation."""
    out = []
    for name in MECHANISMS:
        try:
            _load(name)
        except (ImportError, AttributeError):
            continue
        out.append(name)
    return out


def make_mechanism(name: str, **params: object) -> Mechanism:
    """Instantiate the mechanism registered under `name` with constructor parameters."""
    if name not in MECHANISMS:
        raise ValueError(f"unknown mechanism {name!r}; expected one of {', '.join(MECHANISMS)}")
    return _load(name)(**params)
