"""Certified lower bounds on the (eps, delta) optimum of a union of Kronecker products, through its structure.

The problem is seed 002's, min trace(W^T W X^+) over diag(X) <= 1 (times P(eps, delta)), for
W = [w_k (x)_i F_ki]_k with Gram sum_k a_k (x)_i G_ki. Three bounds, each never above the optimum:

- parts: OPT(W) >= sum_k OPT(term k) (every term is answered by the same strategy, and each at least as badly
  as by its own optimum), and a Kronecker term's optimum is the product of its factors' (their duals multiply,
  `dpopt.hdmm`): sum_k a_k prod_i l_ki with l_ki the certified dual bound of G_ki (`solve_convex_dp`). It is
  above the sum of the parts' SVD bounds, the bound `dpopt.workloads.Stack.error_lower_bound` reports.
- product dual: the Lagrangian dual of seed 002 at product multipliers u = (x)_i u_i,
  OPT >= ||W D_u^{1/2}||_*^2 / sum(u) (`dpopt.bounds.l2_optimum_lower_bound`; u = 1 is the SVD bound of
  the whole union). With thin factors V_ki (V_ki^T V_ki = G_ki, r_ki rows), Z = [sqrt(a_k) (x)_i V_ki D_i^{1/2}]_k
  has ||Z||_* = ||W D^{1/2}||_*, and Z Z^T is formed block by block from the factors,
  Z_k Z_l^T = sqrt(a_k a_l) (x)_i V_ki D_i V_li^T, never an n x n matrix: its size is sum_k prod_i r_ki.
  The bound is maximised over u by L-BFGS on log u (one u_i per group of attributes with the same factors), with
  gradient d||Z||_* = 1/2 trace((Z Z^T)^{-1/2} d(Z Z^T)). Measured on the 1- and 2-way Prefix marginals of 8^3:
  the best product u gives 2041.13 against the optimum 2044.02 (the SVD bound, u = 1: 1866.57).
- groups: OPT(W) >= sum_g OPT(W_g) for any partition of the terms into groups; a union too large for one
  product dual (`MAX_DUAL_ROWS`) is split into groups of terms that share attributes, each bounded by the
  larger of its product dual and its parts.

Round-off only lowers every bound: the eigenvalues of Z Z^T lose their backward error and that of forming the
blocks (5 (s + sum_i n_i) eps lambda_max, s the size), the dual factors' bounds are certified by their solver.
"""

from __future__ import annotations

import math
import string
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpopt.bounds import EPS, svdb_from_singular_value_bounds
from dpopt.solvers.convex_dp import solve_convex_dp
from dpopt.solvers.lbfgs import LbfgsMonitor, minimize_lbfgs
from dpopt.solvers.residual_kron import Progress, UnionTerms, _is_total

#: Largest Z Z^T (rows) the product dual decomposes; larger unions are bounded in groups of terms.
MAX_DUAL_ROWS = 6000
#: Relative gap of the factor solves behind the parts bound.
PARTS_TOL = 1e-9


def _thin(G: np.ndarray) -> np.ndarray:
    """V (r x n) with V^T V = G over G's numerical range; one row sqrt(c) 1^T for G = c 1 1^T."""
    n = G.shape[0]
    if _is_total(G):
        return np.full((1, n), math.sqrt(float(G.sum()) / (n * n)))
    lam, E = np.linalg.eigh((G + G.T) / 2)
    keep = lam > 1e-13 * float(lam.max())
    return np.sqrt(lam[keep])[:, None] * E[:, keep].T


def parts_bound(terms: UnionTerms, members: list[int] | None = None) -> float:
    """sum_k a_k prod_i l_ki over the terms (all, or `members`): the certified seed 002 optima of the terms alone."""
    memo: dict[bytes, float] = {}

    def factor(G: np.ndarray) -> float:
        key = G.tobytes()
        if key not in memo:
            n = G.shape[0]
            if _is_total(G):  # the total query alone: the optimum is its own value, c (SVD bound, tight)
                memo[key] = float(G.sum()) / (n * n)
            else:
                res = solve_convex_dp(G, tol=PARTS_TOL)
                memo[key] = float(res.dual_bound) if res.dual_bound is not None else 0.0
        return memo[key]

    ks = range(len(terms.a)) if members is None else members
    total = sum(terms.a[k] * math.prod(factor(G) for G in terms.grams[k]) for k in ks)
    return total * (1.0 - 4.0 * len(terms.sizes) * EPS)  # products and sums rounded: stay below the exact value


@dataclass
class DualPoint:
    """The product dual at multipliers u_i: certified bound, value and gradient in log u_i (per attribute)."""

    bound: float
    value: float
    grad: list[np.ndarray]


class ProductDual:
    """Seed 002's Lagrangian dual ||W D_u^{1/2}||_*^2 / sum(u) at product multipliers, through the blocks Z_k Z_l^T
    (module docstring)."""

    def __init__(self, terms: UnionTerms, members: list[int] | None = None) -> None:
        self.terms = terms
        self.ks = list(range(len(terms.a))) if members is None else list(members)
        self.V = {k: [_thin(G) for G in terms.grams[k]] for k in self.ks}
        self.rows = {k: [V.shape[0] for V in self.V[k]] for k in self.ks}
        self.size = sum(math.prod(r) for r in self.rows.values())

    def evaluate(self, us: list[np.ndarray], gradient: bool = True) -> DualPoint:
        """The bound at u = (x)_i us[i] (each us[i] > 0), with d value / d log u_i when `gradient`."""
        t, ks = self.terms, self.ks
        d = len(t.sizes)
        C = {(k, l): [(self.V[k][i] * us[i]) @ self.V[l][i].T for i in range(d)] for k in ks for l in ks}
        off = np.cumsum([0] + [math.prod(self.rows[k]) for k in ks])
        K = np.empty((self.size, self.size))
        for a, k in enumerate(ks):
            for b, l in enumerate(ks):
                blk = np.ones((1, 1))
                for M in C[k, l]:
                    blk = np.kron(blk, M)
                K[off[a]:off[a + 1], off[b]:off[b + 1]] = math.sqrt(t.a[k] * t.a[l]) * blk
        K = (K + K.T) / 2
        if gradient:
            lam, E = np.linalg.eigh(K)
        else:
            lam, E = np.linalg.eigvalsh(K), None
        top = float(np.max(np.abs(lam)))
        err = 5.0 * (self.size + sum(t.sizes)) * EPS * top
        sigma = np.sqrt(np.clip(lam - err, 0.0, None))
        sums = [float(u.sum()) for u in us]
        total_u = math.prod(sums) * (1.0 + (d + 2) * EPS)  # above the exact sum(u): the bound only drops
        bound = svdb_from_singular_value_bounds(sigma, 1.0, term_rel_err=EPS) / total_u * (1.0 - 2.0 * EPS)
        live = lam > 1e-12 * top
        T = float(np.sqrt(lam[live]).sum())
        value = T * T / math.prod(sums)
        grads: list[np.ndarray] = [np.zeros(len(u)) for u in us]
        if gradient:
            assert E is not None
            R = (E[:, live] / np.sqrt(lam[live])) @ E[:, live].T  # (Z Z^T)^{-1/2} on its range
            for a, k in enumerate(ks):
                for b, l in enumerate(ks):
                    Rkl = R[off[a]:off[a + 1], off[b]:off[b + 1]].reshape(self.rows[k] + self.rows[l])
                    for i in range(d):
                        Gam = _contract_except(Rkl, C[k, l], i, d)
                        dT = 0.5 * math.sqrt(t.a[k] * t.a[l]) * np.einsum("pj,pq,qj->j", self.V[k][i], Gam,
                                                                          self.V[l][i])
                        grads[i] += dT  # d T / d u_i
            grads = [(2.0 * T * g / math.prod(sums) - value / s) * u for g, s, u in zip(grads, sums, us, strict=True)]
        return DualPoint(bound, value, grads)


def _contract_except(R: np.ndarray, Cs: list[np.ndarray], keep: int, d: int) -> np.ndarray:
    """sum over every row index p_j and column index q_j (j != keep) of R[p, q] prod_j Cs[j][p_j, q_j]."""
    letters = string.ascii_letters
    rows, cols = letters[:d], letters[d:2 * d]
    ops = [R] + [Cs[j] for j in range(d) if j != keep]
    subs = [rows + cols] + [rows[j] + cols[j] for j in range(d) if j != keep]
    return np.einsum(",".join(subs) + "->" + rows[keep] + cols[keep], *ops, optimize=True)


def product_dual_bound(terms: UnionTerms, members: list[int] | None = None, *, max_iter: int = 60,
                       deadline: float | None = None, progress: Progress | None = None) -> tuple[float, dict[str, Any]]:
    """The best seed 002 dual at product multipliers found by L-BFGS on log u from u = 1 (the SVD bound, seed 004
    Def. 4.1), and how it went."""
    dual = ProductDual(terms, members)
    group = terms.groups()
    n_groups = max(group) + 1
    size_of = {g: terms.sizes[group.index(g)] for g in range(n_groups)}
    cuts = np.cumsum([size_of[g] for g in range(n_groups)])[:-1]

    def us(z: np.ndarray) -> list[np.ndarray]:
        zs = np.split(z, cuts)
        return [np.exp(zs[g] - zs[g].max()) for g in group]

    t_first = time.perf_counter()
    first = dual.evaluate(us(np.zeros(sum(size_of.values()))), gradient=False)
    cost = 3.0 * (time.perf_counter() - t_first)  # an evaluation with eigenvectors and gradient, about
    best = {"bound": first.bound, "svd": first.bound}
    if deadline is not None:  # as many iterations (about two evaluations each) as end within the deadline
        max_iter = min(max_iter, int((deadline - time.perf_counter()) / (2.0 * cost)))

    def loss_grad(z: np.ndarray) -> tuple[float, np.ndarray]:
        p = dual.evaluate(us(z))
        best["bound"] = max(best["bound"], p.bound)
        g = np.concatenate([sum(p.grad[i] for i in range(len(group)) if group[i] == gr) for gr in range(n_groups)])
        return -math.log(p.value), -g / p.value

    z0 = np.zeros(sum(size_of.values()))
    nit = 0
    if max_iter > 0 and not (deadline is not None and time.perf_counter() >= deadline):
        monitor = LbfgsMonitor(z0, deadline, progress, "product dual bound")
        res = minimize_lbfgs(loss_grad, z0, monitor, maxiter=max_iter, ftol=1e-10, gtol=1e-8)
        nit = int(res.nit)
    return best["bound"], {"svd_bound": best["svd"], "iterations": nit, "rows": dual.size}


def _groups(terms: UnionTerms, max_rows: int) -> list[list[int]]:
    """Terms packed greedily into groups of at most max_rows dual rows, each term joining the group it shares
    most attributes with (a term above max_rows alone)."""
    rows = [math.prod(_thin(G).shape[0] for G in Gs) for Gs in terms.grams]
    order = sorted(range(len(rows)), key=lambda k: (-len(terms.support[k]), -rows[k], k))
    groups: list[list[int]] = []
    used: list[int] = []
    for k in order:
        fits = [g for g in range(len(groups)) if used[g] + rows[k] <= max_rows]
        if fits:
            share = [len(set(terms.support[k]) & {i for j in groups[g] for i in terms.support[j]}) for g in fits]
            g = fits[int(np.argmax(share))]
            groups[g].append(k)
            used[g] += rows[k]
        else:
            groups.append([k])
            used.append(rows[k])
    return groups


def union_lower_bound(workload_terms: UnionTerms, *, max_rows: int = MAX_DUAL_ROWS, max_iter: int = 60,
                      deadline: float | None = None, progress: Progress | None = None) -> tuple[float, dict[str, Any]]:
    """The tightest of the module's certified bounds on seed 002's min trace(W^T W X^+) s.t. diag(X) <= 1, and its parts.

    Returns (bound, info) with info["parts"] (sum of the terms' optima), info["svd_bound"] (the product dual at
    u = 1, when the union fits one dual), info["kind"] naming the bound returned, and the group sizes.
    """
    terms = workload_terms
    parts = parts_bound(terms)
    info: dict[str, Any] = {"parts": parts}
    dual_rows = ProductDual(terms).size
    if dual_rows <= max_rows:
        value, extra = product_dual_bound(terms, max_iter=max_iter, deadline=deadline, progress=progress)
        info.update(extra)
        info["product_dual"] = value
        best, kind = max((value, "product dual"), (parts, "sum of the parts' optima"))
        info["kind"] = kind
        return best, info
    total, sizes = 0.0, []
    for g in _groups(terms, max_rows):
        own = parts_bound(terms, g)
        if len(g) > 1:
            left = None if deadline is None else deadline
            value, extra = product_dual_bound(terms, g, max_iter=max_iter, deadline=left, progress=progress)
            own = max(own, value)
        total += own
        sizes.append(len(g))
    total *= 1.0 - 2.0 * len(sizes) * EPS
    info["groups"] = sizes
    best, kind = max((total, f"product duals of {len(sizes)} groups of terms"), (parts, "sum of the parts' optima"))
    info["kind"] = kind
    return best, info
