"""The Toeplitz family: C = T(c) lower-triangular Toeplitz, optimised by L-BFGS on its coefficients.

The loss is `ToeplitzObjective` (O(n log n) for a Toeplitz workload; a dense A goes through batched FFTs, n <= 4096);
the gradient is analytic (power-series adjoints). The start is the square-root factorization sqrt(a) (the
optimum for k = 1 is within a few percent of it: Fichtenberger, Henzinger and Upadhyay 2023). Beyond
COARSE_STEPS the problem is first solved at COARSE_STEPS steps and its coefficients, as a ratio to sqrt(a) at
the same relative position j / n, start the full solve (grid sequencing). The reported sensitivity is the
certified one of `toeplitz_sensitivity`; the optimiser uses the first pattern's 11^T value, exact for c >= 0, so
for k > 1 (and columns that overlap within a pattern) the coefficients are kept >= 0 (L-BFGS-B bounds), the
non-negative class of Choquette-Choo et al. 2023.
`coefficients=m` keeps c_0..c_(m-1) free and the rest zero (a banded Toeplitz C).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy.linalg import toeplitz as dense_toeplitz

from dpopt.streaming import series
from dpopt.streaming.base import Factorization, prepare
from dpopt.streaming.fit import KEEP_C_STEPS, deadline_of, factorization, run_lbfgs
from dpopt.streaming.participation import Participation
from dpopt.streaming.toeplitz_loss import MAX_STAGE_ITERATIONS, ToeplitzObjective
from dpopt.workloads import Workload

#: Size of the coarse solve that starts a Toeplitz solve beyond it (grid sequencing).
COARSE_STEPS = 1 << 14


def toeplitz_matrix(c: np.ndarray) -> np.ndarray:
    """T(c): the n x n lower-triangular Toeplitz matrix with first column c."""
    c = np.asarray(c, dtype=float)
    return np.tril(dense_toeplitz(c))


def sqrt_start(W: Workload, n: int) -> np.ndarray:
    """The square-root coefficients sqrt(a) of a Toeplitz workload, else those of prefix sums."""
    a = W.toeplitz_column()
    if a is None or np.all(a == a[0]):
        return series.prefix_sqrt(n) * (1.0 if a is None else np.sqrt(a[0]))
    return series.sqrt(a, n)


def prolong(c_coarse: np.ndarray, base_coarse: np.ndarray, base: np.ndarray) -> np.ndarray:
    """Coefficients for n steps from a coarse solution: its ratio to the start, read at the same j / n."""
    nc, n = len(c_coarse), len(base)
    ratio = c_coarse / base_coarse
    return base * np.interp(np.arange(n) * (nc - 1) / max(n - 1, 1), np.arange(nc), ratio)


def _solve(W: Workload, p: Participation, objective: str, c0: np.ndarray, m: int, deadline: float | None,
           callback: Callable[[dict[str, Any]], None] | None, stage: str, max_iter: int
           ) -> tuple[np.ndarray, str, int]:
    obj = ToeplitzObjective(W, p, objective)
    c, status, nit_all = c0, "converged", 0
    for mu in obj.temperatures():
        obj.mu = mu
        c, status, nit = _solve_once(obj, p, c, m, deadline, callback, stage if mu is None else f"{stage} mu={mu:g}",
                                     max_iter if mu is None else min(max_iter, MAX_STAGE_ITERATIONS), nit_all)
        nit_all += nit
        if status == "time_limit":
            break
    return c, status, nit_all


def _solve_once(obj: ToeplitzObjective, p: Participation, c0: np.ndarray, m: int, deadline: float | None,
                callback: Callable[[dict[str, Any]], None] | None, stage: str, max_iter: int, offset: int
                ) -> tuple[np.ndarray, str, int]:
    n = p.n

    def fun(x: np.ndarray) -> tuple[float, np.ndarray]:
        c = np.zeros(n)
        c[:m] = x
        f, g = obj.value_grad(c)
        return f, g[:m]

    # k > 1 with overlapping columns: c >= 0 keeps X entrywise non-negative, where the optimiser's sensitivity (the
    # first pattern at Gamma = 11^T) is exact; a banded c with m <= b has diagonal blocks and needs no bound.
    bounds = [(0.0, None)] * m if p.epochs > 1 and m > p.separation else None
    x0 = np.maximum(c0[:m], 0.0) if bounds else c0[:m]
    x, status, nit = run_lbfgs(fun, x0, deadline=deadline, callback=callback, stage=stage, max_iter=max_iter,
                               bounds=bounds, offset=offset)
    c = np.zeros(n)
    c[:m] = x
    return c, status, nit


def coarse_problem(W: Workload, p: Participation, size: int = COARSE_STEPS) -> tuple[Workload, Participation] | None:
    """The same workload and epochs at about `size` steps (Toeplitz workloads only; None unless n > 2 size)."""
    a = W.toeplitz_column()
    if a is None or p.n <= 2 * size:
        return None
    nc = max(p.epochs, (size // p.epochs) * p.epochs)
    return _ToeplitzColumn(a[:nc]), Participation(nc, p.epochs)


class _ToeplitzColumn(Workload):
    """A lower-triangular Toeplitz workload known by its first column (the coarse problem's workload)."""

    def __init__(self, a: np.ndarray) -> None:
        self._a = np.asarray(a, dtype=float)
        self.name = f"toeplitz({len(a)})"

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self._a), len(self._a))

    def toeplitz_column(self) -> np.ndarray:
        return self._a

    def matrix(self) -> np.ndarray:
        return toeplitz_matrix(self._a)


def optimise(A: Workload | np.ndarray, participation: Participation, *, objective: str = "mean",
             time_limit: float | None = None, callback: Callable[[dict[str, Any]], None] | None = None,
             coefficients: int | None = None, max_iter: int = 2000) -> Factorization:
    """The best lower-triangular Toeplitz C = T(c) for A under k epochs, by L-BFGS on c (the
    sensitivity from truncated autocorrelations)."""
    t0 = time.perf_counter()
    W, p = prepare(A, participation, objective)
    n = p.n
    m = n if coefficients is None else int(coefficients)
    if not 1 <= m <= n:
        raise ValueError(f"coefficients must lie in 1..n = {n}, got {coefficients}")
    deadline = deadline_of(time_limit)
    base = sqrt_start(W, n)
    c0 = base.copy()
    coarse = coarse_problem(W, p) if m == n else None
    nit0 = 0
    if coarse is not None:
        Wc, pc = coarse
        base_c = sqrt_start(Wc, pc.n)
        share = None if deadline is None else time.perf_counter() + 0.25 * (deadline - time.perf_counter())
        cc, _, nit0 = _solve(Wc, pc, objective, base_c, pc.n, share, callback, f"toeplitz coarse n={pc.n}", max_iter)
        c0 = prolong(cc, base_c, base)
    c, status, nit = _solve(W, p, objective, c0, m, deadline, callback, "toeplitz", max_iter)
    obj = ToeplitzObjective(W, p, objective)
    from dpopt.streaming.toeplitz_loss import pattern_column

    v = pattern_column(c, p)
    c = c / np.sqrt(v @ v)
    losses = obj.losses(c)
    C = toeplitz_matrix(c) if n <= KEEP_C_STEPS else None
    params = {"coefficients": c[:m].tolist(), "free_coefficients": m}
    return factorization("toeplitz", p, objective, C, params, losses, status, t0,
                         {"iterations": nit, "coarse_iterations": nit0})
