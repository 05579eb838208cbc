"""The privacy cost with which the union benchmark scores ResPlanMax's plan (`benchmarks.union_peers`), against a
brute force over the cells of the stacked measurement matrix. The peer itself is not installed here; the scoring
is plain numpy."""

from __future__ import annotations

from functools import reduce
from itertools import combinations

import numpy as np
import pytest

from benchmarks.union_peers import plan_privacy_cost


def _closure(subsets: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    out = {T for S in subsets for k in range(len(S) + 1) for T in combinations(S, k)}
    return sorted(out, key=lambda S: (len(S), S))


def _measurement(S: tuple[int, ...], R: list[np.ndarray]) -> np.ndarray:
    """kron over attributes of R_a (a in S) or the all-ones row (a not in S): measurement S on the full domain."""
    return reduce(np.kron, [R[a] if a in S else np.ones((1, R[a].shape[1])) for a in range(len(R))])


@pytest.mark.parametrize("seed", range(5))
def test_plan_cost_is_the_largest_column_norm_of_the_stacked_measurements(seed: int) -> None:
    rng = np.random.default_rng(seed)
    sizes = [3, 4, 2]
    R = [rng.standard_normal((n - 1, n)) for n in sizes]  # rows not orthonormal: the case the peer mis-charges
    noise = {S: float(rng.uniform(0.2, 3.0)) for S in _closure([(0, 1), (1, 2)])}
    stacked = np.vstack([_measurement(S, R) / np.sqrt(v) for S, v in noise.items()])
    brute = float(np.max(np.sum(stacked**2, axis=0)))
    col_max = [float(np.max(np.sum(r**2, axis=0))) for r in R]
    # the same products of O(1) numbers summed in another order: agreement to a few ulps, 1e-12 is loose
    assert plan_privacy_cost(noise, col_max) == pytest.approx(brute, rel=1e-12)
    # the peer's charge, max diag R^T (R R^T)^-1 R (the cost of noise correlated as R R^T), is below it here:
    # scoring with it would report a variance no mechanism with these measurements reaches
    claimed = [float(np.max(np.diag(r.T @ np.linalg.solve(r @ r.T, r)))) for r in R]
    assert plan_privacy_cost(noise, claimed) < brute * (1 - 1e-6)
