"""Losses, gradients and the exact sensitivity of a lower-triangular Toeplitz strategy C = T(c).

With q = 1 / c (C^-1 = T(q)) and B = A C^-1:
- A Toeplitz (A = T(a): prefix sums, momentum with a constant learning rate): B = T(a * q), so
  ||B||_F^2 = sum_j (n - j) b_j^2 and max_t ||B_t||^2 = sum_j b_j^2 (the last row), b = a * q, all in
  O(n log n) by `dpopt.streaming.series` (power-series division by FFT).
- any other lower-triangular A (a learning-rate schedule, an `npy:` matrix): B_t = row t of A times T(q), every
  row by one batched FFT correlation, O(n^2 log n) time and O(n^2) memory (n <= DENSE_MAX_STEPS).
The sensitivity of T(c) under k epochs comes from truncated autocorrelations: for i <= j,
X_ij = sum_(s=0)^(n-1-j) c_s c_(s+j-i), so every pattern block needs only the k lags 0, b, ..., (k-1) b.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import fft as sfft

from dpopt.streaming import series
from dpopt.streaming.participation import Participation, block_sensitivity
from dpopt.workloads import Workload

#: Largest n of a non-Toeplitz workload for a Toeplitz-structured strategy (the dense B is n x n).
DENSE_MAX_STEPS = 4096
#: Log-sum-exp temperatures of the max objective on a dense workload, each run from the previous one's point, and
#: the iterations allowed at each (the sharpest is the slowest to converge); the reported max loss is exact.
MAX_TEMPERATURES = (1e-1, 2e-2, 5e-3)
MAX_STAGE_ITERATIONS = 400
#: Largest n of a Toeplitz-structured fit: about 300 bytes per step were measured at n = 10^6 (peak RSS 290 MB),
#: so 2^25 steps need about 10 GB.
MAX_TOEPLITZ_STEPS = 1 << 25
#: Largest n k of the pattern blocks formed for a certified sensitivity (b k^2 = n k values, 8 bytes each: 2 GB).
MAX_BLOCK_VALUES = 250_000_000


def check_toeplitz_size(n: int, p: Participation | None = None) -> None:
    """Refuse n (and n k for the sensitivity blocks) above what fits in memory, with the estimate."""
    if n > MAX_TOEPLITZ_STEPS:
        raise ValueError(f"n = {n} steps is above {MAX_TOEPLITZ_STEPS} for a Toeplitz-structured strategy (about "
                         f"{300 * n / 1e9:.0f} GB at 300 bytes per step)")
    if p is not None and p.epochs > 1 and p.n * p.epochs > MAX_BLOCK_VALUES:
        raise ValueError(f"the sensitivity of {p.epochs} epochs over {p.n} steps forms n k = {p.n * p.epochs} block "
                         f"values (about {8 * p.n * p.epochs / 1e9:.0f} GB), above {MAX_BLOCK_VALUES}")


def toeplitz_blocks(c: np.ndarray, p: Participation) -> np.ndarray:
    """(b, k, k) pattern blocks of X = T(c)^T T(c) from the k truncated autocorrelations at lags 0, b, .., (k-1) b."""
    n, k, b = p.n, p.epochs, p.separation
    c = np.asarray(c, dtype=float)
    r = np.arange(b)
    out = np.empty((b, k, k))
    for d in range(k):
        lag = d * b
        cum = np.cumsum(c[: n - lag] * c[lag:])  # cum[m] = sum_(s <= m) c_s c_(s + lag)
        for a in range(k - d):
            j = r + (a + d) * b
            out[:, a, a + d] = cum[n - 1 - j]
            out[:, a + d, a] = out[:, a, a + d]
    return out


def toeplitz_sensitivity(c: np.ndarray, p: Participation) -> float:
    """Certified sens^2 of T(c) under p: ||c||^2 for k = 1, else `block_sensitivity` of its blocks."""
    c = np.asarray(c, dtype=float)
    if p.epochs == 1:
        return float(c @ c)
    return block_sensitivity(toeplitz_blocks(c, p))


def pattern_column(c: np.ndarray, p: Participation) -> np.ndarray:
    """v = T(c) u_0, u_0 the indicator of the steps 0, b, ..., (k-1) b (the first pattern)."""
    v = np.array(c, dtype=float)
    b = p.separation
    for a in range(1, p.epochs):
        v[a * b:] += c[: p.n - a * b]
    return v


class ToeplitzObjective:
    """log(sens~^2) + log(F(q)) of T(c) for a workload and objective, with its gradient in c.

    sens~^2 = ||T(c) u_0||^2 is <X_pi0, 11^T>, the sensitivity of the first pattern at Gamma = 11^T: exact whenever
    c >= 0 (then X >= 0 entrywise and the first pattern has the longest sums); the reported sensitivity is always
    the certified one (`toeplitz_sensitivity`). F is ||B||_F^2 / n (mean) or max_t ||B_t||^2 (max; for a dense A,
    smoothed by log-sum-exp at temperature `mu`, exact as mu -> 0).
    """

    def __init__(self, W: Workload, p: Participation, objective: str) -> None:
        check_toeplitz_size(W.n, p)
        self.n, self.p, self.objective = W.n, p, objective
        self.a = W.toeplitz_column()
        self.mu = MAX_TEMPERATURES[-1]
        if self.a is None:
            if W.n > DENSE_MAX_STEPS:
                raise ValueError(f"workload {W.name} is not Toeplitz: a Toeplitz-structured strategy forms B densely, "
                                 f"n <= {DENSE_MAX_STEPS}; got n = {W.n}")
            self.A = W.matrix()
            self._size = sfft.next_fast_len(2 * self.n - 1, real=True)
            self._Ahat = sfft.rfft(self.A[:, ::-1], self._size, axis=1)
        self.prefix = self.a is not None and bool(np.all(self.a == self.a[0]))

    def temperatures(self) -> tuple[float | None, ...]:
        """The smoothing temperatures to run in turn: MAX_TEMPERATURES for the max objective on a dense workload,
        else (None,) (the objective is smooth as it is)."""
        return MAX_TEMPERATURES if (self.a is None and self.objective == "max") else (None,)

    # -- B and its row norms ------------------------------------------------------------------------
    def _b(self, q: np.ndarray) -> np.ndarray:
        """b = a * q (Toeplitz A)."""
        return self.a[0] * np.cumsum(q) if self.prefix else series.conv(self.a, q, self.n)

    def dense_B(self, q: np.ndarray) -> np.ndarray:
        """B = A T(q) for a dense A, row by row through one batched FFT correlation."""
        n, size = self.n, self._size
        prod = sfft.irfft(self._Ahat * sfft.rfft(q, size)[None, :], size, axis=1)[:, :n]
        return prod[:, ::-1]

    def row_norms(self, q: np.ndarray) -> np.ndarray:
        """||B_t||^2 for every t."""
        if self.a is not None:
            return np.cumsum(self._b(q) ** 2)
        B = self.dense_B(q)
        return np.einsum("ij,ij->i", B, B)

    def q_loss(self, q: np.ndarray) -> tuple[float, np.ndarray]:
        """F(q) and dF/dq."""
        n = self.n
        if self.a is not None:
            b = self._b(q)
            w = (n - np.arange(n)) / n if self.objective == "mean" else np.ones(n)
            g = 2.0 * w * b
            dq = self.a[0] * np.cumsum(g[::-1])[::-1] if self.prefix else series.corr(g, self.a)
            return float(w @ (b * b)), dq
        B = self.dense_B(q)
        rows = np.einsum("ij,ij->i", B, B)
        if self.objective == "mean":
            omega = np.full(n, 1.0 / n)
            F = float(rows.sum()) / n
        else:  # log-sum-exp of log row norms: F = exp(mu log sum exp(log r_t / mu))
            z = np.log(rows) / self.mu
            zmax = z.max()
            s = np.exp(z - zmax)
            F = math.exp(self.mu * (zmax + math.log(s.sum())))
            omega = F * (s / s.sum()) / rows
        H = 2.0 * omega[:, None] * B
        size = self._size
        dq = sfft.irfft((self._Ahat * sfft.rfft(H, size, axis=1)).sum(axis=0), size)[:n][::-1]
        return F, dq

    def value_grad(self, c: np.ndarray) -> tuple[float, np.ndarray]:
        """log sens~^2 + log F and its gradient in c (dq = -q * q * dc as power series)."""
        q = series.inverse(c, self.n)
        F, dq = self.q_loss(q)
        dc_F = -series.corr(dq, series.conv(q, q, self.n))
        v = pattern_column(c, self.p)
        s = float(v @ v)
        ds = pattern_column_adjoint(2.0 * v, self.p)
        return math.log(s) + math.log(F), ds / s + dc_F / F

    def losses(self, c: np.ndarray) -> tuple[float, float, float]:
        """(mean_loss, max_loss, sens2) with the certified sensitivity."""
        q = series.inverse(c, self.n)
        rows = self.row_norms(q)
        sens2 = toeplitz_sensitivity(c, self.p)
        return sens2 * float(rows.sum()) / self.n, sens2 * float(rows.max()), sens2


def pattern_column_adjoint(g: np.ndarray, p: Participation) -> np.ndarray:
    """The adjoint of c -> pattern_column(c): out_m = sum_a g_(m + a b)."""
    out = np.array(g, dtype=float)
    b = p.separation
    for a in range(1, p.epochs):
        out[: p.n - a * b] += g[a * b:]
    return out
