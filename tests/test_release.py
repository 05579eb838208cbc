"""Release mode: OpenDP samplers, the privacy ledger, labelled releases end to end (dpopt.release)."""

from __future__ import annotations

import math
import sys
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from conftest import require_shared
from scipy import stats

from dpopt.data import Domain, IntegerRange, histogram
from dpopt.mechanisms import make_mechanism
from dpopt.privacy import Privacy, gaussian_delta
from dpopt.queries import (
    Between,
    DomainMismatchError,
    Equals,
    In,
    identity_workload,
    marginal_workload,
    predicate_workload,
    stack_workloads,
)
from dpopt.release import (
    BudgetExceededError,
    Charge,
    LedgerCorruptError,
    PrivacyLedger,
    ReleaseUnavailableError,
    _secure_noise,  # module-private: no ledger
    certified_gaussian_sigma,
    release,
    zcdp_budget,
    zcdp_to_dp_epsilon,
)
from dpopt.strategy import Strategy

COLUMNS = ["query", "answer", "std", "noise", "noise_scale", "mode", "mechanism", "strategy", "epsilon",
           "delta"]
KS_ALPHA = 1e-6  # a correct sampler fails the KS check with probability 1e-6


def secure_laplace(values: np.ndarray, scale: float) -> np.ndarray:
    return _secure_noise(values, scale, gaussian=False)


def secure_gaussian(values: np.ndarray, sigma: float) -> np.ndarray:
    return _secure_noise(values, sigma, gaussian=True)


def _ks_critical(n: int) -> float:
    return float(stats.kstwo.ppf(1 - KS_ALPHA, n))


N_RELEASES = 400  # independent releases behind each Monte-Carlo check of released noise
SIGMAS = 5.0  # bounds are 5 standard errors (or chi-square quantiles at 1e-7 per side)


def _noise_mismatch(err: np.ndarray, std: np.ndarray, noise: str) -> str | None:
    """Why errors err (N releases x m queries) are not zero-mean noise of the stated std (None: fine).

    Mean of each query: within SIGMAS standard errors std/sqrt(N).  Spread, with z = err/std:
    Gaussian noise has sum z^2 ~ chi-square(N), checked against its 1e-7 and 1 - 1e-7 quantiles;
    a weighted sum of Laplace draws has E z^2 = 1 and Var z^2 = kurtosis - 1 <= 5, so mean z^2 must
    lie within SIGMAS sqrt(5/N) of 1.  A noise scale off by a factor 2 either way moves mean z^2 to
    4 or 1/4, outside both bounds for N = N_RELEASES.
    """
    n = err.shape[0]
    z = err / std
    bad_mean = np.abs(err.mean(axis=0)) >= SIGMAS * std / math.sqrt(n)
    if bad_mean.any():
        return f"mean error of queries {np.flatnonzero(bad_mean).tolist()} is not 0"
    ss = (z**2).sum(axis=0)
    if noise == "gaussian":
        lo, hi = stats.chi2.ppf([1e-7, 1 - 1e-7], n)
    else:
        lo, hi = n * (1 - SIGMAS * math.sqrt(5 / n)), n * (1 + SIGMAS * math.sqrt(5 / n))
    bad_var = (ss <= lo) | (ss >= hi)
    if bad_var.any():
        return f"mean z^2 {(ss / n)[bad_var].round(3).tolist()} is not 1"
    return None


def _repeated_errors(mech, x: np.ndarray, truth: np.ndarray, dom: Domain) -> tuple:
    """(N_RELEASES x m errors answer - truth, stated std, noise kind) of independent releases."""
    eps, delta = mech.privacy_.epsilon, mech.privacy_.delta
    led = PrivacyLedger(eps * (N_RELEASES + 1), delta * (N_RELEASES + 1))
    outs = [release(mech, x, led, domain=dom) for _ in range(N_RELEASES)]
    err = np.array([o["answer"].to_numpy() - truth for o in outs])
    std = outs[0]["std"].to_numpy()
    assert all((o["std"].to_numpy() == std).all() for o in outs)
    return err, std, outs[0]["noise"].iloc[0]


def _assert_noise_as_stated(err: np.ndarray, std: np.ndarray, noise: str) -> None:
    """The errors match the stated std, and the same check rejects a std off by a factor 2."""
    assert _noise_mismatch(err, std, noise) is None
    assert _noise_mismatch(err, 2 * std, noise) is not None
    assert _noise_mismatch(err, std / 2, noise) is not None


def _state(led: PrivacyLedger) -> tuple:
    return (led.history, led.spent_epsilon, led.spent_delta, led.remaining())


# -- samplers -------------------------------------------------------------------------------------
def test_laplace_sampler_distribution() -> None:
    b, N = 2.5, 40_000
    z = secure_laplace(np.zeros(N), b)
    crit = _ks_critical(N)
    assert stats.kstest(z, stats.laplace(scale=b).cdf).statistic < crit
    # The check can fail: a 15% wrong scale is rejected at this sample size.
    assert stats.kstest(z, stats.laplace(scale=1.15 * b).cdf).statistic > crit
    se = math.sqrt(5.0 / N)  # relative s.e. of a Laplace sample variance: (mu4/sigma^4 - 1) = 5
    assert abs(z.var() / (2 * b**2) - 1) < 6 * se
    shifted = secure_laplace(np.full(1000, 1e6), b)
    assert abs(np.median(shifted) - 1e6) < 1.0


def test_gaussian_sampler_distribution() -> None:
    sigma, N = 3.0, 15_000
    z = secure_gaussian(np.zeros(N), sigma)
    crit = _ks_critical(N)
    assert stats.kstest(z, stats.norm(scale=sigma).cdf).statistic < crit
    assert stats.kstest(z, stats.norm(scale=1.2 * sigma).cdf).statistic > crit
    assert abs(z.var() / sigma**2 - 1) < 6 * math.sqrt(2.0 / N)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_sampler_scale_validated(bad: float) -> None:
    with pytest.raises(ValueError, match="must be a finite number > 0"):
        secure_laplace(np.zeros(3), bad)
    with pytest.raises(ValueError, match="NaN or infinite"):
        secure_gaussian(np.array([1.0, math.nan]), 1.0)


def test_fail_closed_without_opendp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opendp.prelude", None)  # makes the import fail
    with pytest.raises(ReleaseUnavailableError, match="refuses to fall back to numpy"):
        secure_laplace(np.zeros(3), 1.0)
    dom = Domain([IntegerRange("a", 0, 3)])
    mech = make_mechanism("identity").fit(identity_workload(dom), Privacy(1.0))
    led = PrivacyLedger(1.0)
    with pytest.raises(ReleaseUnavailableError):
        release(mech, np.ones(4), led, domain=dom)
    assert led.history == [] and led.remaining_epsilon == 1.0


# -- privacy arithmetic ---------------------------------------------------------------------------
def test_gaussian_delta_matches_calibration() -> None:
    # The analytic calibration is the smallest sigma with delta(sigma) <= delta: a slightly
    # smaller sigma must overshoot.
    p = Privacy(1.0, 1e-6, calibration="analytic")
    s = p.noise_scale(1.0)
    assert gaussian_delta(s, 1.0, 1.0) <= 1e-6 < gaussian_delta(0.99 * s, 1.0, 1.0)
    # Independent check by numerical integration of the privacy-loss tail at one point.
    sigma, eps = 2.0, 0.5
    mu = 1.0 / (2 * sigma**2)  # privacy loss ~ N(mu, 2 mu) for sens 1 (Balle-Wang Lemma 3)
    loss = stats.norm(mu, math.sqrt(2 * mu))
    direct = loss.sf(eps) - math.exp(eps) * stats.norm(-mu, math.sqrt(2 * mu)).sf(eps)
    assert gaussian_delta(sigma, 1.0, eps) == pytest.approx(direct, rel=1e-9)


def test_zcdp_conversion_and_budget() -> None:
    for eps, delta in [(1.0, 1e-5), (0.1, 1e-9), (8.0, 1e-3)]:
        rho = zcdp_budget(eps, delta)
        assert zcdp_to_dp_epsilon(rho, delta) == pytest.approx(eps, rel=1e-12)
    # OpenDP's own zCDP -> (eps, delta) conversion is at least as tight as ours.
    import opendp.prelude as dp

    dp.enable_features("contrib")
    space = dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.l2_distance(T=float)
    meas = dp.m.make_gaussian(*space, scale=3.0)
    rho = meas.map(1.0)
    assert rho == pytest.approx(1 / 18, rel=1e-12)
    theirs = dp.c.make_zCDP_to_approxDP(meas).map(1.0).epsilon(1e-6)
    ours = zcdp_to_dp_epsilon(rho, 1e-6)
    assert theirs <= ours <= 1.5 * theirs


# -- ledger ---------------------------------------------------------------------------------------
def test_basic_ledger_refuses_overspend_and_keeps_state() -> None:
    led = PrivacyLedger(1.0, 1e-6)
    led.charge(Charge(0.1, 0.0, 0.005, "laplace"))
    led.charge(Charge(0.2, 0.0, 0.02, "laplace"))  # 0.1 + 0.2 > 0.3 in binary, still fine
    led.charge(Charge(0.5, 5e-7, 0.01, "gaussian"))
    before = _state(led)
    with pytest.raises(BudgetExceededError,
                       match=r"requested \(eps=0.3, delta=0\) but remaining \(eps=0.2"):
        led.charge(Charge(0.3, 0.0, 0.045, "laplace"))
    assert _state(led) == before
    with pytest.raises(BudgetExceededError, match="delta=6e-07"):
        led.charge(Charge(0.1, 6e-7, 0.001, "gaussian"))
    assert _state(led) == before
    led.charge(Charge(0.2, 5e-7, 0.001, "gaussian"))  # exactly the rest
    assert led.remaining_epsilon == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(BudgetExceededError):
        led.charge(Charge(1e-6, 0.0, 0.0, "laplace"))
    assert len(led.history) == 4
    again = PrivacyLedger.from_dict(led.to_dict())
    assert again.history == led.history and again.spent_epsilon == led.spent_epsilon


def test_pure_ledger_refuses_any_delta() -> None:
    led = PrivacyLedger(5.0)
    with pytest.raises(BudgetExceededError, match="delta=1e-09"):
        led.charge(Charge(0.1, 1e-9, 0.0, "gaussian"))


def test_zcdp_ledger_composes_gaussians_better_than_basic() -> None:
    total_eps, total_delta = 1.0, 1e-6
    zled = PrivacyLedger(total_eps, total_delta, accounting="zcdp")
    bled = PrivacyLedger(total_eps, total_delta)
    sigma, sens = 20.0, 1.0
    rho = sens**2 / (2 * sigma**2)
    eps_each = zcdp_to_dp_epsilon(rho, total_delta / 100)
    n_ok = 0
    while zled.can_afford(Charge(eps_each, total_delta / 100, rho, "gaussian")):
        zled.charge(Charge(eps_each, total_delta / 100, rho, "gaussian"))
        n_ok += 1
    assert n_ok == math.floor(zcdp_budget(total_eps, total_delta) / rho + 1e-9)
    assert zled.spent_epsilon <= total_eps * (1 + 1e-12)
    before = _state(zled)
    with pytest.raises(BudgetExceededError, match=r"requested rho=.* but remaining rho="):
        zled.charge(Charge(eps_each, 0.0, rho, "gaussian"))
    assert _state(zled) == before
    n_basic = 0
    while bled.can_afford(Charge(eps_each, total_delta / 100, rho, "gaussian")):
        bled.charge(Charge(eps_each, total_delta / 100, rho, "gaussian"))
        n_basic += 1
    assert n_ok > 2 * n_basic


@pytest.mark.parametrize(
    ("fields", "pattern"),
    [
        ({"epsilon": -5.0}, r"epsilon must be a finite number >= 0, got -5.0"),
        ({"epsilon": math.nan}, "epsilon must be a finite number >= 0, got nan"),
        ({"epsilon": math.inf}, "epsilon must be a finite number >= 0, got inf"),
        ({"delta": -1e-9}, r"delta must be a finite number in \[0, 1\)"),
        ({"delta": 1.0}, r"delta must be a finite number in \[0, 1\)"),
        ({"rho": -0.1}, "rho must be a finite number >= 0"),
        ({"epsilon": True}, "epsilon must be a number, got True"),
        ({"noise": "uniform"}, r"noise must be one of \('laplace', 'gaussian'\)"),
        ({"label": 3}, "label must be a string"),
    ],
)
def test_charge_must_be_finite_and_non_negative(fields: dict, pattern: str) -> None:
    led = PrivacyLedger(1.0, 1e-6)
    good = {"epsilon": 0.5, "delta": 0.0, "rho": 0.125, "noise": "laplace"}
    with pytest.raises(ValueError, match=pattern):
        led.charge(Charge(**{**good, **fields}))
    # A negative charge used to be recorded and raise the remaining budget from 1 to 6.
    assert led.history == [] and led.remaining_epsilon == 1.0
    assert Charge(0.0, 0.0, 0.0, "gaussian").epsilon == 0.0  # a free charge is fine


def test_ledger_state_is_replayed_under_its_budget() -> None:
    led = PrivacyLedger(1.0)
    led.charge(Charge(0.6, 0.0, 0.18, "laplace"))
    state = led.to_dict()
    assert PrivacyLedger.from_dict(state).history == led.history
    state["history"].append(dict(state["history"][0]))  # 1.2 > 1: an overspent history
    with pytest.raises(LedgerCorruptError, match="history entry 1 overspends the budget"):
        PrivacyLedger.from_dict(state)
    with pytest.raises(LedgerCorruptError, match="expected exactly the keys"):
        PrivacyLedger.from_dict({"total_epsilon": 1.0})


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        ((-1.0,), "total_epsilon must be a finite number > 0"),
        ((0.0,), "total_epsilon must be a finite number > 0"),
        ((math.inf,), "total_epsilon must be a finite number > 0"),
        ((1.0, 1.0), r"total_delta must lie in \[0, 1\)"),
        ((1.0, -1e-9), r"total_delta must lie in \[0, 1\)"),
        ((1.0, 0.0, "zcdp"), "needs total_delta > 0"),
        ((1.0, 0.0, "renyi"), "accounting must be 'basic' or 'zcdp'"),
    ],
)
def test_ledger_rejects_bad_budgets(args: tuple, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        PrivacyLedger(*args)


# -- release --------------------------------------------------------------------------------------
@pytest.fixture
def small() -> tuple[Domain, np.ndarray]:
    dom = Domain([IntegerRange("age", 0, 9), IntegerRange("sex", 0, 1)])
    rng = np.random.default_rng(3)
    df = pd.DataFrame({"age": rng.integers(0, 10, 400), "sex": rng.integers(0, 2, 400)})
    return dom, histogram(df, dom)[0]


def test_release_scale_is_sens1_over_eps_for_the_strategy_used(small) -> None:
    dom, x = small
    W = stack_workloads([marginal_workload(dom, ["age"]), marginal_workload(dom, ["sex"])])
    for name in ("identity", "laplace", "hierarchical"):
        mech = make_mechanism(name).fit(W, Privacy(0.5))
        led = PrivacyLedger(0.5)
        out = release(mech, x, led, domain=dom)
        A = mech.strategy_.A
        A = A.toarray() if hasattr(A, "toarray") else A
        sens1 = np.abs(A).sum(axis=0).max()
        assert list(out.columns) == COLUMNS
        assert (out["noise_scale"] == sens1 / 0.5).all()
        B = mech.strategy_.reconstruct(W)
        B = B.toarray() if hasattr(B, "toarray") else np.asarray(B)
        np.testing.assert_allclose(out["std"], math.sqrt(2) * sens1 / 0.5 * np.linalg.norm(B, axis=1))
        np.testing.assert_allclose(out["std"] ** 2, mech.expected_error_.per_query, rtol=1e-9)
        assert (out["mode"] == "release").all() and (out["mechanism"] == name).all()
        assert out["query"].tolist() == W.row_labels()
        assert led.remaining_epsilon == pytest.approx(0.0, abs=1e-12)


def test_release_gaussian_sigma_is_the_one_opendp_certifies(small) -> None:
    dom, x = small
    W = marginal_workload(dom, ["age"])
    priv = Privacy(1.0, 1e-6, calibration="analytic")
    mech = make_mechanism("hierarchical").fit(W, priv)
    # One Gaussian release calibrated to (1, 1e-6) costs more than the zCDP budget of (1, 1e-6)
    # (the Bun-Steinke conversion the ledger uses is loose); zCDP pays off over many releases.
    led = PrivacyLedger(3.0, 1e-6, accounting="zcdp")
    out = release(mech, x, led, domain=dom)
    sens2 = mech.strategy_.sens2
    sigma = certified_gaussian_sigma(sens2, 1.0, 1e-6)
    assert (out["noise_scale"] == sigma).all() and (out["noise"] == "gaussian").all()
    # OpenDP's certificate is weaker than the continuous Gaussian's exact one, so its sigma is
    # larger than the analytic calibration, which is exact for (1, 1e-6) (gaussian_delta).
    analytic = priv.noise_scale(sens2)
    assert sigma > analytic and gaussian_delta(sigma, sens2, 1.0) < 1e-6
    # rho is OpenDP's map, (sens2 / sigma)^2 / 2 to its round-up of one ulp (2.2e-16 relative).
    assert led.spent_rho == pytest.approx(sens2**2 / (2 * sigma**2), rel=1e-15)
    # std follows the sigma drawn: the research-mode error at the analytic sigma, rescaled; the two
    # routes differ by a few roundings of float64 (rel 1e-9 leaves room for the summation order).
    np.testing.assert_allclose(out["std"] ** 2,
                               mech.expected_error_.per_query * (sigma / analytic) ** 2, rtol=1e-9)


def test_release_noise_is_laplace_end_to_end() -> None:
    n, eps = 1000, 0.25
    dom = Domain([IntegerRange("v", 0, n - 1)])
    x = np.arange(n, dtype=float)
    mech = make_mechanism("laplace").fit(identity_workload(dom), Privacy(eps))
    out = release(mech, x, PrivacyLedger(eps), domain=dom)
    z = out["answer"].to_numpy() - x  # A = W = I, B = I: the answers carry the raw noise
    assert stats.kstest(z, stats.laplace(scale=1 / eps).cdf).statistic < _ks_critical(n)
    assert stats.kstest(z, stats.laplace(scale=2.5 / eps).cdf).statistic > _ks_critical(n)


def test_release_ignores_an_undercalibrated_privacy_sigma(small) -> None:
    # A Privacy whose own calibration gives too little noise cannot lower the release's sigma:
    # release mode draws the sigma OpenDP certifies for (eps, delta), whatever the calibration.
    dom, x = small
    W = marginal_workload(dom, ["sex"])
    strat = Strategy(np.eye(dom.size))
    bad = SimpleNamespace(epsilon=1.0, delta=1e-5, calibration="custom",
                          noise_scale=lambda s: 1.0 * s)
    assert gaussian_delta(bad.noise_scale(1.0), 1.0, 1.0) > 1e-5  # it would not be (1, 1e-5)-DP
    mech = SimpleNamespace(strategy_=strat, privacy_=bad, workload_=W, short_name="custom")
    led = PrivacyLedger(1.0, 1e-5)
    out = release(mech, x, led, domain=dom)
    assert (out["noise_scale"] == certified_gaussian_sigma(1.0, 1.0, 1e-5)).all()
    assert [(c.epsilon, c.delta) for c in led.history] == [(1.0, 1e-5)]


def test_release_bad_inputs_change_nothing(small) -> None:
    dom, x = small
    W = marginal_workload(dom, ["age"])
    mech = make_mechanism("identity").fit(W, Privacy(1.0))
    led = PrivacyLedger(1.0)
    other = Domain([IntegerRange("age", 1, 10), IntegerRange("sex", 0, 1)])
    cases = [
        (lambda: release(mech, x[:-1], led, domain=dom), r"length 19, expected 20"),
        (lambda: release(mech, np.r_[np.nan, x[1:]], led, domain=dom), "NaN"),
        (lambda: release(mech, x, led, domain=other), "is over Domain"),
        (lambda: release(mech, x, led), "pass domain="),
        (lambda: release(mech, x, led, labels=["a"], domain=dom), "labels has 1 entries"),
        (lambda: release(make_mechanism("identity"), x, led), "fitted mechanism with strategy_"),
        (lambda: release(mech, x, {"eps": 1}), "ledger must be a PrivacyLedger"),
    ]
    for call, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            call()
    with pytest.raises(DomainMismatchError):
        release(mech, x, led, domain=other)
    neg = SimpleNamespace(strategy_=mech.strategy_, workload_=W,
                          privacy_=SimpleNamespace(epsilon=-1.0, delta=0.0))
    with pytest.raises(ValueError, match="epsilon must be a finite number > 0, got -1.0"):
        release(neg, x, led, domain=dom)
    with pytest.raises(ValueError, match="epsilon must be a finite number > 0"):
        Privacy(-1.0)
    assert led.history == [] and led.remaining_epsilon == 1.0


def test_release_needs_the_domain_of_a_bound_workload(small) -> None:
    dom, x = small
    mech = make_mechanism("identity").fit(marginal_workload(dom, ["age"]), Privacy(1.0))
    led = PrivacyLedger(10.0)
    # Same size (20 cells), so x alone cannot reveal that it was built over another domain.
    shifted = Domain([IntegerRange("age", 1, 10), IntegerRange("sex", 0, 1)])
    swapped = Domain([IntegerRange("sex", 0, 1), IntegerRange("age", 0, 9)])
    renamed = Domain([IntegerRange("years", 0, 9), IntegerRange("sex", 0, 1)])
    for other, pattern in [
        (shifted, r"differ in attribute 'age': low 0 vs 1, high 9 vs 10"),
        (swapped, r"differ in attribute order: \(age, sex\) vs \(sex, age\)"),
        (renamed, r"differ in attributes: \['age'\] only in the first, \['years'\] only in"),
    ]:
        with pytest.raises(DomainMismatchError, match=pattern):
            release(mech, x, led, domain=other)
    with pytest.raises(DomainMismatchError, match=r"is bound to Domain\(age:10, sex:2\); pass domain="):
        release(mech, x, led)
    assert led.history == []
    # A workload bound to no domain (a plain matrix family) is released without one.
    from dpopt.workloads import AllRange

    plain = make_mechanism("identity").fit(AllRange(20), Privacy(1.0))
    assert len(release(plain, x, led)) == 20 * 21 // 2 and len(led.history) == 1


def test_histogram_refuses_data_without_rows(small) -> None:
    dom, _ = small
    with pytest.raises(ValueError, match=r"the data have no rows \(a header only\?\)"):
        histogram(pd.DataFrame({"age": [], "sex": []}), dom)


def test_adult_end_to_end_release_then_refusal() -> None:
    require_shared("data/adult/adult.csv")
    adult = require_shared("data/adult/adult-domain.json").parent
    df = pd.read_csv(adult / "adult.csv")
    dom = Domain.from_json(adult / "adult-domain.json").project(["age", "race", "sex"])
    x, report = histogram(df, dom)
    assert report.n_counted == 48842
    W = stack_workloads([
        predicate_workload(dom, {
            "women in their twenties": Between("age", 20, 29) & Equals("sex", 0),
            "race 0 or 1": In("race", [0, 1]),
        }),
        marginal_workload(dom, ["sex"]),
    ])
    mech = make_mechanism("hierarchical").fit(W, Privacy(0.5))
    ledger = PrivacyLedger(0.8)
    out = release(mech, x, ledger, domain=dom)
    assert out["query"].tolist() == ["women in their twenties", "race 0 or 1", "sex=0", "sex=1"]
    truth = np.array([
        (df.age.between(20, 29) & (df.sex == 0)).sum(), df.race.isin([0, 1]).sum(),
        (df.sex == 0).sum(), (df.sex == 1).sum()])
    # Released answers are the true counts plus zero-mean noise of the stated std, checked over
    # N_RELEASES releases of the same queries on the same data (a wrong query, data vector or noise
    # scale fails).  Noise on the queries themselves keeps each release to 4 draws; a hierarchical
    # release draws 1,700 (0.3 s each), too slow to repeat here.
    on_queries = make_mechanism("laplace").fit(W, Privacy(0.5))
    _assert_noise_as_stated(*_repeated_errors(on_queries, x, truth, dom))
    assert (out["noise_scale"] == mech.strategy_.sens1 / 0.5).all()
    assert (out["mode"] == "release").all()
    # The same release again would spend 1.0 > 0.8: refused, nothing released, budget unchanged.
    before = _state(ledger)
    with pytest.raises(BudgetExceededError, match=r"requested \(eps=0.5.*remaining \(eps=0.3"):
        release(mech, x, ledger, domain=dom)
    assert _state(ledger) == before
    assert ledger.remaining_epsilon == pytest.approx(0.3)


@pytest.mark.parametrize("delta", [0.0, 1e-6])
def test_release_through_a_factored_hdmm_strategy(small, delta) -> None:
    # hdmm selects through factors and never holds a dense A; release measures through them with the
    # workload as given (bound to the domain, labelled), and the noise matches the factored error.
    dom, x = small
    W = stack_workloads([marginal_workload(dom, ["age"]), marginal_workload(dom, ["sex"])])
    priv = Privacy(1.0, delta)
    mech = make_mechanism("hdmm").fit(W, priv)
    led = PrivacyLedger(1.0, delta, accounting="zcdp" if delta else "basic")
    if delta:  # one calibrated Gaussian release costs more than a zCDP budget of the same (eps, delta)
        led = PrivacyLedger(3.0, delta, accounting="zcdp")
    out = release(mech, x, led, domain=dom)
    assert out["query"].tolist() == W.row_labels()
    assert (out["mechanism"] == "hdmm").all()
    # The noise drawn is Laplace b = sens1/eps as modelled, or the sigma OpenDP certifies, which
    # differs from the modelled (classic) sigma: the error scales by the square of their ratio.
    ratio = 1.0
    if delta:
        ratio = out["noise_scale"].iloc[0] / priv.noise_scale(mech.strategy_.sens2)
    assert float((out["std"] ** 2).sum()) == pytest.approx(mech.expected_error_.total * ratio**2,
                                                           rel=1e-8)
    err, std, noise = _repeated_errors(mech, x, W.sparse() @ x, dom)
    assert noise == ("gaussian" if delta else "laplace")
    _assert_noise_as_stated(err, std, noise)
