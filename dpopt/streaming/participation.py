"""Multi-participation: k epochs of b = n / k steps, and the certified sensitivity of a strategy under it.

After Choquette-Choo et al. 2023, "Multi-epoch matrix factorization mechanisms for private machine
learning", and Denisov et al. 2022): a user contributes at most once per epoch, at the steps of one pattern
pi_r = {r, r + b, ..., r + (k - 1) b}, r = 0..b-1 (the patterns partition the n steps), each contribution a
vector of norm at most 1. With X = C^T C and X_pi its k x k block on a pattern,

    sens^2 = max_pi max{<X_pi, Gamma> : Gamma PSD, diag Gamma <= 1} = max_pi min{1^T y : Diag(y) - X_pi PSD}.

`block_sensitivity` returns a certified upper bound on that number for any stack of blocks: k = 1 is the
diagonal; an entrywise non-negative block gives 1^T X_pi 1 exactly (Gamma = 11^T is feasible, and
|Gamma_ij| <= 1 for every feasible Gamma); any other block goes to a batched log-barrier Newton method on y,
whose y is raised until Diag(y) - X_pi - m I passes a Cholesky factorisation with the margin m of
`cholesky_margin` (so Diag(y) - X_pi is PSD in exact arithmetic), and 1^T y of that y is returned.
Other participation schemes (b-min-sep, random batches) are refused by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpopt.validation import check_positive_int

#: Schemes named in the literature that are not certified here (refused by name).
UNSUPPORTED_SCHEMES = ("b-min-sep", "min-sep", "random-batches", "poisson", "shuffling")
#: Unit roundoff of float64.
UNIT_ROUNDOFF = np.finfo(float).eps / 2
#: Relative duality gap k / t (per pattern) at which the barrier method stops.
SDP_RTOL = 1e-9


@dataclass(frozen=True)
class Participation:
    """k epochs over n steps (k divides n): a user takes part at steps r, r + b, ..., r + (k - 1) b, b = n / k
    (Choquette-Choo et al. 2023)."""

    n: int
    epochs: int = 1
    scheme: str = "epochs"

    def __post_init__(self) -> None:
        if self.scheme != "epochs":
            if str(self.scheme).lower() in UNSUPPORTED_SCHEMES:
                raise ValueError(f"participation scheme {self.scheme!r} is not certified here; only 'epochs' "
                                 "(k epochs of b = n / k steps, one contribution per epoch) is")
            raise ValueError(f"unknown participation scheme {self.scheme!r}; expected 'epochs'")
        n = check_positive_int(self.n, "n")
        k = check_positive_int(self.epochs, "epochs")
        if n % k:
            raise ValueError(f"epochs k = {k} must divide the number of steps n = {n}")
        object.__setattr__(self, "n", n)
        object.__setattr__(self, "epochs", k)

    @property
    def separation(self) -> int:
        """b = n / k, the steps between two participations of one user."""
        return self.n // self.epochs

    def patterns(self) -> np.ndarray:
        """(b, k) int array: row r is the pattern r, r + b, ..., r + (k - 1) b."""
        b = self.separation
        return np.arange(b)[:, None] + b * np.arange(self.epochs)[None, :]


def pattern_blocks(X: np.ndarray, p: Participation) -> np.ndarray:
    """(b, k, k): the block X_pi of X = C^T C on every pattern (multi-participation sensitivity)."""
    X = np.asarray(X, dtype=float)
    if X.shape != (p.n, p.n):
        raise ValueError(f"X has shape {X.shape}; expected ({p.n}, {p.n}) for {p.n} steps")
    idx = p.patterns()
    return X[idx[:, :, None], idx[:, None, :]]


def participation_sensitivity(X: np.ndarray, p: Participation) -> float:
    """Certified upper bound on sens^2 = max_pi max{<X_pi, Gamma>: Gamma PSD, diag Gamma <= 1}."""
    if p.epochs == 1:
        return float(np.max(np.diag(np.asarray(X, dtype=float))))
    return block_sensitivity(pattern_blocks(X, p))


def sensitivity_lower(X: np.ndarray, p: Participation) -> float:
    """A lower bound on sens^2 from feasible Gamma (11^T, I and the barrier's normalised S^-1)."""
    return block_sensitivity_lower(pattern_blocks(X, p))


def cholesky_margin(M_diag_max: np.ndarray, k: int) -> np.ndarray:
    """Margin m with: Cholesky of M - m I completing in float64 implies M PSD in exact arithmetic.

    Higham, Accuracy and Stability, Thm. 10.5: a completed Cholesky of H gives H + E = L L^T with
    |E| <= gamma_(k+1) |L| |L^T|, and |L||L^T| has entries at most max_i H_ii, so ||E||_2 <= k gamma_(k+1)
    max_i H_ii. m = 2 k gamma_(k+1) max_i M_ii (gamma_j = j u / (1 - j u)) covers it with a factor 2 to spare.
    """
    g = (k + 1) * UNIT_ROUNDOFF / (1 - (k + 1) * UNIT_ROUNDOFF)
    return 2.0 * k * g * np.maximum(M_diag_max, 0.0)


def _chol_ok(M: np.ndarray) -> np.ndarray:
    """Per block of a (P, k, k) stack: True where numpy's Cholesky completes."""
    try:
        np.linalg.cholesky(M)
        return np.ones(len(M), dtype=bool)
    except np.linalg.LinAlgError:
        ok = np.zeros(len(M), dtype=bool)
        for i, Mi in enumerate(M):
            try:
                np.linalg.cholesky(Mi)
                ok[i] = True
            except np.linalg.LinAlgError:
                pass
        return ok


def _certify(Xs: np.ndarray, y: np.ndarray) -> np.ndarray:
    """y raised until Diag(y) - X_pi - m I passes Cholesky for every block (m from `cholesky_margin`)."""
    P, k, _ = Xs.shape
    y = y.copy()
    lam = np.linalg.eigvalsh(y[:, :, None] * np.eye(k) - Xs)[:, 0]
    scale = np.abs(y).max(axis=1) + np.abs(Xs).max(axis=(1, 2))
    shift = np.maximum(0.0, -lam) + 4.0 * cholesky_margin(scale, k)
    y += shift[:, None]
    todo = np.arange(P)
    for _ in range(60):
        M = y[todo, :, None] * np.eye(k) - Xs[todo]
        m = cholesky_margin(np.diagonal(M, axis1=1, axis2=2).max(axis=1), k)
        ok = _chol_ok(M - m[:, None, None] * np.eye(k))
        todo = todo[~ok]
        if not len(todo):
            return y
        y[todo] += np.maximum(shift[todo], 1e-15 * scale[todo])[:, None]
        shift[todo] *= 2.0
    raise RuntimeError("could not certify the sensitivity: Diag(y) - X_pi never passed the Cholesky test")


def _barrier(Xs: np.ndarray, rtol: float = SDP_RTOL, max_newton: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """min 1^T y s.t. Diag(y) - X_pi PSD for a (P, k, k) stack, by a log-barrier path-following Newton method.

    Minimises t 1^T y - log det(Diag(y) - X_pi) for t = t0, 10 t0, ...; at the centre, Gamma = S^-1 / t has unit
    diagonal (dual feasible) and the gap 1^T y - <X_pi, Gamma> = k / t. Returns (y, Gamma) at the last centre.
    """
    P, k, _ = Xs.shape
    eye = np.eye(k)
    y = np.abs(Xs).sum(axis=2) + 1e-3 * (np.abs(Xs).max(axis=(1, 2)) + 1e-300)[:, None]  # Gershgorin: strictly feasible
    obj_scale = np.maximum(y.sum(axis=1), 1e-300)
    t = k / obj_scale  # gap k / t starts at about the objective
    for _ in range(60):
        for _ in range(max_newton):
            S = y[:, :, None] * eye - Xs
            Sinv = np.linalg.inv(S)
            g = t[:, None] - np.diagonal(Sinv, axis1=1, axis2=2)
            H = Sinv * Sinv
            dy = -np.linalg.solve(H, g[:, :, None])[:, :, 0]
            dec = np.einsum("pi,pi->p", -g, dy)  # Newton decrement squared
            if np.all(dec < 1e-10):
                break
            L = np.linalg.cholesky(S)
            Li = np.linalg.inv(L)
            D = np.einsum("pij,pj,pkj->pik", Li, dy, Li)
            lmin = np.linalg.eigvalsh(D)[:, 0]
            step = np.where(lmin < 0, np.minimum(1.0, 0.99 / np.maximum(-lmin, 1e-300)), 1.0)
            step = np.where(dec > 0.25, np.minimum(step, 1.0 / (1.0 + np.sqrt(np.maximum(dec, 0)))), step)
            y = y + step[:, None] * dy
        if np.all(k / t <= rtol * np.abs(y.sum(axis=1)) + 1e-300):
            break
        t = t * 10.0
    S = y[:, :, None] * eye - Xs
    Gamma = np.linalg.inv(S) / t[:, None, None]
    return y, Gamma


def _nonneg(Xs: np.ndarray) -> np.ndarray:
    return np.all(Xs >= 0, axis=(1, 2))


def block_sensitivity(Xs: np.ndarray) -> float:
    """Certified upper bound on max_pi min{1^T y : Diag(y) - X_pi PSD} over a (P, k, k) stack of blocks.

    k = 1: max X_pi; non-negative blocks: 1^T X_pi 1 (exact), times (1 + 2 k^2 u) for the rounding of the sum;
    other blocks: 1^T y for y certified by `_certify` after the barrier method `_barrier`.
    """
    Xs = np.asarray(Xs, dtype=float)
    if Xs.ndim != 3 or Xs.shape[1] != Xs.shape[2]:
        raise ValueError(f"expected a (P, k, k) stack of blocks, got shape {Xs.shape}")
    if not np.all(np.isfinite(Xs)):
        raise ValueError("X_pi has NaN or infinite entries")
    k = Xs.shape[1]
    if k == 1:
        return float(Xs.max())
    pos = _nonneg(Xs)
    best = -math.inf
    if pos.any():
        best = float(Xs[pos].sum(axis=(1, 2)).max()) * (1.0 + 2.0 * k * k * UNIT_ROUNDOFF)
    rest = Xs[~pos]
    if len(rest):
        rest = 0.5 * (rest + np.swapaxes(rest, 1, 2))
        y, _ = _barrier(rest)
        y = _certify(rest, y)
        best = max(best, float(y.sum(axis=1).max()))
    return best


def block_sensitivity_lower(Xs: np.ndarray) -> float:
    """max_pi <X_pi, Gamma> for the feasible Gamma in {11^T, I, the barrier's S^-1 scaled to unit diagonal}."""
    Xs = np.asarray(Xs, dtype=float)
    k = Xs.shape[1]
    low = max(float(Xs.sum(axis=(1, 2)).max()), float(np.trace(Xs, axis1=1, axis2=2).max()))
    if k == 1 or _nonneg(Xs).all():
        return low
    rest = Xs[~_nonneg(Xs)]
    rest = 0.5 * (rest + np.swapaxes(rest, 1, 2))
    _, Gamma = _barrier(rest)
    d = np.sqrt(np.diagonal(Gamma, axis1=1, axis2=2))
    G = Gamma / (d[:, :, None] * d[:, None, :])
    return max(low, float(np.einsum("pij,pij->p", rest, G).max()))
