"""Mechanisms behind one fit/answer interface, registered under stable short names."""

from __future__ import annotations

from dpopt.mechanisms.base import FitInfo, Mechanism, MechanismError, Selection, lower_bound
from dpopt.mechanisms.baselines import (
    HierarchicalMechanism,
    IdentityMechanism,
    LaplaceMechanism,
    WaveletMechanism,
)
from dpopt.mechanisms.convergence import ConvergenceWarning
from dpopt.mechanisms.lowrank import LowRankMechanism
from dpopt.mechanisms.matrix import (
    AppendixBMechanism,
    ConvexOptimumMechanism,
    EigenDesignMechanism,
    MatrixMechanism,
)
from dpopt.mechanisms.orthogonal import OrthogonalMechanism
from dpopt.mechanisms.registry import MECHANISMS, available_mechanisms, make_mechanism

__all__ = [
    "FitInfo",
    "Mechanism",
    "MechanismError",
    "Selection",
    "lower_bound",
    "ConvergenceWarning",
    "LaplaceMechanism",
    "IdentityMechanism",
    "HierarchicalMechanism",
    "WaveletMechanism",
    "MatrixMechanism",
    "EigenDesignMechanism",
    "ConvexOptimumMechanism",
    "AppendixBMechanism",
    "LowRankMechanism",
    "OrthogonalMechanism",
    "MECHANISMS",
    "available_mechanisms",
    "make_mechanism",
]
