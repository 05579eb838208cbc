"""Low-Rank Mechanism (LRM, seed 000): W = B L with ||L[:, j]||_1 <= 1, answers B (L x + noise) (Eq. 6).

Selection solves Formula (7) (gamma = 0) or its relaxation (8) (||W - B L||_F <= gamma, an absolute
Frobenius bound as in the paper) by the inexact augmented Lagrangian of Algorithm 1
(`dpopt.solvers.lrm.solve_lrm`). The rank r of the decomposition defaults to ceil(1.2 rank(W)), the
paper's recommendation (Section 6.1).

Errors (Lemma 1, Theorem 3), total over the m queries:
- noise: 2/eps^2 * ||B||_F^2 * max_j ||L[:, j]||_1^2 under eps-DP (the core's `expected_error`);
- structure (gamma > 0 only): ||(W - B L) x||^2, data-dependent, reported separately by
  `structural_error(x)` and by `expected_error(x=...)` as `bias_sq`. Theorem 3 bounds it by
  ||W - B L||_F^2 ||x||^2 <= gamma^2 ||x||^2 (the paper prints gamma ||x||^2; its proof gives gamma^2).
Under (eps, delta)-DP the decomposition is answered with Gaussian noise scaled to the L2 sensitivity
of L: valid, but L was optimised for the L1 constraint of Formula (7).

Support: with gamma = 0 the relative residual ||W - B L||_F / ||W||_F must be <= tol (the solver's
own test); with gamma > 0 the absolute residual must be <= gamma, so a relaxed strategy is accepted
within gamma only. The lower bound `bound_` is P * SVDB(W) for gamma = 0; for gamma > 0 the mechanism
answers B L rather than W exactly, so `bound_` is P * SVDB(B L), the bound that applies to its noise.

With `baselines=True` (the default) a baseline strategy (identity, noise on queries, hierarchical,
wavelet; `dpopt.baselines.baseline_strategies`) whose exact error is below the noise error of (B, L) is
returned instead, and the status names it; a relaxed (B, L) errs by its bias besides, so such a baseline
is better still. `baselines=False` keeps Algorithm 1's decomposition, as the paper reproductions do.

A solver that stops at its iteration or time cap yields a valid but uncertified strategy: `fit` uses it
only if it supports the workload, says so in `fit_info_.status` and issues a ConvergenceWarning
(`on_unconverged="raise"` refuses it instead); a failed solver makes `fit` raise. See
`dpopt.mechanisms.convergence`.
"""

from __future__ import annotations

import math
import numbers
import time
from typing import Any

import numpy as np

from dpopt.bounds import svd_bound
from dpopt.error import ErrorReport, expected_error
from dpopt.mechanisms.base import (
    MIN_SOLVER_SECONDS,
    Mechanism,
    MechanismError,
    ProgressSink,
    Selection,
)
from dpopt.mechanisms.convergence import check_policy, solver_status
from dpopt.privacy import Privacy
from dpopt.solvers.result import TIME_LIMIT
from dpopt.strategy import Strategy
from dpopt.validation import check_finite_vector
from dpopt.workloads import Workload, as_workload

SOLVERS = ("alm", "cvxpy")
# Under a time limit: seconds of work the limit does not cut, in units of one thin SVD of W (the
# probe `_select` times anyway): measured 14 to 46 (load-dependent) with 1 BLAS thread and time
# limits of 1e-3 s and 60 s on allrange:64, prefix:256 and allrange:256 (see _budgeted).
FIXED_COST_SVDS = 25.0


class LowRankMechanism(Mechanism):
    """LRM (seed 000, Sections 4-5): Formula (7)/(8) by Algorithm 1, answers by Eq. (6)."""

    short_name = "lrm"

    def __init__(
        self,
        rank: int | None = None,
        gamma: float = 0.0,
        solver: str = "alm",
        seed: int | np.random.Generator | None = 0,
        tol: float = 1e-6,
        max_outer: int = 1000,
        solver_options: dict[str, Any] | None = None,
        on_unconverged: str = "warn",
        baselines: bool = True,
    ) -> None:
        if not isinstance(baselines, bool):
            raise MechanismError(f"lrm: baselines must be True or False, got {baselines!r}")
        if rank is not None and (
            isinstance(rank, bool) or not isinstance(rank, numbers.Integral) or int(rank) < 1
        ):
            raise MechanismError(
                f"lrm: rank must be a positive integer (the number of rows of L) or None for "
                f"ceil(1.2 rank(W)); got {rank!r}"
            )
        if isinstance(gamma, bool) or not isinstance(gamma, numbers.Real) or not math.isfinite(gamma) or gamma < 0:
            raise MechanismError(f"lrm: gamma must be a finite number >= 0 (||W - B L||_F bound), got {gamma!r}")
        if solver not in SOLVERS:
            raise MechanismError(f"lrm: solver must be one of {SOLVERS}, got {solver!r}")
        if not 0.0 < tol < 1.0:
            raise MechanismError(f"lrm: tol must lie in (0, 1), got {tol!r}")
        self.rank = None if rank is None else int(rank)
        self.gamma = float(gamma)
        self.solver = solver
        self.seed = seed
        self.tol = float(tol)
        self.max_outer = max_outer
        self.solver_options = dict(solver_options or {})
        self.on_unconverged = check_policy(on_unconverged, "lrm")
        # True: a baseline strategy with less error than (B, L) is returned instead (Mechanism._least_error_selection)
        self.baselines = baselines
        # Exact decompositions are accepted at the solver's own residual test; relaxed ones within gamma.
        self.support_rtol = self.tol * (1.0 + 1e-9)

    # -- selection ---------------------------------------------------------------------------------
    def _select(self, workload: Workload, privacy: Privacy) -> Selection:
        W = self._workload_rows(workload, "Formula (7) needs the rows of W to build B")
        from dpopt.solvers.lrm import default_rank, numerical_rank, solve_lrm

        t0 = time.perf_counter()
        rank_w = numerical_rank(W)
        t_svd = time.perf_counter() - t0  # one thin SVD of W: the unit of LRM's cost model below
        if rank_w == 0:
            raise MechanismError(f"lrm: workload {workload.name} is all zeros; nothing to answer")
        r = default_rank(W) if self.rank is None else self.rank
        if self.gamma == 0.0 and r < rank_w:
            raise MechanismError(
                f"lrm: rank r = {r} is below rank(W) = {rank_w}, so W = B L is impossible with gamma = 0; "
                "use rank >= rank(W) or a relaxation gamma > 0"
            )
        if self.solver == "cvxpy":
            raise MechanismError(
                "lrm: Formula (7) is bilinear in (B, L) and has no CVXPY model here; use solver='alm'"
            )
        opts = {"tol": self.tol, "max_outer": self.max_outer, **self.solver_options}
        last: dict[str, np.ndarray] = {}
        if opts.get("time_limit") is not None:
            opts, last = self._budgeted(W, opts, t_svd, workload)
        try:
            res = solve_lrm(W, rank=r, gamma=self.gamma, seed=self.seed, **opts)
        except ValueError as exc:
            raise MechanismError(f"lrm: solver rejected workload {workload.name}: {exc}") from None
        status, message = solver_status(res, "lrm", self.on_unconverged)
        B, L = res.x
        if last and res.status == TIME_LIMIT and res.extra.get("kept_start"):
            B, L, message = self._best_valid(W, B, L, r, last, message)
        if not privacy.is_pure:
            message = (
                f"{message}; L optimised for L1 sensitivity (Formula (7)), answered with Gaussian noise "
                "scaled to its L2 sensitivity"
            )
        extra = {
            k: res.extra[k]
            for k in ("rank", "residual", "rel_residual", "max_col_l1", "error_factor", "beta")
            if k in res.extra
        }
        extra.update({"rank_W": rank_w, "gamma": self.gamma, "inner_iterations": int(res.ninner)})
        return Selection(
            Strategy(L, B=B, name="lrm", gamma=self.gamma),
            solver="alm",
            status=status,
            iterations=int(res.nit),
            message=message,
            extra=extra,
        )

    def _budgeted(
        self, W: np.ndarray, opts: dict[str, Any], t_svd: float, workload: Workload
    ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """Solver options under a time limit, and the dict in which the last ALM iterate is kept.

        Work that the solver's time limit does not cut (its starts, the final polish of each start and
        run, the support check and error) costs about FIXED_COST_SVDS thin SVDs of W (measured); the
        solver gets the budget left after that reserve, and a budget smaller than the reserve is
        refused as "would take about N s". Unless the caller set them: repair=False, because
        `repair_pair` factors B (m x r) with a full m x m U, a cost the limit does not bound, and init
        "svd" alone without random restarts (a capped run whose iterate misses the residual test then
        returns its own start). `_best_valid` then compares that start with the last iterate and the
        noise-on-data start.
        """
        limit = float(opts["time_limit"])
        fixed = FIXED_COST_SVDS * t_svd
        if fixed > limit:
            about = f"{math.ceil(fixed)}" if fixed >= 10 else f"{fixed:.2g}"
            raise MechanismError(
                f"lrm: would take about {about} s on {workload.name} ({W.shape[0]} x {W.shape[1]}: "
                f"{FIXED_COST_SVDS:g} thin SVDs of W at {t_svd:.2g} s each before and after its iterations), "
                f"more than the {limit:.2g} s left of its time limit (use --time-limit)"
            )
        user = self.solver_options
        out = {**opts, "time_limit": max(limit - fixed, MIN_SOLVER_SECONDS)}
        if "repair" not in user:
            out["repair"] = False
        if "init" not in user and "restarts" not in user:
            out["init"], out["restarts"] = "svd", 0
        last: dict[str, np.ndarray] = {}
        inner = opts.get("callback")

        def keep(info: dict[str, Any]) -> None:
            last["L"] = info["L"]
            if inner is not None:
                inner(info)

        out["callback"] = keep
        return out, last

    def _best_valid(
        self, W: np.ndarray, B: np.ndarray, L: np.ndarray, r: int, last: dict[str, np.ndarray], message: str
    ) -> tuple[np.ndarray, np.ndarray, str]:
        """A capped solver's start (B, L), or a better valid pair at hand: the last iterate L, projected
        and given B by `polish`, or (gamma = 0) the noise-on-data start `identity_start` (W = W I)."""
        from dpopt.solvers.l1ball import project_l1_ball_columns
        from dpopt.solvers.lrm import identity_start, pair_stats, polish

        bound = self.gamma if self.gamma > 0 else self.tol * float(np.linalg.norm(W))

        def factor(B: np.ndarray, L: np.ndarray) -> float:
            """||B||_F^2 max_j ||L[:, j]||_1^2 (the error up to P), inf unless the pair is feasible."""
            resid, l1, f = pair_stats(W, B, L)
            return f if resid <= bound and l1 <= 1.0 + 1e-9 else math.inf

        best = (factor(B, L), B, L, "")
        candidates = []
        if "L" in last:
            Lk = project_l1_ball_columns(np.asarray(last["L"], dtype=float))
            candidates.append((polish(W, Lk, self.gamma, self.tol), Lk, "the last iterate, projected, with its B"))
        start = identity_start(W, r) if self.gamma == 0 else None
        if start is not None:
            candidates.append((*start, "the noise-on-data start (identity_start)"))
        for Bc, Lc, what in candidates:
            f = factor(Bc, Lc)
            if f < best[0]:
                best = (f, Bc, Lc, what)
        if best[3]:
            message += f"; used instead, as the best valid pair at hand: {best[3]}"
        return best[1], best[2], message

    def fit(self, workload: Workload | np.ndarray, privacy: Privacy, *, time_limit: float | None = None,
            progress: ProgressSink | None = None) -> LowRankMechanism:
        """Select (B, L) and check support; for gamma > 0 the bound is that of the answered workload B L.

        time_limit (seconds): Algorithm 1 (`solve_lrm`) gets what is left after the reserve for the work
        it cannot cut (see `_budgeted`; a smaller limit raises MechanismError "would take about N s").
        A capped run returns the best valid pair at hand (its feasible iterate, else the best of its SVD
        start, its last iterate made exact and the noise-on-data start) with status 'time_limit: valid,
        not certified optimal'. progress: see `dpopt.mechanisms.base.FitBudget`.
        """
        super().fit(workload, privacy, time_limit=time_limit, progress=progress)
        if self.strategy_.gamma > 0.0:  # a returned baseline is exact: its bound is that of W
            B = np.asarray(self.strategy_.B)
            L = np.asarray(self.strategy_.A)
            self.bound_ = privacy.variance_factor * svd_bound(B @ L)
            self.fit_info_.extra["bound_of"] = "B L (relaxed, gamma > 0)"
        else:
            self.fit_info_.extra["bound_of"] = "W"
        return self

    # -- errors ------------------------------------------------------------------------------------
    def expected_error(
        self, workload: Workload | np.ndarray | None = None, x: np.ndarray | None = None
    ) -> ErrorReport:
        """Noise error of the fitted decomposition; with x, also `bias_sq` = ||(W - B L) x||^2 (Theorem 3)."""
        self._check_fitted()
        w = self.workload_ if workload is None else as_workload(workload)
        return expected_error(self.strategy_, w, self.privacy_, x=x, rtol=self.support_rtol)

    def structural_error(self, x: np.ndarray) -> float:
        """LRM Theorem 3 (seed 000), second term: the data-dependent ||(W - B L) x||^2 (0 for exact W = B L)."""
        self._check_fitted()
        x = check_finite_vector(x, "data vector x", self.workload_.n)
        bias = self.expected_error(x=x).bias_sq
        assert bias is not None
        return bias

    def theorem3_bound(self, x: np.ndarray) -> float:
        """LRM Theorem 3 (seed 000): noise error + ||W - B L||_F^2 ||x||^2, an upper bound on the total error."""
        self._check_fitted()
        x = check_finite_vector(x, "data vector x", self.workload_.n)
        resid = self.strategy_.residual(self.workload_)
        return self.expected_error_.total + resid**2 * float(x @ x)
