"""The BLT family: buffered linear Toeplitz C with K buffers.

Dvijotham, McMahan, Pillutla, Steinke and Thakurta 2024, "Efficient and near-optimal noise generation for
streaming differential privacy" (McMahan et al. 2024): C = T(c) with c_0 = 1 and c_t = sum_i omega_i theta_i^(t-1)
(t >= 1), a rational generating function, so C x and C^-1 z stream with K buffers of the model's dimension
(`dpopt.streaming.noise`). Here theta_i in (0, 1) and omega_i > 0 (parameterised as sigmoid and exp), which keeps
c > 0, so the multi-participation sensitivity is exact in closed form (non-negative X). The loss is the Toeplitz
family's (`ToeplitzObjective`: O(n log n) for a Toeplitz workload), differentiated through c(theta, omega) in
O(n K). Start: the theta_i log-spaced in 1 - theta, the omega_i fitted to the square-root coefficients by
non-negative least squares; beyond COARSE_STEPS the parameters are first optimised at COARSE_STEPS steps, then at
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


def initial_blt(K: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """theta_i = 1 - 10^(-e_i), e_i evenly spaced in [0.3, log10 n]; omega >= 0 fitting sqrt(1 / (1 - z))."""
    theta = 1.0 - 10.0 ** -np.linspace(0.3, max(np.log10(n), 0.6), K)
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
    theta, omega = initial_blt(K, min(n, COARSE_STEPS) if n > 1 else 2)
    x0 = _pack(theta, omega)
    nit0 = 0
    for size in coarse_sizes(n):  # each level starts the next: the parameters do not depend on n
        coarse = coarse_problem(W, p, size)
        if coarse is None:
            continue
        Wc, pc = coarse
        share = None if deadline is None else time.perf_counter() + 0.4 * (deadline - time.perf_counter())
        x0, _, nit = _solve(Wc, pc, objective, x0, share, callback, f"blt coarse n={pc.n}", max_iter)
        nit0 += nit
    x, status, nit = _solve(W, p, objective, x0, deadline, callback, "blt", max_iter)
    theta, omega = _unpack(x)
    c = blt_coefficients(theta, omega, n)
    losses = ToeplitzObjective(W, p, objective).losses(c)
    params = {"buffers": K, "theta": theta.tolist(), "omega": omega.tolist()}
    C = toeplitz_matrix(c) if n <= KEEP_C_STEPS else None
    return factorization("blt", p, objective, C, params, losses, status, t0,
                         {"iterations": nit, "coarse_iterations": nit0})
