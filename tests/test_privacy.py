"""Privacy parameters, Laplace and Gaussian calibration (classic and analytic)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.optimize import brentq
from scipy.stats import norm

from dpopt.privacy import Privacy, analytic_gaussian_sigma, epsilon_for_sigma

EPS = np.finfo(float).eps


@pytest.mark.parametrize("eps", [0, -1, math.nan, math.inf, "1"])
def test_epsilon_must_be_positive_finite(eps):
    with pytest.raises(ValueError, match="epsilon"):
        Privacy(eps)


@pytest.mark.parametrize("delta", [-0.1, 1.0, 2.0, math.nan])
def test_delta_in_unit_interval(delta):
    with pytest.raises(ValueError, match="delta"):
        Privacy(1.0, delta)


def test_unknown_calibration():
    with pytest.raises(ValueError, match="calibration"):
        Privacy(1.0, 1e-6, calibration="foo")


def test_laplace_and_classic_gaussian_factors():
    p = Privacy(0.5)
    assert p.noise == "laplace" and p.norm == 1
    assert p.variance_factor == pytest.approx(2 / 0.25)
    assert p.noise_scale(3.0) == pytest.approx(6.0)
    g = Privacy(0.5, 1e-5)
    assert g.noise == "gaussian" and g.norm == 2
    assert g.variance_factor == pytest.approx(2 * math.log(2 / 1e-5) / 0.25)


def _hockey_stick_delta(sigma: float, eps: float) -> float:
    """delta of the Gaussian mechanism at sensitivity 1 by its definition, sup_S P(S) - e^eps Q(S) with
    P = N(0, sigma^2), Q = N(1, sigma^2): the integral of p - e^eps q over {p > e^eps q} = (-inf, z*),
    by numerical quadrature (independent of Balle and Wang's closed form in Phi)."""
    log_ratio = lambda z: norm.logpdf(z, 0, sigma) - norm.logpdf(z, 1, sigma) - eps  # noqa: E731, decreasing
    z_star = brentq(log_ratio, -100 - 100 * sigma**2 * eps, 100, xtol=1e-14, rtol=1e-15)
    f = lambda z: norm.pdf(z, 0, sigma) - math.exp(eps) * norm.pdf(z, 1, sigma)  # noqa: E731
    value, _ = quad(f, -np.inf, z_star, epsabs=0, epsrel=1e-11, limit=200)
    return value


def test_analytic_gaussian_meets_delta_exactly_and_beats_classic():
    for eps, delta in [(0.1, 1e-6), (1.0, 1e-5), (4.0, 1e-9)]:
        s = analytic_gaussian_sigma(eps, delta)
        achieved = _hockey_stick_delta(s, eps)
        smaller = _hockey_stick_delta(s * (1 - 1e-6), eps)
        # Smallest: a sigma 1e-6 relatively smaller is not (eps, delta)-DP.
        assert smaller > delta
        # Exact: the bisection brackets the exact sigma within 1e-12 relatively, which moves delta by
        # |d log delta / d log sigma| * 1e-12 (the slope measured over the 1e-6 step); 1e-10 for the
        # quadrature (asked for 1e-11).
        slope = math.log(smaller / achieved) / 1e-6
        assert achieved == pytest.approx(delta, rel=2e-12 * slope + 1e-10)
        if eps <= 1:
            assert s < math.sqrt(2 * math.log(2 / delta)) / eps
    a = Privacy(1.0, 1e-5, calibration="analytic")
    assert a.noise_scale(2.0) == pytest.approx(2 * analytic_gaussian_sigma(1.0, 1e-5), rel=1e-9)


def test_research_noise_has_calibrated_variance():
    rng = np.random.default_rng(1)
    z = Privacy(1.0).sample_noise(2.0, 200_000, rng)
    assert z.var() == pytest.approx(8.0, rel=0.02)
    with pytest.raises(ValueError, match="Generator"):
        Privacy(1.0).sample_noise(1.0, 3, rng=np.random.RandomState(0))


def test_one_default_calibration_for_the_library_and_every_command():
    import dataclasses

    from dpopt.cli import build_parser
    from dpopt.experiments import SweepConfig, Task
    from dpopt.privacy import DEFAULT_CALIBRATION

    parser = build_parser()
    defaults = {
        "Privacy": Privacy(1.0, 1e-6).calibration,
        "compare": parser.parse_args(["compare", "--workload", "allrange:4", "-e", "1"]).calibration,
        "answer": parser.parse_args(["answer", "--epsilon", "1"]).calibration,
        "sweep config": {f.name: f.default for f in dataclasses.fields(SweepConfig)}["calibration"],
        "sweep task": {f.name: f.default for f in dataclasses.fields(Task)}["calibration"],
    }
    assert defaults == dict.fromkeys(defaults, DEFAULT_CALIBRATION)


def test_epsilon_for_sigma_inverts_the_calibrations():
    delta, sigma = 1e-6, math.sqrt(60.0)  # eps about 0.7 (classic), inside its eps <= 1 range
    eps = epsilon_for_sigma(sigma, delta, "classic")
    # classic: sigma = sqrt(2 ln(2/delta)) / eps, a few float operations each way
    assert Privacy(eps, delta, calibration="classic").sigma_factor == pytest.approx(sigma, rel=8 * EPS)
    # analytic: bisection to rtol 1e-10 on eps; the analytic sigma at the result is sigma to that rtol
    # times the elasticity of sigma in eps (about 1 here), and never above it beyond its own bisection
    # (rtol 1e-12).
    eps_a = epsilon_for_sigma(sigma, delta, "analytic")
    sigma_a = Privacy(eps_a, delta, calibration="analytic").sigma_factor
    assert sigma_a == pytest.approx(sigma, rel=1e-8)
    assert sigma_a <= sigma * (1 + 1e-12)
    # an eps 1e-8 smaller (100 times the bisection's rtol) needs more noise than sigma
    assert Privacy(eps_a * (1 - 1e-8), delta, calibration="analytic").sigma_factor > sigma
    # The analytic calibration never needs more eps than the classic one for eps <= 1.
    assert eps <= 1.0 and eps_a <= eps
    for bad in ((0.0, delta, "classic"), (1.0, 1.5, "analytic"), (1.0, delta, "laplace")):
        with pytest.raises(ValueError):
            epsilon_for_sigma(*bad)

