"""The largest per-query variance of a union of Kronecker products through the residual Kronecker family
(`dpopt.union_strategy.ResidualKronMatrix`): the parts' weights that minimise it, certified within the family,
and a certified lower bound over every strategy.

Variances. A query (x)_i f_i of term k (weight w_k) has, with part weights w_A (z_A = w_A^{-2}),

    Var = w_k^2 sum_A z_A prod_{i in A} f_i^T N_{A,i} f_i prod_{i not in A} (phi_i^T f_i)^2,

multilinear in each attribute's features (f^T N_{A,i} f over the parts A containing i, and (phi^T f)^2) with
non-negative coefficients. So for every z >= 0 the largest variance over a term's rows is reached on rows whose
features are, per attribute, a vertex of their convex hull exposed by a non-negative direction
(`exposed_rows`): the term's grid shrinks to those rows, exactly.

Weights. With sens^2 <= sum_A w_A^2 = sum_A 1 / z_A (each factor at max diag 1), the family's problem is
min_z max_q (V z)_q sum_A 1 / z_A over the rows q of the shrunk grids (V_qA >= 0). For any distribution p over
the rows, min_z (p^T V z) sum_A 1 / z_A = (sum_A sqrt((V^T p)_A))^2 (Cauchy-Schwarz): a lower bound within the
family. The max is smoothed by the beta-norm ||V z||_beta (beta = 8 ... 2048, L-BFGS in log z), whose
weights p_q proportional to (V z)_q^beta give that certificate.

Every strategy. max_q Var_q >= sum_q p_q Var_q for any distribution p, and the right side is seed 002's sum
objective for the workload with rows scaled by sqrt(p_q); with p uniform it is the sum bound of
`dpopt.solvers.union_bound.union_lower_bound` divided by m (on the 1- and 2-way Prefix marginals of 6^3: 7.27
against the dense minimax optimum 7.41 and the family's 8.59).
"""

from __future__ import annotations

import math
import time
from itertools import combinations
from typing import Any

import numpy as np
import scipy.sparse as sp

from dpopt.bounds import EPS
from dpopt.kron_strategy import _terms
from dpopt.solvers.lbfgs import LbfgsMonitor, minimize_lbfgs
from dpopt.solvers.residual_kron import Progress, UnionTerms, _is_total, optimize_residual_kron
from dpopt.solvers.result import CONVERGED, STALLED, TIME_LIMIT, SolverResult
from dpopt.solvers.union_bound import union_lower_bound
from dpopt.union_strategy import ResidualKronMatrix
from dpopt.workloads import ExplicitWorkload, Kron, Stack, Workload, kron_form

#: Smoothing exponents of the largest variance, in turn.
BETAS = (8.0, 32.0, 128.0, 512.0, 2048.0)
#: Rounds of reweighting the terms of the sum family by their largest variances.
REWEIGHT_ROUNDS = 4


def term_factors(workload: Workload) -> list[tuple[float, list[np.ndarray]]]:
    """(w_k, [F_ki dense]) for every Kronecker term of a union (or one product)."""
    w = kron_form(workload)
    out = []
    for wt, part in _terms(w):
        mats = [f.stored() for f in part.factors]  # type: ignore[attr-defined]
        out.append((float(wt), [np.asarray(M.toarray() if sp.issparse(M) else M, dtype=float) for M in mats]))
    return out


def exposed_rows(features: np.ndarray) -> np.ndarray:
    """Indices of the rows that maximise c^T f for some c >= 0 (ties kept once): with two features the upper-right
    convex chain of the Pareto front, with more the Pareto front (a superset, exact all the same)."""
    F = np.asarray(features, dtype=float)
    uniq, first = np.unique(F, axis=0, return_index=True)
    order = np.lexsort(uniq.T[::-1])[::-1]  # descending by the first feature, then the next
    front: list[int] = []
    for j in order:
        if not any(np.all(uniq[k] >= uniq[j]) and np.any(uniq[k] > uniq[j]) for k in front):
            front.append(int(j))
    if F.shape[1] == 2 and len(front) > 2:
        pts = sorted(front, key=lambda j: (uniq[j, 0], -uniq[j, 1]))  # x up, y down along the Pareto front
        chain: list[int] = []
        for j in pts:
            while len(chain) >= 2:
                (x1, y1), (x2, y2), (x3, y3) = uniq[chain[-2]], uniq[chain[-1]], uniq[j]
                if (x2 - x1) * (y3 - y1) - (y2 - y1) * (x3 - x1) >= 0:  # chain[-1] on or below the chord
                    chain.pop()
                else:
                    break
            chain.append(j)
        front = chain
    return np.sort(first[front])


def variance_rows(M: ResidualKronMatrix, terms: list[tuple[float, list[np.ndarray]]]) -> tuple[np.ndarray, np.ndarray,
                                                                                             list[dict[str, Any]]]:
    """V (rows x parts) of the shrunk grids: Var_q = (V z)_q for every z; the term of each row; per term its
    exposed rows per attribute (for the bound's product distributions)."""
    index = {A: k for k, A in enumerate(M.subsets)}
    ginv = {A: dict(zip(A, Ns, strict=True)) for A, Ns in zip(M.subsets, M._ginverses, strict=True)}
    blocks, owner, info = [], [], []
    for t, (wt, Fs) in enumerate(terms):
        S = tuple(i for i, F in enumerate(Fs) if not _is_total(F.T @ F))
        scale = wt**2 * math.prod(float((F @ M.bases[i])[0]) ** 2 for i, F in enumerate(Fs) if i not in S)
        parts = [A for r in range(len(S) + 1) for A in combinations(S, r) if A in index]
        beta = {i: (Fs[i] @ M.bases[i]) ** 2 for i in S}
        feat = {i: {A: np.einsum("ij,jk,ik->i", Fs[i], ginv[A][i], Fs[i]) for A in parts if i in A} for i in S}
        rows = {i: exposed_rows(np.column_stack([*feat[i].values(), beta[i]])) for i in S}
        cols = np.zeros((math.prod(len(rows[i]) for i in S), len(M.subsets)))
        for A in parts:
            vec = np.ones(1)
            for i in S:
                vec = np.kron(vec, (feat[i][A] if i in A else beta[i])[rows[i]])
            cols[:, index[A]] = scale * vec
        blocks.append(cols)
        owner.append(np.full(cols.shape[0], t))
        info.append({"support": S, "rows": rows})
    return np.vstack(blocks), np.concatenate(owner), info


def family_dual(V: np.ndarray, p: np.ndarray) -> float:
    """(sum_A sqrt((V^T p)_A))^2 (Cauchy-Schwarz, as in ResidualPlanner's budget): for a distribution p over rows, a
    lower bound on min_z max_q (V z)_q sum_A 1/z_A."""
    return float(np.sqrt(np.clip(V.T @ (p / p.sum()), 0.0, None)).sum()) ** 2


def max_weights(V: np.ndarray, tol: float = 1e-4, deadline: float | None = None,
                progress: Progress | None = None) -> tuple[np.ndarray, np.ndarray, float, float, str]:
    """ResidualPlanner's max-variance budget (Xiao et al. 2023) over the family's parts: z minimising
    max_q (V z)_q sum_A 1/z_A (normalised to sum 1/z = 1), the row distribution p of its certificate, the value,
    the certified lower bound and a status (module docstring)."""
    live = V.max(axis=0) > 0
    Vl = V[:, live]
    y = -0.5 * np.log(np.maximum(Vl.mean(axis=0), np.finfo(float).tiny))  # start: z_A ~ 1 / sqrt(mean column)
    best: dict[str, Any] = {"value": math.inf, "lower": 0.0}
    status, nit = STALLED, 0
    for beta in BETAS:
        def loss_grad(y: np.ndarray, beta: float = beta) -> tuple[float, np.ndarray]:
            z = np.exp(y - y.max())
            v = Vl @ z
            top = float(v.max())
            r = (v / top) ** beta
            norm = float(r.sum())
            s = float(np.sum(1.0 / z))
            f = math.log(top) + math.log(norm) / beta + math.log(s)
            g = (r @ Vl) * z / (norm * top) - (1.0 / z) / s
            return f, g

        monitor = LbfgsMonitor(y, deadline, progress, f"max-variance weights (beta {beta:g})")
        res = minimize_lbfgs(loss_grad, y, monitor, maxiter=500, ftol=1e-14, gtol=1e-10)
        nit += int(res.nit)
        y = np.asarray(res.x)
        z = np.exp(y - y.max())
        v = Vl @ z
        value = float(v.max()) * float(np.sum(1.0 / z))
        p = (v / v.max()) ** beta
        lower = family_dual(Vl, p)
        if value < best["value"]:
            best.update(value=value, z=z, p=p)
        if lower > best["lower"]:
            best["lower"], best["p"] = lower, p
        if monitor.stopped:
            status = TIME_LIMIT
            break
        if best["value"] <= (1.0 + tol) * best["lower"]:
            status = CONVERGED
            break
    z_full = np.zeros(V.shape[1])
    z_full[live] = best["z"] * float(np.sum(1.0 / best["z"]))  # sum_A 1 / z_A = 1: sensitivity at most 1
    return z_full, best["p"] / float(best["p"].sum()), best["value"], best["lower"], status


def optimize_residual_kron_max(
    workload: Workload, *, tol: float = 1e-4, bound: bool = True, deadline: float | None = None,
    progress: Progress | None = None,
) -> tuple[ResidualKronMatrix, SolverResult]:
    """The residual Kronecker strategy with the least largest per-query variance (ResidualPlanner's max objective over
    the family of `dpopt.solvers.residual_kron`; module docstring).

    The factors and bases are the sum family's (`optimize_residual_kron`) for the workload, then for its terms
    reweighted by their largest variances (REWEIGHT_ROUNDS rounds); for each, the parts' weights minimise the
    largest variance; the best is kept (the reweighting gained about 1% on 8^3 and 6^3). fun is its largest variance at
    sensitivity at most 1 (the exact strategy's is never above); dual_bound, when `bound`, a certified lower
    bound on the largest variance of every strategy of sensitivity 1; extra["family_bound"] the certificate of the
    weights within the family.
    """
    t0, c0 = time.perf_counter(), time.process_time()
    terms = term_factors(workload)
    found = []
    omega = np.ones(len(terms))
    for _ in range(REWEIGHT_ROUNDS):
        scaled = Stack([Kron([ExplicitWorkload(F) for F in Fs]) for _, Fs in terms],
                       [wt * math.sqrt(o) for (wt, _), o in zip(terms, omega, strict=True)])
        M, res = optimize_residual_kron(scaled, deadline=deadline, progress=progress)
        V, owner, info = variance_rows(M, terms)
        z, p, value, lower, status = max_weights(V, tol, deadline, progress)
        found.append((value, lower, status, M, z, p, owner, info, res))
        top = np.array([float((V[owner == t] @ z).max()) for t in range(len(terms))])
        omega = omega * top / top.max()
        if deadline is not None and time.perf_counter() >= deadline:
            break
    value, lower, status, M, z, p, owner, info, res = min(found, key=lambda f: f[0])
    keep = z > 0
    parts = [(A, Bs) for A, Bs, k in zip(M.subsets, M.factors, keep, strict=True) if k]
    strat = ResidualKronMatrix(M.domain_sizes, M.bases, parts, np.sqrt(1.0 / z[keep]))
    dual, binfo = None, {}
    if bound:  # p uniform over all m queries: OPT_max >= OPT_sum / m (the certificate's own p, spread as a
        # product over each term's attributes, gave a 4-8x weaker bound on 6^3 and 8^3)
        m = sum(math.prod(F.shape[0] for F in Fs) for _, Fs in terms)
        total, binfo = union_lower_bound(UnionTerms.of(workload), deadline=deadline, progress=progress)
        dual = total / m * (1.0 - 2.0 * EPS)
    return strat, SolverResult.since(
        t0, c0, x=z, fun=value, status=status, nit=res.nit, dual_bound=dual,
        gap=None if not dual else value / dual - 1.0,
        message=(f"part weights for the largest variance over {len(found)} reweightings of the sum family; within the "
                 f"family {value:.10g} >= {lower:.10g}"),
        extra={"family_bound": lower, "rows": int(V.shape[0]), "bound_info": binfo,
               "sum_family_value": found[0][0], "values": [f[0] for f in found]},
    )
