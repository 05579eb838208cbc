"""Baseline mechanisms: Laplace (noise on queries), identity (noise on data), hierarchical, wavelet."""

from __future__ import annotations

from dpopt.baselines import (
    hierarchical_strategy,
    identity_strategy,
    per_dimension,
    wavelet_strategy,
    workload_strategy,
)
from dpopt.mechanisms.base import Mechanism, Selection
from dpopt.privacy import Privacy
from dpopt.workloads import Workload


class _KroneckerBaseline(Mechanism):
    """A baseline whose strategy on W_1 (x) ... (x) W_d is the Kronecker product of its per-factor strategies."""

    def kronecker_policy(self, privacy: Privacy) -> str | None:
        """Per factor when the domain is too large for a dense strategy (the same strategy as the dense one)."""
        return "large"


class LaplaceMechanism(_KroneckerBaseline):
    """Noise on every query answer, A = W, B = I (seed 000's NOQ / M_R; Dwork et al. 2006)."""

    short_name = "laplace"

    def kronecker_policy(self, privacy: Privacy) -> str | None:
        """Always per factor: A = W is the Kronecker product of the factors' rows, whose product may have
        too many rows to list even on a small domain (AllRange(64) x AllRange(32): 1.1e6 x 2048)."""
        return "separable"

    def _select(self, workload: Workload, privacy: Privacy) -> Selection:
        return Selection(workload_strategy(workload))


class IdentityMechanism(_KroneckerBaseline):
    """Noise on data, A = I, answers W (x + z) (seed 000's NOD / M_D)."""

    short_name = "identity"

    def _select(self, workload: Workload, privacy: Privacy) -> Selection:
        return Selection(identity_strategy(workload.n))


class HierarchicalMechanism(_KroneckerBaseline):
    """Hierarchical strategy with branching b, least-squares inference (Hay et al. 2010; seed 003)."""

    short_name = "hierarchical"

    def __init__(self, branching: int = 2) -> None:
        self.branching = branching

    def _select(self, workload: Workload, privacy: Privacy) -> Selection:
        name = f"hierarchical(b={self.branching})"
        return Selection(per_dimension(workload, lambda n: hierarchical_strategy(n, self.branching), name))


class WaveletMechanism(_KroneckerBaseline):
    """Haar wavelet strategy, least-squares inference (Privelet, Xiao et al. 2010; seed 003)."""

    short_name = "wavelet"

    def _select(self, workload: Workload, privacy: Privacy) -> Selection:
        return Selection(per_dimension(workload, wavelet_strategy, "wavelet"))
