"""HDMM-style strategy selection by workload structure: Kronecker products, unions of them, and marginals.

(eps, delta), Kronecker workload W = (x)_i W_i: each factor is solved to certified optimality
(`dpopt.solvers.convex_dp`), and A = (x)_i A_i. This product strategy is optimal for the Kronecker problem, and that
is certified: with factor duals u_i, the product u = (x)_i u_i is dual feasible for the product problem and
phi(u) = T(u)^2 / sum(u) = prod_i T_i^2 / sum(u_i) = prod_i phi_i(u_i), because
(D_u^{1/2} G D_u^{1/2})^{1/2} = (x)_i (D_i^{1/2} G_i D_i^{1/2})^{1/2} and traces and sums of Kronecker products
factorise. The product strategy's error is prod_i error_i (sens2 and trace(G X^+) factorise), so its
certified gap is prod_i (1 + gap_i) - 1. The SVD bound factorises the same way (singular values of a Kronecker
product are the products of the factors'), SVDB(W) = prod_i SVDB(W_i), but it is not tight for ranges.

eps-DP: the product of per-factor p-Identity optima minimises the product error over Kronecker strategies
(the error of a Kronecker strategy on a Kronecker workload is a product of positive per-factor terms, and
sens1 multiplies), but Kronecker strategies are not optimal among all strategies, and the L1 problem has
no certificate here: the reported bound 2/eps^2 SVDB(W) is a valid but loose lower bound.

Unions of Kronecker products: HDMM's OPT_(x) by block coordinate descent: with every factor but i fixed,
the error sum_k a_k prod_j trace(G_kj X_j^+) is a 1-D problem in X_i with Gram sum_k b_k G_ki; and HDMM's
OPT_+ (one Kronecker part per term, `union_strategy`) with closed-form part weights; under (eps, delta) also
the residual Kronecker family (`dpopt.solvers.residual_kron`: a part per attribute subset on optimised
residual bases). The best is kept.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.sparse as sp

from dpopt.baselines import hierarchical_strategy, qardaji_branching, qardaji_tree, wavelet_strategy
from dpopt.kron_strategy import SUPPORT_RTOL, KronMatrix
from dpopt.linalg import psd_pinv
from dpopt.privacy import Privacy
from dpopt.solvers.convex_dp import solve_convex_dp
from dpopt.solvers.marginal_opt import optimize_marginals_laplace, residual_planner
from dpopt.solvers.pidentity import pidentity_matrix, search_pidentity
from dpopt.solvers.residual_kron import optimize_residual_kron
from dpopt.solvers.result import CONVERGED, MIN_SOLVER_SECONDS, TIME_LIMIT, Selection, SolverResult
from dpopt.strategy import RANK_RTOL, Strategy
from dpopt.union_strategy import UnionKronMatrix
from dpopt.workloads import (
    GramWorkload,
    Kron,
    Marginals,
    Stack,
    Workload,
    WorkloadTooLargeError,
    kron_form,
)

FactorSolver = Callable[[np.ndarray], tuple[np.ndarray, SolverResult]]
Progress = Callable[[dict[str, Any]], None]


def _past(deadline: float | None) -> bool:
    """True when a `time.perf_counter()` deadline is set and reached."""
    return deadline is not None and time.perf_counter() >= deadline


def selection_of(strategy: Strategy, workload: Workload, privacy: Privacy, *, solver: str, status: str,
                 iterations: int, t0: float, c0: float, unit_bound: tuple[float, str] | None = None,
                 extra: dict[str, Any] | None = None) -> Selection:
    """The selection of `strategy`: its exact error, P times the unit bound (the workload's own certified bound
    by default) with the gap error / bound - 1, and the seconds since perf_counter t0, process_time c0."""
    err = strategy.expected_error(workload, privacy)
    value, kind = workload.error_lower_bound() if unit_bound is None else unit_bound
    bound = privacy.variance_factor * value
    return Selection(strategy=strategy, error=err, privacy=privacy, bound=bound, bound_kind=kind, solver=solver,
                     status=status, iterations=iterations, gap=err.total / bound - 1.0 if bound > 0 else None,
                     wall_seconds=time.perf_counter() - t0, cpu_seconds=time.process_time() - c0,
                     extra=extra or {})


# After an eps-DP factor's search: its p-Identity strategy's scoring (A^T A, its Cholesky factor and inverse, about
# 1.5 baseline scorings), the workload's SVD bound (an eigenvalue decomposition) and the per-query variances that
# compare reports (a product with the inverse): about four scorings of one baseline, each O(n^3).
RESERVE_SCORINGS = 4.0


def default_p(n: int) -> int:
    """HDMM's p-Identity size: n / 16 extra queries (p = 16 for n = 256), at least 1."""
    return max(1, n // 16)


def gaussian_factor(
    G: np.ndarray, tol: float = 1e-8, deadline: float | None = None, progress: Progress | None = None
) -> tuple[np.ndarray, SolverResult]:
    """Certified (eps, delta) factor strategy (A_i with sens2 = 1, solver result), or a baseline it ties with.

    Uses `dpopt.solvers.convex_dp.solve_convex_dp` (dual Newton-CG, seed 002's dual certified).
    deadline (a `time.perf_counter()` value) becomes solve_convex_dp's time_limit: past it, the solver
    returns its iterate with status TIME_LIMIT and its certified gap; progress gets its iterations.
    """
    kwargs: dict[str, Any] = {}
    if deadline is not None:
        kwargs["time_limit"] = max(deadline - time.perf_counter(), MIN_SOLVER_SECONDS)
    if progress is not None:
        from dpopt.mechanisms.base import _progress_event

        def report(info: dict[str, Any]) -> None:
            progress({**_progress_event(info), "stage": "convex-dp factor"})

        kwargs["callback"] = report
    res = solve_convex_dp(G, tol=tol, **kwargs)
    A = res.extra.get("A")
    if A is None:
        A = Strategy.from_gram(res.x).A
    return keep_best_factor(np.asarray(A, dtype=float), res, G, norm=2, optimiser="convex-dp")


def factor_baselines(n: int, gaussian: bool = False) -> dict[str, np.ndarray | sp.csr_matrix]:
    """The baselines of a factor: identity, the binary hierarchy, Qardaji et al.'s hierarchy (their branching for
    the noise, no root; what the hierarchical mechanism measures) and Haar wavelet (sparse, n x n or more)."""
    out: dict[str, np.ndarray | sp.csr_matrix] = {"identity": sp.identity(n, format="csr")}
    if n > 1:
        out["hierarchical"] = sp.csr_matrix(hierarchical_strategy(n).A)
        b = qardaji_branching(n, gaussian)
        if b != 2:
            out[f"hierarchical(b={b})"] = sp.csr_matrix(qardaji_tree(n, gaussian).A)
        out["wavelet"] = sp.csr_matrix(wavelet_strategy(n).A)
    return out


def factor_unit_error(A: np.ndarray | sp.csr_matrix | Strategy, G: np.ndarray, norm: int) -> float:
    """sens_norm(A)^2 trace(G (A^T A)^+): one factor's error up to P(eps, delta) (inf if A misses G's range).

    A of full column rank supports every G, so only a rank-deficient A is checked (through its null space).
    """
    s = A if isinstance(A, Strategy) else Strategy(A)
    if not s.full_column_rank and s.unsupported_fraction(GramWorkload(G, m=G.shape[0])) > SUPPORT_RTOL:
        return math.inf
    return s.sensitivity(norm) ** 2 * float(np.einsum("ij,ji->", G, s.gram_pinv()))


Candidates = dict[str, tuple[Strategy, float]]


def baseline_candidates(G: np.ndarray, norm: int) -> Candidates:
    """The family's baselines (`factor_baselines`) as Strategies with their unit errors on G (`factor_unit_error`;
    the identity's is trace(G), its columns having unit norms)."""
    out = {}
    for name, A in factor_baselines(G.shape[0], gaussian=norm == 2).items():
        s = Strategy(A, name=name)
        out[name] = (s, float(np.trace(G)) if name == "identity" else factor_unit_error(s, G, norm))
    return out


def keep_best_factor(
    A: np.ndarray, res: SolverResult, G: np.ndarray, norm: int, optimiser: str, baselines: Candidates | None = None,
) -> tuple[np.ndarray, SolverResult]:
    """The optimiser's factor A or a baseline of its family, whichever has the least error (ties: A).

    The Kronecker error factorises over the factors (module doc), so keeping the least per-factor error
    keeps the least product over every combination of candidates: the product strategy is never worse
    than identity, either hierarchy or wavelet per factor. baselines: `baseline_candidates(G, norm)` when the
    caller has them already. Returns the kept factor dense (the block descent forms its Gram) and res; res.extra
    gets "candidates" (unit errors), "kept" and "factor_strategy" (the kept factor as a Strategy, with what its
    scoring computed, for `KronMatrix`); a certificate in res stays valid, since it bounds every strategy.
    """
    own = Strategy(A, name=optimiser)
    cands = {optimiser: (own, factor_unit_error(own, G, norm)),
             **(baseline_candidates(G, norm) if baselines is None else baselines)}
    errors = {name: err for name, (_, err) in cands.items()}
    kept = min(errors, key=lambda k: (errors[k], k != optimiser))
    res.extra["candidates"] = errors
    res.extra["kept"] = kept
    res.extra["factor_strategy"] = cands[kept][0]
    if kept != optimiser:
        res.message += (f"; baseline {kept!r} kept (unit error {errors[kept]:.17g} < {optimiser}'s "
                        f"{errors[optimiser]:.17g})")
    A_kept = cands[kept][0].A
    return np.asarray(A_kept.toarray() if sp.issparse(A_kept) else A_kept, dtype=float), res


def laplace_factor(
    G: np.ndarray, p: int | None = None, seed: int = 0, deadline: float | None = None,
    progress: Progress | None = None, gram_matvec: Callable[[np.ndarray], np.ndarray] | None = None,
    rounds: int | None = None,
) -> tuple[np.ndarray, SolverResult]:
    """eps-DP factor strategy: the better of HDMM's OPT_0, improved on until the deadline, and the family's baselines.

    `search_pidentity` runs OPT_0 at HDMM's tolerance and then polishes and restarts until the deadline (rounds:
    its round limit). OPT_0 alone lost to identity on AllRange(16) (852 against 816); see `keep_best_factor`.
    The baselines are scored first, and the search stops RESERVE_SCORINGS times one baseline's scoring time before
    the deadline, for the work after it of about that cost. gram_matvec: V -> G V through
    the factor's structure (`Workload.gram_matvec`). Past the deadline: the best iterate, status TIME_LIMIT.
    """
    t0, c0 = time.perf_counter(), time.process_time()
    baselines = baseline_candidates(G, norm=1)
    scoring = time.process_time() - c0
    if deadline is not None:
        # what follows the search costs about RESERVE_SCORINGS scorings of one baseline (the identity's is free)
        deadline -= RESERVE_SCORINGS * (time.perf_counter() - t0) / max(1, len(baselines) - 1)
    res = search_pidentity(G, p or default_p(G.shape[0]), seed=seed, rounds=rounds, deadline=deadline,
                           progress=progress, gram_matvec=gram_matvec)
    res.extra["scoring_cpu_seconds"] = scoring  # before the search: its history's CPU seconds start after it
    return keep_best_factor(pidentity_matrix(res.x), res, G, norm=1, optimiser="p-identity", baselines=baselines)


def _default_solver(privacy: Privacy, deadline: float | None, progress: Progress | None) -> FactorSolver:
    """The factor solver of the privacy setting, with the deadline and progress bound; eps-DP solves are OPT_0
    and its polish only (no further rounds), as block descent calls them once per factor and sweep."""
    if privacy.is_pure:
        return functools.partial(laplace_factor, deadline=deadline, progress=progress, rounds=0)
    if deadline is None and progress is None:
        return gaussian_factor
    return functools.partial(gaussian_factor, deadline=deadline, progress=progress)


def _status(results: list[SolverResult], default: str) -> str:
    """TIME_LIMIT if any solve hit the deadline, else the first other unconverged status, else default."""
    statuses = [r.status for r in results if r.status != CONVERGED]
    if TIME_LIMIT in statuses:
        return TIME_LIMIT
    return statuses[0] if statuses else default


def _gram_key(G: np.ndarray) -> tuple[tuple[int, ...], bytes]:
    """A key under which identical factor Grams are solved once."""
    return G.shape, np.ascontiguousarray(G).tobytes()


def _cached(solver: Callable[..., tuple[np.ndarray, SolverResult]]) -> Callable[..., tuple[np.ndarray, SolverResult]]:
    """Solve identical factor Grams once (AllRange(256) x AllRange(256) has two equal factors); keywords reach the
    first solve of each Gram."""
    memo: dict[tuple[tuple[int, ...], bytes], tuple[np.ndarray, SolverResult]] = {}

    def run(G: np.ndarray, **kwargs: Any) -> tuple[np.ndarray, SolverResult]:
        key = _gram_key(G)
        if key not in memo:
            memo[key] = solver(G, **kwargs)
        return memo[key]

    return run


def own_queries_error(factor: Workload, G: np.ndarray, norm: int, beat: float) -> float | None:
    """The unit error sens(W_i)^2 rank(W_i) of measuring a factor's own queries with least-squares answers
    (trace(G G^+) = rank G), or None when it cannot be below `beat` or the factor has no rows.

    rank G >= trace(G)^2 / ||G||_F^2 (Cauchy-Schwarz on its eigenvalues), so the rank is computed (eigenvalues
    above RANK_RTOL of the largest, as `Strategy` counts them) only when that bound leaves the queries a chance.
    """
    try:
        sens2 = factor.max_column_norm(norm) ** 2
    except WorkloadTooLargeError:
        return None
    rank_at_least = float(np.trace(G)) ** 2 / float(np.einsum("ij,ij->", G, G))
    if sens2 * math.floor(rank_at_least * (1.0 - 1e-9)) >= beat:
        return None
    lam = np.linalg.eigvalsh(G)
    return sens2 * int(np.count_nonzero(lam > RANK_RTOL * lam[-1]))


def _prefer_factor_queries(
    A: np.ndarray, factor: Workload, G: np.ndarray, norm: int, kept: str, error: float | None = None
) -> tuple[np.ndarray | sp.spmatrix, str]:
    """A, or the factor's own queries W_i (measured with noise, least-squares answers) when they have less error.

    error: A's unit error when already known (`keep_best_factor` records it). W_i's error comes from its
    sensitivity and rank (`own_queries_error`), so its rows are formed only when they are kept.
    """
    if error is None:
        error = factor_unit_error(A, G, norm)
    own = own_queries_error(factor, G, norm, error)
    if own is not None and own < error:
        try:
            return factor.sparse(), "own queries"
        except WorkloadTooLargeError:
            pass
    return A, kept


def _kept_note(kept: list[str], optimiser: str) -> str:
    """' (baseline X kept for factor i, ...)' when a baseline beat the optimiser somewhere, else ''."""
    notes = [f"{k} for factor {i + 1}" for i, k in enumerate(kept) if k != optimiser]
    return f" (baseline kept: {', '.join(notes)})" if notes else ""


def optimize_kron(
    workload: Kron, privacy: Privacy, factor_solver: FactorSolver | None = None,
    deadline: float | None = None, progress: Progress | None = None,
) -> Selection:
    """Product of per-factor optima for a Kronecker workload (certified for (eps, delta); see module doc).

    deadline (a `time.perf_counter()` value) and progress reach the default factor solver: a factor
    solved past the deadline is its solver's iterate or a baseline (`keep_best_factor`), status TIME_LIMIT.
    """
    t0, c0 = time.perf_counter(), time.process_time()
    if factor_solver is None:
        solve = _cached(functools.partial(laplace_factor if privacy.is_pure else gaussian_factor, progress=progress))
    else:
        solve = _cached(factor_solver)
    mats, results = [], []
    optimiser = "p-identity" if privacy.is_pure else "convex-dp"
    kept = []
    grams = workload.factor_grams
    keys = [_gram_key(G) for G in grams]
    for i, (f, G) in enumerate(zip(workload.factors, grams, strict=True)):
        kwargs: dict[str, Any] = {}
        if factor_solver is None:
            # the time left is shared by the distinct factors not yet solved (equal factors are solved once)
            left = len(set(keys[i:]) - set(keys[:i]))
            if deadline is not None and left:
                kwargs["deadline"] = time.perf_counter() + (deadline - time.perf_counter()) / left
            if privacy.is_pure and f.structured_gram:
                kwargs["gram_matvec"] = f.gram_matvec
        A, res = solve(G, **kwargs)
        k = res.extra.get("kept", optimiser)
        known = res.extra.get("candidates", {}).get(k) if factor_solver is None else None
        chosen, k = _prefer_factor_queries(A, f, G, privacy.norm, k, known)
        # the kept factor as scored (its Cholesky factor computed once) unless the factor's own queries replaced it
        mats.append(res.extra.get("factor_strategy", A) if chosen is A else chosen)
        results.append(res)
        kept.append(k)
    strat = Strategy(KronMatrix(mats), name="kron-" + ("p-identity" if privacy.is_pure else "optimal"))
    svdb = workload.svd_bound()
    if not privacy.is_pure and all(r.dual_bound is not None for r in results):
        unit_bound = math.prod(float(r.dual_bound) for r in results)  # type: ignore[arg-type]
        bound_kind = "product of factor dual bounds (certified for the Kronecker problem)"
    else:
        unit_bound = svdb
        bound_kind = "svd bound"
    return selection_of(
        strat, workload, privacy,
        solver=("convex-dp per factor" if not privacy.is_pure else "p-identity: OPT_0, then improved")
        + _kept_note(kept, optimiser),
        status=_status(results, "converged" if privacy.is_pure else "optimal"),
        iterations=sum(r.nit for r in results), t0=t0, c0=c0, unit_bound=(max(unit_bound, svdb), bound_kind),
        extra={"svd_bound": privacy.variance_factor * svdb, "factor_gaps": [r.gap for r in results],
               "factor_kept": kept},
    )


def optimize_union_kron(
    workload: Stack,
    privacy: Privacy,
    sweeps: int = 4,
    rtol: float = 1e-6,
    factor_solver: FactorSolver | None = None,
    deadline: float | None = None,
    progress: Progress | None = None,
) -> Selection:
    """HDMM OPT_(x) for a union of Kronecker products: block coordinate descent over the factors.

    deadline (a `time.perf_counter()` value): the factor solves get it, and descent stops after the
    first sweep that ends past it (every factor then has a strategy), with status TIME_LIMIT.
    """
    t0, c0 = time.perf_counter(), time.process_time()
    solve = factor_solver or _default_solver(privacy, deadline, progress)
    terms = workload.kron_terms()
    a = np.array([t[0] for t in terms])
    d = workload.n_factors
    tr = np.array([[float(np.trace(G)) for G in Gs] for _, Gs in terms])  # X_i = I to start
    mats: list[np.ndarray | None] = [None] * d
    history, iters, capped = [], 0, False
    for _ in range(sweeps):
        for i in range(d):
            b = a * np.prod(np.delete(tr, i, axis=1), axis=1)
            Ghat = sum(bk * Gs[i] for bk, (_, Gs) in zip(b / b.max(), terms, strict=True))
            A, res = solve(np.asarray(Ghat))
            iters += res.nit
            capped = capped or res.status == TIME_LIMIT
            mats[i] = A
            Xp = psd_pinv(A.T @ A)[0]
            tr[:, i] = [float(np.einsum("ij,ij->", Gs[i], Xp)) for _, Gs in terms]
        history.append(float(np.dot(a, np.prod(tr, axis=1))))
        if len(history) > 1 and history[-2] - history[-1] <= rtol * history[-1]:
            break
        if _past(deadline) and len(history) < sweeps:
            capped = True
            break
    strat = Strategy(KronMatrix([m for m in mats if m is not None]), name="union-kron")
    return selection_of(
        strat, workload, privacy,
        solver="block coordinate descent (" + ("p-identity" if privacy.is_pure else "convex-dp") + ")",
        status=TIME_LIMIT if capped else ("converged" if len(history) < sweeps else "max_iter"),
        iterations=iters, t0=t0, c0=c0, extra={"history": history},
    )


def optimize_union_of_krons(
    workload: Stack, privacy: Privacy, factor_solver: FactorSolver | None = None,
    deadline: float | None = None, progress: Progress | None = None,
) -> Selection:
    """HDMM OPT_+: each term k gets its own optimised Kronecker part A^(k) (unit sensitivity), weighted w_k.

    With per-term errors e_k = a_k ||W_k A^(k)+||_F^2, the error (sum_k w_k)^2 sum_k e_k / w_k^2 (L1) is
    minimised by w_k proportional to e_k^(1/3); (sum_k w_k^2) sum_k e_k / w_k^2 (L2) by w_k^2 proportional to
    sqrt(e_k). Both use the triangle-inequality sensitivity, exact here because every part has constant
    column norms (see `union_strategy`).
    """
    t0, c0 = time.perf_counter(), time.process_time()
    solve = _cached(factor_solver or _default_solver(privacy, deadline, progress))
    parts, errs, iters, statuses = [], [], 0, []
    for wt, term in zip(workload.weights, workload.parts, strict=True):
        sel = optimize_kron(term, privacy, factor_solver=solve)
        assert isinstance(sel.strategy.A, KronMatrix)
        parts.append(sel.strategy.A)
        errs.append(float(wt) ** 2 * sel.strategy.unit_error(term) * sel.strategy.sensitivity(privacy.norm) ** 2)
        iters += sel.iterations
        statuses.append(sel.status)
    e = np.array(errs)
    w = e ** (1.0 / 3.0) if privacy.is_pure else e**0.25
    w = w / (w.sum() if privacy.is_pure else math.sqrt(float(np.sum(w**2))))
    strat = Strategy(UnionKronMatrix(parts, w, list(range(len(parts)))), name="union-of-krons")
    return selection_of(
        strat, workload, privacy,
        solver="union of Kronecker parts (" + ("p-identity" if privacy.is_pure else "convex-dp") + ")",
        status=TIME_LIMIT if TIME_LIMIT in statuses else "converged", iterations=iters, t0=t0, c0=c0,
        extra={"weights": w.tolist(), "sens_exact": strat.A.sens_exact},
    )


def optimize_residual_union(workload: Workload, privacy: Privacy, deadline: float | None = None,
                            progress: Progress | None = None, **_: Any) -> Selection:
    """The residual Kronecker strategy of a union of Kronecker products ((eps, delta); `dpopt.solvers.residual_kron`).

    Its error is exact (the strategy's own sensitivity); extra["orthogonal_error"] is the error of the same
    family at the orthogonal bases (QuerySmasher's and ResidualPlanner+'s decomposition), for comparison.
    """
    t0, c0 = time.perf_counter(), time.process_time()
    M, res = optimize_residual_kron(workload, deadline=deadline, progress=progress)
    strat = Strategy(M, name="residual-kron")
    return selection_of(
        strat, workload, privacy, solver="residual Kronecker parts (certified factors, L-BFGS bases)",
        status=res.status, iterations=res.nit, t0=t0, c0=c0,
        extra={"orthogonal_error": privacy.variance_factor * res.extra["orthogonal_fun"],
               "family_unit_error": res.fun, "sens_exact": M.sens_exact, "message": res.message},
    )


def optimize_union(workload: Stack, privacy: Privacy, **opts: Any) -> Selection:
    """The best of OPT_(x) (one Kronecker strategy, block descent), OPT_+ (a union of Kronecker parts) and, under
    (eps, delta), the residual Kronecker family.

    OPT_+ and the residual family are skipped when opts' deadline has passed (status TIME_LIMIT).
    """
    single = optimize_union_kron(workload, privacy, **opts)
    if len(workload.parts) == 1:
        return single
    if _past(opts.get("deadline")):
        single.status = TIME_LIMIT
        single.extra["skipped"] = "union of Kronecker parts (time limit reached)"
        return single
    union = optimize_union_of_krons(workload, privacy, factor_solver=opts.get("factor_solver"),
                                    deadline=opts.get("deadline"), progress=opts.get("progress"))
    found = [single, union]
    if not privacy.is_pure and opts.get("factor_solver") is None and not _past(opts.get("deadline")):
        found.append(optimize_residual_union(workload, privacy, deadline=opts.get("deadline"),
                                             progress=opts.get("progress")))
    best = min(found, key=lambda sel: sel.error.total)
    best.extra["alternatives"] = {sel.solver: float(sel.error.total) for sel in found}
    return best


def optimize_marginals(workload: Marginals, privacy: Privacy, **opts: Any) -> Selection:
    """(eps, delta): ResidualPlanner's closed form (optimal, gap 0); eps-DP: HDMM's marginal template."""
    t0, c0 = time.perf_counter(), time.process_time()
    if privacy.is_pure:
        strat, res = optimize_marginals_laplace(workload, **opts)
        solver, status, iters = "marginal template L-BFGS", res.status, res.nit
        if res.extra["kept"] != "optimised":  # named for what it measures, with least-squares answers
            solver += f" ({res.extra['kept']} measured: less error than the template's weights)"
    else:
        strat, _ = residual_planner(workload)
        solver, status, iters = "residual planner (closed form)", "optimal", 0
    return selection_of(
        strat, workload, privacy, solver=solver, status=status, iterations=iters, t0=t0, c0=c0,
        unit_bound=(workload.svd_bound(), "svd bound (tight for marginals under (eps, delta))"),
    )


def hdmm_rmse(selection: Selection, privacy: Privacy) -> float:
    """RMSE in HDMM's convention: sqrt(sens^2 ||W A^+||_F^2 / m), no privacy constant."""
    return math.sqrt(selection.error.total / privacy.variance_factor / selection.error.m)


def select_strategy(workload: Workload, privacy: Privacy, **opts: Any) -> Selection:
    """Dispatch on the workload's structure: marginals, a single Kronecker product, or a union."""
    if not isinstance(privacy, Privacy):
        raise ValueError(f"privacy must be a dpopt.privacy.Privacy, got {type(privacy).__name__}")
    w = kron_form(workload)
    if isinstance(w, Marginals):
        return optimize_marginals(w, privacy, **opts)
    if isinstance(w, Kron):
        return optimize_kron(w, privacy, **opts)
    if isinstance(w, Stack):
        return optimize_union(w, privacy, **opts)
    raise ValueError(f"no optimiser for workload type {type(w).__name__}")
