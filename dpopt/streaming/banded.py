"""The banded family (BandMF): C lower triangular with bandwidth w, C_ij = 0 for i - j >= w.

Choquette-Choo et al. 2023, "(Amplified) Banded Matrix Factorizations": with w <= b = n / k, X = C^T C is banded
with bandwidth w, so every pattern block X_pi is diagonal and the multi-participation sensitivity is exactly
max_r sum_a X_(r + ab, r + ab). Two structures:
- "toeplitz" (default for a Toeplitz workload; McKenna 2024, "Scaling up the banded matrix factorization
  mechanism"): C = T(c) with c_0..c_(w-1) free, the Toeplitz family's O(n log n) loss (any n; 2^15 and beyond).
- "general" (default otherwise, n <= DENSE_BANDED_STEPS): every band entry free, columns normalised to unit norm
  (C = C~ D^-1, so X_jj = 1 and sens^2 = k exactly when w <= b), B^T = C^-T A^T by blocked banded solves in
  O(n^2 w) and the band of the gradient -B^T G C^-T in O(n^2 w), both in matrix products; mean, or max by
  log-sum-exp smoothing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy.linalg import solve_triangular

from dpopt.streaming import series
from dpopt.streaming.base import Factorization, dense_losses, prepare
from dpopt.streaming.fit import KEEP_C_STEPS, deadline_of, factorization, run_lbfgs
from dpopt.streaming.participation import Participation
from dpopt.streaming.toeplitz import optimise as optimise_toeplitz
from dpopt.streaming.toeplitz_loss import MAX_STAGE_ITERATIONS, MAX_TEMPERATURES
from dpopt.workloads import Workload

#: Largest n of the general (non-Toeplitz) banded structure: B is formed densely (n x n).
DENSE_BANDED_STEPS = 4096


def band_to_matrix(L: np.ndarray) -> np.ndarray:
    """C from its band: C_(j+d, j) = L[j, d] for d < w and j + d < n."""
    n = L.shape[0]
    return band_block(L, 0, n, 0, n)


#: Columns of the gradient's band formed by one matrix product (`band_of_product`), and rows of one block of the
#: blocked banded solves. Measured at n = 4096, w = 64, one BLAS thread: the band 0.07 s against 0.57 s by w
#: diagonal passes; the solves 0.16 / 0.33 s against 0.28 / 0.57 s for scipy's solve_banded (blocks of 64, 256,
#: 512 rows: 0.40 / 0.53, 0.19 / 0.38, 0.23 / 0.47 s).
_BAND_BLOCK = 128


def band_block(L: np.ndarray, r0: int, r1: int, c0: int, c1: int) -> np.ndarray:
    """C[r0:r1, c0:c1] of the lower band C (C[j + d, j] = L[j, d] for d < w, j + d < n) as a dense block."""
    n, w = L.shape
    out = np.zeros((r1 - r0, c1 - c0))
    for d in range(w):  # the d-th subdiagonal's columns c with r0 <= c + d < r1 inside the block and the matrix
        c = np.arange(max(c0, r0 - d), min(c1, r1 - d, n - d))
        out[c + d - r0, c - c0] = L[c, d]
    return out


def solve_band_transposed(L: np.ndarray, R: np.ndarray, *, upper_rhs: bool = False) -> np.ndarray:
    """X with C^T X = R (C the lower band of L), by block back substitution: each block of _BAND_BLOCK rows one
    product with the w - 1 rows below it and one dense triangular solve. upper_rhs: R is upper triangular, so X
    is, and each block's columns left of it are skipped."""
    n, w = L.shape
    X = np.zeros(R.shape)
    for i1 in range(n, 0, -_BAND_BLOCK):
        i0 = max(0, i1 - _BAND_BLOCK)
        e = min(i1 + w - 1, n)
        c0 = i0 if upper_rhs else 0
        rhs = np.array(R[i0:i1, c0:], dtype=float)
        if e > i1:
            rhs -= band_block(L, i1, e, i0, i1).T @ X[i1:e, c0:]
        X[i0:i1, c0:] = solve_triangular(band_block(L, i0, i1, i0, i1).T, rhs, lower=False, check_finite=False)
    return X


def solve_band(L: np.ndarray, R: np.ndarray) -> np.ndarray:
    """Y with C Y = R (C the lower band of L), by block forward substitution (as `solve_band_transposed`)."""
    n, w = L.shape
    Y = np.zeros(R.shape)
    for i0 in range(0, n, _BAND_BLOCK):
        i1 = min(i0 + _BAND_BLOCK, n)
        s0 = max(0, i0 - (w - 1))
        rhs = np.array(R[i0:i1], dtype=float)
        if i0 > s0:
            rhs -= band_block(L, i0, i1, s0, i0) @ Y[s0:i0]
        Y[i0:i1] = solve_triangular(band_block(L, i0, i1, i0, i1), rhs, lower=True, check_finite=False)
    return Y


def band_of_product(B: np.ndarray, H: np.ndarray, w: int) -> np.ndarray:
    """The band of B^T H for B lower triangular (n x n): out[j, d] = B[:, j + d] . H[:, j] for d < w, j + d < n.

    One product B[j0:, j0:j1 + w - 1]^T H[j0:, j0:j1] per block of _BAND_BLOCK columns (rows above j0 of B's
    columns are zero): n^2 (s + w) / 2 flops in matrix products, against n^2 w in w memory-bound passes."""
    n = B.shape[0]
    out = np.zeros((n, w))
    for j0 in range(0, n, _BAND_BLOCK):
        j1 = min(j0 + _BAND_BLOCK, n)
        c1 = min(j1 + w - 1, n)
        M = B[j0:, j0:c1].T @ H[j0:, j0:j1]  # M[r, i] = B[:, j0 + r] . H[:, j0 + i]
        i = np.arange(j1 - j0)[:, None]
        r = i + np.arange(w)[None, :]
        inside = r < c1 - j0
        out[j0:j1][inside] = M[r[inside], np.broadcast_to(i, r.shape)[inside]]
    return out


class GeneralBanded:
    """f(L) = log F(A (C~ D^-1)^-1) over the band L of C~ with unit-norm columns (D = column norms): BandMF
    (Choquette-Choo et al. 2023) with the column normalisation that makes sens^2 = k exact for w <= b."""

    def __init__(self, A: np.ndarray, w: int, objective: str) -> None:
        self.A, self.w, self.objective = A, w, objective
        self.n = A.shape[0]
        self.mu = MAX_TEMPERATURES[0]
        self.mask = np.arange(w)[None, :] < (self.n - np.arange(self.n))[:, None]  # band entries inside the matrix

    def normalised(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(band of C, column norms of C~) for the flat parameters x."""
        Lt = x.reshape(self.n, self.w) * self.mask
        norms = np.sqrt(np.einsum("jd,jd->j", Lt, Lt))
        return Lt / norms[:, None], norms

    def decoder(self, L: np.ndarray) -> np.ndarray:
        """B = A C^-1: B^T = C^-T A^T by one blocked banded solve (A^T upper triangular, so is B^T)."""
        return solve_band_transposed(L, self.A.T, upper_rhs=True).T

    def value_grad(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        n, w = self.n, self.w
        L, norms = self.normalised(x)
        B = self.decoder(L)
        rows = np.einsum("ij,ij->i", B, B)
        if self.objective == "mean":
            F = float(rows.sum()) / n
            omega = np.full(n, 1.0 / n)
        else:
            z = np.log(rows) / self.mu
            s = np.exp(z - z.max())
            F = math.exp(self.mu * (z.max() + math.log(s.sum())))
            omega = F * (s / s.sum()) / rows
        G = 2.0 * omega[:, None] * B  # dF/dB
        H = solve_band(L, G.T).T  # H = G C^-T  (C H^T = G^T)
        gL = -band_of_product(B, H, w) / F  # band of dF/dC = -B^T H
        radial = np.einsum("jd,jd->j", gL, L)
        gx = (gL - radial[:, None] * L) / norms[:, None] * self.mask
        return math.log(F), gx.ravel()


def _optimise_general(W: Workload, p: Participation, objective: str, w: int, deadline: float | None,
                      callback: Callable[[dict[str, Any]], None] | None, max_iter: int
                      ) -> tuple[np.ndarray, str, int]:
    n = p.n
    if n > DENSE_BANDED_STEPS:
        raise ValueError(f"banded with the general structure forms B densely, n <= {DENSE_BANDED_STEPS}; got n = {n} "
                         "(a Toeplitz workload takes structure='toeplitz' at any n)")
    if p.epochs > 1 and w > p.separation:
        raise ValueError(f"banded:{w} with the general structure needs w <= b = n / k = {p.separation} (then the "
                         "sensitivity is exact); use structure='toeplitz' or a smaller band")
    prob = GeneralBanded(W.matrix(), w, objective)
    x0 = np.tile(series.prefix_sqrt(w), (n, 1)) * prob.mask
    temps = MAX_TEMPERATURES if objective == "max" else (None,)
    status, nit_all = "converged", 0
    for mu in temps:
        if mu is not None:
            prob.mu = mu
        x, status, nit = run_lbfgs(prob.value_grad, x0.ravel(), deadline=deadline, callback=callback,
                                   stage="banded" if mu is None else f"banded mu={mu:g}",
                                   max_iter=max_iter if mu is None else min(max_iter, MAX_STAGE_ITERATIONS),
                                   offset=nit_all)
        x0, nit_all = x.reshape(n, w), nit_all + nit
        if status == "time_limit":
            break
    L, _ = prob.normalised(x0.ravel())
    return band_to_matrix(L), status, nit_all


def optimise(A: Workload | np.ndarray, participation: Participation, *, objective: str = "mean",
             time_limit: float | None = None, callback: Callable[[dict[str, Any]], None] | None = None,
             bandwidth: int = 8, structure: str | None = None, max_iter: int = 2000) -> Factorization:
    """The best banded C of bandwidth w for A under k epochs (BandMF, Choquette-Choo et al. 2023;
    the Toeplitz band of McKenna 2024)."""
    t0 = time.perf_counter()
    W, p = prepare(A, participation, objective)
    w = int(bandwidth)
    if not 1 <= w <= p.n:
        raise ValueError(f"bandwidth must lie in 1..n = {p.n}, got {bandwidth}")
    toeplitz_ok = W.toeplitz_column() is not None
    structure = structure or ("toeplitz" if toeplitz_ok else "general")
    if structure not in ("toeplitz", "general"):
        raise ValueError(f"structure must be 'toeplitz' or 'general', got {structure!r}")
    if structure == "toeplitz":
        f = optimise_toeplitz(W, p, objective=objective, time_limit=time_limit, callback=callback, coefficients=w,
                              max_iter=max_iter)
        f.family, f.params = "banded", {"bandwidth": w, "structure": "toeplitz",
                                        "coefficients": f.params["coefficients"]}
        f.fit_seconds = time.perf_counter() - t0
        return f
    C, status, nit = _optimise_general(W, p, objective, w, deadline_of(time_limit), callback, max_iter)
    losses = dense_losses(W, C, p)
    params = {"bandwidth": w, "structure": "general"}
    if p.n > KEEP_C_STEPS:  # never: general banded stops at DENSE_BANDED_STEPS
        params["band"] = [[float(C[j + d, j]) for d in range(min(w, p.n - j))] for j in range(p.n)]
    return factorization("banded", p, objective, C, params, losses, status, t0, {"iterations": nit})
