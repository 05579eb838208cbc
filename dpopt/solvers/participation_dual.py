"""Certified least error over every factorization when each user contributes to several steps (dual Newton-CG).

The problem (Denisov et al., NeurIPS 2022, for one participation; Choquette-Choo et al., "Multi-epoch matrix
factorization mechanisms for private machine learning", ICML 2023, and "(Amplified) banded matrix factorization",
NeurIPS 2023, for several). A workload A (n x n lower triangular in streaming, any matrix here) with Gram G = A^T A,
a strategy C with Gram X = C^T C, and participation patterns: b disjoint sets pi of k steps covering all n (k
epochs of b = n / k steps: pi_r = {r, r + b, ..., r + (k - 1) b}). A user's contributions (one vector of norm
<= 1 per step of one pattern) move C x by at most sqrt(sens(X)), where, with X_pi the k x k block of X on pi,

    sens(X) = max_pi max{<X_pi, Gamma> : Gamma PSD, diag(Gamma) <= 1} = max_pi min{1^T y : Diag(y) - X_pi PSD}

(the two forms are an SDP pair; `pattern_sensitivity` solves the second per block). The least total squared error
at unit noise over every factorization A = B C is therefore the SDP

    OPT = min tr(G X^{-1})  subject to  X_pi <= Diag(y_pi),  1^T y_pi <= 1  for every pattern pi,

whose mean loss is OPT / n. For k = 1 it is seed 002's problem (diag(X) <= 1), solved by
`convex_dp.solve_convex_dp`, which `solve_participation` calls unchanged.

Dual (the certificate). Lagrange multipliers Lambda_pi (k x k PSD) for X_pi <= Diag(y_pi) and mu_pi >= 0 for
1^T y_pi <= 1; minimising over the free y_pi forces diag(Lambda_pi) = mu_pi 1. Let Lambda be the n x n matrix with
these blocks on the patterns (zero elsewhere): after ordering the steps pattern by pattern it is block diagonal.
Minimising tr(G X^{-1}) + <Lambda, X> over X as in `convex_dp_core` (V^T V = G) gives X(Lambda) =
V^T (V Lambda V^T)^{-1/2} V and the concave dual function

    g(Lambda) = 2 tr((V Lambda V^T)^{1/2}) - sum_pi mu_pi = 2 phi(Lambda) - tr(Lambda) / k,

homogeneous of degree 1/2 in phi, so that the best bound on the ray t Lambda is phi^2 / sum(mu). More generally any
PSD Lambda_pi certifies: <Lambda_pi, X_pi> <= max_i (Lambda_pi)_ii sens(X) (Lambda_pi / max diag is a feasible
Gamma), so OPT >= phi(Lambda)^2 / sum_pi max_i (Lambda_pi)_ii, which is the bound this solver reports (with
Lambda = F F^T for a computed factor F, so that it is PSD by construction). k = 1 gives Lambda = diag(d).

Ascent. With T = V Lambda V^T = U diag(s^2) U^T and Z = U^T V (columns z_i, ordered pattern by pattern):
grad g = X(Lambda)_pi - I / k restricted to the blocks, X(Lambda) = Z^T diag(1/s) Z, and in a direction E of
multipliers (blocks E_pi), with F = Z E Z^T and kappa_ab = 1 / (s_a s_b (s_a + s_b)),

    -Hess g [E, E] = sum_ab F_ab^2 kappa_ab,

the formula of `convex_dp_dual` with E no longer diagonal: a Hessian product is one (r x n)(n x r) product pair
(float32, as there) plus O(n k r) for the block-sparse parts. The multipliers live on the subspace of block
matrices with symmetric, constant-diagonal blocks (coordinates: an orthonormal basis of it per block,
`constant_diagonal_basis`). The PSD constraint on Lambda_pi is kept by a log-det barrier: Newton-CG on
psi_nu(Lambda) = g(Lambda) + nu sum_pi log det Lambda_pi with a fraction-to-the-boundary step. At a maximiser of
psi_nu, X(Lambda)_pi = Diag(y_pi) - nu Lambda_pi^{-1} with 1^T y_pi = 1, so X(Lambda) is strictly feasible and its
value phi exceeds g by exactly nu n: the barrier keeps the iterates interior, and nu falls with the measured gap
(by up to 100x per Newton step after full steps, as in long-step path following). For prefix sums the optimal
blocks Lambda_pi are positive definite (the optimal X_pi are diagonal), so the barrier fades and Newton converges
quadratically.

Preconditioner. The exact Hessian block of each pattern in these coordinates (its m = k (k - 1) / 2 + 1 coordinates
coupled through entries (z_i o z_l)^T kappa (z_j o z_m)), plus the barrier's nu Lambda_pi^{-1} (x) Lambda_pi^{-1}:
(k + 1) / 2 float32 products of kappa with the pairwise column products per Newton step. Measured on prefix sums
(n = 128, k = 16, near the optimum): condition number of the Hessian 3.1e3, with the Jacobi diagonal 1.8e3, with
these blocks 14 (k = 4: 92, 53, 5.5); at n = 512, k = 16 a solve to gap 1e-9 took 44 CG steps with the blocks
against 394 with the exact Jacobi diagonal.

Primal point (upper bound). X(Lambda) has a certified sensitivity (`pattern_sensitivity`: 1^T y_pi for a y_pi with
Diag(y_pi) - X_pi proven PSD): "uniform scaling" X(Lambda) / max_pi c_pi has value max_pi c_pi phi exactly;
"pattern rescaling" scales each pattern's steps by c_pi^{-1/2} (D X(Lambda) D, every pattern at sensitivity 1; the
analogue of seed 002's diagonal rescaling, second-order accurate where the optimum has interior blocks), its value
by a Cholesky solve. The returned X is scaled so that its own certified sensitivity is <= 1, and its value is
recomputed from it, so a reported loss is reached by a strategy with a proven sensitivity.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.linalg as sla

from dpopt.solvers.convex_dp import solve_convex_dp
from dpopt.solvers.convex_dp_core import (
    RANK_TOL,
    certified_status,
    check_newton_options,
    objective_from_factor,
    orthogonal_rows_nuclear_lower_bound,
    range_factor,
    unit_scale,
    unscaled_callback,
)
from dpopt.solvers.diag_dual_newton import pcg
from dpopt.solvers.result import MAX_ITER, STALLED, SolverResult, lap_timer, relative_gap, stop_rule
from dpopt.validation import check_gram, check_time_limit

#: T = V Lambda V^T counts as positive definite above this times its largest eigenvalue (as `convex_dp_dual`).
_PD_RTOL = 1e3 * np.finfo(float).eps
#: Armijo fraction, halvings of a step, and the relative round-off level of psi below which it cannot rank points.
_ARMIJO = 1e-4
_MAX_BACKTRACK = 30
_G_NOISE = 1e-12
#: A step goes at most this fraction of the way to the boundary of the PSD cone (per block).
_TO_BOUNDARY = 0.99
#: nu is this fraction of the measured absolute gap over n (on the central path the gap is nu n), _NU_FULL_STEP after
#: a full Newton step, and never rises. Measured: prefix sums n = 512, k = 16 to a gap of 1e-8 in 10 Newton steps
#: (19 with the fraction 0.1 throughout); a rule that let nu fall 100x per full step whatever the gap stalled at a
#: 1.2% gap on an ill-conditioned random triangular A (n = 24, k = 3), which this one solves to 4.5e-10.
_NU_GAP_FRACTION = 0.1
_NU_FULL_STEP = 1e-2
#: Pattern rescaling (a Cholesky factorisation and solve) is tried once the uniform gap is below this.
_RESCALE_BELOW = 1e-2
#: The numerical floor: once the gap is below _FLOOR_GAP, a Newton step that shrinks the gap by less than the
#: fraction _FLOOR_DECREASE, taken with the barrier's share nu n / (primal - dual) of the gap at most _FLOOR_BARRIER
#: (nu is set to 0.01 or 0.1 of the gap over n, so a step that reached the centre for its nu would have shrunk the
#: gap to about that share), ends the ascent as stalled. Measured on prefix sums at tol 1e-15: n = 64, 256, 512,
#: 1024 (k = 4, 4, 16, 16) reached gaps of 9.6e-12 to 1.3e-11 and then took 1 to 4 more steps without moving them
#: (each to 0.94-1.0 of the last) before a line search failed; n = 4096, k = 16 reached 1.27e-8 in 259 CPU s, took a
#: damped step to 1.23e-8, and then spent over 450 s halving its next step 12 times and more (one BLAS thread).
#: Before the floor every step shrank the gap to at most 0.78 of itself, and below 1e-6 to at most 0.04.
_FLOOR_GAP = 1e-6
_FLOOR_BARRIER = 0.2
_FLOOR_DECREASE = 0.1
#: float32 bytes of the pairwise column products formed at once for the preconditioner.
_PAIR_BYTES = 1 << 28
#: Blocks up to this size are multiplied entry by entry (k vector operations); larger ones by batched products.
_SMALL_BLOCK = 8
#: float32 Hessian products only while max(kappa) ||Z||_F^4 stays below this (`convex_dp_dual._FLOAT32_SAFE`).
_FLOAT32_SAFE = 1e36
#: The sinc expansion of kappa in the preconditioner (`cauchy_expansion`): truncation and step. Measured (prefix sums,
#: n = 1024, k = 16, one BLAS thread): 30 CG steps either way, 6.3 CPU s against 8.6 s with kappa itself ((k + 1) / 2
#: float32 products of kappa with the pairwise column products per Newton step).
_SINC_DELTA = 1e-4
_SINC_STEP = 1.0
#: Relative accuracy of the pattern sensitivities computed for the primal points (`pattern_sensitivity`).
SENSITIVITY_RTOL = 1e-10


def cauchy_expansion(sh: np.ndarray, *, delta: float = _SINC_DELTA, h: float = _SINC_STEP) -> tuple[np.ndarray, np.ndarray]:
    """(E (q, r), w (q,)) with sum_q w_q E_qa E_qb ~ 1 / (sh_a + sh_b) for sh in (0, 1], all w_q > 0 (sinc quadrature,
    Trefethen and Weideman, SIAM Review 56(3), 2014, Sec. 14).

    1 / (x + y) = int_R exp(-(x + y) e^tau) e^tau dtau, by the trapezoidal (sinc) rule in tau with step h from
    tau = log(delta / 2) to log(log(1 / delta) / (2 min sh)) + 1; E_qa = exp(-e^tau_q sh_a), w_q = h e^tau_q.
    Measured over sh in [1e-6, 1]: relative error 7e-4 at h = 1 (23 nodes at min sh = 1e-4), 7e-5 at h = 0.75.
    A sum of positive rank-one terms: the expansion is PSD, as the Cauchy matrix is.
    """
    tau = np.arange(math.log(delta / 2.0), math.log(math.log(1.0 / delta) / (2.0 * float(sh.min()))) + 1.0 + h, h)
    t = np.exp(tau)
    return np.exp(-np.outer(t, sh)), h * t


def check_patterns(patterns: np.ndarray, n: int) -> np.ndarray:
    """patterns as a (b, k) int array whose entries are 0..n-1, each once (a partition of the n steps)."""
    P = np.asarray(patterns)
    if P.ndim != 2 or P.size == 0 or not np.issubdtype(P.dtype, np.integer):
        raise ValueError(f"patterns must be a (b, k) integer array; got shape {P.shape} of {P.dtype}")
    if P.size != n or not np.array_equal(np.sort(P.ravel()), np.arange(n)):
        raise ValueError(f"patterns must contain every step 0..{n - 1} exactly once (a partition of the steps)")
    return P.astype(np.int64)


def constant_diagonal_basis(k: int) -> np.ndarray:
    """Orthonormal basis (m, k, k), m = k (k - 1) / 2 + 1, of the symmetric k x k matrices with constant diagonal:
    I / sqrt(k), then (e_i e_j^T + e_j e_i^T) / sqrt(2) for i < j (Frobenius inner product)."""
    i, j = np.triu_indices(k, 1)
    m = 1 + i.size
    B = np.zeros((m, k, k))
    B[0] = np.eye(k) / math.sqrt(k)
    B[np.arange(1, m), i, j] = B[np.arange(1, m), j, i] = 1.0 / math.sqrt(2.0)
    return B


def kernel_blocks(F: Callable[..., np.ndarray], k: int) -> np.ndarray:
    """The (b, m, m) matrices of a bilinear form H[E, E'] = sum E_ij E'_lm F(i, l, j, m) in `constant_diagonal_basis(k)`.

    F(i, l, j, m) gives (b,)-arrays broadcast over index arrays and must satisfy F(i, l, j, m) = F(j, m, i, l) =
    F(l, i, m, j) (true of the Hessian, F = (z_i o z_l)^T kappa (z_j o z_m), and of the barrier's
    Lambda^{-1} (x) Lambda^{-1}, F = Li_il Li_jm). Entries: [0, 0] = sum_il F(i, l, i, l) / k,
    [0, (p q)] = sqrt(2 / k) sum_i F(i, p, i, q), [(p q), (r s)] = F(p, r, q, s) + F(p, s, q, r).
    """
    p, q = np.triu_indices(k, 1)
    d = np.arange(k)
    off = F(p[:, None], p[None, :], q[:, None], q[None, :]) + F(p[:, None], q[None, :], q[:, None], p[None, :])
    mixed = math.sqrt(2.0 / k) * F(d[:, None], p[None, :], d[:, None], q[None, :]).sum(axis=1)
    corner = F(d[:, None], d[None, :], d[:, None], d[None, :]).sum(axis=(1, 2)) / k
    m = 1 + p.size
    H = np.empty((corner.shape[0], m, m))
    H[:, 0, 0] = corner
    H[:, 0, 1:] = mixed
    H[:, 1:, 0] = mixed
    H[:, 1:, 1:] = off
    return H


@dataclass
class PatternSensitivity:
    """Per block: upper (b,) = 1^T y + margin with Diag(y) - X_pi proven PSD (certified), y (b, k), and lower (b,) =
    <X_pi, Gamma> at the feasible Gamma (PSD, unit diagonal) of the last barrier point (exact up to round-off)."""

    upper: np.ndarray
    lower: np.ndarray
    y: np.ndarray

    @property
    def value(self) -> float:
        """The certified sensitivity max_pi upper_pi."""
        return float(self.upper.max())


def pattern_sensitivity(blocks: np.ndarray, *, rtol: float = SENSITIVITY_RTOL, max_iter: int = 500) -> PatternSensitivity:
    """min 1^T y s.t. Diag(y) - X_pi PSD per k x k block: the participation sensitivity (Choquette-Choo et al. 2023).

    Path-following damped Newton on the self-concordant barrier 1^T y / t - log det(Diag(y) - X_pi), batched over
    the blocks: the damped step dy / (1 + lambda) (lambda the Newton decrement) never leaves the domain and a full
    step is taken once lambda < 1/4; t falls by 10x at each approximate centre until t k <= rtol 1^T y (on the
    central path the gap to the maximum over Gamma is t k). Certificate: the Cholesky factorisation of
    M = fl(Diag(y) - X_pi) succeeding proves M + E PSD with ||E||_2 <= gamma_{k+1} tr(M) (Demmel), and forming M
    adds at most eps tr(M) (|M_ij| <= sqrt(M_ii M_jj)), so upper = 1^T y + k (gamma_{k+1} + eps) tr(M).
    """
    X = np.asarray(blocks, dtype=float)
    X = (X + X.transpose(0, 2, 1)) / 2.0
    b, k, _ = X.shape
    d = np.arange(k)
    eps = np.finfo(float).eps
    diag_x = X[:, d, d].copy()
    scale = np.maximum(np.abs(X).max(axis=(1, 2)), np.finfo(float).tiny)
    off = X.copy()
    off[:, d, d] = 0.0
    shift = 1.5 * np.maximum(np.linalg.eigvalsh(off)[:, -1], 0.0) + 1e-6 * scale
    y = diag_x + shift[:, None]
    t = shift.copy()  # Diag(y) - X = shift I - off: near the centre of t = shift when off is small against shift
    frozen = np.zeros(b, dtype=bool)  # blocks done, or whose Newton step round-off left the cone
    for _ in range(max_iter):
        M = -X
        M[:, d, d] += y
        Mi = np.linalg.inv(M)
        Mi = (Mi + Mi.transpose(0, 2, 1)) / 2.0
        grad = 1.0 / t[:, None] - Mi[:, d, d]
        dy = -np.linalg.solve(Mi * Mi, grad[:, :, None])[:, :, 0]
        lam = np.sqrt(np.maximum(-np.einsum("bi,bi->b", grad, dy), 0.0))
        y_new = y + np.where((lam < 0.25)[:, None], dy, dy / (1.0 + lam[:, None]))
        M[:, d, d] += y_new - y
        ok = np.isfinite(y_new).all(axis=1)
        try:
            np.linalg.cholesky(M)
        except np.linalg.LinAlgError:
            ok &= np.linalg.eigvalsh(M)[:, 0] > 0.0
        frozen |= ~ok
        y = np.where((ok & ~frozen)[:, None], y_new, y)
        centred = lam < 0.25
        frozen |= centred & (t * k <= rtol * y.sum(axis=1))
        if frozen.all():
            break
        t = np.where(centred, t / 10.0, t)
    M = -X
    M[:, d, d] += y
    trace_m = np.maximum(np.einsum("bii->b", M), 0.0)
    gamma = (k + 1) * eps / (1.0 - (k + 1) * eps)
    upper = y.sum(axis=1) + k * (gamma + eps) * trace_m
    for i in range(b):
        while not _cholesky_ok(M[i]):  # only if the last iterate left the cone by round-off: move inside
            y[i] += max(4.0 * eps * scale[i], 1e-3 * (trace_m[i] + eps * scale[i]))
            M[i] = -X[i]
            M[i][d, d] += y[i]
            trace_m[i] = max(float(np.trace(M[i])), 0.0)
            upper[i] = y[i].sum() + k * (gamma + eps) * trace_m[i]
    Mi = np.linalg.inv(M)
    dg = np.sqrt(np.maximum(Mi[:, d, d], np.finfo(float).tiny))
    Gamma = Mi / dg[:, :, None] / dg[:, None, :]
    lower = np.einsum("bij,bij->b", Gamma, X)
    return PatternSensitivity(upper=upper, lower=np.minimum(lower, upper), y=y)


def _cholesky_ok(M: np.ndarray) -> bool:
    """True when LAPACK's Cholesky factorisation of the symmetric M succeeds."""
    _, info = sla.lapack.dpotrf(M, lower=1, overwrite_a=0, clean=0)
    return info == 0


def _positive_inverse(H: np.ndarray) -> np.ndarray:
    """Inverses of the symmetric PSD matrices H (b, m, m) by Cholesky, or, when one is singular by round-off, by
    eigen-decomposition with eigenvalues floored at eps times the largest (a positive definite preconditioner)."""
    try:
        Li = np.linalg.inv(np.linalg.cholesky(H))
        return np.matmul(Li.transpose(0, 2, 1), Li)
    except np.linalg.LinAlgError:
        w, Q = np.linalg.eigh(H)
        w = np.maximum(w, np.finfo(float).eps * np.maximum(w[:, -1:], np.finfo(float).tiny))
        return np.matmul(Q / w[:, None, :], Q.transpose(0, 2, 1))


@dataclass
class BlockPoint:
    """A dual iterate: multipliers L (b, k, k), phi = tr((V Lambda V^T)^{1/2}), s (r,) = sqrt of T's eigenvalues,
    Z (r, n) = U^T V (columns in pattern order) and the blocks Xb (b, k, k) of X(Lambda) = Z^T diag(1/s) Z."""

    L: np.ndarray
    phi: float
    s: np.ndarray
    Z: np.ndarray
    Xb: np.ndarray

    @property
    def mass(self) -> float:
        """sum_pi mu_pi = tr(Lambda) / k."""
        return float(np.einsum("bii->", self.L)) / self.L.shape[1]

    def psi(self, nu: float) -> float:
        """g(Lambda) + nu sum_pi log det Lambda_pi (the barrier objective)."""
        value = 2.0 * self.phi - self.mass
        return value + nu * float(np.linalg.slogdet(self.L)[1].sum()) if nu > 0 else value

    def rescaled(self, r: float) -> BlockPoint:
        """The point at r^2 Lambda (phi scales by r, X(Lambda) by 1 / r)."""
        return BlockPoint(self.L * (r * r), self.phi * r, self.s * r, self.Z, self.Xb / r)


def block_right(M3: np.ndarray, L: np.ndarray) -> np.ndarray:
    """M Lambda for M (r, n) given as M3 (r, b, k) and the block-diagonal Lambda as L (b, k, k); returns (r, n)."""
    r, b, k = M3.shape
    if k <= _SMALL_BLOCK:
        out = np.zeros_like(M3, dtype=np.result_type(M3, L))
        for j in range(k):
            out += M3[:, :, j, None] * L[None, :, j, :].astype(M3.dtype)
        return out.reshape(r, b * k)
    return np.matmul(M3.transpose(1, 0, 2), L.astype(M3.dtype)).transpose(1, 0, 2).reshape(r, b * k)


def gram_lower(W: np.ndarray) -> np.ndarray:
    """The lower triangle of W W^T (W (r, n) float64, C order) by one BLAS syrk, half the flops of W @ W.T."""
    return sla.blas.dsyrk(1.0, W.T, trans=1, lower=1)


def block_diagonal(P3: np.ndarray, Q3: np.ndarray) -> np.ndarray:
    """The diagonal k x k blocks of P^T Q for P, Q (r, n) given as (r, b, k): returns (b, k, k)."""
    return np.matmul(P3.transpose(1, 2, 0), Q3.transpose(1, 0, 2))


class ParticipationDual:
    """Seed 002's dual with one PSD k x k block per pattern (Choquette-Choo et al. 2023; module docstring) on V (r, n)
    with V^T V = G, steps reordered pattern by pattern (patterns (b, k))."""

    def __init__(self, V: np.ndarray, patterns: np.ndarray) -> None:
        self.b, self.k = patterns.shape
        self.r, self.n = V.shape
        self.order = patterns.ravel()
        self.V = np.ascontiguousarray(V[:, self.order])
        self.basis = constant_diagonal_basis(self.k)
        self.n_eigh = 0
        self.n_svd = 0

    def coords(self, E: np.ndarray) -> np.ndarray:
        """Coordinates (b, m) of block matrices E (b, k, k) projected on the constant-diagonal subspace."""
        return np.tensordot(E, self.basis, axes=((1, 2), (1, 2)))

    def blocks(self, v: np.ndarray) -> np.ndarray:
        """Block matrices (b, k, k) of coordinates v (b, m)."""
        return np.tensordot(v, self.basis, axes=(1, 0))

    def evaluate(self, L: np.ndarray) -> BlockPoint | None:
        """phi, X(Lambda)'s blocks and (s, Z) from an eigen-decomposition of T = V Lambda V^T (an SVD of V Lambda^{1/2}
        when T is too ill-conditioned for its eigenvalues, `convex_dp_dual._PD_RTOL`); None unless Lambda > 0 and T > 0."""
        r, b, k = self.r, self.b, self.k
        try:
            F = np.linalg.cholesky(L)
        except np.linalg.LinAlgError:
            return None
        W = block_right(self.V.reshape(r, b, k), F)  # V F, F F^T = Lambda
        T = gram_lower(W)
        ev, U = sla.eigh(T, driver="evd", overwrite_a=True, check_finite=False)
        del T
        self.n_eigh += 1
        if np.isfinite(ev).all() and ev[0] > _PD_RTOL * ev[-1]:
            s = np.sqrt(ev)
        elif r == self.n:
            U, s, _ = sla.svd(W, full_matrices=False, check_finite=False, lapack_driver="gesdd")
            self.n_svd += 1
            if not np.isfinite(s).all() or s[-1] <= _PD_RTOL * s[0]:
                return None
        else:
            return None
        Z = U.T @ self.V
        del U
        Z3 = Z.reshape(r, b, k)
        Xb = block_diagonal(Z3 / s[:, None, None], Z3)
        return BlockPoint(L=L, phi=float(s.sum()), s=s, Z=Z, Xb=(Xb + Xb.transpose(0, 2, 1)) / 2.0)

    def gradient(self, p: BlockPoint, nu: float) -> np.ndarray:
        """Coordinates of grad psi_nu = X(Lambda)_pi - I / k + nu Lambda_pi^{-1}."""
        E = p.Xb - np.eye(self.k) / self.k
        if nu > 0:
            E = E + nu * np.linalg.inv(p.L)
        return self.coords(E)

    def newton_direction(self, p: BlockPoint, nu: float, grad: np.ndarray, eta: float, max_cg: int,
                         deadline: float | None) -> tuple[np.ndarray, int]:
        """Solve (-Hess psi_nu) step = grad by CG to relative residual eta, preconditioned by the blocks of each pattern
        (module docstring); returns the step's coordinates (b, m) and the number of Hessian products."""
        r, b, k = self.r, self.b, self.k
        s, Z = p.s, p.Z
        top = float(s.max())
        sh = s / top  # kappa = kappa_hat / top^3 keeps kappa_hat within float32's range
        kappa = 1.0 / (sh[:, None] * sh[None, :] * (sh[:, None] + sh[None, :]))
        unit = 1.0 / top**3
        fro2 = float(np.einsum("an,an->", Z, Z))
        dtype = np.float32 if float(kappa.max()) * fro2**2 < _FLOAT32_SAFE else np.float64
        Zf, K = Z.astype(dtype), kappa.astype(dtype)
        del kappa
        Z3 = Zf.reshape(r, b, k)
        Li = np.linalg.inv(p.L) if nu > 0 else None
        H = unit * self._pattern_hessians(Z3, sh)
        if Li is not None:
            H += nu * kernel_blocks(lambda i, l, j, m: Li[:, i, l] * Li[:, j, m], k)
        h_diag = np.einsum("bii->bi", H)  # CG's fallback scale only: the preconditioner is H_inv
        H_inv = _positive_inverse(H)
        del H

        def inverse(v: np.ndarray) -> np.ndarray:
            return np.einsum("bij,bj->bi", H_inv, v)

        def hess_vec(v: np.ndarray) -> np.ndarray:
            E = self.blocks(v)
            scale = float(np.abs(E).max())
            if not scale > 0.0:
                return np.zeros_like(v)
            W = block_right(Z3, E / scale)
            F = W @ Zf.T
            del W
            F *= K
            M = (F @ Zf).reshape(r, b, k)
            out = (unit * scale) * block_diagonal(Z3, M).astype(float)
            if Li is not None:
                out += nu * np.matmul(np.matmul(Li, E), Li)
            return self.coords(out)

        return pcg(hess_vec, h_diag, grad, eta, max_cg, deadline=deadline, inverse=inverse)

    def _pattern_hessians(self, Z3: np.ndarray, sh: np.ndarray) -> np.ndarray:
        """(b, m, m): each pattern's block of the Hessian of -2 phi (times top^3) in the basis, from the entries
        (z_i o z_l)^T kappa_hat (z_j o z_m) over pairs i <= l, j <= m of its columns, with kappa_hat replaced by its
        sinc expansion sum_q w_q u_q u_q^T (`cauchy_expansion` divided by sh): one (q x r) by (r x n (k + 1) / 2)
        product of the nodes with the pairwise column products, formed `_PAIR_BYTES` at a time."""
        r, b, k = Z3.shape
        i, j = np.triu_indices(k)
        pair = np.zeros((k, k), dtype=np.int64)
        pair[i, j] = pair[j, i] = np.arange(i.size)
        E, w = cauchy_expansion(sh)
        U = (E / sh[None, :]).astype(Z3.dtype)  # kappa_hat = sum_q w_q u_q u_q^T, u_q = E_q / sh
        C = np.empty((b, w.size, i.size))
        chunk = max(1, _PAIR_BYTES // (r * i.size * Z3.itemsize))
        for c0 in range(0, b, chunk):
            c1 = min(b, c0 + chunk)
            P = Z3[:, c0:c1, i] * Z3[:, c0:c1, j]  # (r, c, w)
            C[c0:c1] = (U @ P.reshape(r, -1)).reshape(w.size, c1 - c0, i.size).transpose(1, 0, 2)
            del P
        Mw = np.matmul(C.transpose(0, 2, 1) * w, C)
        return kernel_blocks(lambda a, c, e, f: Mw[:, pair[a, c], pair[e, f]], k)

    def step_to_boundary(self, L: np.ndarray, E: np.ndarray) -> float:
        """Largest alpha (capped at 1 / _TO_BOUNDARY) with Lambda + alpha E PSD, from the eigenvalues of
        F^{-1} E F^{-T} (Lambda = F F^T)."""
        try:
            Fi = np.linalg.inv(np.linalg.cholesky(L))
        except np.linalg.LinAlgError:  # Lambda at the boundary by round-off
            return 0.0
        low = float(np.linalg.eigvalsh(np.matmul(np.matmul(Fi, E), Fi.transpose(0, 2, 1)))[:, 0].min())
        return 1.0 / _TO_BOUNDARY if low >= -_TO_BOUNDARY else -1.0 / low

    # The ascent's interface (`ascend`, `finish`); the max problem's `participation_max.JointDual` overrides it.

    def start(self) -> BlockPoint | None:
        """The first iterate: `_start`'s multipliers."""
        return self.evaluate(_start(self))

    def ascent_gradient(self, p: BlockPoint, nu: float) -> np.ndarray:
        return self.gradient(p, nu)

    def direction(self, p: BlockPoint, nu: float, grad: np.ndarray, eta: float, max_cg: int,
                  deadline: float | None) -> tuple[np.ndarray, int]:
        return self.newton_direction(p, nu, grad, eta, max_cg, deadline)

    def to_boundary(self, p: BlockPoint, step: np.ndarray) -> float:
        return self.step_to_boundary(p.L, self.blocks(step))

    def move(self, p: BlockPoint, step: np.ndarray, alpha: float) -> BlockPoint | None:
        return self.evaluate(p.L + alpha * self.blocks(step))

    def uniform_value(self, p: BlockPoint, c_max: float) -> float:
        """Value of X(Lambda) / c_max: c_max phi exactly."""
        return c_max * p.phi

    def rescaled_value(self, p: BlockPoint, c: np.ndarray) -> float:
        """Value of D X(Lambda) D, D = c_pi^{-1/2} on pattern pi, by a Cholesky solve (inf unless G is nonsingular
        and X numerically positive definite)."""
        if self.r < self.n:
            return math.inf
        Y = self.strategy_factor(p, c)
        try:
            return objective_from_factor(self.V, Y.T @ Y)
        except np.linalg.LinAlgError:
            return math.inf

    def value(self, X: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
        """tr(G X^{-1}) of the strategy returned (pattern order), and no further arrays."""
        try:
            return objective_from_factor(self.V, X), {}
        except np.linalg.LinAlgError:
            return math.inf, {}

    def bound_factor(self, p: BlockPoint) -> np.ndarray:
        """The factor V (pattern order) that p was evaluated on."""
        return self.V

    def strategy_factor(self, p: BlockPoint, c: np.ndarray | None = None) -> np.ndarray:
        """Y (r, n) with Y^T Y = X(Lambda) (pattern order), each pattern's columns scaled by c_pi^{-1/2} if c given."""
        Y = p.Z / np.sqrt(p.s)[:, None]
        if c is not None:
            Y *= np.repeat(1.0 / np.sqrt(c), self.k)[None, :]
        return Y

    def certified_bound(self, p: BlockPoint, fun: float, tol: float, V: np.ndarray | None = None) -> tuple[float, str]:
        """Seed 002's dual bound phi(Lambda')^2 / sum_pi max_i (Lambda'_pi)_ii for Lambda' = F F^T, F the blocks' Cholesky factors (PSD by
        construction), the max diagonal rounded up by (k + 2) eps; phi bounded from below from p's eigenbasis
        (`orthogonal_rows_nuclear_lower_bound` on Z F), and, when that leaves a relative gap to fun above tol, also
        by the singular values of V F less r eps sigma_max each (a backward-stable SVD's error), the larger kept.
        V (r, n), in pattern order, replaces the problem's own factor where p was evaluated on another one."""
        r, b, k = self.r, self.b, self.k
        V = self.V if V is None else V
        F = np.linalg.cholesky(p.L)
        mass = float(np.einsum("bij,bij->bi", F, F).max(axis=1).sum()) * (1.0 + (k + 2) * np.finfo(float).eps)
        phi = orthogonal_rows_nuclear_lower_bound(block_right(p.Z.reshape(r, b, k), F))
        bound, how = (0.0 if phi is None else phi * phi / mass), "eigenbasis row orthogonality"
        if relative_gap(fun, bound) > tol:
            sv = sla.svdvals(block_right(V.reshape(r, b, k), F), check_finite=False)
            self.n_svd += 1
            svd_phi = float(sv.sum()) - r * r * np.finfo(float).eps * float(sv.max())
            if svd_phi > 0.0 and svd_phi * svd_phi / mass > bound:
                bound, how = svd_phi * svd_phi / mass, "singular values"
        return bound, how


def solve_participation(
    G: np.ndarray,
    patterns: np.ndarray,
    *,
    tol: float = 1e-8,
    max_iter: int = 100,
    forcing: float = 0.5,
    max_cg: int = 200,
    callback: Callable[[dict[str, Any]], bool | None] | None = None,
    time_limit: float | None = None,
    rank_tol: float = RANK_TOL,
) -> SolverResult:
    """Least tr(G X^{-1}) with every pattern's sensitivity <= 1, certified (seed 002 generalised; Choquette-Choo et al. 2023).

    G (n, n): A^T A, PSD, not zero. patterns (b, k): a partition of the n steps (k = 1: seed 002's problem through
    `solve_convex_dp` unchanged). tol: relative gap (fun - dual_bound) / fun at which it stops with CONVERGED;
    max_iter: Newton steps; forcing: largest CG relative residual (the forcing sequence is min(forcing, sqrt(gap)));
    max_cg: CG steps per Newton step; callback: called per iteration with nit, fun, dual_bound, gap, nu (True stops);
    time_limit: wall seconds (an iteration starts only when one as long as the last still ends within it).

    Returns a SolverResult with x = X (n, n) in the steps' own order with certified sensitivity <= 1, fun =
    tr(G X^{-1}) (a Cholesky solve; for singular G the value bound of a ridge completion, see below), dual_bound =
    certified lower bound over every factorization, gap. extra: "Lambda" (b, k, k) multipliers of the bound (in
    G's units), "sensitivity" (the certified sensitivity of x), "sensitivity_y" (b, k) its certificate,
    "construction", "nu", "history", "decompositions", "cg_steps". For singular G the strategy is
    (1 - theta) X / c + theta I / k with theta = tol / 10 (sensitivity <= 1, range(G) covered), and fun its bound
    c phi / (1 - theta).
    """
    G = check_gram(G)
    n = G.shape[0]
    P = check_patterns(patterns, n)
    if P.shape[1] == 1:
        res = solve_convex_dp(G, tol=tol, max_iter=max_iter, forcing=forcing, max_cg=max_cg, callback=callback,
                              time_limit=time_limit, rank_tol=rank_tol)
        res.extra["sensitivity"] = float(np.diag(res.x).max())
        return res
    check_newton_options(tol, forcing, max_iter, max_cg, 0.0)
    time_limit = check_time_limit(time_limit)
    t_wall, t_cpu = time.perf_counter(), time.process_time()
    G, scale = unit_scale(G)
    V, _, _ = range_factor(G, rank_tol=rank_tol, full=False)
    del G
    dual = ParticipationDual(V, P)
    del V
    callback = unscaled_callback(callback, scale)
    out = ascend(dual, tol=tol, max_iter=max_iter, forcing=forcing, max_cg=max_cg, callback=callback,
                 time_limit=time_limit, t_start=t_wall)
    res = finish(dual, out, tol, scale, t_wall, t_cpu, "participation dual")
    res.extra["decompositions"]["eigh"] += 1  # G's, in range_factor
    return res


def _start(dual: ParticipationDual) -> np.ndarray:
    """Lambda_pi = mu_pi I with mu_pi the mean over the pattern of the SVD-bound multipliers diag(G^{1/2})^2."""
    V = dual.V
    root_diag = np.einsum("ai,a->i", V * V, 1.0 / np.linalg.norm(V, axis=1))
    d0 = np.maximum(root_diag**2, 1e-12 * float((root_diag**2).max()))
    mu = d0.reshape(dual.b, dual.k).mean(axis=1)
    return mu[:, None, None] * np.eye(dual.k)


@dataclass
class _Candidate:
    """A primal point: X(Lambda) at `point` with pattern pi scaled by 1 / c_pi (sensitivity 1 each), its value."""

    point: BlockPoint
    c: np.ndarray
    fun: float
    construction: str


@dataclass
class Ascent:
    """What `ascend` found: the best dual point, the best primal candidate, and run data."""

    best_dual: Any
    candidate: _Candidate
    status: str
    message: str
    nit: int
    cg_steps: int
    nu: float
    history: list[dict[str, float]]


def ascend(problem: ParticipationDual, *, tol: float, max_iter: int, forcing: float, max_cg: int,
           callback: Callable[[dict[str, Any]], bool | None] | None, time_limit: float | None,
           t_start: float) -> Ascent:
    """Newton-CG on psi_nu with a falling barrier parameter (module docstring), stopping at relative gap <= tol.

    Each iterate is first moved to the best point on its ray t Lambda for psi_nu (m u^2 - phi u - nu n = 0 with
    u = sqrt(t)); its dual bound phi^2 / sum(mu) and the values of X(Lambda) scaled uniformly and (below
    _RESCALE_BELOW) per pattern are kept when best; nu is the gap over n times sigma (1e-2 after a full step, 0.1
    otherwise) and never rises; the step goes _TO_BOUNDARY of the way to the cone's boundary at most, then halves
    until psi_nu rises by Armijo's rule (or, at round-off level, stays and the gradient halves).
    """
    n = problem.n
    point = problem.start()
    if point is None:
        raise ValueError("the dual function is not differentiable at the start (V Lambda V^T is singular)")
    best_dual_value, best_dual_point = 0.0, point
    candidate: _Candidate | None = None
    nu, alpha, cg_steps = 0.0, 0.0, 0
    history: list[dict[str, float]] = []
    status, message, nit = MAX_ITER, f"reached max_iter = {max_iter}", 0
    lap = lap_timer()
    for nit in range(max_iter + 1):
        last = lap()
        m = point.mass
        point = point.rescaled((point.phi + math.sqrt(point.phi**2 + 4.0 * m * nu * n)) / (2.0 * m))
        value = point.phi**2 / point.mass
        if value > best_dual_value:
            best_dual_value, best_dual_point = value, point
        c = pattern_sensitivity(point.Xb).upper
        uniform = problem.uniform_value(point, float(c.max()))
        if candidate is None or uniform < candidate.fun:
            candidate = _Candidate(point, np.full(problem.b, float(c.max())), uniform, "uniform scaling")
        if relative_gap(uniform, best_dual_value) <= _RESCALE_BELOW:
            rescaled = problem.rescaled_value(point, c)
            if rescaled < candidate.fun:
                candidate = _Candidate(point, c, rescaled, "pattern rescaling")
        gap = relative_gap(candidate.fun, best_dual_value)
        history.append({"nit": nit, "primal": candidate.fun, "dual": best_dual_value, "gap": gap, "nu": nu,
                        "alpha": alpha, "cg": cg_steps})
        report = {"nit": nit, "fun": candidate.fun, "dual_bound": best_dual_value, "gap": gap, "nu": nu, "alpha": alpha}
        stop = stop_rule(callback is not None and bool(callback(report)), gap, tol, nit, max_iter,
                         time.perf_counter() - t_start + last, time_limit)
        if stop is not None:
            status, message = stop
            break
        if (gap <= _FLOOR_GAP and len(history) >= 2
                and gap > (1.0 - _FLOOR_DECREASE) * history[-2]["gap"]
                and nu * n <= _FLOOR_BARRIER * (candidate.fun - best_dual_value)):
            status, message = STALLED, f"a Newton step left the gap at {gap:.2e} (numerical floor)"
            break
        target = (_NU_FULL_STEP if alpha >= 1.0 else _NU_GAP_FRACTION) * (candidate.fun - best_dual_value) / n
        nu = target if nit == 0 else min(nu, target)
        grad = problem.ascent_gradient(point, nu)
        deadline = None if time_limit is None else t_start + time_limit
        step, used = problem.direction(point, nu, grad, min(forcing, math.sqrt(max(gap, 0.0))), max_cg, deadline)
        cg_steps += used
        slope = float(np.vdot(grad, step))
        alpha = min(1.0, _TO_BOUNDARY * problem.to_boundary(point, step))
        base, grad_norm = point.psi(nu), float(np.abs(grad).max())
        trial = None
        for _ in range(_MAX_BACKTRACK if alpha > 0.0 else 0):
            trial = problem.move(point, step, alpha)
            if trial is not None:
                value = trial.psi(nu)
                if value >= base + _ARMIJO * alpha * slope or (value >= base - _G_NOISE * abs(base) and float(
                        np.abs(problem.ascent_gradient(trial, nu)).max()) <= 0.5 * grad_norm):
                    break
            trial = None
            alpha *= 0.5
        if trial is None:
            status, message = STALLED, f"line search failed at gap {gap:.2e} (numerical floor)"
            break
        point = trial
    return Ascent(best_dual_point, candidate, status, message, nit, cg_steps, nu, history)


def finish(problem: ParticipationDual, out: Ascent, tol: float, scale: float, t_wall: float, t_cpu: float,
           method: str) -> SolverResult:
    """The SolverResult of an ascent: the candidate scaled to a certified sensitivity <= 1 and its value recomputed
    (`problem.value`), the dual bound certified at the best dual point, values in G's units (times scale), X in the
    steps' own order. For singular G (rank r < n) the strategy is (1 - theta) X / c + theta I / k, theta = tol / 10
    (sensitivity <= 1, range(G) covered), with the value bound c phi / (1 - theta)."""
    n, k = problem.n, problem.k
    Y = problem.strategy_factor(out.candidate.point, out.candidate.c)
    X = Y.T @ Y
    del Y
    X = (X + X.T) / 2.0
    theta = tol / 10.0 if problem.r < n else 0.0
    if theta > 0.0:
        X *= 1.0 - theta
        X[np.diag_indices(n)] += theta / k
    factor = 1.0
    for _ in range(3):  # exact but for rounding: the matrix returned is certified itself
        sens = pattern_sensitivity(_pattern_blocks(X, problem.b, k))
        if sens.value <= 1.0:
            break
        X /= sens.value * (1.0 + 4.0 * np.finfo(float).eps)
        factor *= sens.value * (1.0 + 4.0 * np.finfo(float).eps)
    fun, arrays = (float(out.candidate.fun) * factor / (1.0 - theta), {}) if theta > 0.0 else problem.value(X)
    best = out.best_dual
    dual_bound, how = problem.certified_bound(best, fun, tol, V=problem.bound_factor(best))
    inverse = np.argsort(problem.order)
    X = X[np.ix_(inverse, inverse)]
    gap = relative_gap(fun, dual_bound)
    status, message = certified_status(out.status, out.message, gap, tol)
    for record in out.history:
        record["primal"] *= scale
        record["dual"] *= scale
    extra = {"method": method, "Lambda": best.L * scale, "sensitivity": sens.value, "sensitivity_y": sens.y,
             "construction": out.candidate.construction, "certificate": how, "nu": out.nu * scale, "rank": problem.r,
             "patterns": problem.order.reshape(problem.b, k), "cg_steps": out.cg_steps, "history": out.history,
             "decompositions": {"eigh": problem.n_eigh, "svd": problem.n_svd},
             **{key: value * scale for key, value in arrays.items()}}
    if hasattr(best, "u"):
        extra["u"] = best.u
    return SolverResult.since(t_wall, t_cpu, x=X, fun=fun * scale, status=status, message=message, nit=out.nit,
                              ninner=out.cg_steps, dual_bound=dual_bound * scale, gap=gap, extra=extra)


def _pattern_blocks(X: np.ndarray, b: int, k: int) -> np.ndarray:
    """The b diagonal k x k blocks of X (n, n) given in pattern order."""
    idx = np.arange(b * k).reshape(b, k)
    return X[idx[:, :, None], idx[:, None, :]]
