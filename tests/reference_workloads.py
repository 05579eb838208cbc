"""Range workloads built independently of dpopt.workloads (explicit loops and closed forms), for the tests
that check dpopt's constructions or need a second one to compare with."""

from __future__ import annotations

import numpy as np


def allrange_gram(n: int) -> np.ndarray:
    """W^T W of AllRange(n): ranges containing cells i <= j number (i + 1)(n - j)."""
    i = np.arange(n)
    return ((np.minimum.outer(i, i) + 1) * (n - np.maximum.outer(i, i))).astype(float)


def prefix_gram(n: int) -> np.ndarray:
    """W^T W of Prefix(n): prefixes containing cells i and j number n - max(i, j)."""
    i = np.arange(n)
    return (n - np.maximum.outer(i, i)).astype(float)


def allrange_matrix(n: int) -> np.ndarray:
    """Every range [a, b], a <= b, as a 0/1 row, ordered by (a, b)."""
    rows = []
    for a in range(n):
        for b in range(a, n):
            row = np.zeros(n)
            row[a : b + 1] = 1.0
            rows.append(row)
    return np.array(rows)


def prefix_matrix(n: int) -> np.ndarray:
    """Every prefix [0, b] as a 0/1 row."""
    return np.tril(np.ones((n, n)))


def width_matrix(n: int, k: int) -> np.ndarray:
    """Every range of width exactly k as a 0/1 row."""
    W = np.zeros((n - k + 1, n))
    for s in range(n - k + 1):
        W[s, s : s + k] = 1.0
    return W


def width_gram(n: int, k: int) -> np.ndarray:
    """W^T W of the ranges of width exactly k."""
    W = width_matrix(n, k)
    return W.T @ W


def range_family_gram(kind: str, n: int) -> np.ndarray:
    """The Gram of "allrange", "prefix" or "widthk" (width n // 4) on n cells."""
    if kind == "allrange":
        return allrange_gram(n)
    if kind == "prefix":
        return prefix_gram(n)
    return width_gram(n, n // 4)


def explicit(workload):  # noqa: ANN001, ANN201 - a test helper
    """The same queries as an explicit (sparse-row) workload: its Gram comes from the rows, not the structure."""
    from dpopt.workloads import as_workload

    return as_workload(workload.sparse(), name=workload.name)
