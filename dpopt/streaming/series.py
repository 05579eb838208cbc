"""Truncated power series by FFT: the algebra of lower-triangular Toeplitz matrices.

A lower-triangular Toeplitz matrix T(c) (T_tj = c_(t-j)) is the power series c(z) = sum_j c_j z^j truncated
to n terms: T(a) T(c) = T(a * c), T(c)^-1 = T(1 / c), T(c)^(1/2) = T(sqrt(c)). Products are FFT convolutions
(O(n log n)); the inverse and the square root are Newton iterations that double the number of correct terms
each step (Brent and Kung 1978, "Fast algorithms for manipulating formal power series"), O(n log n) in all.
"""

from __future__ import annotations

import numpy as np
from scipy import fft as sfft


def conv(x: np.ndarray, y: np.ndarray, n: int) -> np.ndarray:
    """The first n coefficients of the product x(z) y(z) (an FFT convolution)."""
    x, y = x[:n], y[:n]
    size = sfft.next_fast_len(len(x) + len(y) - 1, real=True)
    out = sfft.irfft(sfft.rfft(x, size) * sfft.rfft(y, size), size)[:n]
    if len(out) < n:
        out = np.concatenate([out, np.zeros(n - len(out))])
    return out


def corr(g: np.ndarray, h: np.ndarray) -> np.ndarray:
    """out_m = sum_(j >= m) g_j h_(j - m), m = 0..n-1 (n = len(g)): the adjoint of h -> g in a product."""
    n = len(g)
    return conv(g[::-1], h, n)[::-1]


def inverse(c: np.ndarray, n: int | None = None) -> np.ndarray:
    """The first n coefficients of 1 / c(z) (c_0 != 0) by Newton's iteration q <- q (2 - c q) (Brent-Kung 1978)."""
    n = len(c) if n is None else n
    if c[0] == 0:
        raise ValueError("a power series with c_0 = 0 has no inverse (C would be singular)")
    q = np.array([1.0 / c[0]])
    m = 1
    while m < n:
        m = min(2 * m, n)
        e = -conv(c, q, m)
        e[0] += 2.0
        q = conv(q, e, m)
    return q[:n]


def sqrt(a: np.ndarray, n: int | None = None) -> np.ndarray:
    """The first n coefficients of the principal square root of a(z) (a_0 > 0): s <- (s + a / s) / 2 (Brent-Kung)."""
    n = len(a) if n is None else n
    if not a[0] > 0:
        raise ValueError("the square root needs a_0 > 0")
    s = np.array([np.sqrt(a[0])])
    m = 1
    while m < n:
        m = min(2 * m, n)
        s = np.concatenate([s, np.zeros(m - len(s))])
        s = 0.5 * (s + conv(a, inverse(s, m), m))
    return s[:n]


def prefix_sqrt(n: int) -> np.ndarray:
    """sqrt(1 / (1 - z)) = sum_j binom(2j, j) / 4^j z^j, by c_j = c_(j-1) (2j - 1) / (2j) (the square root of prefix
    sums, Fichtenberger, Henzinger and Upadhyay 2023)."""
    j = np.arange(1, n)
    return np.concatenate([[1.0], np.cumprod((2 * j - 1) / (2 * j))])
