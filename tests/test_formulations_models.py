"""Every convex model: SCS and Clarabel agree, known orderings hold, small optima match independent numbers."""

from __future__ import annotations

import math

import cvxpy as cp
import numpy as np
import pytest
from conftest import require_shared

from dpopt.baselines import hierarchical_strategy, identity_strategy, wavelet_strategy
from dpopt.bounds import svd_bound_from_gram
from dpopt.error import expected_error
from dpopt.privacy import Privacy
from dpopt.workloads import AllRange, Identity, Prefix, WidthK, WRange, WRelated
from formulations import appendix_b, eigen_design, mm_approx, mm_pure, per_query
from formulations.solve import FormulationError, solve

# SCS (tightened) vs Clarabel, relative: 100x the loosest stopping tolerance used below (1e-6). SCS's
# eps bounds scaled primal/dual residuals and the gap, not the objective's relative error, which can be
# two orders larger on badly scaled models (see SCS_TOL_CASE: 1.5e-4 off at eps = 1e-6).
AGREE_RTOL = 1e-4
# The tolerance Clarabel reaches on every model: below 1e-6 it stops with "insufficient progress"
# (CVXPY: optimal_inaccurate) on some cut-laden mm_pure models, e.g. WRange(32, 16), pinned by
# test_clarabel_stall_below_its_reached_tolerance_is_explicit; 1e-6 is still two orders tighter than
# the agreement asked for.
CLARABEL_TOL = 1e-6
SCS_TOL = 1e-9  # tightened from SCS's default 1e-4
# SCS converges slowly on per_query at tight tolerances, most on WidthK (whitened model, measured here:
# WidthK(16, 4) takes 14,525 iterations at 1e-6 and 58,575 at 1e-7; 1e-6 agrees with Clarabel to 3e-6
# there and to 2.2e-6 or better on Prefix, WidthK, WRange and WRelated at n = 64, WidthK(64, 16) in
# 1,050 iterations).
# Likewise on appendix_b from n = 32 on (no convergence within 200,000 iterations at 1e-9).
SCS_TOL_MODEL = {"per_query": 1e-6, "appendix_b": 1e-6}
# At n = 64, 1e-6 is not enough for appendix_b on AllRange and Prefix: SCS stops there 1.5e-4 and 1.2e-4
# below Clarabel's optimum (AllRange(64): 69,950 iterations). At 1e-7 it converges (78,125 and 31,425
# iterations, duality gap < 1e-7) and agrees to 2e-5 and 5e-5 (measured on this machine); the other
# families agree at 1e-6.
SCS_TOL_CASE = {("appendix_b", "allrange", 64): 1e-7, ("appendix_b", "prefix", 64): 1e-7}
GAUSS = Privacy(1.0, 1e-6)


def family(name: str, n: int):
    """The five workload families of the cross-solver tests at domain size n."""
    if name == "allrange":
        return AllRange(n)
    if name == "prefix":
        return Prefix(n)
    if name == "widthk":
        return WidthK(n, max(2, n // 4))
    if name == "wrange":
        return WRange(2 * n, n, seed=1)
    if name == "wrelated":
        return WRelated(2 * n, n, max(2, n // 4), seed=1)
    raise ValueError(name)


FAMILIES = ["allrange", "prefix", "widthk", "wrange", "wrelated"]


def per_query_bounds(W: np.ndarray, seed: int = 0) -> np.ndarray:
    """Variance bounds c_i = ||w_i||^2 * U(0.5, 1.5): the identity strategy is feasible at t <= 2."""
    rng = np.random.default_rng(seed)
    return np.einsum("ij,ij->i", W, W) * rng.uniform(0.5, 1.5, size=W.shape[0])


BUILDERS = {
    "mm_approx": mm_approx.build,
    "eigen_design": eigen_design.build,
    "appendix_b": appendix_b.build,
    "mm_pure": mm_pure.build,
    "per_query": lambda w: per_query.build(w, per_query_bounds(w.matrix())),
}


def _agree(model_name: str, fam: str, n: int) -> tuple[float, float]:
    w = family(fam, n)
    a = solve(BUILDERS[model_name](w), "clarabel", tol=CLARABEL_TOL)
    scs_tol = SCS_TOL_CASE.get((model_name, fam, n), SCS_TOL_MODEL.get(model_name, SCS_TOL))
    b = solve(BUILDERS[model_name](w), "scs", tol=scs_tol)
    assert a.objective > 0
    rel = abs(a.objective - b.objective) / abs(a.objective)
    assert rel <= AGREE_RTOL, f"{model_name} on {w.name}: clarabel {a.objective} vs scs {b.objective}"
    return a.objective, b.objective


def _cases(sizes, slow: bool):
    """(model, family, n) triples; the expensive ones (measured on this 2-core machine) are slow."""
    out = []
    for n in sizes:
        for model_name in BUILDERS:
            for fam in FAMILIES:
                # From n = 32 on, every SDP takes Clarabel several seconds on this machine.
                expensive = n >= 32 and model_name != "eigen_design"
                if expensive == slow:
                    out.append((model_name, fam, n))
    return out


@pytest.mark.parametrize("model_name,fam,n", _cases([8, 16, 32, 64], slow=False))
def test_scs_and_clarabel_agree(model_name, fam, n):
    _agree(model_name, fam, n)


def test_scs_and_clarabel_agree_n32_allrange_sdp():
    _agree("mm_approx", "allrange", 32)


@pytest.mark.slow
@pytest.mark.parametrize("model_name,fam,n", _cases([16, 32, 64], slow=True))
def test_scs_and_clarabel_agree_large(model_name, fam, n):
    # The n = 64 cases are the longest of the suite. mm_pure (with its triangle cuts), measured one at a
    # time at load ~5 on 2 cores: Clarabel 60-330 CPU s and up to 3.7 GB per family (AllRange 283 s,
    # Prefix 329, WidthK 166, WRange 329, WRelated 60), SCS at 1e-9 4-144 CPU s; they agreed to 8e-10
    # or better. per_query: 5 cases in 865 CPU s, Clarabel on AllRange(64) most of it.
    _agree(model_name, fam, n)


def test_clarabel_stall_below_its_reached_tolerance_is_explicit():
    # Why CLARABEL_TOL is 1e-6: on mm_pure with WRange(32, 16) Clarabel reaches its 1e-6 stopping rule
    # (status optimal, relative gap ~1e-7, a tenth of the tolerance) but at 1e-8 it stopped here with
    # insufficient progress, which CVXPY reports as optimal_inaccurate. Whether it stalls just above 1e-8
    # or just reaches it depends on the last bits of the data (the Gram's eigendecomposition), so the
    # test asserts what holds either way: an inaccurate 1e-8 status is refused unless accepted, an
    # optimal one certifies its gap, and either point agrees with SCS at 1e-9 to the 1e-4 asked for.
    w = WRange(32, 16, seed=1)
    tight = solve(mm_pure.build(w), "clarabel", tol=1e-8, accept_inaccurate=True)
    if tight.inaccurate:
        with pytest.raises(FormulationError, match=tight.status):
            solve(mm_pure.build(w), "clarabel", tol=1e-8)
    else:
        assert abs(tight.gap) <= 1e-8
    reached = solve(mm_pure.build(w), "clarabel", tol=CLARABEL_TOL)
    scs = solve(mm_pure.build(w), "scs", tol=SCS_TOL)
    assert reached.status == "optimal" and scs.status == "optimal"
    assert abs(reached.gap) <= CLARABEL_TOL
    assert abs(tight.objective - scs.objective) / scs.objective <= AGREE_RTOL
    assert abs(reached.objective - scs.objective) / scs.objective <= AGREE_RTOL


def test_smoothed_appendix_b_agrees_and_brackets_the_max():
    w = family("wrange", 8)
    exact = solve(appendix_b.build(w), "clarabel").objective
    mu = 0.5
    a = solve(appendix_b.build(w, mu=mu), "clarabel").objective
    b = solve(appendix_b.build(w, mu=mu), "scs", tol=SCS_TOL).objective
    assert abs(a - b) / a <= AGREE_RTOL
    # smoothing only raises the max, by at most mu log(m); both Clarabel values are within the default
    # relative gap 1e-8 of their optima, so 1e-7 relative (and 1e-6 absolute above) covers them
    assert exact * (1 - 1e-7) <= a <= exact + mu * math.log(8) + 1e-6


# --- orderings ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("fam", FAMILIES)
@pytest.mark.parametrize("n", [8, 16])
def test_sdp_optimum_between_svd_bound_and_every_strategy(fam, n):
    w = family(fam, n)
    G = w.gram()
    P = GAUSS.variance_factor
    res = solve(mm_approx.build(w), "clarabel")
    sdp = P * res.objective
    # The recovered strategy attains the optimum (seed 002: the SDP is exact for (eps, delta)): it is built
    # from Clarabel's point (default gap and feasibility 1e-8), whose residuals move its exact error by
    # ~ 1e-8 times cond(X) (<= ~100 at n <= 16); compared at 1e-6. Orderings below: 1e-7 covers
    # Clarabel's 1e-8 on the SDP value (the SVD bound is computed to round only downwards).
    assert expected_error(res.strategy, w, GAUSS).total == pytest.approx(sdp, rel=1e-6)
    svdb = P * svd_bound_from_gram(G)
    eigen = solve(eigen_design.build(w), "clarabel").strategy
    errors = {
        s.name: expected_error(s, w, GAUSS).total
        for s in (eigen, wavelet_strategy(n), hierarchical_strategy(n), identity_strategy(n))
    }
    assert svdb <= sdp * (1 + 1e-7)
    for name, err in errors.items():
        assert sdp <= err * (1 + 1e-7), f"SDP optimum above {name} on {w.name}"
    # Eigen-design contains the identity (u = 1), so it is never worse than it.
    assert errors["eigen_design"] <= errors["identity"] * (1 + 1e-7)
    assert mm_approx.report(res.strategy, w, GAUSS)["ratio"] == pytest.approx(sdp / svdb, rel=1e-6)


@pytest.mark.parametrize("fam", FAMILIES)
def test_appendix_b_equals_the_sdp(fam):
    w = family(fam, 8)
    sdp = solve(mm_approx.build(w), "clarabel").objective
    res = solve(appendix_b.build(w), "clarabel")
    # two Clarabel models at the default 1e-8 (relative gap) of the same optimum
    assert res.objective == pytest.approx(sdp, rel=1e-6)
    # Its strategy (normalised to sens2 = 1, column norms of n = 8 entries: n eps) attains the same value,
    # up to the solver's residuals (1e-8) amplified by the recovery (cond(X) <= ~100): 1e-6.
    s = res.strategy
    assert s.sens2 == pytest.approx(1.0, rel=1e-12)
    assert float(np.trace(w.gram() @ s.gram_pinv())) == pytest.approx(sdp, rel=1e-6)


def test_identity_workload_optimum_is_the_identity():
    # For W = I the SVD bound is tight: SVDB = n and X = I is optimal.
    res = solve(mm_approx.build(Identity(6)), "clarabel")
    # Clarabel's default relative gap 1e-8; 1e-7
    assert res.objective == pytest.approx(6.0, rel=1e-7)
    assert solve(eigen_design.build(Identity(6)), "clarabel").objective == pytest.approx(6.0, rel=1e-7)


# --- ALLRANGE(n): the SDP against an independent first-order computation -----------------------------


def _dual_value(G: np.ndarray, u: np.ndarray) -> float:
    """Weak-duality lower bound 2 tr((U^1/2 G U^1/2)^1/2) - sum(u) on min tr(G X^-1), diag(X) <= 1."""
    r = np.sqrt(u)
    lam = np.linalg.eigvalsh((r[:, None] * G) * r[None, :])
    return float(2.0 * np.sqrt(np.clip(lam, 0.0, None)).sum() - u.sum())


def projected_gradient_opt(G: np.ndarray, gap_tol: float = 1e-9, max_iter: int = 100_000) -> float:
    """min trace(G X^{-1}) over {diag(X) = 1, X > 0} by projected gradient (written for this test).

    For G > 0 the optimum of the diag(X) <= 1 problem has diag(X) = 1 (seed 002, Lemma 5), so the
    feasible set is affine and the projection of the gradient -X^{-1} G X^{-1} zeroes its diagonal.
    Step sizes: Barzilai-Borwein, halved until X stays positive definite (Cholesky) and the Armijo
    condition holds. Stops on a certified relative duality gap: the Lagrangian dual at the
    multipliers u = diag(X^{-1} G X^{-1}) (exact at the optimum, KKT) is a lower bound for any
    u > 0, so (f - dual) / f <= gap_tol bounds the reference's own error. gap_tol = 1e-9 sits well
    above float64's attainable accuracy here (f and the dual are sums of n^2 well-scaled terms,
    relative round-off ~ n * 1e-16) and well below the 1e-6 the test compares at.
    """
    n = G.shape[0]
    X = np.eye(n)

    def f(M: np.ndarray) -> float:
        return float(np.trace(G @ np.linalg.inv(M)))

    fx, step = f(X), 1e-2
    X_prev = D_prev = None
    for _ in range(max_iter):
        Xi = np.linalg.inv(X)
        D = Xi @ G @ Xi
        u = np.diag(D).copy()
        if fx - _dual_value(G, u) <= gap_tol * fx:
            return fx
        np.fill_diagonal(D, 0.0)
        nd = float(np.linalg.norm(D))
        if X_prev is not None:
            s, y = (X - X_prev).ravel(), (D_prev - D).ravel()
            if s @ y > 0:
                step = float(s @ s) / float(s @ y)
        while step > 1e-300:
            Xn = X + step * D
            try:
                np.linalg.cholesky(Xn)
            except np.linalg.LinAlgError:
                step /= 2
                continue
            fn = f(Xn)
            if fn <= fx - 1e-4 * step * nd * nd:
                break
            step /= 2
        else:
            break  # no step decreases f in float64: stalled before the certified gap
        X_prev, D_prev, X, fx = X, D, Xn, fn
    raise AssertionError(f"projected gradient did not reach a certified gap of {gap_tol:g}")


@pytest.mark.parametrize("n", [4, 6, 8, 10])
def test_allrange_sdp_matches_projected_gradient(n):
    G = AllRange(n).gram()
    pg = projected_gradient_opt(G)
    # The reference is certified to 1e-9; Clarabel at 1e-9 (relative gap) adds as much: 1e-7. SCS at 1e-9
    # is good to ~1e-6 relative at best (a first-order method on scaled residuals): 1e-5.
    for solver, tol, rtol in (("clarabel", 1e-9, 1e-7), ("scs", SCS_TOL, 1e-5)):
        assert solve(mm_approx.build(G), solver, tol=tol).objective == pytest.approx(pg, rel=rtol)


# --- eps-DP relaxation: a lower bound on every feasible eps-DP strategy --------------------------------


def _l1_unit_error(strategy, w) -> float:
    return expected_error(strategy, w, Privacy(1.0)).total / Privacy(1.0).variance_factor


@pytest.mark.parametrize("fam", FAMILIES)
def test_pure_relaxation_bounds_every_eps_dp_strategy(fam, record_property):
    from dpopt.solvers.lrm import solve_lrm
    from dpopt.strategy import Strategy

    n = 8
    w = family(fam, n)
    bound = solve(mm_pure.build(w), "clarabel").objective
    l2 = solve(mm_approx.build(w), "clarabel")
    lam, Q = np.linalg.eigh(l2.strategy.gram)
    sqrt_root = Strategy((Q * np.sqrt(np.clip(lam, 0, None))) @ Q.T, name="l2-opt (sqrt)")
    lrm = solve_lrm(w.matrix(), seed=0)
    assert lrm.success  # its contract: ||W - B L|| <= 1e-6 ||W||
    B, L = lrm.x
    candidates = {
        "identity": identity_strategy(n),
        "hierarchical": hierarchical_strategy(n),
        "wavelet": wavelet_strategy(n),
        "l2-opt (cholesky)": l2.strategy,
        "l2-opt (sqrt)": sqrt_root,
        "eigen_design": solve(eigen_design.build(w), "clarabel").strategy,
    }
    errors = {k: _l1_unit_error(s, w) for k, s in candidates.items()}
    errors["lrm"] = float(np.sum(B * B)) * float(np.abs(L).sum(axis=0).max()) ** 2
    # Clarabel's bound is within its default 1e-8 of the relaxation's optimum: 1e-7. The LRM pair answers
    # B L, which equals W only to 1e-6 relatively; the bound for B L differs from W's by ~2e-6: 1e-5.
    slack = {name: 1e-5 if name == "lrm" else 1e-7 for name in errors}
    for name, err in errors.items():
        assert bound <= err * (1 + slack[name]), f"relaxation above the L1 error of {name} on {w.name}"
    best = min(errors, key=errors.get)
    record_property("gap", errors[best] / bound)
    print(f"{w.name}: bound {bound:.4f}, best {best} {errors[best]:.4f}, gap {errors[best] / bound:.3f}")


def test_triangle_cuts_hold_for_every_l1_strategy_and_can_bind():
    rng = np.random.default_rng(7)
    T = mm_pure.triangle_matrix(6)
    for p in (1, 2, 3, 6, 12):
        for _ in range(50):
            A = rng.standard_normal((p, 6)) * (rng.random((p, 6)) < 0.6)
            A /= np.maximum(np.abs(A).sum(axis=0), 1e-300) * rng.uniform(1.0, 2.0, size=6)
            # columns of L1 norm <= 1 after one division: the cut values carry a few eps of round-off
            assert (T @ (A.T @ A).ravel(order="F")).min() >= -1 - 1e-12
    # Vertices of the L1 ball attain -1: a = e1, b = -e1, c = 0 ... and a = e1, b = -e1/2 + e2/2, etc.
    A = np.array([[1.0, -1.0, 0.0, 0.0, 0.0, 0.0]])
    assert (T @ (A.T @ A).ravel(order="F")).min() == -1.0  # entries 0, +-1: exact in floating point
    # On a random low-rank workload the cuts are active: the bound rises above the L2 relaxation.
    w = family("wrelated", 8)
    cut = solve(mm_pure.build(w), "clarabel").objective
    no_cut = solve(mm_pure.build(w, cuts=None), "clarabel").objective
    assert cut > no_cut * (1 + 1e-3)  # 2.7% here; each value within Clarabel's 1e-8


def test_seed_lifting_does_not_change_the_value():
    w = family("wrange", 6)
    lifted = solve(mm_pure.build(w, cuts=None, lifted=True), "clarabel").objective
    plain = solve(mm_pure.build(w, cuts=None), "clarabel").objective
    sdp = solve(mm_approx.build(w), "clarabel").objective
    # three Clarabel models (default relative gap 1e-8) of the same optimum
    assert lifted == pytest.approx(plain, rel=1e-6)
    assert plain == pytest.approx(sdp, rel=1e-6)
    # 2 / eps^2 = 8 for eps = 1/2: products by powers of two, exact up to the order of two roundings
    assert mm_pure.bound(plain, Privacy(0.5)) == pytest.approx(8.0 * plain, rel=1e-15)
    with pytest.raises(ValueError, match="delta = 0"):
        mm_pure.bound(plain, GAUSS)


# --- per-query accuracy --------------------------------------------------------------------------------


def test_per_query_identity_workload_is_analytic():
    # W = I: X_ii (X^{-1})_ii >= 1 gives t >= max_i 1 / c_i, attained by X = diag(1 / c).
    c = np.array([0.5, 1.0, 2.0, 4.0])
    for solver in ("clarabel", "scs"):
        res = solve(per_query.build(Identity(4), c), solver, tol=1e-9)
        # Clarabel at 1e-9 (relative gap); SCS at 1e-9 is good to ~1e-6 at best: 1e-5 for both
        assert res.objective == pytest.approx(2.0, rel=1e-5 if solver == "scs" else 1e-7)


def _unit_variances(strategy, W: np.ndarray) -> np.ndarray:
    """Variance of every query under unit noise per unit sensitivity: sens2^2 diag(W (A^T A)^+ W^T)."""
    return strategy.sens2**2 * strategy.query_unit_variances(W)


@pytest.mark.parametrize("fam", ["prefix", "wrange", "wrelated"])
def test_per_query_strategy_meets_every_bound_and_scales(fam):
    w = family(fam, 8)
    W = w.matrix()
    c = per_query_bounds(W)
    res = solve(per_query.build(w, c), "clarabel")
    t = res.objective
    s = res.strategy
    assert s.sens2 == pytest.approx(1.0, rel=1e-12)  # normalised: column norms of n = 8 entries, n eps
    # With sens2 = 1 and unit noise per unit sensitivity the variances are at most t * c_i, i.e. the
    # bounds hold at variance factor P = 1 / t; at least one bound is active. The strategy comes from
    # Clarabel's point (default 1e-8), its residuals amplified by the recovery (cond(X) <= ~100): 1e-6.
    ratio = _unit_variances(s, W) / (t * c)
    assert ratio.max() == pytest.approx(1.0, rel=1e-6)
    # Halving every bound doubles the least privacy cost (two solves, each within 1e-8).
    assert solve(per_query.build(w, c / 2), "clarabel").objective == pytest.approx(2 * t, rel=1e-6)


def test_per_query_with_the_sdp_variances_costs_at_most_one():
    # The total-error optimum (diag X <= 1) meets its own per-query variances, so t* <= 1.
    w = family("prefix", 8)
    W = w.matrix()
    v = _unit_variances(solve(mm_approx.build(w), "clarabel").strategy, W)
    assert solve(per_query.build(w, v * 1.01), "clarabel").objective <= 1.0 / 1.01 * (1 + 1e-6)


def _per_query_orthonormal_basis(W: np.ndarray, c: np.ndarray) -> float:
    """The per-query SDP in the orthonormal row-space basis (before whitening), solved by Clarabel."""
    _, sing, Vt = np.linalg.svd(W, full_matrices=False)
    U = Vt[sing > 1e-6 * sing[0]].T
    V = W @ U
    n, k = U.shape
    S = cp.Variable((k, k), symmetric=True)
    Z = cp.Variable((n, n), symmetric=True)
    t = cp.Variable()
    problem = cp.Problem(
        cp.Minimize(t),
        [
            cp.bmat([[S, U.T], [U, Z]]) >> 0,
            cp.diag(Z) <= t,
            cp.sum(cp.multiply(V @ S, V), axis=1) <= c,
        ],
    )
    return solve(problem, "clarabel", tol=1e-9).objective


@pytest.mark.parametrize("fam", ["widthk", "wrange", "wrelated"])
def test_per_query_whitened_model_has_the_orthonormal_basis_optimum(fam):
    # The whitening S = R S' R is a change of variables: same t. A zero query (bound 0) is appended to
    # check that dropping it before whitening loses nothing.
    W = np.vstack([family(fam, 8).matrix(), np.zeros((1, 8))])
    c = np.append(per_query_bounds(W[:-1]), 0.0)
    model = per_query.build(W, c)
    t = solve(model, "clarabel", tol=1e-9).objective
    # two Clarabel solves at 1e-9 (relative gap) of the same optimum: 1e-7
    assert t == pytest.approx(_per_query_orthonormal_basis(W[:-1], c[:-1]), rel=1e-7)
    # Every bound holds for the recovered strategy at variance factor 1 / t, one is active (the strategy
    # from the solver's point: its 1e-9 residuals amplified by the recovery, cond <= ~100; 1e-6).
    ratio = _unit_variances(per_query.to_strategy(model), W[:-1]) / (t * c[:-1])
    assert ratio.max() == pytest.approx(1.0, rel=1e-6)


def test_per_query_whitened_rows_form_a_tight_frame():
    w = family("wrange", 8)
    W = w.matrix()
    c = per_query_bounds(W)
    model = per_query.build(w, c)
    P, R, U, L = (model.data[key] for key in ("rows", "R", "U", "basis"))
    k = U.shape[1]
    # Dense factorizations at k = 8 with cond(R) = cond(L) ~ 10: errors ~ k cond eps ~ 2e-14 (relative to
    # the unit-scale U and P): 1e-12.
    np.testing.assert_allclose(P.T @ P, np.eye(k), atol=1e-12)
    np.testing.assert_allclose(L @ R, U, atol=1e-12)
    # c_i p_i S' p_i^T is the variance v_i S v_i^T of query i with S = R S' R (v_i = w_i U).
    rng = np.random.default_rng(3)
    G = rng.standard_normal((k, k))
    S_white = G @ G.T
    S = R @ S_white @ R
    np.testing.assert_allclose(
        c * np.einsum("ij,jk,ik->i", P, S_white, P),
        np.einsum("ij,jk,ik->i", W @ U, S, W @ U),
        rtol=1e-10,  # positive quadratic forms through R twice: ~ k eps cond(R)^2 ~ 2e-13 relative
    )
    # X = L S'^{-1} L^T = U S^{-1} U^T: two solves with cond(S) ~ 4e4 (S = R S' R, S' random), so the
    # entries agree to ~ k cond(S) eps ||X|| (7e-11 ||X||), not elementwise relative; 10x that.
    X_white, X_plain = L @ np.linalg.solve(S_white, L.T), U @ np.linalg.solve(S, U.T)
    atol = 10 * k * np.linalg.cond(S) * np.finfo(float).eps * np.abs(X_plain).max()
    np.testing.assert_allclose(X_white, X_plain, rtol=0, atol=atol)
    # Scaling W by a and c by a^2 leaves the whitened data unchanged (up to the rounding of the scaled
    # inputs through factorizations with cond ~ 10: ~1e-14).
    scaled = per_query.build(7.0 * W, 49.0 * c)
    np.testing.assert_allclose(np.abs(scaled.data["rows"]), np.abs(P), atol=1e-12)
    np.testing.assert_allclose(scaled.data["basis"] @ scaled.data["basis"].T, L @ L.T, atol=1e-12)


def test_per_query_prefix_basis_is_sparse_and_the_same_program():
    w = AllRange(8)
    W = w.matrix()
    c = np.full(W.shape[0], 2.0)  # equal bounds: D^T C^-1 D = ((n + 1) I - J) / 2, so R is I and J only
    model = per_query.build(w, c)  # auto: a full-rank range workload with more queries than cells
    assert model.data["row_basis"] == "prefix"
    P, R, U, L = (model.data[key] for key in ("rows", "R", "U", "basis"))
    k = U.shape[1]
    # Rows of ranges not starting at cell 0 keep the two nonzeros of e_b - e_{a-1} (d_i 1 = 0), the
    # 8 prefix rows are dense: 2 (36 - 8) + 8 * 8 stored entries.
    assert P.nnz == 2 * (W.shape[0] - k) + k * k
    # Whitened as in the basis U: P^T P = I up to eigh's rounding, k cond eps with cond that of
    # D^T C^-1 D (9 here), and the dropped entries (each below k eps max|P|); 10x that.
    D = per_query.prefix_differences(W)
    eps, cond_r2 = np.finfo(float).eps, np.linalg.cond(D.T @ (D / c[:, None]))
    np.testing.assert_allclose((P.T @ P).toarray(), np.eye(k), atol=10 * k * cond_r2 * eps)
    # U = T^T: W = D T, so each variance w_i X^{-1} w_i^T with X = U S^{-1} U^T is d_i S d_i^T, and the
    # sparse bound matrix applied to vec(S') gives c_i p_i S' p_i^T = that variance for S = R S' R.
    rng = np.random.default_rng(5)
    G = rng.standard_normal((k, k))
    S_white = G @ G.T
    S = R @ S_white @ R
    X = U @ np.linalg.solve(S, U.T)
    M = per_query.quadratic_rows(P)
    variances = np.einsum("ij,jk,ik->i", W, np.linalg.inv(X), W)
    # The reference goes through inv(X) (k cond(X) eps) and S' through R twice (cond(R)^2 = cond_r2):
    # 10 k cond(X) cond_r2 eps relative, which must stay far below the size of an error in M.
    rtol = 10 * k * np.linalg.cond(X) * cond_r2 * eps
    assert rtol < 1e-6
    np.testing.assert_allclose(c * (M @ S_white.ravel(order="F")), variances, rtol=rtol)
    np.testing.assert_allclose(L @ np.linalg.solve(S_white, L.T), X, rtol=0,
                               atol=10 * k * np.linalg.cond(S) * eps * np.abs(X).max())
    # The same optimum as the basis U: two Clarabel solves at 1e-9 relative gap: 1e-7.
    t_prefix = solve(model, "clarabel", tol=1e-9).objective
    t_plain = solve(per_query.build(w, c, basis="whitened"), "clarabel", tol=1e-9).objective
    assert t_prefix == pytest.approx(t_plain, rel=1e-7)
    # Auto keeps the basis U for Prefix (as many queries as cells), for a rank-deficient range workload
    # and for unequal bounds (R dense, so P would be dense too), and the prefix basis is refused for
    # the rank-deficient one.
    assert per_query.build(w, per_query_bounds(W)).data["row_basis"] == "whitened"
    assert per_query.build(Prefix(8), 1.0).data["row_basis"] == "whitened"
    assert per_query.build(WidthK(8, 3), 1.0).data["row_basis"] == "whitened"
    with pytest.raises(ValueError, match="full column rank"):
        per_query.build(WidthK(8, 3), 1.0, basis="prefix")
    with pytest.raises(ValueError, match="basis"):
        per_query.build(w, c, basis="diagonal")


# --- published reference: HDMM's 1-D table at n = 128 (slow: SCS on a 256 x 256 block) -----------------


@pytest.mark.slow
@pytest.mark.parametrize("wname", ["all-range", "prefix", "width32"])
def test_sdp_against_hdmm_table_n128(wname):
    import pandas as pd

    reference = require_shared("reference/hdmm-oned.csv")  # fails under CI=true when absent
    row = pd.read_csv(reference).query("domain == 128 and workload == @wname").iloc[0]
    w = {"all-range": AllRange(128), "prefix": Prefix(128), "width32": WidthK(128, 32)}[wname]
    res = solve(mm_approx.build(w), "scs", tol=1e-7)
    rmse = math.sqrt(res.objective / w.m)
    # The table prints 16-17 digits; HDMM's eigendecomposition and our bound (which round-off may only
    # lower, by ~ n eps sqrt(cond(G)) relative, < 1e-9 at n = 128) agree far inside 1e-7.
    assert math.sqrt(svd_bound_from_gram(w.gram()) / w.m) == pytest.approx(row["SVDB"], rel=1e-7)
    # The optimum lies between the SVD bound and the Newton-method strategy the table reports. SCS at
    # 1e-7 is good to ~1e-5 relative on the objective at best, half that on its square root: 1e-5.
    assert row["SVDB"] <= rmse <= row["YuanConvex"] * (1 + 1e-5)
    print(f"{wname}(128): SVDB {row['SVDB']:.5f} <= SDP optimum {rmse:.5f} <= YuanConvex {row['YuanConvex']:.5f}")
