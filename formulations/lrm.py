"""Low-Rank Mechanism decomposition (seed 000, Formulas (7) and (8)) as alternating convex CVXPY models.

    minimise tr(B^T B)  s.t.  ||W - B L||_F <= gamma  (gamma = 0: W = B L),  ||L[:, j]||_1 <= 1 for all j,

with W (m x n), B (m x r), L (r x n). Under eps-DP the decomposition answers W with total squared
error 2/eps^2 * tr(B^T B) (seed 000, Lemma 1 with sensitivity max_j ||L[:, j]||_1 <= 1). The problem
is bi-convex: convex in B for fixed L and in L for fixed B, not jointly. Following the paper's
Algorithm 1 (inexact augmented Lagrangian), each block is a CVXPY model with parameters so that it is
compiled once and re-solved:

- B-step (the paper's Eq. (9), here solved by the conic solver):
      min_B  1/2 ||B||_F^2 + <pi, W - B L> + beta/2 ||W - B L||_F^2;
- L-step (the paper's Formula (10), with cp.norm1 column constraints):
      min_L  <pi, W - B L> + beta/2 ||W - B L||_F^2  s.t.  ||L[:, j]||_1 <= 1.

Completing the square, <pi, R> + beta/2 ||R||^2 = beta/2 ||C - B L||^2 - ||pi||^2/(2 beta) with
C = W + pi / beta. The B-step is the least-squares model 1/2 ||B||^2 + 1/2 ||T - B Ls||^2 in the
parameters T = sqrt(beta) C and Ls = sqrt(beta) L. The L-step model is min 1/2 ||C_s - B_s L||_F^2 in
the parameters C_s = s C and B_s = s B (Formula (10) times s^2 / beta, plus a constant: the same
minimisers for every s > 0); both models are DPP (compiled once, re-solved with new values).
The scale s (`l_step_scale`) is where the conic solver's absolute tolerances act:
    "sqrt_beta": s = sqrt(beta), the L-step in units of J (the default for interior-point solvers:
        Clarabel at tolerance 1e-8 meets the certificate below on every block of the crossval runs,
        L-step bounds at most 7e-8 |J|);
    "unit": s = 1, beta-free (the default for SCS). At the sqrt(beta) scale the data grow with beta
        while the L1 rows stay of order 1, and SCS needed ever more iterations: 225 at beta = 1,
        6925 at 2^14 and over 200000 (status optimal_inaccurate at tolerance 1e-8) at 2^16 on
        wrange:16x32:seed=5, where `dpopt crossval` failed; on the unit scale 225-375 iterations at
        eight betas from 1 to 2^17 sampled along that run.

Every block is checked by its own optimality, computed here from its solution independently of the
conic solver (`b_step_gap`, `l_step_gap`: bounds on the block's suboptimality in units of the
augmented Lagrangian J(B, L) = 1/2 ||B||^2 + <pi, W - B L> + beta/2 ||W - B L||^2). A block is
certified when its bound is at most rtol max(|J|, 1), the decrease the inner loop counts as no
progress. The blocks are inexact steps of an inexact ALM: a block whose status is 'optimal' but whose
bound is above that level (SCS on the unit scale at tolerance 1e-8: 0, 44, 25 and 12 of the 183,
451, 378 and 571 L-steps of the four crossval runs, largest 1.2e-3 |J|; the L-step bound is the
Frank-Wolfe gap, first order in the distance to the minimiser, and on one such block SCS's objective
was below Clarabel's at tolerance 1e-10 while its bound was 1600 times larger) is kept, counted and
reported in the result's message and extra (uncertified_blocks, max_block_gap); a status other than
'optimal' still raises FormulationError. What the result claims does not rest on the blocks: the
stopping rule below is evaluated on (B, L) directly, the final L is scaled into the unit L1 ball
column by column (a conic solver meets the constraint only to its feasibility tolerance), and the final
refit of B is certified by a Lagrangian lower bound (`refit_lower_bound`); `fit` raises
FormulationError when the refit's relative gap exceeds REFIT_GAP_RTOL.

Stopping rule (checked after every outer iteration k, whose inner loop alternates the two steps at most
`max_inner` times and stops early once the augmented Lagrangian decreases by less than rtol of its
value): with tau_k = ||W - B L||_F,
    gamma > 0: converged when tau_k <= gamma (the paper's "tau is sufficiently small");
    gamma = 0: converged when tau_k <= rtol ||W||_F and |f_k - f_{k-1}| <= rtol f_k, f = ||B||_F^2.
Otherwise beta doubles every `beta_double_every` iterations and pi <- pi + beta (W - B L), as in the
paper; the run stops with MAX_ITER at max_outer, STALLED when beta exceeds beta_max, TIME_LIMIT at
time_limit. Finally B is re-fitted for the returned L by Formula (8) in B alone
(`build_b_refit`: min ||B||_F^2 s.t. ||W - B L||_F <= gamma, with gamma = rtol ||W||_F in place of 0
for Formula (7)), so the reported objective is the best B for that L.

Start: `dpopt.linalg.svd_start`, the same as the hand-written solver's: seed 000's Lemma 3 decomposition
from the SVD W = U S V^T (k = rank W) with r - k extra rows of L drawn from N(0, 1/n) (a zero row of L
would stay zero in both steps), L scaled to largest column L1 norm 1; B0 = W L0^+.
"""

from __future__ import annotations

import math
import time

import cvxpy as cp
import numpy as np

from dpopt.linalg import svd_start
from dpopt.solvers.result import CONVERGED, MAX_ITER, STALLED, TIME_LIMIT, SolverResult
from dpopt.strategy import Strategy
from dpopt.validation import as_generator, check_choice, check_positive_int, check_positive_number
from dpopt.workloads import Workload
from formulations.inputs import workload_matrix
from formulations.model import Model
from formulations.solve import DEFAULT_TOL, FormulationError, solve

# Solvers whose L-step runs on the unit scale under l_step_scale="auto" (see module doc).
FIRST_ORDER_SOLVERS = ("scs",)
# The final refit must be within this relative gap of its Lagrangian lower bound.
REFIT_GAP_RTOL = 1e-6


def build_b_step(W: np.ndarray, r: int) -> Model:
    """ALM B-step of seed 000 Algorithm 1 (closed form Eq. (9) in the paper), as a CVXPY model.

    Parameters T (m x n) = sqrt(beta)(W + pi/beta) and Ls (r x n) = sqrt(beta) L; variable B (m x r).
    Minimises 1/2 ||B||_F^2 + 1/2 ||T - B Ls||_F^2.
    """
    t0 = time.perf_counter()
    m, n = W.shape
    B = cp.Variable((m, r), name="B")
    T = cp.Parameter((m, n), name="T")
    Ls = cp.Parameter((r, n), name="Ls")
    problem = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(B) + 0.5 * cp.sum_squares(T - B @ Ls)))
    return Model(
        name="lrm_b_step",
        problem=problem,
        variables={"B": B},
        build_seconds=time.perf_counter() - t0,
        data={"T": T, "Ls": Ls},
    )


def build_l_step(W: np.ndarray, r: int) -> Model:
    """ALM L-step of seed 000 Algorithm 1 (Formula (10), solved there by Algorithm 2), as a CVXPY model.

    Parameters C (m x n) = s (W + pi/beta) and B (m x r) = s B for a scale s > 0 (see module doc);
    variable L (r x n). Minimises 1/2 ||C - B L||_F^2 s.t. cp.norm1(L, axis=0) <= 1 (every column in the
    unit L1 ball); Formula (10) is beta / s^2 times this objective minus a constant (same minimisers).
    """
    t0 = time.perf_counter()
    m, n = W.shape
    L = cp.Variable((r, n), name="L")
    C = cp.Parameter((m, n), name="C")
    B = cp.Parameter((m, r), name="B")
    problem = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(C - B @ L)), [cp.norm1(L, axis=0) <= 1])
    return Model(
        name="lrm_l_step",
        problem=problem,
        variables={"L": L},
        build_seconds=time.perf_counter() - t0,
        data={"C": C, "B": B},
    )


def l_step_gap(C: np.ndarray, B: np.ndarray, L: np.ndarray, beta: float = 1.0) -> float:
    """Duality gap of the L-step (Formula (10) / beta) at a feasible L; an upper bound on its suboptimality.

    C (m x n), B (m x r), L (r x n) with every column in the unit L1 ball. For g(L) = 1/2 ||C - B L||_F^2
    with gradient G = B^T (B L - C), the Fenchel dual at Y = C - B L gives
        g(L) - min g <= <G, L> + sum_j max_i |G[i, j]|
    (the Frank-Wolfe gap: the support function of the unit L1 ball is the max norm). Returns beta times
    the bound: with the ALM's beta, the bound in units of the augmented Lagrangian J.
    """
    G = B.T @ (B @ L - C)
    return beta * float(np.sum(G * L) + np.abs(G).max(axis=0).sum())


def b_step_gap(T: np.ndarray, Ls: np.ndarray, B: np.ndarray) -> float:
    """Bound on the suboptimality of the B-step (the objective whose minimiser is Eq. (9)) at B.

    T (m x n), Ls (r x n), B (m x r). The objective h(B) = 1/2 ||B||_F^2 + 1/2 ||T - B Ls||_F^2 is
    1-strongly convex, so h(B) - min h <= 1/2 ||grad h(B)||_F^2 with grad h(B) = B - (T - B Ls) Ls^T.
    """
    grad = B - (T - B @ Ls) @ Ls.T
    return 0.5 * float(np.sum(grad * grad))


def into_l1_ball(L: np.ndarray) -> np.ndarray:
    """L (r x n) with every column of L1 norm above 1 scaled down to norm 1 (the L-step's feasible set)."""
    return L / np.maximum(1.0, np.abs(L).sum(axis=0))


def build_b_refit(W: np.ndarray, L: np.ndarray, gamma: float) -> Model:
    """Formula (8) (Formula (7) when gamma = 0) of seed 000 in B alone, for a fixed L.

    minimise ||B||_F^2 s.t. ||W - B L||_F <= gamma (gamma > 0) or W = B L (gamma = 0); variable B (m x r).
    The exact form is infeasible unless the row space of L contains W's exactly; `fit` uses gamma > 0.
    """
    t0 = time.perf_counter()
    m, r = W.shape[0], L.shape[0]
    B = cp.Variable((m, r), name="B")
    fit = [W == B @ L] if gamma == 0 else [cp.norm(W - B @ L, "fro") <= gamma]
    return Model(
        name="lrm_b_refit",
        problem=cp.Problem(cp.Minimize(cp.sum_squares(B)), fit),
        variables={"B": B},
        build_seconds=time.perf_counter() - t0,
        data={"gamma": gamma},
    )


def refit_lower_bound(W: np.ndarray, L: np.ndarray, gamma: float, B: np.ndarray) -> float:
    """Lagrangian lower bound on Formula (8) of seed 000 in B alone (the refit), from a candidate B.

    W (m x n), L (r x n), B (m x r), gamma > 0. For every lam >= 0,
        min ||B||^2 s.t. ||W - B L||_F^2 <= gamma^2  >=  d(lam) = ||B_lam||^2 + lam (||W - B_lam L||^2 - gamma^2),
    B_lam = lam W L^T (I + lam L L^T)^{-1} (the minimiser of the Lagrangian). lam is read off the
    stationarity condition B = lam (W - B L) L^T at the candidate (least squares, clipped at 0).
    """
    R = W - B @ L
    D = R @ L.T
    lam = max(0.0, float(np.sum(B * D)) / max(float(np.sum(D * D)), np.finfo(float).tiny))
    M = np.eye(L.shape[0]) + lam * (L @ L.T)
    B_lam = np.linalg.solve(M, lam * (L @ W.T)).T  # M is symmetric
    R_lam = W - B_lam @ L
    return float(np.sum(B_lam * B_lam)) + lam * (float(np.sum(R_lam * R_lam)) - gamma**2)


def fit(
    workload: Workload | np.ndarray,
    *,
    r: int | None = None,
    gamma: float = 0.0,
    solver: str = "clarabel",
    tol: float = DEFAULT_TOL,
    rtol: float = 1e-6,
    max_outer: int = 300,
    max_inner: int = 3,
    beta0: float = 1.0,
    beta_double_every: int = 10,
    beta_max: float = 1e10,
    seed: int | np.random.Generator | None = 0,
    start: np.ndarray | None = None,
    time_limit: float | None = None,
    l_step_scale: str = "auto",
) -> SolverResult:
    """LRM Algorithm 1 (seed 000, Section 5) with both blocks solved as CVXPY models; see module doc.

    workload: a dpopt Workload with rows or W (m x n). r: rows of L, default ceil(1.2 rank W) (seed 000,
    Section 6.1). gamma: absolute bound on ||W - B L||_F (Formula (8)); 0 for Formula (7).
    solver, tol: passed to `formulations.solve.solve` for every step. seed: randomness of the start's
    extra rows; start: an explicit L0 (r x n, columns in the unit L1 ball) instead of the SVD start.
    l_step_scale: "sqrt_beta", "unit" or "auto" (unit for the first-order solvers in FIRST_ORDER_SOLVERS,
    sqrt_beta otherwise); see module doc.

    Returns a SolverResult: x = (B (m x r), L (r x n)), fun = ||B||_F^2 after the final refit,
    nit = outer iterations, ninner = inner alternations, and extra: strategy (a dpopt Strategy: L with
    the given B and gamma when gamma > 0, else L with least-squares reconstruction), residual
    ||W - B L||_F, max_col_l1, n_solves, solver, l_step_scale, block checks (max_block_gap and
    uncertified_blocks per block, each bound relative to max(|J|, 1); n_blocks), refit_gap (certified
    relative gap of the final refit) and histories (fun, residual, beta per outer iteration).
    """
    wall0, cpu0 = time.perf_counter(), time.process_time()
    W, _ = workload_matrix(workload)  # refuses zero workloads, zero columns, NaN and inf
    m, n = W.shape
    if not (isinstance(gamma, (int, float)) and math.isfinite(gamma) and gamma >= 0):
        raise ValueError(f"gamma must be a finite number >= 0, got {gamma!r}")
    for name, v in (("max_outer", max_outer), ("max_inner", max_inner), ("beta_double_every", beta_double_every)):
        check_positive_int(v, name)
    for name, v in (("rtol", rtol), ("beta0", beta0), ("beta_max", beta_max)):
        check_positive_number(v, name)
    check_choice(l_step_scale, ("auto", "sqrt_beta", "unit"), "l_step_scale")
    if l_step_scale == "auto":
        l_step_scale = "unit" if str(solver).strip().lower() in FIRST_ORDER_SOLVERS else "sqrt_beta"
    rank = int(np.linalg.matrix_rank(W))
    if start is not None:
        L = np.asarray(start, dtype=float)
        if L.ndim != 2 or L.shape[1] != n or not np.all(np.isfinite(L)):
            raise ValueError(f"start must be a finite L0 of shape (r, {n}), got {L.shape}")
        if np.abs(L).sum(axis=0).max() > 1 + 1e-12:
            raise ValueError("start L0 must have every column in the unit L1 ball")
        if r is not None and r != L.shape[0]:
            raise ValueError(f"start has {L.shape[0]} rows but r = {r}")
        r = L.shape[0]
        B = W @ np.linalg.pinv(L)
    else:
        r = max(1, math.ceil(1.2 * rank - 1e-9)) if r is None else r
        check_positive_int(r, "r")
        B, L = svd_start(W, int(r), as_generator(seed))
    normW = float(np.linalg.norm(W))

    b_step, l_step = build_b_step(W, r), build_l_step(W, r)
    pi = np.zeros_like(W)
    beta = float(beta0)
    hist: dict[str, list[float]] = {"fun": [], "residual": [], "beta": []}
    n_solves, ninner, k = 0, 0, 0
    max_gap = {"B": 0.0, "L": 0.0}  # largest block bound / max(|J|, 1)
    uncertified = {"B": 0, "L": 0}  # blocks whose bound exceeds rtol max(|J|, 1)
    status, message = MAX_ITER, f"reached max_outer = {max_outer} outer iterations"

    def lagrangian(B: np.ndarray, L: np.ndarray) -> float:
        R = W - B @ L
        return 0.5 * float(np.sum(B * B)) + float(np.sum(pi * R)) + 0.5 * beta * float(np.sum(R * R))

    def check(block: str, gap: float, J: float) -> None:
        rel = gap / max(abs(J), 1.0)
        max_gap[block] = max(max_gap[block], rel)
        uncertified[block] += rel > rtol

    for k in range(1, max_outer + 1):
        sb = math.sqrt(beta)
        C = W + pi / beta
        T = sb * C
        s = sb if l_step_scale == "sqrt_beta" else 1.0
        b_step.data["T"].value = T
        l_step.data["C"].value = s * C
        J_prev = lagrangian(B, L)
        for _ in range(max_inner):
            Ls = sb * L
            b_step.data["Ls"].value = Ls
            B = _solve_value(b_step, "B", solver, tol)
            check("B", b_step_gap(T, Ls, B), lagrangian(B, L))
            l_step.data["B"].value = s * B
            L = _solve_value(l_step, "L", solver, tol)
            J = lagrangian(B, L)
            check("L", l_step_gap(C, B, into_l1_ball(L), beta), J)
            n_solves += 2
            ninner += 1
            if J_prev - J <= rtol * max(abs(J), 1.0):
                break
            J_prev = J
        tau = float(np.linalg.norm(W - B @ L))
        f = float(np.sum(B * B))
        hist["fun"].append(f)
        hist["residual"].append(tau)
        hist["beta"].append(beta)
        if gamma > 0 and tau <= gamma:
            status, message = CONVERGED, f"residual {tau:.3g} <= gamma = {gamma:g}"
            break
        if gamma == 0 and tau <= rtol * normW and len(hist["fun"]) > 1:
            if abs(hist["fun"][-2] - f) <= rtol * f:
                status, message = CONVERGED, f"relative residual {tau / normW:.3g} and change in ||B||^2 <= {rtol:g}"
                break
        if time_limit is not None and time.perf_counter() - wall0 > time_limit:
            status, message = TIME_LIMIT, f"time limit {time_limit:g} s reached"
            break
        if k % beta_double_every == 0:
            beta *= 2.0
        if beta > beta_max:
            status, message = STALLED, f"beta exceeded beta_max = {beta_max:g}"
            break
        pi = pi + beta * (W - B @ L)

    # The returned L is feasible exactly: the solver's L meets the L1 constraint to its tolerance.
    L = into_l1_ball(L)
    # Formula (7) (gamma = 0) is refitted within the stopping tolerance: W = B L exactly is infeasible
    # in floating point whenever the row space of L holds W only up to rounding.
    gamma_fit = float(gamma) if gamma > 0 else rtol * normW
    refit = build_b_refit(W, L, gamma_fit)
    B = _solve_value(refit, "B", solver, tol)
    n_solves += 1
    fun = float(np.sum(B * B))
    refit_gap = (fun - refit_lower_bound(W, L, gamma_fit, B)) / max(fun, np.finfo(float).tiny)
    if refit_gap > REFIT_GAP_RTOL:
        raise FormulationError(
            f"model {refit.name}: solver {solver}'s refit is {refit_gap:.3g} above its Lagrangian lower bound "
            f"(relative), more than REFIT_GAP_RTOL = {REFIT_GAP_RTOL:g}"
        )
    n_unc = uncertified["B"] + uncertified["L"]
    if n_unc:
        message += (
            f"; {n_unc} of {2 * ninner} blocks above their certificate rtol |J| (inexact steps, largest "
            f"{max(max_gap.values()):.2g} |J|); stopping rule and refit certified"
        )
    residual = float(np.linalg.norm(W - B @ L))
    strategy = Strategy(L, B=B, name="lrm_conic", gamma=gamma_fit)
    return SolverResult.since(
        wall0, cpu0, x=(B, L), fun=fun, status=status, message=message, nit=k, ninner=ninner,
        extra={
            "strategy": strategy,
            "residual": residual,
            "max_col_l1": float(np.abs(L).sum(axis=0).max()),
            "rank": r,
            "gamma": float(gamma),
            "n_solves": n_solves,
            "solver": solver,
            "l_step_scale": l_step_scale,
            "n_blocks": 2 * ninner,
            "max_block_gap": dict(max_gap),
            "uncertified_blocks": dict(uncertified),
            "refit_gap": refit_gap,
            "history": hist,
        },
    )


def _solve_value(model: Model, name: str, solver: str, tol: float) -> np.ndarray:
    """Solve one block and return the value of its variable `name` (raises FormulationError if not optimal)."""
    solve(model, solver, tol=tol)
    return np.asarray(model.value(name), dtype=float)
