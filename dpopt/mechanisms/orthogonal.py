"""Orthogonal Mechanism (OM, seed 001): noise on the disjoint-domain queries W~, answers B (W~ x + noise).

Choices (the paper leaves them open; the solver module documents each in detail):
- Algorithm 2, line 1 ("randomly select r independent queries"): rows of W are scanned in a random
  order drawn from `seed` (an int or Generator); `seed=None` scans them in input order (reproduces
  Example 1). The choice is deterministic given the seed.
- line 17 ("independent and normalised queries"): `basis` is passed to the solver ("auto", its
  default, "rows" or "orthonormal"; see `dpopt.solvers.orthogonal.subdomain_queries`). Each sub-domain's
  block is scaled to sensitivity 1.
- Algorithm 3: B is solved block by block (exact W = B W~ even for sub-domains with several queries).
Under (eps, delta)-DP the same decomposition is answered with Gaussian noise scaled to the L2
sensitivity of W~ (valid, but the paper's construction targets the L1 sensitivity).

With `baselines=True` (the default) a baseline strategy (identity, noise on queries, hierarchical,
wavelet; `dpopt.baselines.baseline_strategies`) whose exact error is below OM's is returned instead, and
the status names it; `baselines=False` keeps OM's decomposition, as the paper reproductions do.

What the algorithm gives (checked against Algorithms 1-3 and Theorem 5 written out independently in
tests/test_om_paper.py; these are the algorithm's outcomes, not defects of this implementation):
- When every sub-domain's selected rows span all of its cells, W~ is the identity (up to row order) and
  B = W with its columns in that order (Corollary 1: B is unique), so OM *is* noise on data, error
  2 ||W||_F^2 / eps^2 to the last digit. A sub-domain of one cell always is spanned, and the paper's
  own workloads have only those: Example 1 (W~ a permutation matrix), and W_tau at the paper's sizes,
  where r = rank(W) rows give 2^r support patterns for n cells (tau = 0.2, 0.4, 0.8 at m = 50 or 200
  and n = 1000 or 2500: n singleton sub-domains every time), so in `dpopt reproduce om-fig*` OM's
  curve is noise on data's. Status: "exact: equals noise on data (W~ = I)".
- When a sub-domain has fewer independent selected rows than cells (a dense W of rank r < n is one
  sub-domain of all n cells), line 17 builds W~ from the r selected rows themselves, and B = W W~^+
  inherits the conditioning of the rows that line 1 happened to draw. On wrelated:64x128:s=13 (eps =
  0.1) that is 8.02e9 total, 7.9x noise on queries and 374x identity's 2.14e7; the draw alone moves it
  from 1.7e9 (input order) to 2.0e11 (seed 1). basis="orthonormal" (rows of an orthonormal basis of
  the same span) gives 4.2e7 there, still above identity. Status: "exact: W~ holds selected rows of W
  on k cells (error set by the rows drawn)". Those are OM's own errors (baselines=False); by default
  identity is returned there.
"""

from __future__ import annotations

import math

import numpy as np

from dpopt.mechanisms.base import Mechanism, MechanismError, Selection
from dpopt.privacy import Privacy
from dpopt.solvers.orthogonal import _BASES, OMStrategy, om_expected_error, orthogonal_strategy
from dpopt.strategy import Strategy
from dpopt.validation import check_choice
from dpopt.workloads import Workload

# Theorem 5 and the core's expected error are the same formula; they must agree to rounding.
THEOREM5_RTOL = 1e-9


def _describe(om: OMStrategy) -> tuple[str, str]:
    """Status and message of a decomposition: does W~ reduce to the identity (then OM is noise on data)?"""
    unspanned = [D_j for D_j, rows_j in zip(om.subdomains, om.blocks, strict=True) if rows_j.size < D_j.size]
    W_t = om.W_tilde
    unit_rows = bool(np.all(np.count_nonzero(W_t, axis=1) == 1) and np.all(W_t[W_t != 0] == 1.0))
    if unit_rows:
        return (
            "exact: equals noise on data (W~ = I)",
            "Algorithms 2-3 (exact W = B W~); every sub-domain's selected rows span all its cells, so W~ is "
            "the identity on the measured cells and B = W: the error is noise on data's, 2 ||W||_F^2 / eps^2",
        )
    cells = int(sum(D_j.size for D_j in unspanned))
    if not unspanned:  # spanned everywhere, but a basis other than "auto" kept rows of W
        return (
            f"exact: W~ holds {om.diagnostics['basis']}-basis queries, not I",
            "Algorithms 2-3 (exact W = B W~); every sub-domain is spanned, but the chosen basis does not "
            "use the unit queries, so the error differs from noise on data",
        )
    return (
        f"exact: W~ holds selected rows of W on {cells} cells (error set by the rows drawn)",
        f"Algorithms 2-3 (exact W = B W~); {len(unspanned)} sub-domain(s) with {cells} cells have fewer "
        "independent selected rows than cells, so W~ is built from those rows (Algorithm 2, line 17) and "
        "B = W W~^+ carries the conditioning of the rows drawn at random (line 1)",
    )


class OrthogonalMechanism(Mechanism):
    """OM Algorithms 1-3 (seed 001, Section 4.2): W = B W~ over disjoint sub-domains, Laplace noise on W~ x."""

    short_name = "om"

    def __init__(
        self,
        seed: int | np.random.Generator | None = 0,
        basis: str = "auto",
        tol: float = 1e-10,
        residual_tol: float = 1e-8,
        baselines: bool = True,
    ) -> None:
        if not isinstance(baselines, bool):
            raise ValueError(f"om: baselines must be True or False, got {baselines!r}")
        check_choice(basis, _BASES, "om: basis")
        if not 0.0 < tol < 1.0 or not 0.0 < residual_tol < 1.0:
            raise ValueError(f"om: tol and residual_tol must lie in (0, 1), got {tol}, {residual_tol}")
        self.seed = seed
        self.basis = basis
        self.tol = tol
        self.residual_tol = residual_tol
        # True: a baseline strategy with less error than (B, W~) is returned instead (Mechanism._least_error_selection)
        self.baselines = baselines
        # W = B W~ holds to residual_tol (max-entry scale); the Frobenius check gets the same margin.
        self.support_rtol = max(1e-8, 10.0 * residual_tol)

    def _select(self, workload: Workload, privacy: Privacy) -> Selection:
        """Algorithms 2 and 3 through `dpopt.solvers.orthogonal.orthogonal_strategy`."""
        W = self._workload_rows(workload, "Algorithm 2 needs every query's row to read its domain (non-zero cells)")
        try:
            om = orthogonal_strategy(
                W, rng=self.seed, tol=self.tol, basis=self.basis, residual_tol=self.residual_tol  # type: ignore[arg-type]
            )
        except ValueError as exc:
            raise MechanismError(f"om: cannot decompose workload {workload.name}: {exc}") from None
        diag = dict(om.diagnostics)
        uncovered = diag.pop("uncovered_cells")
        extra: dict[str, object] = {
            **diag,
            "uncovered_cells": int(len(uncovered)),
            "subdomain_sizes": [int(d.size) for d in om.subdomains],
        }
        status, message = _describe(om)
        if not privacy.is_pure:
            message += "; Gaussian noise on W~ scaled to its L2 sensitivity (the paper uses Laplace)"
        return Selection(
            Strategy(om.W_tilde, B=om.B, name="om"),
            solver="om-greedy",
            status=status,
            iterations=int(diag["n_subdomains"]),
            message=message,
            extra=extra,
        )

    def fit(self, workload: Workload | np.ndarray, privacy: Privacy) -> OrthogonalMechanism:
        """Select W~ and B (Algorithms 2-3), then cross-check Theorem 5 against the core's error under eps-DP."""
        super().fit(workload, privacy)
        info = self.fit_info_
        # Theorem 5 is a statement about OM's own (B, W~); a returned baseline has nothing to check
        if self.privacy_.is_pure and self._own_strategy_returned():
            assert self.strategy_.B is not None
            thm5 = om_expected_error(np.asarray(self.strategy_.B), np.asarray(self.strategy_.A), self.privacy_.epsilon)
            total = self.expected_error_.total
            rel = abs(thm5 - total) / max(abs(total), np.finfo(float).tiny)
            info.extra["theorem5_total"] = thm5
            info.extra["theorem5_rel_diff"] = rel
            if not rel <= THEOREM5_RTOL:
                raise MechanismError(
                    f"om: Theorem 5 gives {thm5:.6g} but the exact error is {total:.6g} "
                    f"(relative difference {rel:.3g}); the decomposition is inconsistent"
                )
        else:
            info.extra["theorem5_total"] = math.nan
            info.extra["theorem5_rel_diff"] = math.nan
        return self

    def _own_strategy_returned(self) -> bool:
        """Whether the fitted strategy is OM's own decomposition, not a baseline with less error."""
        return self.fit_info_.extra.get("returned", "om") == "om"

    def theorem5_error(self) -> float:
        """OM Theorem 5 (seed 001): 2 trace(B B^T) S(W~)^2 / eps^2, total over the m queries (eps-DP only)."""
        self._check_fitted()
        if not self.privacy_.is_pure:
            raise MechanismError("om: Theorem 5 is stated for eps-DP (Laplace noise); privacy has delta > 0")
        if not self._own_strategy_returned():
            raise MechanismError(f"om: Theorem 5 concerns OM's decomposition; {self.fit_info_.extra['returned']} "
                                 "was returned instead (less error)")
        assert self.strategy_.B is not None
        return om_expected_error(np.asarray(self.strategy_.B), np.asarray(self.strategy_.A), self.privacy_.epsilon)
