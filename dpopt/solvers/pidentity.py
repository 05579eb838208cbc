"""p-Identity strategies for eps-DP (HDMM, McKenna et al. VLDB 2018, Section 5, OPT_0), written from the paper.

A = [I; Theta] D^{-1} with Theta (p x n) >= 0 and D = diag(1 + 1^T Theta): every column of A has L1 norm
exactly 1, so sens1(A) = 1 and the eps-DP error is 2/eps^2 * trace(G (A^T A)^{-1}), G = W^T W.

With M = I + Theta^T Theta, s = 1 + Theta^T 1, C = D G D and R = (I_p + Theta Theta^T)^{-1} (Woodbury:
M^{-1} = I - Theta^T R Theta, and Theta M^{-1} = R Theta):
  loss  f = trace(C M^{-1}) = sum_i G_ii s_i^2 - <R Theta, Theta C>
  grad  df/dTheta = -2 Theta M^{-1} C M^{-1} + 1_p g^T,  g_k = 2 (G D M^{-1})_kk.
Both need G only through Z = G (D Theta^T) (n x p), since Theta C = Z^T D: one product of G with p vectors per
evaluation (O(p n^2) dense, O(p n) through a range workload's prefix sums, `Workload.gram_matvec`), the rest
O(p^2 n), and no n x n temporary.

`optimize_pidentity` is HDMM's OPT_0: seeded restarts of L-BFGS-B, the best kept. `search_pidentity` runs OPT_0's
restarts first, each on until ten iterations gain less than HDMM's 1e-4 together (HDMM's test stops at the first flat
step), and then spends the time left improving on their value (not in the paper: polishing the best Theta to a tight
tolerance, then further rounds of restarts), so it gets to OPT_0's value about as soon as OPT_0 would, and every
later iterate only improves on it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy.linalg import cho_factor, cho_solve

from dpopt.solvers.lbfgs import LbfgsMonitor, deadline_share, lbfgs_status, minimize_lbfgs
from dpopt.solvers.result import TIME_LIMIT, SolverResult
from dpopt.validation import as_generator, check_gram, check_positive_int

GramMatvec = Callable[[np.ndarray], np.ndarray]
Progress = Callable[[dict[str, Any]], None]

# HDMM's L-BFGS-B relative-decrease test for its templates (ftol 1e-4 in the authors' templates.py): OPT_0's
# restarts stop there, each about 1% above the value its basin converges to.
HDMM_FTOL = 1e-4
# OPT_0's restarts in `search_pidentity`'s first phase and in each later round.
OPT0_RESTARTS = 5
# The polishing tolerance. Measured at p = 16, two restarts: with ftol 1e-10 AllRange(256) converges in 21,524
# iterations in all and Prefix(256) in 8,244; at ftol 1e-12 AllRange stalls in its line search after 28,825
# and gains only 5.5e-6 relative (Prefix 1.1e-5), far below the spread between restarts (1e-3 to 3e-2).
POLISH_FTOL = 1e-10
# L-BFGS-B's cap on evaluations per run (scipy's maxfun; it also bounds the iterations).
MAX_EVALUATIONS = 20_000
# `search_pidentity` stops its rounds once this many in a row improved the best value by less than ROUND_RTOL.
PATIENCE = 3
ROUND_RTOL = 1e-4
# Theta uniform on [0, 1] starts its column sums near 1 + p / 2: at p = 64 (n = 1024) about 33, and at p = 256 about
# 129, so far from the optimum that 40 CPU s of L-BFGS-B on Prefix(4096) end at 1.21e6 where the same run from Theta
# uniform on [0, 64 / p] ends at 4.84e5 (4.25e5 from [0, 16 / p]), measured at one BLAS thread. At p = 64 the narrower
# start is no help (its loose stops are 1-2% higher on Width32(1024)). `search_pidentity`'s first restart starts on
# [0, min(1, HDMM_START_P / p)]; the others keep HDMM's start.
HDMM_START_P = 64
# `search_pidentity`'s loose runs end when their last 10 iterations gained less than 1e-4 together: HDMM's test
# (ftol 1e-4 on one iteration) ends a run on its first flat step, often about 1% above where its basin levels off.
SCREEN_FLAT = (10, 1e-4)


def pidentity_matrix(Theta: np.ndarray) -> np.ndarray:
    """A = [I; Theta] D^{-1} ((n + p) x n), columns of unit L1 norm (HDMM Section 5)."""
    Theta = np.asarray(Theta, dtype=float)
    if Theta.ndim != 2 or np.any(Theta < 0) or not np.all(np.isfinite(Theta)):
        raise ValueError("Theta must be a finite non-negative p x n matrix")
    s = 1.0 + Theta.sum(axis=0)
    return np.vstack([np.eye(Theta.shape[1]), Theta]) / s[None, :]


def pidentity_loss_and_grad(
    theta: np.ndarray, G: np.ndarray, p: int, gram_matvec: GramMatvec | None = None
) -> tuple[float, np.ndarray]:
    """trace(G (A^T A)^{-1}) for the p-Identity strategy with parameters theta (p*n,) and its gradient (HDMM Section 5).

    G (n x n) gives its diagonal and, unless gram_matvec (V -> G V for V of shape (n, p)) is given, the one
    product G (D Theta^T) of the evaluation (module docstring).
    """
    d = np.diagonal(G)
    n = d.size
    Th = theta.reshape(p, n)
    s = 1.0 + Th.sum(axis=0)
    V = Th.T * s[:, None]  # D Theta^T
    Z = G @ V if gram_matvec is None else gram_matvec(V)  # G D Theta^T (n x p)
    ThC = Z.T * s[None, :]  # Theta C = Theta D G D
    R = np.linalg.inv(np.eye(p) + Th @ Th.T)
    RTh = R @ Th
    loss = float(np.dot(d, s * s) - np.einsum("ij,ij->", RTh, ThC))
    Y = R @ ThC  # R Theta C = Theta M^{-1} C
    ThK = Y - (Y @ Th.T) @ RTh  # Theta M^{-1} C M^{-1}
    g = 2.0 * (d * s - np.einsum("kq,qk->k", Z, RTh))
    return loss, (g[None, :] - 2.0 * ThK).ravel()


def pidentity_error(Theta: np.ndarray, G: np.ndarray) -> float:
    """trace(G (A^T A)^{-1}) for A = pidentity_matrix(Theta), by Cholesky of A^T A (HDMM Section 5).

    The Woodbury loss above subtracts two terms of size trace(D G D) and solves with I + Theta
    Theta^T, whose condition grows with Theta^2: its relative error reaches 1e-8 at n = 256, p = 16.
    A^T A = D^{-1} (I + Theta^T Theta) D^{-1} is well conditioned (columns of unit L1 norm, the
    identity block bounds its smallest eigenvalue away from 0), so this is accurate to
    O(n cond(A^T A) eps_mach) relative; O(n^3), used once per result, not per iteration.
    """
    Theta = np.asarray(Theta, dtype=float)
    s = 1.0 + Theta.sum(axis=0)
    X = (np.eye(Theta.shape[1]) + Theta.T @ Theta) / np.outer(s, s)  # A^T A without forming A
    factor = cho_factor(X, lower=True)
    return float(np.trace(cho_solve(factor, np.asarray(G, dtype=float))))


class _Runner:
    """L-BFGS-B runs on one p-Identity problem: G scaled by trace(G) / n (so the loss is O(n) whatever the
    workload's size), the iterations counted across runs, and whether a deadline stopped one."""

    def __init__(self, G: np.ndarray, p: int, gram_matvec: GramMatvec | None, rng: np.random.Generator,
                 progress: Callable[[str], Progress | None]) -> None:
        self.scale = float(np.trace(G)) / G.shape[0]
        self.G, self.p, self.n, self.rng, self.progress = G / self.scale, p, G.shape[0], rng, progress
        self.matvec = None if gram_matvec is None else (lambda V: gram_matvec(V) / self.scale)
        self.nit, self.runs, self.capped = 0, 0, False

    def run(self, x0: np.ndarray, ftol: float, stage: str, until: float | None, max_evaluations: int,
            flat: tuple[int, float] | None = None) -> Any:
        """One run from x0 (Theta >= 0): its best iterate (fun in G's units) and status; flat: `LbfgsMonitor`'s
        test over the last k iterations, a run it ends being converged."""
        monitor = LbfgsMonitor(x0, until, self.progress(stage), stage, self.nit, scale=self.scale, flat=flat)
        res = minimize_lbfgs(pidentity_loss_and_grad, x0, monitor, args=(self.G, self.p, self.matvec),
                             bounds=[(0.0, None)] * x0.size, maxiter=max_evaluations, maxfun=max_evaluations,
                             ftol=ftol, gtol=1e-10)
        res.fun, res.x = float(res.fun) * self.scale, np.maximum(res.x, 0.0)
        res.status = lbfgs_status(monitor.stopped, bool(res.success) or monitor.flat, int(res.nit), max_evaluations)
        if monitor.stopped:
            res.message = "stopped at the time limit"
        self.nit += int(res.nit)
        self.runs += 1
        self.capped = self.capped or monitor.stopped
        return res

    def restarts(self, k: int, ftol: float, until: float | None, label: str, max_evaluations: int,
                 adaptive: bool = False, first_scale: float = 1.0,
                 flat: tuple[int, float] | None = None) -> tuple[Any, list[float]]:
        """Up to k runs from uniform starts on [0, 1] before `until` (runs past it skipped, the first always made):
        the best run's result and every run's value.

        The runs share the time left equally; adaptive: the first run may use all of it, and later runs are
        made only as many as fit at the mean duration of those before (so a budget that one run fills is not
        cut into runs that each stop before their tolerance). first_scale multiplies the first run's start.
        """
        top, values, t_start = None, [], time.perf_counter()
        for i in range(k):
            share = deadline_share(until, k - i)
            if i > 0 and until is not None:
                fit = (until - time.perf_counter()) / ((time.perf_counter() - t_start) / i)
                if adaptive and math.floor(fit) < 1 or _past(until):
                    break
                if adaptive:
                    share = deadline_share(until, min(k - i, math.floor(fit)))
            elif adaptive:
                share = until
            res = self.run(self.rng.random(self.p * self.n) * (first_scale if i == 0 else 1.0), ftol,
                           f"{label} restart {i + 1}/{k}", share, max_evaluations, flat)
            values.append(res.fun)
            if top is None or res.fun < top.fun:
                top = res
        assert top is not None
        return top, values


def optimize_pidentity(
    G: np.ndarray,
    p: int,
    restarts: int = OPT0_RESTARTS,
    seed: int | np.random.Generator | None = 0,
    max_iter: int = MAX_EVALUATIONS,
    ftol: float = POLISH_FTOL,
    deadline: float | None = None,
    progress: Progress | None = None,
    gram_matvec: GramMatvec | None = None,
) -> SolverResult:
    """HDMM OPT_0: best p-Identity strategy for Gram G (n x n) over `restarts` seeded L-BFGS-B runs.

    Each run starts from Theta uniform on [0, 1] (HDMM's start) and stops at L-BFGS-B's relative-decrease test
    ftol (HDMM's own is HDMM_FTOL; the default POLISH_FTOL runs each restart to convergence) or after max_iter
    evaluations. gram_matvec: V -> G V through the workload's structure (`Workload.gram_matvec`).
    Returns SolverResult with x = Theta (p x n), fun = trace(G (A^T A)^{-1}) (sens1 = 1, evaluated by
    `pidentity_error`), status CONVERGED when the best run met L-BFGS-B's tolerance;
    extra["losses"] lists every restart's final loss as the optimiser saw it (Woodbury form).

    deadline: a `time.perf_counter()` value, shared equally among the restarts left. A run past its share
    stops at its next iteration with its best iterate so far; restarts past the deadline are skipped (the
    first run always makes one iteration, so there is a Theta to return; every Theta >= 0 is a valid
    strategy); the status is then TIME_LIMIT.
    progress: called after each L-BFGS-B iteration with {"iteration", "stage", "loss"}.
    """
    G = check_gram(G)
    check_positive_int(p, "p")
    if restarts < 1:
        raise ValueError(f"restarts must be >= 1, got {restarts}")
    t0, c0 = time.perf_counter(), time.process_time()
    runner = _Runner(G, p, gram_matvec, as_generator(seed), lambda stage: progress)
    best, losses = runner.restarts(restarts, ftol, deadline, "p-identity", max_iter)
    status = TIME_LIMIT if runner.capped else best.status
    note = f"best of {runner.runs} L-BFGS-B restarts" + (f" ({restarts - runner.runs} skipped at the time limit)"
                                                         if runner.runs < restarts else "")
    if runner.capped and runner.runs == restarts:
        note += " (time limit reached)"
    Theta = best.x.reshape(p, runner.n)
    return SolverResult.since(t0, c0, x=Theta, fun=pidentity_error(Theta, G), status=status,
                              message=f"{note}: {best.message}", nit=runner.nit,
                              extra={"losses": losses, "restarts_run": runner.runs})


class _Incumbent:
    """The best Theta of a search so far, and the CPU seconds and value of every improvement on the best value seen."""

    def __init__(self, c0: float) -> None:
        self.c0 = c0
        self.fun, self.x, self.status = math.inf, None, ""
        self.seen = math.inf
        self.history: list[tuple[float, float, str]] = []  # (CPU s since the start, value, stage)

    def note(self, value: float, stage: str) -> None:
        """An iterate's value: recorded in the history when it is the lowest seen."""
        if value < self.seen:
            self.seen = value
            self.history.append((time.process_time() - self.c0, value, stage))

    def offer(self, res: Any, stage: str) -> None:
        """Keep a run's best iterate when it improves on the best."""
        self.note(res.fun, stage)
        if res.fun < self.fun:
            self.fun, self.x, self.status = res.fun, res.x, res.status


def search_pidentity(
    G: np.ndarray,
    p: int,
    seed: int | np.random.Generator | None = 0,
    restarts: int = OPT0_RESTARTS,
    rounds: int | None = None,
    deadline: float | None = None,
    progress: Progress | None = None,
    gram_matvec: GramMatvec | None = None,
    screen: tuple[int, float] | None = SCREEN_FLAT,
) -> SolverResult:
    """HDMM OPT_0 first, then improvements on its value until the deadline (OPT_0 as in HDMM Section 5; the rest is not in the paper).

    1. OPT_0's restarts: `restarts` L-BFGS-B runs from the seeded uniform starts of `optimize_pidentity` (up to
       p = HDMM_START_P, n = 1024; beyond, the first starts on [0, HDMM_START_P / p], where HDMM's start leaves a
       budget-bound run far behind), the best kept. screen = (k, rtol) ends a run once its last k iterations gained
       less than rtol together (SCREEN_FLAT), so each run goes at least as far as under HDMM's one-step test
       (screen None: that test, ftol HDMM_FTOL, and then these are OPT_0's runs exactly). With a deadline, within
       half of the time left, as many as fit (`_Runner.restarts`, adaptive).
    2. The best Theta polished: L-BFGS-B from it at POLISH_FTOL (a restart gains 0.5-1.5% over its loose stop).
    3. Rounds: `restarts` further runs from new starts (ended as in 1), the best of them polished and kept when it improves
       on the best so far (converged restarts spread by 1e-3 to 3e-2, so more basins pay), until the deadline,
       `rounds` rounds, or PATIENCE rounds in a row that improved the best value by less than ROUND_RTOL.
    rounds: None means until the deadline or the patience rule; without a deadline, None means one round.
    Every iterate is a valid strategy and the best is kept, so the value never rises after OPT_0's.
    gram_matvec: V -> G V through the workload's structure (`Workload.gram_matvec`).
    progress: called after each L-BFGS-B iteration with {"iteration", "stage", "loss"}.

    Returns SolverResult: x = Theta (p x n), fun = trace(G (A^T A)^{-1}) as the optimiser evaluated it (Woodbury
    form, 1e-8 relative; `pidentity_error` gives it by Cholesky, O(n^3), left to the caller), status TIME_LIMIT
    when the deadline stopped a run, else the status of the run that found the best Theta (CONVERGED when it met
    the polishing tolerance); extra["opt0"] = OPT_0's value, extra["history"] = [(CPU seconds since the start,
    value, stage)] at every iterate that lowered the best value seen, extra["rounds"] = rounds after OPT_0.
    """
    G = check_gram(G)
    check_positive_int(p, "p")
    check_positive_int(restarts, "restarts")
    if rounds is not None and (isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0):
        raise ValueError(f"rounds must be None or an integer >= 0, got {rounds!r}")
    if rounds is None and deadline is None:
        rounds = 1
    t0, c0 = time.perf_counter(), time.process_time()
    best = _Incumbent(c0)

    def observe(stage: str) -> Progress:
        def event(info: dict[str, Any]) -> None:
            best.note(float(info["loss"]), stage)
            if progress is not None:
                progress(info)
        return event

    runner = _Runner(G, p, gram_matvec, as_generator(seed), observe)

    def polished(res: Any, label: str) -> Any:
        out = runner.run(res.x, POLISH_FTOL, label, deadline, MAX_EVALUATIONS)
        return out if out.fun <= res.fun else res

    half = None if deadline is None else time.perf_counter() + (deadline - time.perf_counter()) / 2
    loose = HDMM_FTOL if screen is None else POLISH_FTOL  # with a screen test, scipy's one-step test never ends a run
    opt0, _ = runner.restarts(restarts, loose, half, "OPT_0", MAX_EVALUATIONS, adaptive=True,
                              first_scale=min(1.0, HDMM_START_P / p), flat=screen)
    best.offer(opt0, "OPT_0")
    done, quiet = 0, 0
    if not _past(deadline):
        best.offer(polished(opt0, "OPT_0 polished"), "OPT_0 polished")
        while not _past(deadline) and (rounds is None or done < rounds) and quiet < PATIENCE:
            before = best.fun
            done += 1
            cand, _ = runner.restarts(restarts, loose, deadline, f"round {done}", MAX_EVALUATIONS, adaptive=True,
                                      flat=screen)
            if not _past(deadline):
                cand = polished(cand, f"round {done} polished")
            best.offer(cand, f"round {done}")
            quiet = quiet + 1 if best.fun > before * (1.0 - ROUND_RTOL) else 0
    Theta = np.asarray(best.x).reshape(p, runner.n)
    test = f"ftol {HDMM_FTOL:g}" if screen is None else f"under {screen[1]:g} gained over {screen[0]} iterations"
    message = (f"OPT_0's {restarts} restarts ({test}) {opt0.fun:.6g}, polished, then {done} round(s) of {restarts} "
               f"restarts: best {best.fun:.6g}" + (" (time limit reached)" if runner.capped else ""))
    return SolverResult.since(t0, c0, x=Theta, fun=best.fun, status=TIME_LIMIT if runner.capped else best.status,
                              message=message, nit=runner.nit,
                              extra={"opt0": opt0.fun, "history": best.history, "rounds": done})


def _past(deadline: float | None) -> bool:
    """True when a `time.perf_counter()` deadline is set and reached."""
    return deadline is not None and time.perf_counter() >= deadline
