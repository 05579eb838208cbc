"""The BLT family: buffered linear Toeplitz C with K buffers.

Dvijotham, McMahan, Pillutla, Steinke and Thakurta 2024, "Efficient and near-optimal noise generation for
streaming differential privacy" (McMahan et al. 2024): C = T(c) with c_0 = 1 and c_t = sum_i omega_i theta_i^(t-1)
(t >= 1), a rational generating function, so C x and C^-1 z stream with K buffers of the model's dimension
(`dpopt.streaming.noise`). Here theta_i in (0, 1) and omega_i > 0 (parameterised as sigmoid and exp), which keeps
c > 0, so the multi-participation sensitivity is exact in closed form (non-negative X). The loss is the Toeplitz
family's (`ToeplitzObjective`: O(n log n) for a Toeplitz workload), differentiated through c(theta, omega) in
O(n K). Start: the theta_i log-spaced in 1 - theta, the omega_i fitted to the square-root coefficients by
non-negative least squares, from each of START_EXPONENTS, the best kept; the loss has local minima where two
buffers merge, and a merged buffer is moved to each gap of the others and solved again (`_split_starts`); beyond
COARSE_STEPS the parameters are first optimised at COARSE_STEPS steps, then at
8 times as many, and so on below n (they do not depend on n), and then refined at n.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy.optimize import nnls
from scipy.special import expit

from dpopt.streaming import series
from dpopt.streaming.base import Factorization, prepare
from dpopt.streaming.fit import KEEP_C_STEPS, deadline_of, factorization, run_lbfgs
from dpopt.streaming.participation import Participation
from dpopt.streaming.toeplitz import COARSE_STEPS, coarse_problem, toeplitz_matrix
from dpopt.streaming.toeplitz_loss import MAX_STAGE_ITERATIONS, ToeplitzObjective
from dpopt.workloads import Workload


def blt_coefficients(theta: np.ndarray, omega: np.ndarray, n: int) -> np.ndarray:
    """c_0 = 1, c_t = sum_i omega_i theta_i^(t-1) for t = 1..n-1 (Dvijotham et al. 2024)."""
    t = np.arange(n - 1)
    c = np.empty(n)
    c[0] = 1.0
    c[1:] = np.exp(np.outer(t, np.log(theta))) @ omega if len(theta) else 0.0
    return c


def _unpack(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    K = len(x) // 2
    return expit(x[:K]), np.exp(x[K:])


def _pack(theta: np.ndarray, omega: np.ndarray) -> np.ndarray:
    return np.concatenate([np.log(theta) - np.log1p(-theta), np.log(omega)])


# Starts of the first level's solve, as ranges (lo, hi) of the exponents e_i of theta_i = 1 - 10^(-e_i); hi None is
# log10 n. The loss has local minima in which two buffers merge (two equal theta_i, in effect K - 1 buffers): on
# prefix sums at n = 4096, k = 16, the first start ends at 360.65 and the second at 360.30; at k = 4 all of them
# end merged at 57.0268, and moving the merged buffer (`_split_starts`) reaches 57.0126, jax-privacy's point.
START_EXPONENTS: tuple[tuple[float, float | None], ...] = ((0.3, None), (0.3, 2.0), (0.1, None))


def initial_blt(K: int, n: int, lo: float = 0.3, hi: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """theta_i = 1 - 10^(-e_i), e_i evenly spaced in [lo, hi] (hi = log10 n by default); omega >= 0 fitting
    sqrt(1 / (1 - z))."""
    top = max(np.log10(n), 0.6) if hi is None else float(hi)
    theta = 1.0 - 10.0 ** -np.linspace(lo, max(top, lo + 0.3), K)
    target = series.prefix_sqrt(n)[1:]
    t = np.unique(np.geomspace(1, n - 1, min(n - 1, 400)).astype(int))
    M = theta[None, :] ** (t[:, None] - 1)
    wts = 1.0 / target[t - 1]  # relative error at every sampled lag
    omega, _ = nnls(M * wts[:, None], np.ones(len(t)))
    return theta, np.maximum(omega, 1e-6)


class BLTObjective:
    """The Toeplitz objective as a function of x = (logit theta, log omega)."""

    def __init__(self, W: Workload, p: Participation, objective: str) -> None:
        self.toe = ToeplitzObjective(W, p, objective)
        self.n = p.n

    def value_grad(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        theta, omega = _unpack(x)
        n = self.n
        t = np.arange(n - 1)
        P = np.exp(np.outer(t, np.log(theta)))  # theta^(t-1) for c_1..c_(n-1)
        c = np.concatenate([[1.0], P @ omega])  # blt_coefficients, with P kept for the gradient
        f, gc = self.toe.value_grad(c)
        g_omega = gc[1:] @ P
        g_theta = omega * ((gc[1:] * t) @ (P / theta))
        return f, np.concatenate([g_theta * theta * (1 - theta), g_omega * omega])


def coarse_sizes(n: int) -> list[int]:
    """COARSE_STEPS, 8 COARSE_STEPS, ... below n / 2: the levels solved before n (grid sequencing)."""
    sizes, m = [], COARSE_STEPS
    while 2 * m < n:
        sizes.append(m)
        m *= 8
    return sizes


def _solve(W: Workload, p: Participation, objective: str, x0: np.ndarray, deadline: float | None,
           callback: Callable[[dict[str, Any]], None] | None, stage: str, max_iter: int
           ) -> tuple[np.ndarray, str, int]:
    obj = BLTObjective(W, p, objective)
    x, status, nit_all = x0, "converged", 0
    for mu in obj.toe.temperatures():
        obj.toe.mu = mu
        x, status, nit = run_lbfgs(obj.value_grad, x, deadline=deadline, callback=callback,
                                   stage=stage if mu is None else f"{stage} mu={mu:g}",
                                   max_iter=max_iter if mu is None else min(max_iter, MAX_STAGE_ITERATIONS),
                                   offset=nit_all)
        nit_all += nit
        if status == "time_limit":
            break
    return x, status, nit_all


def _best_start(W: Workload, p: Participation, objective: str, K: int, size0: int, deadline: float | None,
                callback: Callable[[dict[str, Any]], None] | None, stage: str, max_iter: int
                ) -> tuple[np.ndarray, str, int]:
    """The first level solved from each of START_EXPONENTS, keeping the least loss (a start whose loss is not
    finite is passed over; the first start always counts, and the time limit ends the others)."""
    best: tuple[float, np.ndarray, str] | None = None
    nit_all = 0
    toe = ToeplitzObjective(W, p, objective)

    def loss_of(x: np.ndarray) -> float:  # the objective's certified loss of x's coefficients; inf if not finite
        with np.errstate(all="ignore"):
            loss = float(toe.losses(blt_coefficients(*_unpack(x), p.n))[0 if objective == "mean" else 1])
        return loss if np.isfinite(loss) else np.inf

    for j, (lo, hi) in enumerate(START_EXPONENTS):
        if j and deadline is not None and time.perf_counter() >= deadline:
            break
        x, status, nit = _solve(W, p, objective, _pack(*initial_blt(K, size0, lo, hi)), deadline, callback,
                                stage if j == 0 else f"{stage} start {j + 1}", max_iter)
        nit_all += nit
        loss = loss_of(x)
        if best is None or loss < best[0]:
            best = (loss, x, status)
        if status == "time_limit":
            break
    assert best is not None
    for _ in range(K - 1):  # merged buffers: move one to each gap of the others, solve, keep the best; again
        improved = False
        for x in _split_starts(best[1]):
            if deadline is not None and time.perf_counter() >= deadline:
                break
            x, status, nit = _solve(W, p, objective, x, deadline, callback, f"{stage} split", max_iter)
            nit_all += nit
            loss = loss_of(x)
            if loss < best[0]:
                best, improved = (loss, x, status), True
        if not improved:
            break
    return best[1], best[2], nit_all


# Two buffers count as merged when their exponents e = -log10(1 - theta) differ by less than this.
MERGED_EXPONENT_GAP = 1e-3


def _split_starts(x: np.ndarray) -> list[np.ndarray]:
    """Starts that undo one merge of buffers in the solution x (two theta_i equal to MERGED_EXPONENT_GAP in
    exponent): the second of the pair moved to the middle of each gap between the other buffers' exponents and
    half a decade beyond either end, with a tenth of the pair's weight (the first keeps the rest)."""
    theta, omega = _unpack(x)
    e = -np.log10(1.0 - theta)
    order = np.argsort(e)
    gaps = np.diff(e[order])
    if len(gaps) == 0 or gaps.min() >= MERGED_EXPONENT_GAP:
        return []
    k = int(np.argmin(gaps))
    i, j = int(order[k]), int(order[k + 1])
    rest = np.sort(np.delete(e, j))
    spots = np.concatenate([[rest[0] - 0.5], (rest[:-1] + rest[1:]) / 2, [rest[-1] + 0.5]])
    starts = []
    for spot in spots:
        th, om = theta.copy(), omega.copy()
        th[j] = 1.0 - 10.0 ** -max(float(spot), 0.05)
        total = omega[i] + omega[j]
        om[i], om[j] = 0.9 * total, 0.1 * total
        starts.append(_pack(th, om))
    return starts


def optimise(A: Workload | np.ndarray, participation: Participation, *, objective: str = "mean",
             time_limit: float | None = None, callback: Callable[[dict[str, Any]], None] | None = None,
             buffers: int = 4, max_iter: int = 2000) -> Factorization:
    """The best BLT C with K buffers for A under k epochs, by L-BFGS on (theta, omega)."""
    t0 = time.perf_counter()
    W, p = prepare(A, participation, objective)
    K = int(buffers)
    if K < 1:
        raise ValueError(f"buffers must be >= 1, got {buffers}")
    deadline = deadline_of(time_limit)
    n = p.n
    size0 = min(n, COARSE_STEPS) if n > 1 else 2
    levels = [lvl for lvl in (coarse_problem(W, p, size) for size in coarse_sizes(n)) if lvl is not None]
    nit0 = 0
    x0 = None
    for i, (Wc, pc) in enumerate(levels):  # each level starts the next: the parameters do not depend on n
        share = None if deadline is None else time.perf_counter() + 0.4 * (deadline - time.perf_counter())
        if i == 0:
            x0, _, nit = _best_start(Wc, pc, objective, K, size0, share, callback, f"blt coarse n={pc.n}", max_iter)
        else:
            x0, _, nit = _solve(Wc, pc, objective, x0, share, callback, f"blt coarse n={pc.n}", max_iter)
        nit0 += nit
    if x0 is None:
        x, status, nit = _best_start(W, p, objective, K, size0, deadline, callback, "blt", max_iter)
    else:
        x, status, nit = _solve(W, p, objective, x0, deadline, callback, "blt", max_iter)
    theta, omega = _unpack(x)
    c = blt_coefficients(theta, omega, n)
    losses = ToeplitzObjective(W, p, objective).losses(c)
    params = {"buffers": K, "theta": theta.tolist(), "omega": omega.tolist()}
    C = toeplitz_matrix(c) if n <= KEEP_C_STEPS else None
    return factorization("blt", p, objective, C, params, losses, status, t0,
                         {"iterations": nit, "coarse_iterations": nit0})
