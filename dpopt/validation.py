"""Input checks shared by the public API: each failure names what was wrong and what was expected."""

from __future__ import annotations

import numbers

import numpy as np


def check_finite_matrix(M: object, what: str) -> np.ndarray:
    """Return M as a 2-D float array with at least one row and column and only finite entries."""
    A = np.asarray(M, dtype=float)
    if A.ndim != 2:
        raise ValueError(f"{what} must be a 2-D matrix, got an array with {A.ndim} dimension(s)")
    if A.shape[0] == 0 or A.shape[1] == 0:
        raise ValueError(f"{what} must have at least one row and one column, got shape {A.shape}")
    if not np.all(np.isfinite(A)):
        bad = int(np.size(A) - np.count_nonzero(np.isfinite(A)))
        raise ValueError(f"{what} has {bad} NaN or infinite entries; expected only finite numbers")
    return A


def check_finite_vector(x: object, what: str, length: int | None = None) -> np.ndarray:
    """Return x as a 1-D float array of the given length with only finite entries."""
    v = np.asarray(x, dtype=float)
    if v.ndim != 1:
        raise ValueError(f"{what} must be a 1-D vector, got shape {v.shape}")
    if length is not None and v.shape[0] != length:
        raise ValueError(f"{what} has length {v.shape[0]}, expected {length} (one entry per cell)")
    if not np.all(np.isfinite(v)):
        raise ValueError(f"{what} has NaN or infinite entries; expected only finite numbers")
    return v


def check_positive_int(v: object, what: str) -> int:
    """Return v as an int >= 1."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or int(v) < 1:
        raise ValueError(f"{what} must be a positive integer, got {v!r}")
    return int(v)


def as_generator(seed: int | np.random.Generator | None) -> np.random.Generator:
    """A numpy Generator from a seed, an existing Generator (used as is) or None (fresh entropy)."""
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is None or isinstance(seed, numbers.Integral):
        return np.random.default_rng(seed)
    raise ValueError(f"seed must be an int, a numpy Generator or None, got {type(seed).__name__}")
