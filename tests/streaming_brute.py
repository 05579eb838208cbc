"""Brute-force references for the streaming tests: sensitivity over every pattern by a CVXPY SDP."""

from __future__ import annotations

import cvxpy as cp
import numpy as np

from dpopt.streaming.participation import Participation

#: Clarabel's default relative gap tolerance is 1e-8; its objective is compared at 1e-6 relative (100x that, for the
#: interior-point residuals of a k x k SDP of modest conditioning).
CVXPY_RTOL = 1e-6


def sdp_value(Xpi: np.ndarray) -> float:
    """max{<X_pi, Gamma>: Gamma PSD, diag Gamma <= 1} by CVXPY (Clarabel)."""
    k = Xpi.shape[0]
    G = cp.Variable((k, k), PSD=True)
    prob = cp.Problem(cp.Maximize(cp.trace(0.5 * (Xpi + Xpi.T) @ G)), [cp.diag(G) <= 1])
    prob.solve(solver="CLARABEL")
    return float(prob.value)


def brute_sensitivity(X: np.ndarray, p: Participation) -> float:
    """sens^2 = max over every pattern of the SDP value of its block (one CVXPY solve per pattern)."""
    idx = p.patterns()
    if p.epochs == 1:
        return float(np.max(np.diag(X)))
    return max(sdp_value(X[np.ix_(r, r)]) for r in idx)


def random_correlations(k: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` random k x k PSD matrices with unit diagonal (feasible Gamma), some of rank one (+-1 vectors)."""
    out = []
    for i in range(count):
        if i % 2:
            s = rng.choice([-1.0, 1.0], size=k)
            out.append(np.outer(s, s))
        else:
            G = rng.standard_normal((k, rng.integers(1, k + 1)))
            M = G @ G.T
            d = np.sqrt(np.diag(M))
            out.append(M / np.outer(d, d))
    return np.array(out)


def check_upper_bound(X: np.ndarray, p: Participation, value: float, rng: np.random.Generator,
                      draws: int = 200) -> None:
    """Assert `value` >= sens^2: against the brute-force SDP (to CVXPY_RTOL) and every random feasible Gamma."""
    brute = brute_sensitivity(X, p)
    assert value >= brute * (1 - CVXPY_RTOL), f"reported sens^2 {value!r} below the brute-force SDP {brute!r}"
    k = p.epochs
    Gs = random_correlations(k, draws, rng)
    idx = p.patterns()
    blocks = X[idx[:, :, None], idx[:, None, :]]
    worst = float(np.einsum("pij,gij->pg", blocks, Gs).max())
    assert value >= worst * (1 - 1e-12), f"reported sens^2 {value!r} below <X_pi, Gamma> = {worst!r} for a feasible Gamma"
