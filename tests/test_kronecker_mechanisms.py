"""Every mechanism with a Kronecker form fits a Kronecker workload per factor (Mechanism._fit_per_factor).

The per-factor strategy A_1 (x) ... (x) A_d is checked against the same mechanism fitted densely over all
cells on small products, where both run: the baselines select the same strategy either way (so the
errors agree to the rounding of two trace computations), and mm-optimal's per-factor optimum agrees
with the dense optimum within the two certified gaps.
"""

from __future__ import annotations

import numpy as np
import pytest

from dpopt.compare import compare
from dpopt.mechanisms import make_mechanism
from dpopt.mechanisms.base import MechanismError, kronecker_factors
from dpopt.privacy import Privacy
from dpopt.specs import parse_workload
from dpopt.workloads import MAX_DENSE_ENTRIES, ExplicitWorkload, GramWorkload

PRIVACIES = {"pure": Privacy(1.0), "approx": Privacy(1.0, 1e-6)}
# The errors are traces of products of n_i x n_i factor matrices (n <= 32 cells here, strategy Grams with
# condition number <= 1e4): computed densely or through the factors they agree to about n cond eps =
# 7e-11 relative; the tolerance leaves an order of magnitude above that.
RTOL = 1e-9
KRONECKER_FORMS = ("identity", "laplace", "hierarchical", "wavelet", "eigen", "mm-optimal")


def _per_factor(name: str, spec: str, privacy: Privacy):
    """The mechanism fitted per factor, whatever the domain's size (what fit does on large domains)."""
    w = parse_workload(spec)
    mech = make_mechanism(name)
    return mech._fit_per_factor(kronecker_factors(w), w, privacy, separable=name == "mm-optimal")


@pytest.mark.parametrize("privacy_name", list(PRIVACIES))
@pytest.mark.parametrize("name", ["identity", "laplace", "hierarchical", "wavelet"])
def test_baselines_per_factor_equal_the_dense_fit(name, privacy_name):
    privacy = PRIVACIES[privacy_name]
    spec = "kron:allrange:8,prefix:4"
    w = parse_workload(spec)
    # laplace always goes per factor on a Kron (A = W); its dense form is fitted on W's explicit rows
    dense = make_mechanism(name).fit(ExplicitWorkload(w.sparse(), name="dense") if name == "laplace" else w, privacy)
    assert not dense.strategy_.factored
    fac = _per_factor(name, spec, privacy)
    assert fac.strategy_.factored
    assert fac.expected_error_.total == pytest.approx(dense.expected_error_.total, rel=RTOL)
    assert fac.expected_error_.sensitivity == pytest.approx(dense.expected_error_.sensitivity, rel=RTOL)
    # per-query variances through the factors equal the squared row norms of the dense B = W A^+
    np.testing.assert_allclose(fac.query_unit_variances(), dense.query_unit_variances(), rtol=RTOL, atol=0)
    assert fac.strategy_.rank == dense.strategy_.rank


@pytest.mark.parametrize("name", KRONECKER_FORMS)
def test_noiseless_answers_through_the_factors_are_the_true_answers(name):
    # With the noise source returning y unchanged, B A x = W x exactly when A supports W: a wrong factor
    # order, transposed factor or reconstruction would give other numbers.
    spec = "kron:allrange:8,prefix:4"
    w = parse_workload(spec)
    fac = _per_factor(name, spec, PRIVACIES["approx"])
    x = np.random.default_rng(3).integers(0, 20, w.n).astype(float)
    got = fac.answers_with(x, lambda y, sens: y)
    want = w.sparse() @ x
    np.testing.assert_allclose(got, want, rtol=0, atol=RTOL * np.abs(want).max())


def test_mm_optimal_per_factor_is_the_dense_optimum_with_a_combined_certificate():
    # (eps, delta): the optimum over the product domain is the product of the factors' optima, so the
    # per-factor value and the dense solver's agree within the sum of their certified gaps, and the
    # product of the factors' dual bounds is a lower bound below both.
    privacy = PRIVACIES["approx"]
    w = parse_workload("kron:allrange:8,prefix:4")
    fac = make_mechanism("mm-optimal").fit(w, privacy)
    assert fac.strategy_.factored and fac.fit_info_.solver.endswith("per factor")
    dense = make_mechanism("mm-optimal").fit(GramWorkload(w.gram(), name="dense", m=w.m), privacy)
    assert not dense.strategy_.factored
    gap_f, gap_d = fac.fit_info_.gap, dense.fit_info_.gap
    assert gap_f is not None and gap_d is not None and 0 <= max(gap_f, 0) <= 1e-7
    e_f, e_d = fac.expected_error_.total, dense.expected_error_.total
    assert abs(e_f - e_d) <= (max(gap_f, 0) + max(gap_d, 0) + RTOL) * max(e_f, e_d)
    lower = fac.fit_info_.extra["unit_lower_bound"] * privacy.variance_factor
    assert lower <= e_f * (1 + RTOL) and lower <= e_d * (1 + RTOL)
    assert e_f <= lower / (1 - gap_f) * (1 + RTOL)  # the reported gap is the one between them


def test_mm_optimal_max_objective_per_factor_multiplies_the_factors_maxima():
    # Kronecker rows have variances prod_k Var_k, so the largest is the product of the factors' largest.
    privacy = PRIVACIES["approx"]
    w = parse_workload("kron:prefix:8,prefix:4")
    fac = make_mechanism("mm-optimal", objective="max").fit(w, privacy)
    assert fac.strategy_.factored
    parts = [make_mechanism("mm-optimal", objective="max").fit(f, privacy) for f in w.factors]
    unit = [float(np.max(p.query_unit_variances())) * p.strategy_.sensitivity(2) ** 2 for p in parts]
    got = float(np.max(fac.query_unit_variances())) * fac.strategy_.sensitivity(2) ** 2
    assert got == pytest.approx(np.prod(unit), rel=RTOL)


@pytest.mark.parametrize("privacy_name", list(PRIVACIES))
def test_compare_on_a_domain_too_large_for_dense_strategies_reports_every_kronecker_form(privacy_name):
    spec = "kron:allrange:128,allrange:128"
    w = parse_workload(spec)
    assert w.n**2 > MAX_DENSE_ENTRIES  # the dense path would refuse this domain
    df = compare(w, PRIVACIES[privacy_name], mechanisms=[*KRONECKER_FORMS, "hdmm", "om"], time_limit=60)
    rows = df.set_index("mechanism")
    for name in (*KRONECKER_FORMS, "hdmm"):
        assert np.isfinite(rows.loc[name, "expected_total_error"]), rows.loc[name, "status"]
        assert rows.loc[name, "ratio_to_bound"] >= 1 - 1e-12
    assert "no Kronecker form" in rows.loc["om", "status"]
    if privacy_name == "approx":  # the certified optimum per factor is hdmm's optimum too
        e_opt, e_h = rows.loc["mm-optimal", "expected_total_error"], rows.loc["hdmm", "expected_total_error"]
        assert e_opt <= e_h * (1 + 1e-7)  # within hdmm's solver tolerance of the certified optimum


def test_a_non_kronecker_workload_too_large_for_dense_is_refused_with_its_reason():
    w = parse_workload("prefix:20000")
    with pytest.raises(MechanismError, match="not a single Kronecker product"):
        make_mechanism("identity").fit(w, PRIVACIES["pure"])


def test_a_given_kronecker_strategy_answers_by_least_squares_and_refuses_nnls():
    """A Strategy whose A is a KronMatrix fits and answers through its factors; NNLS inference, which needs
    the dense A, says so instead of forming it."""
    from dpopt.kron_strategy import KronMatrix
    from dpopt.mechanisms.matrix import MatrixMechanism
    from dpopt.strategy import Strategy
    from dpopt.workloads import Identity, Kron, Prefix

    S = Strategy(KronMatrix([np.eye(3), np.eye(2)]), name="identity(x)identity")
    W = Kron([Prefix(3), Identity(2)])
    ls = MatrixMechanism(S).fit(W, PRIVACIES["pure"])
    # identity measurements: the error is 2/eps^2 per unit of ||W||_F^2 = (1 + 2 + 3) * 2 = 12 exactly
    assert ls.strategy_.factored and ls.expected_error_.total == pytest.approx(2.0 * 12, rel=1e-12)
    assert ls.answer(np.ones(6), np.random.default_rng(0)).shape == (6,)
    nnls = MatrixMechanism(S, inference="nnls").fit(W, PRIVACIES["pure"])
    with pytest.raises(MechanismError, match="NNLS inference needs the dense strategy"):
        nnls.answer(np.ones(6), np.random.default_rng(0))


# Unions of Kronecker products too large for a dense strategy: identity, hierarchical and wavelet measure the
# Kronecker product of their strategy on each attribute (`attribute_factors`). On a small union, fitted that way
# by force, the error is checked against the dense strategy formed from the same factors (kron of the factors'
# dense A) and the answers to exact measurements against W x. Sizes 4 x 5 x 3: every factor Gram has condition
# number <= 1e3, so the two trace computations agree to about n cond eps = 1e-11 relative; RTOL leaves 100x.
UNION_SPECS = ("marginals:4x5x3:1,2:prefix", "marginals:4x5x3:2:range", "marginals:4x5x3:1,2")


@pytest.mark.parametrize("privacy_name", list(PRIVACIES))
@pytest.mark.parametrize("spec", UNION_SPECS)
@pytest.mark.parametrize("name", ["identity", "hierarchical", "wavelet"])
def test_baselines_on_a_large_union_measure_per_attribute(name, spec, privacy_name, monkeypatch):
    import dpopt.mechanisms.base as base
    from dpopt.strategy import Strategy

    privacy = PRIVACIES[privacy_name]
    w = parse_workload(spec)
    assert kronecker_factors(w) is None  # a union, not one Kronecker product
    monkeypatch.setattr(base, "MAX_DENSE_ENTRIES", w.n**2 - 1)  # as if the domain were too large for dense
    mech = make_mechanism(name).fit(w, privacy)
    assert "per factor" in mech.fit_info_.solver
    factors = [np.asarray(f.todense() if hasattr(f, "todense") else f, dtype=float) for f in mech.strategy_.A.factors]
    assert [f.shape[1] for f in factors] == list(w.domain_sizes)
    A = factors[0]
    for f in factors[1:]:
        A = np.kron(A, f)
    dense = Strategy(A).expected_error(ExplicitWorkload(w.sparse().toarray()), privacy)
    assert mech.expected_error_.total == pytest.approx(dense.total, rel=RTOL)
    monkeypatch.undo()  # the same mechanism fitted densely on the small union selects the same strategy
    assert make_mechanism(name).fit(w, privacy).expected_error_.total == pytest.approx(dense.total, rel=RTOL)
    x = np.random.default_rng(0).integers(0, 20, w.n).astype(float)
    answers = mech.strategy_.A.answers(mech.strategy_.measured(x), w)
    # exact measurements through factor pseudo-inverses of condition <= 1e3 (above): round-off about n cond eps
    # relative to the counts' scale sum|x|, far below 1e-9 of it
    np.testing.assert_allclose(answers, w.matvec(x), rtol=1e-9, atol=1e-9 * float(np.abs(x).sum()))


def test_laplace_on_a_large_union_is_refused_by_name(monkeypatch):
    import dpopt.mechanisms.base as base

    w = parse_workload(UNION_SPECS[0])
    monkeypatch.setattr(base, "MAX_DENSE_ENTRIES", w.n**2 - 1)
    monkeypatch.setattr(base, "DENSE_MAX_CELLS", 10)
    with pytest.raises(MechanismError, match="not a single Kronecker product"):
        make_mechanism("laplace").fit(w, Privacy(1.0))
