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
    "hdmm": "dpopt.implicit.mechanisms:HDMMMechanism",
}


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
