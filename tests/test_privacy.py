"""Privacy parameters, Laplace and Gaussian calibration (classic and analytic)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from dpopt.privacy import Privacy, analytic_gaussian_sigma


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


def test_analytic_gaussian_meets_delta_exactly_and_beats_classic():
    for eps, delta in [(0.1, 1e-6), (1.0, 1e-5), (4.0, 1e-9)]:
        s = analytic_gaussian_sigma(eps, delta)
        achieved = norm.cdf(1 / (2 * s) - eps * s) - math.exp(eps) * norm.cdf(-1 / (2 * s) - eps * s)
        assert achieved == pytest.approx(delta, rel=1e-6)
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
