"""Privacy parameters and noise calibration (research mode; release-mode samplers live in dpopt.release).

- delta = 0: eps-DP, Laplace noise with scale b = sens1 / eps on every measurement; variance 2 b^2.
- delta > 0: (eps, delta)-DP, Gaussian noise with standard deviation sigma = sens2 * c(eps, delta).
  "classic" (the seeds' convention, Li and Miklau Prop. 3.1): c = sqrt(2 ln(2/delta)) / eps, so
  P(eps, delta) = c^2 = 2 ln(2/delta) / eps^2. Its privacy proof assumes eps <= 1.
  "analytic" (Balle and Wang, ICML 2018, Thm. 8): the smallest sigma with
  Phi(D/(2 s) - eps s / D) - e^eps Phi(-D/(2 s) - eps s / D) <= delta, valid for every eps > 0 and never
  larger than the classic sigma for eps <= 1.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from scipy.special import log_ndtr

from dpopt.validation import check_choice, check_number, check_positive_number

CALIBRATIONS = ("classic", "analytic")
#: The one default calibration of the library and of every command: the seeds' classic Gaussian sigma, so the
#: papers' numbers reproduce; "analytic" (Balle and Wang 2018) on request. Releases always draw OpenDP's
#: certified sigma whatever the calibration (`dpopt.release`).
DEFAULT_CALIBRATION = "classic"


@dataclass(frozen=True)
class Privacy:
    """Privacy budget (epsilon, delta) with the Gaussian calibration to use when delta > 0."""

    epsilon: float
    delta: float = 0.0
    calibration: str = DEFAULT_CALIBRATION

    def __post_init__(self) -> None:
        eps, delta = self.epsilon, self.delta
        check_positive_number(eps, "epsilon")
        check_number(delta, "delta")
        if not math.isfinite(delta) or not 0.0 <= delta < 1.0:
            raise ValueError(f"delta must lie in [0, 1), got {delta}")
        check_choice(self.calibration, CALIBRATIONS, "calibration")
        object.__setattr__(self, "epsilon", float(eps))
        object.__setattr__(self, "delta", float(delta))

    @property
    def is_pure(self) -> bool:
        """True for eps-DP (delta = 0)."""
        return self.delta == 0.0

    @property
    def noise(self) -> str:
        """'laplace' for eps-DP, 'gaussian' for (eps, delta)-DP."""
        return "laplace" if self.is_pure else "gaussian"

    @property
    def norm(self) -> int:
        """Which sensitivity applies: 1 (L1) for Laplace, 2 (L2) for Gaussian."""
        return 1 if self.is_pure else 2

    @property
    def convention(self) -> str:
        """The calibration in words, for every reported number."""
        if self.is_pure:
            return "laplace: b = sens1/eps, variance 2 b^2"
        if self.calibration == "classic":
            return "gaussian-classic: sigma = sens2 sqrt(2 ln(2/delta))/eps"
        return "gaussian-analytic (Balle-Wang 2018)"

    @cached_property
    def variance_factor(self) -> float:
        """Noise variance per measurement for unit sensitivity: 2/eps^2 (Laplace) or c^2 (Gaussian)."""
        if self.is_pure:
            return 2.0 / self.epsilon**2
        return self.sigma_factor**2

    @cached_property
    def sigma_factor(self) -> float:
        """Gaussian standard deviation for unit L2 sensitivity."""
        if self.is_pure:
            raise ValueError("sigma_factor is defined for Gaussian noise only (delta > 0)")
        if self.calibration == "classic":
            return math.sqrt(2.0 * math.log(2.0 / self.delta)) / self.epsilon
        return analytic_gaussian_sigma(self.epsilon, self.delta, 1.0)

    def achieved_delta(self) -> float:
        """delta the Gaussian sigma_factor actually gives at epsilon (Balle and Wang 2018, Thm. 8); 0 for Laplace."""
        if self.is_pure:
            return 0.0
        return gaussian_delta(self.sigma_factor, 1.0, self.epsilon)

    def noise_scale(self, sensitivity: float) -> float:
        """Laplace scale b = sens1/eps, or Gaussian sigma = sens2 * sigma_factor."""
        if not math.isfinite(sensitivity) or sensitivity < 0:
            raise ValueError(f"sensitivity must be finite and >= 0, got {sensitivity}")
        if self.is_pure:
            return sensitivity / self.epsilon
        return sensitivity * self.sigma_factor

    def sample_noise(self, sensitivity: float, size: int, rng: np.random.Generator) -> np.ndarray:
        """Research-mode noise (numpy Generator; not for releases): Laplace or Gaussian, `size` draws."""
        if not isinstance(rng, np.random.Generator):
            raise ValueError("rng must be a numpy.random.Generator (research mode)")
        scale = self.noise_scale(sensitivity)
        if self.is_pure:
            return rng.laplace(0.0, scale, size=size)
        return rng.normal(0.0, scale, size=size)


#: Smallest positive delta whose ln(2/delta) is finite in float64 (2/delta overflows below it).
MIN_DELTA = 2.0 / sys.float_info.max


def _named(name: str, value: float) -> str:
    """`--epsilon 1e-320` for a command-line flag, `epsilon=1e-320` for a parameter."""
    return f"{name} {value!r}" if name.startswith("-") else f"{name}={value!r}"


def check_privacy_range(privacy: Privacy, names: tuple[str, str] = ("epsilon", "delta")) -> float:
    """P(eps, delta), refused unless it is a positive normal float64 (2/eps^2 or the Gaussian sigma^2).

    ValueError in one line naming the parameter (`names`: how the caller calls epsilon and delta, e.g. the
    flags --epsilon and --delta) and the range expected; `compare` and `answer` both run it before any fit.
    """
    eps_name, delta_name = names
    if 0.0 < privacy.delta < MIN_DELTA:
        raise ValueError(
            f"{_named(delta_name, privacy.delta)} is too small: ln(2/delta) overflows float64; expected 0 "
            f"(eps-DP) or a delta of at least {MIN_DELTA:.2g}"
        )
    try:
        factor = privacy.variance_factor
    except (OverflowError, ZeroDivisionError, ValueError):
        factor = math.inf if privacy.epsilon < 1 else 0.0
    if not math.isfinite(factor):
        raise ValueError(
            f"{_named(eps_name, privacy.epsilon)} is too small: the noise variance factor P(eps, delta) overflows "
            "float64; expected epsilon of about 1e-150 or more"
        )
    if factor < sys.float_info.min:
        raise ValueError(
            f"{_named(eps_name, privacy.epsilon)} is too large: the noise variance factor P(eps, delta) = "
            f"{factor!r} underflows float64; expected epsilon of about 1e150 or less"
        )
    return factor


# A noise source: perturb(y, sensitivity) returns the exact measurements y (any shape) plus noise
# calibrated to the strategy's sensitivity. Research mode: `research_perturb` (numpy, fast, not for
# publication); release mode: dpopt.release's OpenDP measurement, charged to a ledger first.
Perturb = Callable[[np.ndarray, float], np.ndarray]


def research_perturb(privacy: Privacy, rng: np.random.Generator) -> Perturb:
    """Research-mode noise source: y + z, z drawn by `privacy.sample_noise` from a numpy Generator."""
    if not isinstance(rng, np.random.Generator):
        raise ValueError("rng must be a numpy.random.Generator (research mode)")

    def perturb(y: np.ndarray, sensitivity: float) -> np.ndarray:
        y = np.asarray(y, dtype=float)
        return y + privacy.sample_noise(sensitivity, y.size, rng).reshape(y.shape)

    return perturb


def gaussian_delta(sigma: float, sens2: float, epsilon: float) -> float:
    """Exact delta of the Gaussian mechanism at epsilon (Balle and Wang, ICML 2018, Thm. 8).

    delta = Phi(D/(2 s) - eps s/D) - e^eps Phi(-D/(2 s) - eps s/D), D = sens2, s = sigma; computed in
    log space. This is the continuous Gaussian's guarantee; release mode charges what OpenDP certifies
    for its own measurement instead (`dpopt.release.certified_gaussian_sigma`), a larger sigma.
    """
    a = sens2 / (2.0 * sigma) - epsilon * sigma / sens2
    b = -sens2 / (2.0 * sigma) - epsilon * sigma / sens2
    la, lb = float(log_ndtr(a)), epsilon + float(log_ndtr(b))
    if lb >= la:
        return 0.0
    return math.exp(la) * -math.expm1(lb - la)


def least_passing(passes: Callable[[float], bool], lo: float, hi: float, rtol: float) -> float:
    """Least x > 0 with passes(x) for a monotone test (False below a threshold, True above), to rtol;
    the bracket [lo, hi] is widened by halving / doubling first. Returns the passing end."""
    while not passes(hi):
        hi *= 2.0
    while passes(lo):
        lo /= 2.0
    while hi - lo > rtol * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if passes(mid) else (mid, hi)
    return hi


def analytic_gaussian_sigma(eps: float, delta: float, sens: float = 1.0, rtol: float = 1e-12) -> float:
    """Smallest sigma for which Gaussian noise is (eps, delta)-DP (Balle and Wang 2018), by bisection."""
    if eps <= 0 or not 0 < delta < 1 or sens <= 0:
        raise ValueError(f"need eps > 0, 0 < delta < 1, sens > 0; got {eps}, {delta}, {sens}")
    return least_passing(lambda sigma: gaussian_delta(sigma, sens, eps) <= delta, 1e-6 * sens, sens, rtol)


def epsilon_for_sigma(sigma: float, delta: float, calibration: str = DEFAULT_CALIBRATION,
                      rtol: float = 1e-10) -> float:
    """Least eps whose Gaussian `Privacy.sigma_factor` at this delta is at most sigma (its inverse):
    classic in closed form, analytic by bisection (the analytic sigma decreases in eps)."""
    if not (0.0 < delta < 1.0) or not (math.isfinite(sigma) and sigma > 0):
        raise ValueError(f"need sigma > 0 finite and 0 < delta < 1; got {sigma}, {delta}")
    if calibration == "classic":
        return math.sqrt(2.0 * math.log(2.0 / delta)) / sigma
    if calibration == "analytic":
        return least_passing(lambda eps: analytic_gaussian_sigma(eps, delta) <= sigma, 1e-3, 1.0, rtol)
    raise ValueError(f"calibration must be 'classic' or 'analytic'; got {calibration!r}")
