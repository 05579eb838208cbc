"""Mechanisms behind one fit/answer interface, registered under stable short names."""

from __future__ import annotations

from dpopt.mechanisms.base import FitInfo, Mechanism, MechanismError, Selection, lower_bound
from dpopt.mechanisms.baselines import (
    HierarchicalMechanism,
    IdentityMechanism,
    LaplaceMechanism,
    WaveletMechanism,
)
from dpopt.mechanisms.registry import MECHANISMS, available_mechanisms, make_mechanism

__all__ = [
    "FitInfo",
    "Mechanism",
    "MechanismError",
    "Selection",
    "lower_bound",
    "LaplaceMechanism",
    "IdentityMechanism",
    "HierarchicalMechanism",
    "WaveletMechanism",
    "MECHANISMS",
    "available_mechanisms",
    "make_mechanism",
]
