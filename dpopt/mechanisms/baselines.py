"""Baseline mechanisms: Laplace (noise on queries), identity (noise on data), hierarchical, wavelet."""

from __future__ import annotations

from dpopt.baselines import (
    hierarchical_strategy,
    identity_strategy,
    per_dimension,
    qardaji_hierarchy,
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
    per_attribute_unions = True

    def _select(self, workload: Workload, privacy: Privacy) -> Selection:
        return Selection(identity_strategy(workload.n))


class HierarchicalMechanism(_KroneckerBaseline):
    """Hierarchical strategy, least-squares inference (Hay et al. 2010; seed 003), its branching chosen as
    Qardaji, Yang and Li 2013 do (HB: `qardaji_branching` per dimension, no root row) unless given.

    branching="qardaji" (default) picks b per dimension by Qardaji et al.'s Eq. (3) and leaves the root out,
    as their HB does (under (eps, delta) Eq. (3) with the Gaussian's sens2^2 = h, `qardaji_variance`); an
    integer b keeps the full tree with its root (Hay et al.'s H_b). The strategy's name says which b was used.
    """

    short_name = "hierarchical"
    per_attribute_unions = True

    def __init__(self, branching: int | str = "qardaji") -> None:
        if branching != "qardaji" and not (isinstance(branching, int) and not isinstance(branching, bool)
                                           and branching >= 2):
            raise ValueError(f"branching must be 'qardaji' or an integer >= 2, got {branching!r}")
        self.branching = branching

    def _select(self, workload: Workload, privacy: Privacy) -> Selection:
        gaussian = not privacy.is_pure
        if self.branching == "qardaji":
            how = f"branching by Qardaji et al. 2013 Eq. (3){' with sens2^2 = h' if gaussian else ''}"
            return Selection(qardaji_hierarchy(workload, gaussian), message=how)
        b = int(self.branching)
        return Selection(per_dimension(workload, lambda n: hierarchical_strategy(n, b), f"hierarchical(b={b})"),
                         message="given branching")


class WaveletMechanism(_KroneckerBaseline):
    """Haar wavelet strategy, least-squares inference (Privelet, Xiao et al. 2010; seed 003)."""

    short_name = "wavelet"
    per_attribute_unions = True

    def _select(self, workload: Workload, privacy: Privacy) -> Selection:
        return Selection(per_dimension(workload, wavelet_strategy, "wavelet"))
