"""Matrix mechanism (seed 003; seed 004 Prop. 3.1): measure A x + noise, answer W A^+ (A x + noise).

The strategy A is given (an ndarray, a sparse matrix or a `Strategy`) or selected from W^T W:
- "eigen": eigen-design, weights on the eigenvectors of W^T W (seed 003; Li and Miklau 2012), then by
  default completed: X + diag(1 - diag X) spends each cell's unused sensitivity (`complete_gram`;
  `complete=False` keeps the bare eigen design);
- "optimal": the (eps, delta) convex optimum min trace(W^T W X^-1) s.t. diag(X) <= 1 (seed 002);
- "appendix-b": the LRM paper's own matrix-mechanism solver (seed 000, Appendix B).
All three optimise the L2 (Gaussian) objective. Under (eps, delta)-DP the mechanism uses L2 sensitivity
and Gaussian noise, and the selected strategy is the one the objective ranks. Under eps-DP it uses L1
sensitivity and Laplace noise (the core's `Privacy` decides): the strategy is still valid, but it was not
optimised for L1 sensitivity, and `fit_info_.status` says so ("converged (L2 objective, not optimised for
eps-DP)"). The L2 optimum can then lose to noise on data: on Adult's age x sex marginal plus the age
ranges (3825 x 170) its eps-DP mean variance is 353.7 / eps^2 against identity's 110.9 / eps^2. With
`baselines` (the default for every selected kind) the strategies of the baseline mechanisms
(`dpopt.baselines.baseline_strategies`: identity, noise on queries, hierarchical, wavelet) are candidates
too, under either privacy model: the one with the smallest exact error is returned and the status names it
("...; identity returned: lower error than mm-optimal's own strategy"; `Mechanism._least_error_selection`).
With objective="max" the candidates are ranked by their largest per-query variance over its target.
`baselines=False` keeps the named design whatever its error, as the paper reproductions do (seed 004's
Table 2, the MM baseline of seeds 000 and 001). A given strategy is never replaced.

A strategy Gram X = A^T A determines the (eps, delta) error; under eps-DP the factor A matters through
sens1(A). `factor="auto"` uses the Cholesky factor under (eps, delta) and, under eps-DP, the factor with
the smallest L1 sensitivity among Cholesky, the symmetric square root and the eigen form diag(sqrt l) V^T.

Inference: least squares (`inference="ls"`, the analytic error applies), or non-negative least squares
on the measurements (`inference="nnls"`, seed 003): x_hat = argmin_{x >= 0} ||A x - y||, answers W x_hat,
certified by its duality gap (`dpopt.solvers.nnls.solve_nnls`) when A has full column rank.
NNLS is data-dependent and biased; its error is not the analytic one (`expected_error_` remains the
least-squares error) and `answer_info_` records which inference produced the last answers.

A solver that stops at its iteration or time cap yields a valid but uncertified strategy: `fit` uses it
only if it supports the workload, says so in `fit_info_.status` and issues a ConvergenceWarning
(`on_unconverged="raise"` refuses it instead); a failed solver makes `fit` raise. See
`dpopt.mechanisms.convergence`.
"""

from __future__ import annotations

import time
from importlib import import_module
from typing import Any, ClassVar

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp
from scipy.optimize import lsq_linear, nnls

from dpopt.error import ErrorReport
from dpopt.mechanisms.base import FitInfo, Mechanism, MechanismError, Selection
from dpopt.mechanisms.convergence import check_policy, solver_status
from dpopt.privacy import Privacy
from dpopt.solvers.marginal_opt import residual_planner
from dpopt.solvers.nnls import solve_nnls
from dpopt.solvers.result import CONVERGED, FAILED, MAX_ITER, STALLED, SolverResult, relative_gap
from dpopt.strategy import RANK_RTOL, Strategy, StrategyError
from dpopt.validation import check_choice, check_finite_vector
from dpopt.workloads import Marginals, Stack, Workload, kron_form

STRATEGY_KINDS = ("eigen", "optimal", "appendix-b")
# What the convex optimum minimises: total squared error (seed 002), or the largest per-query variance.
OBJECTIVES = ("sum", "max")
FACTORS = ("auto", "cholesky", "sqrt", "eigen")
INFERENCES = ("ls", "nnls")
# Hand-written solver for each kind: (module, function, what its SolverResult.x is): "gram" X = A^T A,
# "weights" u on the eigenvectors in extra["eigenvectors"], or "strategy" A itself.
_HAND_SOLVERS = {
    "eigen": ("dpopt.solvers.eigen_design", "solve_eigen_design", "weights"),
    "optimal": ("dpopt.solvers.convex_dp", "solve_convex_dp", "gram"),
    "appendix-b": ("dpopt.solvers.appendix_b", "solve_appendix_b", "strategy"),
}
# CVXPY reference model (module in formulations/) for each kind.
_CVXPY_MODELS = {"eigen": "eigen_design", "optimal": "mm_approx", "appendix-b": "appendix_b"}
# A cell is unmeasured when its column of W has squared norm below this fraction of the largest.
ZERO_COLUMN_RTOL = 1e-14
# The marginal-algebra optimum meets the SVD bound exactly; the two computed numbers differ by the rounding
# of sums over at most 2^d residual blocks (about 1e-14 relative), so a gap above 1e-9 means a defect.
MARGINAL_GAP_TOL = 1e-9
# A union of Kronecker products on more cells than this is fitted through the residual Kronecker family with a
# certified gap (`MatrixMechanism._fit_union_family`); up to it, by the dense certified solve (8^4 in 64 s).
UNION_DENSE_MAX_CELLS = 4096
# Completion skips a cell whose unused L2 sensitivity 1 - X_jj is at most this. The eigen solver stops
# at a relative gap of 1e-8, so diag(X) falls short of 1 by that order where the optimum has it equal
# to 1 (marginals). Completing such a cell adds a direction at eigenvalue c ~ 1e-9 next to W's null
# space; eigh then resolves the near-null eigenvectors only to eps / c ~ 1e-7 (Davis-Kahan), and the
# strategy's computed error drifts below the SVD bound by 1e-9 relative, while the completion gains
# at most about 2 c ||X^+|| relative error. 1e-6 is 100x the solver's slack.
COMPLETION_MIN = 1e-6
# NNLS: iteration cap of scipy's active-set method (per call) and tolerance of the sparse solver.
NNLS_MAX_ITER_FACTOR = 50
NNLS_SPARSE_TOL = 1e-10
# Certified NNLS (full column rank): stop at this relative duality gap.
NNLS_GAP_TOL = 1e-9


def _gram_factors(X: np.ndarray) -> dict[str, np.ndarray]:
    """Candidate A with A^T A = X (n x n PSD): upper Cholesky (if X is definite), symmetric root, eigen form."""
    X = (X + X.T) / 2
    lam, V = np.linalg.eigh(X)
    keep = lam > RANK_RTOL * max(float(lam.max()), np.finfo(float).tiny)
    root = np.sqrt(np.where(keep, lam, 0.0))
    out = {"sqrt": (V * root) @ V.T, "eigen": root[keep, None] * V[:, keep].T}
    if keep.all():
        try:
            out["cholesky"] = sla.cholesky(X, lower=False)
        except sla.LinAlgError:
            pass
    return out


def factor_gram(X: np.ndarray, factor: str, privacy: Privacy) -> tuple[np.ndarray, str]:
    """A (r x n) with A^T A = X and the name of the factor used (see the module docstring for "auto")."""
    check_choice(factor, FACTORS, "factor")
    cands = _gram_factors(X)
    if factor == "auto":
        if not privacy.is_pure:
            name = "cholesky" if "cholesky" in cands else "eigen"
        else:
            name = min(cands, key=lambda k: (float(np.abs(cands[k]).sum(axis=0).max()), k))
        return cands[name], name
    if factor not in cands:  # Cholesky of a singular X
        return cands["eigen"], "eigen"
    return cands[factor], factor


def _ls_error_factor(X: np.ndarray, G: np.ndarray, factor: str, privacy: Privacy) -> float:
    """sens(A)^2 * trace(G X^+) for the factor A of X that `factor_gram` picks: the error up to P."""
    A, _ = factor_gram(X, factor, privacy)
    s = Strategy(A)
    return s.sensitivity(privacy.norm) ** 2 * float(np.einsum("ij,ji->", G, s.gram_pinv()))


def complete_gram(X: np.ndarray, G: np.ndarray, factor: str, privacy: Privacy) -> tuple[np.ndarray, bool]:
    """Li and Miklau's completion: X + diag(1 - diag X), spending each cell's unused L2 sensitivity.

    X (n x n) with diag(X) <= 1 (an eigen-design Gram). Under (eps, delta) the completed strategy is never
    worse (trace(G X^-1) can only fall at equal sens2 = 1); it reproduces seed 004's Table 2 eigen column.
    Under eps-DP the added rows may raise sens1, so the completion is kept only if its error is smaller.
    Unused sensitivity at or below COMPLETION_MIN is the solver's stopping slack, not a design choice,
    and is left unspent (see COMPLETION_MIN). Returns (X', whether the completion was applied).
    """
    c = np.clip(1.0 - np.diag(X), 0.0, None)
    c[c <= COMPLETION_MIN] = 0.0
    if not c.any():
        return X, False
    Xc = X + np.diag(c)
    if not privacy.is_pure:
        return Xc, True
    if _ls_error_factor(Xc, G, factor, privacy) < _ls_error_factor(X, G, factor, privacy):
        return Xc, True
    return X, False


def _strategy_from_given(strategy: Any) -> Strategy:
    """A given strategy as a least-squares Strategy (an explicit B is dropped: the mechanism uses W A^+)."""
    if isinstance(strategy, Strategy):
        return Strategy(strategy.A, name=strategy.name)
    if isinstance(strategy, np.ndarray) or sp.issparse(strategy):
        return Strategy(strategy, name="given")
    raise ValueError(
        f"strategy must be an ndarray, a sparse matrix, a Strategy or one of {STRATEGY_KINDS}, "
        f"got {type(strategy).__name__}"
    )


class MatrixMechanism(Mechanism):
    """Matrix mechanism: strategy A given or selected from W^T W, least-squares (or NNLS) inference (seed 003)."""

    short_name: ClassVar[str] = "matrix"
    #: The strategy selected when none is given (the presets below differ only in it).
    default_strategy: ClassVar[str] = "eigen"

    def __init__(
        self,
        strategy: Any = None,
        solver: str = "auto",
        inference: str = "ls",
        factor: str = "auto",
        solver_options: dict[str, Any] | None = None,
        on_unconverged: str = "warn",
        complete: bool | None = None,
        baselines: bool | None = None,
        objective: str = "sum",
        targets: Any = None,
    ) -> None:
        strategy = self.default_strategy if strategy is None else strategy
        check_choice(objective, OBJECTIVES, f"{self.short_name}: objective")
        if objective == "max" and strategy != "optimal":
            raise ValueError(f"{self.short_name}: objective='max' applies to the convex optimum (mm-optimal) only")
        if targets is not None and objective != "max":
            raise ValueError(f"{self.short_name}: per-query targets apply to objective='max' only")
        if targets is not None:
            t = np.asarray(targets, dtype=float)
            if t.ndim > 1 or t.size == 0 or not np.all(np.isfinite(t)) or np.any(t <= 0):
                raise ValueError(f"{self.short_name}: targets must be one number or one per query, all > 0 and finite")
        self.objective = objective
        self.targets = targets
        if isinstance(strategy, str):
            check_choice(strategy, STRATEGY_KINDS, f"{self.short_name}: strategy")
        else:
            strategy = _strategy_from_given(strategy)
        if not isinstance(solver, str) or not (solver in ("auto", "hand") or solver.startswith("cvxpy")):
            raise ValueError(
                f"{self.short_name}: solver must be 'auto', 'hand' or 'cvxpy[:NAME]', got {solver!r}"
            )
        check_choice(inference, INFERENCES, f"{self.short_name}: inference")
        check_choice(factor, FACTORS, f"{self.short_name}: factor")
        self.strategy = strategy
        self.solver = solver
        self.inference = inference
        self.factor = factor
        self.solver_options = dict(solver_options or {})
        self.on_unconverged = check_policy(on_unconverged, self.short_name)
        if complete not in (None, True, False):
            raise ValueError(f"{self.short_name}: complete must be True, False or None, got {complete!r}")
        if complete and strategy != "eigen":
            raise ValueError(f"{self.short_name}: complete=True applies to the eigen-design strategy only")
        # default: complete the eigen design (Li and Miklau), leave the other kinds as their solvers chose
        self.complete = bool(strategy == "eigen" if complete is None else complete)
        if baselines not in (None, True, False):
            raise ValueError(f"{self.short_name}: baselines must be True, False or None, got {baselines!r}")
        if baselines and not isinstance(strategy, str):
            raise ValueError(f"{self.short_name}: baselines applies to a selected strategy, not a given one")
        # default: every selected strategy competes with the baselines; a given strategy is the caller's choice
        self.baselines = bool(isinstance(strategy, str) if baselines is None else baselines)

    def _fit(self, workload: Workload | np.ndarray, privacy: Privacy) -> MatrixMechanism:
        """`fit` under the current budget; the (eps, delta) optimum of a marginal workload in closed form; a union
        of Kronecker products above UNION_DENSE_MAX_CELLS cells through the residual Kronecker family."""
        if isinstance(workload, Marginals) and self._marginal_optimum_applies(privacy):
            return self._fit_marginal_algebra(workload, privacy)
        if self._union_family_applies(workload, privacy):
            return self._fit_union_family(workload, privacy)  # type: ignore[arg-type]
        return super()._fit(workload, privacy)  # type: ignore[return-value]

    def size_problem(self, workload: Workload, privacy: Privacy) -> str | None:
        """None for a marginal workload whose optimum is in closed form (any domain) or a union of Kronecker products
        fitted through the residual Kronecker family, else the dense size limit."""
        if isinstance(workload, Marginals) and self._marginal_optimum_applies(privacy):
            return None
        if self._union_family_applies(workload, privacy):
            return None
        return super().size_problem(workload, privacy)
    def _union_family_applies(self, workload: Workload | np.ndarray, privacy: Privacy) -> bool:
        """True for the convex optimum under (eps, delta), least squares and no targets, on a union of two or more
        Kronecker products over two or more attributes (not marginals) with more than UNION_DENSE_MAX_CELLS cells."""
        if not isinstance(workload, Stack) or self.strategy != "optimal" or self.inference != "ls":
            return False
        if self.targets is not None or privacy.is_pure or isinstance(workload, Marginals):
            return False
        w = workload
        return (isinstance(w, Stack) and w.kron_parts and len(w.parts) > 1 and w.n_factors > 1
                and w.n > UNION_DENSE_MAX_CELLS)

    def _fit_union_family(self, workload: Workload, privacy: Privacy) -> MatrixMechanism:
        """A union of Kronecker products beyond the dense certified solve: the residual Kronecker family
        (`dpopt.solvers.residual_kron`, or `residual_kron_max` for objective "max"), with its certified gap
        against the bound of `dpopt.solvers.union_bound` (through the factors; no n x n matrix is formed).

        The gap is the family's distance to that bound, not the optimum's: the optimum over all strategies lies
        between the two. The time budget is shared: the family first, the bound with what is left.
        """
        from dpopt.mechanisms.base import current_budget
        from dpopt.solvers.residual_kron import UnionTerms, optimize_residual_kron
        from dpopt.solvers.residual_kron_max import optimize_residual_kron_max
        from dpopt.solvers.union_bound import union_lower_bound

        t0, c0 = time.perf_counter(), time.process_time()
        budget = current_budget()
        deadline = None if budget.time_limit is None else t0 + budget.time_limit
        w = kron_form(workload)
        if self.objective == "max":
            M, res = optimize_residual_kron_max(w, deadline=deadline, progress=budget.progress)
            unit_bound, kind = res.dual_bound, "largest variance >= sum bound / m (union_lower_bound)"
        else:
            M, res = optimize_residual_kron(w, deadline=deadline, progress=budget.progress)
            unit_bound, info = union_lower_bound(UnionTerms.of(w), deadline=deadline, progress=budget.progress)
            kind = info["kind"]
        strategy = Strategy(M, name="residual-kron")
        err = strategy.expected_error(w, privacy, rtol=self.support_rtol)
        value = float(np.max(strategy.query_unit_variances(w))) if self.objective == "max" else err.total
        if self.objective == "max":
            value *= privacy.variance_factor * err.sensitivity**2
        gap = None if not unit_bound else relative_gap(value, privacy.variance_factor * unit_bound)
        info_ = FitInfo(solver="residual Kronecker family (certified factors, L-BFGS bases)", status=res.status,
                        iterations=int(res.nit), wall_seconds=time.perf_counter() - t0,
                        cpu_seconds=time.process_time() - c0, gap=gap,
                        message=f"{res.message}; certified bound: {kind}",
                        extra={"unit_lower_bound": unit_bound, "bound_kind": kind, "kind": "optimal",
                               "objective": self.objective, "family": res.extra, "sens_exact": M.sens_exact,
                               "returned": "residual-kron"})
        return self._adopt(w, workload, privacy, strategy, err, info_,  # type: ignore[return-value]
                           bound=privacy.variance_factor * w.error_lower_bound()[0])

    def _marginal_optimum_applies(self, privacy: Privacy) -> bool:
        """True for the convex optimum of the total error under (eps, delta) with least-squares answers."""
        return (self.strategy == "optimal" and self.objective == "sum" and self.inference == "ls"
                and not privacy.is_pure)

    def _fit_marginal_algebra(self, workload: Workload, privacy: Privacy) -> MatrixMechanism:
        """The convex optimum of a marginal workload by ResidualPlanner (Xiao et al. 2023), on any domain.

        W^T W and the constraint diag(X) <= 1 are invariant under permuting the values of each attribute,
        and the problem is convex, so the group average of an optimal X is optimal and lies in the algebra
        spanned by the marginal projections; ResidualPlanner's closed form is the optimum there, hence the
        global optimum. Its error meets the SVD bound (tight for marginals, seed 004 Thm. 5.5): the gap
        is certified by that bound.
        """
        t0, c0 = time.perf_counter(), time.process_time()
        mw = kron_form(workload)
        assert isinstance(mw, Marginals)
        strategy, _ = residual_planner(mw)
        strategy.name = str(self.strategy)  # the convex optimum, named as on the dense path
        err = strategy.expected_error(mw, privacy)
        svdb = mw.svd_bound()
        gap = relative_gap(err.total, privacy.variance_factor * svdb)
        status = CONVERGED if gap <= MARGINAL_GAP_TOL else STALLED
        info = FitInfo(solver="residual planner (marginal algebra)", status=status,
                       wall_seconds=time.perf_counter() - t0, cpu_seconds=time.process_time() - c0, gap=gap,
                       message="closed form over the marginal algebra, which holds the optimum by symmetry",
                       extra={"unit_lower_bound": svdb, "kind": "optimal", "returned": "optimal"})
        return self._adopt(mw, workload, privacy, strategy, err, info)  # type: ignore[return-value]

    def kronecker_policy(self, privacy: Privacy) -> str | None:
        """The convex optimum per factor always: on a Kronecker workload it is the product of the factors'
        optima, for the sum (dual bounds multiply, see `Mechanism._fit_per_factor`) and for the max objective
        without per-query targets (query variances and their maxima multiply); eigen-design
        per factor when the domain is too large for it; Appendix B (minutes per factor of 256 cells), a given
        strategy, NNLS or targets never."""
        if self.strategy not in ("optimal", "eigen") or self.inference != "ls" or self.targets is not None:
            return None
        return "separable" if self.strategy == "optimal" else "large"

    # -- selection ---------------------------------------------------------------------------------
    def _select(self, workload: Workload, privacy: Privacy) -> Selection:
        if isinstance(self.strategy, Strategy):
            return Selection(self.strategy, solver="given", status="given", message="strategy given by the caller")
        if self.objective == "max":
            return self._select_minimax(workload, privacy)
        G_full = workload.gram()
        d = np.diag(G_full)
        if not d.max() > 0:
            raise MechanismError(f"{self.short_name}: workload {workload.name} is all zeros; nothing to answer")
        # Cells no query touches (zero columns of W) are not measured: they leave trace(G X^-1)
        # unchanged, so the optimum is not unique there, and measuring them only adds sensitivity.
        kept = np.flatnonzero(d > ZERO_COLUMN_RTOL * d.max())
        G = G_full[np.ix_(kept, kept)]
        # trace(G X^-1) scales with G: normalise so solver tolerances mean the same on every workload.
        scale = float(np.mean(np.diag(G)))
        G = G / scale
        result, solver_name, what = self._run_solver(G, workload)
        status, message = solver_status(result, self.short_name, self.on_unconverged)
        X = np.zeros_like(G_full)
        try:
            Xk = result.gram(G.shape[0], what)
        except ValueError as e:
            raise MechanismError(f"{self.short_name}: {e}") from None
        completed = False
        if self.complete:
            Xk, completed = complete_gram(Xk, G, self.factor, privacy)
        X[np.ix_(kept, kept)] = Xk
        A, used = factor_gram(X, self.factor, privacy)
        chosen = Strategy(A, name=str(self.strategy))
        if privacy.is_pure:
            status = f"{status} (L2 objective, not optimised for eps-DP)"
            message = (
                f"{message}; selected for L2 sensitivity (the (eps, delta) objective) and evaluated under "
                "eps-DP with L1 sensitivity and Laplace noise: valid, not optimised for eps-DP"
            ).lstrip("; ")
        extra: dict[str, Any] = {
            "factor": used,
            "kind": self.strategy,
            "completed": completed,
            "inference": self.inference,
            "unmeasured_cells": int(G_full.shape[0] - kept.size),
            "solver_fun": float(result.fun),
            # Certified lower bound on trace(W^T W X^+) over the solver's strategy family at sens2 = 1,
            # in the units of workload.gram(): times P(eps, delta), a lower bound on the Gaussian error.
            "unit_lower_bound": None if result.dual_bound is None else float(result.dual_bound) * scale,
            "solver_wall_seconds": float(result.wall_seconds),
        }
        return Selection(
            chosen,
            solver=solver_name,
            status=status,
            iterations=int(result.nit),
            gap=result.gap,
            message=message,
            extra=extra,
        )

    def _select_minimax(self, workload: Workload, privacy: Privacy) -> Selection:
        """The certified minimax strategy: least max_i Var(q_i) / c_i over diag(X) <= 1 (`solve_minimax`)."""
        from dpopt.solvers.minimax import solve_minimax

        targets = 1.0 if self.targets is None else np.asarray(self.targets, dtype=float)
        if np.ndim(targets) == 1 and targets.shape != (workload.m,):
            raise MechanismError(f"{self.short_name}: {targets.size} targets for {workload.m} queries")
        try:
            result = solve_minimax(workload, targets, **self.solver_options)
        except ValueError as exc:
            raise MechanismError(f"{self.short_name}: solve_minimax cannot handle workload {workload.name}: {exc}") from None
        status, message = solver_status(result, self.short_name, self.on_unconverged)
        A, used = factor_gram(np.asarray(result.x, dtype=float), self.factor, privacy)
        chosen = Strategy(A, name="minimax")
        if privacy.is_pure:
            status = f"{status} (L2 objective, not optimised for eps-DP)"
        return Selection(
            chosen, solver="solve_minimax", status=status, iterations=int(result.nit), gap=result.gap,
            message=message,
            extra={"objective": "max", "factor": used, "kind": "optimal", "inference": self.inference,
                   # certified lower bound on max_i Var_i / c_i at sens2 = 1 and unit noise
                   "unit_lower_bound": None if result.dual_bound is None else float(result.dual_bound),
                   "solver_wall_seconds": float(result.wall_seconds)},
        )

    def record(self) -> dict[str, Any]:
        """The shared record keys; after a fit through the union family also its certified bound (P times
        `dpopt.solvers.union_bound`'s, on the total or on the largest variance, by objective)."""
        rec = super().record()
        low = self.fit_info_.extra.get("unit_lower_bound")
        if self.fit_info_.extra.get("returned") == "residual-kron" and low is not None:
            rec["certified_bound"] = self.privacy_.variance_factor * float(low)
            rec["certified_bound_kind"] = self.fit_info_.extra["bound_kind"]
        return rec

    def _baseline_objective(self, report: ErrorReport) -> float:
        """The total error, or for objective "max" the largest per-query variance over its target, max_i Var_i / c_i."""
        if self.objective == "sum":
            return float(report.total)
        per_query = report.per_query
        if per_query is None:  # no listable rows: no per-query variances to rank by
            return float("inf")
        targets = 1.0 if self.targets is None else np.asarray(self.targets, dtype=float)
        return float(np.max(per_query / targets))

    def _run_solver(self, G: np.ndarray, workload: Workload) -> tuple[SolverResult, str, str]:
        """Run the hand-written solver or the CVXPY model for self.strategy on the normalised Gram G.

        solver="auto" uses the hand-written solver when its module is installed, else the CVXPY model.
        """
        kind = str(self.strategy)
        module, func, what = _HAND_SOLVERS[kind]
        solve = None
        if not self.solver.startswith("cvxpy"):
            try:
                solve = getattr(import_module(module), func)
            except (ImportError, AttributeError):
                if self.solver == "hand":
                    raise MechanismError(
                        f"{self.short_name}: strategy {kind!r} needs {module}.{func}, which is not "
                        "available on this installation; use solver='cvxpy'"
                    ) from None
        if solve is None:
            return (*self._run_cvxpy(kind, G), "gram")
        try:
            return solve(G, **self.solver_options), func, what
        except ValueError as exc:
            raise MechanismError(f"{self.short_name}: {func} cannot handle workload {workload.name}: {exc}") from None

    def _run_cvxpy(self, kind: str, G: np.ndarray) -> tuple[SolverResult, str]:
        """The CVXPY reference model for `kind` (formulations/), solved by the named conic solver.

        An inaccurate solution (optimal_inaccurate, user_limit) is kept and reported as MAX_ITER, so the
        convergence policy applies to it like to a hand-written solver at its iteration cap.
        """
        name = self.solver.partition(":")[2] or "clarabel"
        try:
            model_module = import_module(f"formulations.{_CVXPY_MODELS[kind]}")
            from formulations.solve import FormulationError, solve
        except ImportError:
            raise MechanismError(f"{self.short_name}: the CVXPY models (formulations/) are not installed") from None
        t0, c0 = time.perf_counter(), time.process_time()
        opts = dict(self.solver_options)
        try:
            model = model_module.build(G)
            res = solve(model, name, accept_inaccurate=True, **opts)
        except (FormulationError, ValueError) as exc:
            raise MechanismError(f"{self.short_name}: CVXPY model for {kind!r} failed: {exc}") from None
        assert res.strategy is not None
        out = SolverResult.since(
            t0, c0, x=res.strategy.gram, fun=res.objective, status=MAX_ITER if res.inaccurate else CONVERGED,
            message=f"{res.solver}: {res.status}", nit=int(res.iterations or 0), dual_bound=res.dual_objective,
            gap=res.gap,
        )
        return out, f"cvxpy:{res.solver}"

    # -- answering ---------------------------------------------------------------------------------
    def answer(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Noisy answers to every workload query (m,): least squares W A^+ y, or W x_hat with NNLS x_hat >= 0.

        y = A x + z with z Laplace (eps-DP, L1 sensitivity) or Gaussian ((eps, delta), L2) from rng.
        `answer_info_` records the inference used and whether the analytic error describes it.
        """
        if self.inference == "ls":
            out = super().answer(x, rng)
            self.answer_info_ = {"inference": "ls", "data_dependent": False, "analytic_error_applies": True}
            return out
        self._check_fitted()
        if not isinstance(rng, np.random.Generator):
            raise MechanismError(f"{self.short_name}: rng must be a numpy.random.Generator (research mode)")
        x = check_finite_vector(x, "data vector x", self.workload_.n)
        try:
            A = self.strategy_.matrix()
        except StrategyError as exc:
            raise MechanismError(f"{self.short_name}: NNLS inference needs the dense strategy: {exc}") from None
        sens = self.strategy_.sensitivity(self.privacy_.norm)
        y = np.asarray(A @ x).ravel() + self.privacy_.sample_noise(sens, self.strategy_.shape[0], rng)
        x_hat, resid = nnls_estimate(A, y)
        self.answer_info_ = {
            "inference": "nnls",
            "data_dependent": True,
            "analytic_error_applies": False,
            "residual_norm": resid,
        }
        return np.asarray(self.workload_.sparse() @ x_hat).ravel()


def nnls_estimate(A: np.ndarray | sp.spmatrix, y: np.ndarray) -> tuple[np.ndarray, float]:
    """Non-negative least squares inference (seed 003): x_hat = argmin_{x >= 0} ||A x - y||_2, and the residual norm.

    A: (r x n) dense or sparse; y: (r,). With full column rank, the certified solver `dpopt.solvers.nnls.solve_nnls`
    (relative duality gap <= NNLS_GAP_TOL; MechanismError if it does not certify); else scipy's active-set NNLS
    (dense; iteration cap NNLS_MAX_ITER_FACTOR * n) or a bounded trust-region solve with LSMR (sparse,
    tolerance NNLS_SPARSE_TOL), neither certified.
    """
    res = solve_nnls(A, y, tol=NNLS_GAP_TOL)
    if res.status == CONVERGED:
        return np.asarray(res.x), float(np.sqrt(2.0 * res.fun))
    if res.status != FAILED:  # full column rank but not certified within its iterations
        raise MechanismError(f"NNLS inference stopped uncertified: {res.message}")
    if sp.issparse(A):
        out = lsq_linear(sp.csr_matrix(A), y, bounds=(0.0, np.inf), method="trf", lsq_solver="lsmr",
                         tol=NNLS_SPARSE_TOL)
        x_hat = np.clip(out.x, 0.0, None)
        return x_hat, float(np.linalg.norm(A @ x_hat - y))
    A = np.asarray(A, dtype=float)
    x_hat, rnorm = nnls(A, y, maxiter=NNLS_MAX_ITER_FACTOR * A.shape[1])
    return x_hat, float(rnorm)


class EigenDesignMechanism(MatrixMechanism):
    """Matrix mechanism with the eigen-design strategy (seed 003; seed 004 Table 2's last column)."""

    short_name: ClassVar[str] = "eigen"
    default_strategy: ClassVar[str] = "eigen"


class ConvexOptimumMechanism(MatrixMechanism):
    """Matrix mechanism with the (eps, delta) convex optimum (seed 002): min trace(W^T W X^-1), diag(X) <= 1."""

    short_name: ClassVar[str] = "mm-optimal"
    default_strategy: ClassVar[str] = "optimal"


class AppendixBMechanism(MatrixMechanism):
    """Matrix mechanism by the LRM paper's Appendix B solver (seed 000: smoothed max-diagonal, projected gradient)."""

    short_name: ClassVar[str] = "mm-appendix-b"
    default_strategy: ClassVar[str] = "appendix-b"
