"""Streaming correlated noise: streamed (C^-1 z)_t equals the batch solve to round-off."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.linalg import solve_triangular

from dpopt.privacy import Privacy
from dpopt.streaming.families import FAMILIES
from dpopt.streaming.noise import MAX_DENSE_NOISE_BYTES, NoiseStream, calibrated_sigma
from dpopt.streaming.participation import Participation
from dpopt.workloads import Prefix

UNIT = np.finfo(float).eps / 2

CASES = [("blt", {"buffers": 3}, "blt", 3), ("banded", {"bandwidth": 4}, "banded", 3),
         ("banded", {"bandwidth": 4, "structure": "general"}, "banded", 3), ("toeplitz", {}, "dense", 48),
         ("sqrt", {}, "dense", 48)]


@pytest.mark.parametrize(("family", "options", "kind", "state"), CASES, ids=[f"{c[0]}-{c[2]}-{len(c[1])}" for c in CASES])
def test_streamed_noise_equals_the_batch_product(family, options, kind, state):
    """Both the stream and scipy's solve are substitutions with backward error |dC| <= gamma_m |C| (Higham, Thm.
    8.5; for BLT the K buffers add K + 2 roundings to each row's sum, m = n + K + 2), so each is within
    gamma_m |C^-1| |C| |y| of the exact y (first order) and they differ by at most twice that; 4 gamma_m is used."""
    n, d = 48, 5
    f = FAMILIES[family](Prefix(n), Participation(n, 4), **options)
    stream = NoiseStream(f, d, sigma=1.0, rng=7)
    assert stream.kind == kind and stream.state_values() == state
    Y = np.array(list(stream))
    Z = np.random.default_rng(7).normal(0.0, 1.0, (n, d))  # the same draws, in the same order
    Yb = solve_triangular(f.C, Z, lower=True)
    m = n + state + 2
    gamma = m * UNIT / (1 - m * UNIT)
    bound = 4 * gamma * (np.abs(np.linalg.inv(f.C)) @ np.abs(f.C) @ np.abs(Yb))
    assert np.all(np.abs(Y - Yb) <= bound)


def test_dense_stream_is_refused_above_its_memory_limit():
    n = 64
    f = FAMILIES["toeplitz"](Prefix(n), Participation(n, 1))
    d = MAX_DENSE_NOISE_BYTES // (8 * n) + 1
    with pytest.raises(ValueError, match="GiB"):
        NoiseStream(f, d, sigma=1.0)


def test_calibration_from_the_scheme_sensitivity():
    n = 32
    f = FAMILIES["blt"](Prefix(n), Participation(n, 4), buffers=2)
    sens = math.sqrt(f.sensitivity)
    assert calibrated_sigma(f, epsilon=1.0, delta=1e-6) == pytest.approx(Privacy(1.0, 1e-6).noise_scale(sens))
    assert calibrated_sigma(f, rho=0.5, clip_norm=2.0) == pytest.approx(2.0 * sens / math.sqrt(1.0))
    with pytest.raises(ValueError, match="either"):
        calibrated_sigma(f)


def test_release_mode_charges_the_ledger_before_drawing():
    pytest.importorskip("opendp")
    from dpopt.release import BudgetExceededError, PrivacyLedger, streaming_noise_source

    n, d = 16, 2
    f = FAMILIES["banded"](Prefix(n), Participation(n, 2), bandwidth=2)
    ledger = PrivacyLedger(1.0, 1e-5)
    sigma, draw = streaming_noise_source(math.sqrt(f.sensitivity), Privacy(1.0, 1e-6), ledger)
    assert ledger.spent_epsilon == pytest.approx(1.0, rel=1e-9) and sigma > 0
    stream = NoiseStream(f, d, sigma, draw=draw)
    assert stream.mode == "release"
    Y = np.array(list(stream))
    assert Y.shape == (n, d) and np.all(np.isfinite(Y))
    with pytest.raises(BudgetExceededError):
        streaming_noise_source(math.sqrt(f.sensitivity), Privacy(1.0, 1e-6), ledger)
