"""Certified least worst-step loss over every factorization with several participations per user (joint dual Newton).

The max loss of a factorization A = B C at unit noise is sens(X) max_t ||B_t||^2 = sens(X) max_t Var_t(X),
Var_t(X) = (A X^{-1} A^T)_tt (Choquette-Choo et al., ICML 2023; sens as in `participation_dual`). Its optimum over
every factorization is, by the minimax theorem (as seed 002's sum problem in `minimax`),

    OPT = min_{sens(X) <= 1} max_t Var_t(X) = max_{u in the simplex} F(u),   F(u) = min_{sens(X) <= 1} tr(G_u X^{-1}),

with G_u = A^T diag(u) A: F(u) is the mean problem of `participation_dual` on G_u. For k = 1 this is
`minimax.solve_minimax` on A with unit targets, which `solve_participation_max` calls unchanged.

Joint dual. With R = diag(u)^{1/2} A and the block multipliers Lambda of `participation_dual`,
g(u, Lambda) = 2 phi(u, Lambda) - tr(Lambda) / k, phi = tr((R Lambda R^T)^{1/2}) = ||diag(u)^{1/2} A Lambda^{1/2}||_*,
and OPT = max over u in the simplex and Lambda of g. phi is jointly concave: it is the least of
(tr(P^T diag(u) P) + tr(Q Lambda Q^T)) / 2 over the factorizations A = P Q, linear in (u, Lambda). Every (u, Lambda)
certifies OPT >= phi^2 / sum_pi max_i (Lambda_pi)_ii (F(u) is at least the mean problem's dual bound at Lambda).

Derivatives. T = R Lambda R^T = U diag(s^2) U^T, Z = U^T R, tau = diag(T^{1/2}); X(u, Lambda) = R^T T^{-1/2} R has
Var_t = tau_t / u_t, and grad_u (2 phi) = Var, grad_Lambda (2 phi) = X's pattern blocks. In a direction (du, E), with
a = du / u, Ah = U^T diag(a) U, Q = Z E Z^T and c_ab = 1 / (s_a + s_b), the second derivative of 2 phi is (from
T' = (diag(a) T + T diag(a)) / 2 + R E R^T and T'' = -(diag(a^2) T + T diag(a^2)) / 4 + diag(a) T diag(a) / 2 +
diag(a) R E R^T + R E R^T diag(a), phi'' = tr(T^{-1/2} T'') / 2 - sum_ab (U^T T' U)_ab^2 kappa_ab / 2)

    -sum_t a_t^2 tau_t / 2 + sum_ab c_ab (Ah_ab^2 (s_a - s_b)^2 / 4 + 2 Ah_ab Q_ab - Q_ab^2 / (s_a s_b)),

so a Hessian product is four n x n products: Ah, Q, then diag(U M U^T) with M = c o (Ah o (s_a - s_b)^2 / 4 + Q)
and the blocks of Z^T N Z with N = c o (Ah - Q / (s_a s_b)). Newton-CG runs on the tangent space of the simplex with
log barriers nu (sum_t log u_t + sum_pi log det Lambda_pi), as `participation_dual` does for Lambda alone (the same
`participation_dual.ascend`): at a maximiser, Var_t = lambda - nu / u_t <= lambda and X(u, Lambda) has sensitivity
<= 1, so the gap is 2 nu n. The weights' barrier curvature is taken in primal-dual scaling, max(nu / u_t^2, z_t / u_t)
with the slack z_t = max_s Var_s - Var_t, so that a weight headed for zero (a step whose variance stays below the
largest at the optimum) is damped rather than cut at the boundary. The preconditioner is `participation_dual`'s for
Lambda and the exact diagonal in u, sum_ab (U_ta^2 s_a)(U_tb^2 s_b) c_ab / u_t^2 (its Cauchy kernel by the same sinc
expansion) plus that curvature, the coupling between u and Lambda left out.

Primal point (upper bound): X(u, Lambda) scaled by its certified pattern sensitivities (uniformly, or per pattern
as in `participation_dual`), its largest variance from a Cholesky factorisation. The returned X is certified
itself, so a reported loss is reached by a strategy with a proven sensitivity.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.linalg as sla

from dpopt.solvers.convex_dp_core import check_newton_options, unscaled_callback
from dpopt.solvers.diag_dual_newton import pcg
from dpopt.solvers.minimax import solve_minimax
from dpopt.solvers.participation_dual import (
    _PD_RTOL,
    ParticipationDual,
    _positive_inverse,
    _start,
    ascend,
    block_diagonal,
    block_right,
    cauchy_expansion,
    check_patterns,
    finish,
    gram_lower,
    kernel_blocks,
)
from dpopt.solvers.result import SolverResult
from dpopt.validation import check_finite_matrix, check_time_limit


@dataclass
class JointPoint:
    """A joint iterate: weights u (n,) on the simplex, multipliers L (b, k, k), phi, s, U, Z = U^T R (pattern
    order), X(u, Lambda)'s blocks Xb and tau = diag(T^{1/2})."""

    u: np.ndarray
    L: np.ndarray
    phi: float
    s: np.ndarray
    U: np.ndarray
    Z: np.ndarray
    Xb: np.ndarray
    tau: np.ndarray

    @property
    def mass(self) -> float:
        return float(np.einsum("bii->", self.L)) / self.L.shape[1]

    @property
    def var(self) -> np.ndarray:
        """Var_t(X(u, Lambda)) = tau_t / u_t."""
        return self.tau / self.u

    def psi(self, nu: float) -> float:
        value = 2.0 * self.phi - self.mass
        if nu > 0:
            value += nu * (float(np.linalg.slogdet(self.L)[1].sum()) + float(np.log(self.u).sum()))
        return value

    def rescaled(self, r: float) -> JointPoint:
        """The point at (u, r^2 Lambda)."""
        return JointPoint(self.u, self.L * (r * r), self.phi * r, self.s * r, self.U, self.Z, self.Xb / r, self.tau * r)


class JointDual(ParticipationDual):
    """Seed 002's dual over step weights u and pattern blocks Lambda (the max problem, Choquette-Choo et al. 2023) on
    A (n x n, columns reordered pattern by pattern; module docstring)."""

    def __init__(self, A: np.ndarray, patterns: np.ndarray) -> None:
        super().__init__(A, patterns)

    def factor(self, u: np.ndarray) -> np.ndarray:
        """R = diag(u)^{1/2} A (pattern order)."""
        return np.sqrt(u)[:, None] * self.V

    def evaluate_joint(self, u: np.ndarray, L: np.ndarray) -> JointPoint | None:
        """The joint point at (u, Lambda); None unless u > 0, Lambda > 0 and T > 0 (`participation_dual._PD_RTOL`)."""
        r, b, k = self.r, self.b, self.k
        if not (u > 0).all():
            return None
        try:
            F = np.linalg.cholesky(L)
        except np.linalg.LinAlgError:
            return None
        R = self.factor(u)
        W = block_right(R.reshape(r, b, k), F)  # R F, F F^T = Lambda
        ev, U = sla.eigh(gram_lower(W), driver="evd", overwrite_a=True, check_finite=False)
        self.n_eigh += 1
        if np.isfinite(ev).all() and ev[0] > _PD_RTOL * ev[-1]:
            s = np.sqrt(ev)
        else:  # small weights make T ill-conditioned: singular values of R F instead (`participation_dual.evaluate`)
            U, s, _ = sla.svd(W, full_matrices=False, check_finite=False, lapack_driver="gesdd")
            self.n_svd += 1
            if not np.isfinite(s).all() or s[-1] <= _PD_RTOL * s[0]:
                return None
        Z = U.T @ R
        Z3 = Z.reshape(r, b, k)
        Xb = block_diagonal(Z3 / s[:, None, None], Z3)
        tau = np.einsum("ta,a,ta->t", U, s, U)
        return JointPoint(u, L, float(s.sum()), s, U, Z, (Xb + Xb.transpose(0, 2, 1)) / 2.0, tau)

    # `participation_dual.ascend`'s interface for the joint problem (u and Lambda move together)

    def start(self) -> JointPoint | None:
        """Uniform weights u = 1 / n and `participation_dual._start`'s multipliers for G_u = G / n."""
        return self.evaluate_joint(np.full(self.n, 1.0 / self.n), _start(self) / self.n)

    def ascent_gradient(self, p: JointPoint, nu: float) -> np.ndarray:
        return self.joint_gradient(p, nu)

    def direction(self, p: JointPoint, nu: float, grad: np.ndarray, eta: float, max_cg: int,
                  deadline: float | None) -> tuple[np.ndarray, int]:
        return self.joint_direction(p, nu, grad, eta, max_cg, deadline)

    def to_boundary(self, p: JointPoint, step: np.ndarray) -> float:
        du, dL = step[: self.n], self.blocks(step[self.n:].reshape(self.b, -1))
        shrink = du < 0
        to_u = float((-p.u[shrink] / du[shrink]).min()) if shrink.any() else math.inf
        return min(to_u, self.step_to_boundary(p.L, dL))

    def move(self, p: JointPoint, step: np.ndarray, alpha: float) -> JointPoint | None:
        u = p.u + alpha * step[: self.n]
        return self.evaluate_joint(u / u.sum(), p.L + alpha * self.blocks(step[self.n:].reshape(self.b, -1)))

    def uniform_value(self, p: JointPoint, c_max: float) -> float:
        """The largest variance of X(u, Lambda) / c_max: c_max max_t tau_t / u_t."""
        return c_max * float(p.var.max())

    def rescaled_value(self, p: JointPoint, c: np.ndarray) -> float:
        return max_variance(self, self.strategy_factor(p, c))

    def value(self, X: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
        """The largest variance of the strategy returned and every step's variance (Cholesky)."""
        variances = step_variances(self, X)
        return float(variances.max()), {"variances": variances}

    def bound_factor(self, p: JointPoint) -> np.ndarray:
        return self.factor(p.u)

    def joint_gradient(self, p: JointPoint, nu: float) -> np.ndarray:
        """grad psi_nu as one vector: (Var + nu / u projected on sum(du) = 0, the Lambda coordinates)."""
        gu = p.var + (nu / p.u if nu > 0 else 0.0)
        gL = self.gradient(p, nu)  # the blocks' part (ParticipationDual.gradient uses Xb and L only)
        return np.concatenate([gu - gu.mean(), gL.ravel()])

    def joint_direction(self, p: JointPoint, nu: float, grad: np.ndarray, eta: float, max_cg: int,
                        deadline: float | None) -> tuple[np.ndarray, int]:
        """Newton-CG direction (du, E) for psi_nu on the tangent space (module docstring): one vector (du, then E's
        coordinates) and the CG steps."""
        n, b, k = self.n, self.b, self.k
        m = self.basis.shape[0]
        s, U, Z, u = p.s, p.U, p.Z, p.u
        Z3 = Z.reshape(n, b, k)
        c = 1.0 / (s[:, None] + s[None, :])
        D4 = (s[:, None] - s[None, :]) ** 2 / 4.0
        ss = np.outer(s, s)
        Li = np.linalg.inv(p.L) if nu > 0 else None
        top = float(s.max())
        sh = s / top
        # preconditioner: Lambda blocks (participation_dual) and the exact u diagonal, both by the sinc expansion
        H = self._pattern_hessians(Z3, sh) / top**3
        if Li is not None:
            H += nu * kernel_blocks(lambda i, l, j, mm: Li[:, i, l] * Li[:, j, mm], k)
        H_inv = _positive_inverse(H)
        E, w = cauchy_expansion(sh)  # c = sum_q w_q e_q e_q^T / top
        Pq = (U * U * s[None, :]) @ E.T  # (n, q)
        # the u barrier's curvature in primal-dual scaling: z_t / u_t with the slack z_t = max_s Var_s - Var_t of the
        # weight's constraint where that exceeds nu / u_t^2 (a weight headed for zero is damped, not overshot). Measured
        # on prefix sums, k = 16, tol 1e-6, one thread: n = 512 in 168 CG steps and 7.9 CPU s against 222 and 9.2 s with
        # nu / u^2 alone; n = 1024 in 127 against 145 CG steps (26 and 22 Newton steps, 42 CPU s either way).
        barrier_u = np.maximum(nu / (u * u), (float(p.var.max()) - p.var) / u)
        hu = (Pq * Pq) @ w / top / (u * u) + barrier_u
        hu = np.maximum(hu, np.finfo(float).eps * float(hu.max()))

        def split(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            return x[:n], x[n:].reshape(b, m)

        def hess(x: np.ndarray) -> np.ndarray:
            du, vL = split(x)
            dL = self.blocks(vL)
            a = du / u
            Ah = U.T @ (a[:, None] * U)
            Q = block_right(Z3, dL) @ Z.T
            M = c * (Ah * D4 + Q)
            N = c * (Ah - Q / ss)
            ou = (0.5 * a * p.tau - np.einsum("ta,ta->t", U @ M, U)) / u
            oL = -block_diagonal(Z3, (N @ Z).reshape(n, b, k))
            ou += barrier_u * du
            if Li is not None:
                oL += nu * np.matmul(np.matmul(Li, dL), Li)
            return np.concatenate([ou - ou.mean(), self.coords(oL).ravel()])

        def inverse(x: np.ndarray) -> np.ndarray:
            zu, vL = split(x)
            zu = zu / hu
            zu -= (1.0 / hu) * float(zu.sum()) / float((1.0 / hu).sum())  # sum zero in the metric diag(hu)
            return np.concatenate([zu, np.einsum("bij,bj->bi", H_inv, vL).ravel()])

        h_diag = np.concatenate([hu, np.einsum("bii->bi", H).ravel()])
        return pcg(hess, h_diag, grad, eta, max_cg, deadline=deadline, inverse=inverse)


def solve_participation_max(
    A: np.ndarray,
    patterns: np.ndarray,
    *,
    tol: float = 1e-8,
    max_iter: int = 100,
    forcing: float = 0.5,
    max_cg: int = 200,
    callback: Callable[[dict[str, Any]], bool | None] | None = None,
    time_limit: float | None = None,
) -> SolverResult:
    """Least max_t (A X^{-1} A^T)_tt with every pattern's sensitivity <= 1, certified (seed 002's dual, jointly in u).

    A (n, n) of full rank; patterns (b, k) a partition of the n steps (k = 1: `solve_minimax(A)` with unit targets,
    unchanged). tol, max_iter, forcing, max_cg, callback, time_limit as in `participation_dual.solve_participation`.
    Returns a SolverResult with x = X (n, n) in the steps' own order with certified sensitivity <= 1, fun = its
    largest variance (by a Cholesky factorisation), dual_bound = certified lower bound over every factorization;
    extra: "u" (the weights of the bound), "Lambda", "variances", "sensitivity", "sensitivity_y", "construction",
    "history", "decompositions", "cg_steps".
    """
    A = check_finite_matrix(A, "workload A")
    n = A.shape[1]
    if A.shape[0] != n:
        raise ValueError(f"the max-loss solver takes a square workload A (n x n); got shape {A.shape}")
    P = check_patterns(patterns, n)
    if P.shape[1] == 1:
        res = solve_minimax(A, 1.0, tol=tol, time_limit=time_limit, callback=callback)
        res.extra["sensitivity"] = float(np.diag(res.x).max())
        return res
    check_newton_options(tol, forcing, max_iter, max_cg, 0.0)
    time_limit = check_time_limit(time_limit)
    t_wall, t_cpu = time.perf_counter(), time.process_time()
    scale = float(np.abs(A.T @ A).max())
    if not scale > 0:
        raise ValueError("workload A must not be zero")
    dual = JointDual(A / math.sqrt(scale), P)
    callback = unscaled_callback(callback, scale)
    out = ascend(dual, tol=tol, max_iter=max_iter, forcing=forcing, max_cg=max_cg, callback=callback,
                 time_limit=time_limit, t_start=t_wall)
    return finish(dual, out, tol, scale, t_wall, t_cpu, "participation joint dual")


def step_variances(dual: JointDual, X: np.ndarray) -> np.ndarray:
    """(A X^{-1} A^T)_tt for every step t (X in pattern order) by a Cholesky factorisation; inf if X is singular."""
    try:
        L = sla.cholesky((X + X.T) / 2.0, lower=True, check_finite=False)
    except np.linalg.LinAlgError:
        return np.full(dual.n, math.inf)
    W = sla.solve_triangular(L, dual.V.T, lower=True, check_finite=False)
    return np.einsum("ij,ij->j", W, W)


def max_variance(dual: JointDual, Y: np.ndarray) -> float:
    """max_t (A X^{-1} A^T)_tt for X = Y^T Y (pattern order); inf if X is singular."""
    return float(step_variances(dual, Y.T @ Y).max())
