"""Streaming correlated noise: the noise of step t is (C^-1 z)_t, z_t ~ N(0, sigma^2 I_d).

Releasing C x + z and decoding with B gives B (C x + z) = A (x + C^-1 z): a trainer adds (C^-1 z)_t to the
clipped gradient sum of step t. `NoiseStream` yields those d-vectors one step at a time, solving C y = z by
forward substitution with only the state the structure needs:
- BLT (c_0 = 1, c_t = sum_i omega_i theta_i^(t-1)): y_t = z_t - sum_i omega_i S_i, S_i <- theta_i S_i + y_t,
  K buffers of d (Dvijotham et al. 2024), O(K d) memory;
- banded (bandwidth w): y_t = (z_t - sum_(j = t-w+1)^(t-1) C_tj y_j) / C_tt, the last w - 1 outputs, O(w d);
- any other C (Toeplitz, sqrt, optimal): every past output, O(n d), refused above MAX_DENSE_NOISE_BYTES.
Noise is research noise (numpy, seeded) unless a `dpopt.release.streaming_noise_source` draw is given (OpenDP,
ledger charged first). `calibrated_sigma` gives sigma for (epsilon, delta) or rho-zCDP from the scheme's
sensitivity; amplification by sampling (Poisson or shuffled batches) is not modelled: every step's
participation is assumed, as in the sensitivity.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator

import numpy as np

from dpopt.privacy import Privacy
from dpopt.streaming.base import Factorization
from dpopt.validation import check_positive_int, check_positive_number

#: Largest history a dense C may keep while streaming (n d float64 values).
MAX_DENSE_NOISE_BYTES = 2 * 1024**3


def calibrated_sigma(f: Factorization, *, epsilon: float | None = None, delta: float | None = None,
                     rho: float | None = None, calibration: str = "classic", clip_norm: float = 1.0) -> float:
    """Gaussian sigma for z from the scheme's L2 sensitivity clip_norm sqrt(sens^2) (no amplification by sampling).

    (epsilon, delta): `dpopt.privacy.Privacy` with its calibration (classic or analytic, Balle and Wang 2018);
    rho: rho-zCDP, sigma = sens / sqrt(2 rho) (Bun and Steinke 2016, Prop. 1.6).
    """
    sens = check_positive_number(clip_norm, "clip_norm") * math.sqrt(f.sensitivity)
    if (rho is None) == (epsilon is None):
        raise ValueError("give either epsilon and delta, or rho")
    if rho is not None:
        return sens / math.sqrt(2.0 * check_positive_number(rho, "rho"))
    if not delta:
        raise ValueError("streaming noise is Gaussian: give delta > 0 with epsilon")
    return Privacy(epsilon, delta, calibration).noise_scale(sens)


def _structure(f: Factorization) -> tuple[str, dict[str, np.ndarray]]:
    """How C streams: ('blt', theta, omega), ('banded', band) or ('dense', C)."""
    p = f.params
    if f.family == "blt":
        return "blt", {"theta": np.asarray(p["theta"], float), "omega": np.asarray(p["omega"], float)}
    if f.family == "banded":
        w = int(p["bandwidth"])
        if p.get("structure") == "toeplitz":
            c = np.asarray(p["coefficients"], float)[:w]
            return "banded", {"toeplitz": c}
        if f.C is None:
            raise ValueError("a general banded factorization without its C cannot stream")
        return "banded", {"C": f.C, "w": np.array(w)}
    if f.C is not None:
        return "dense", {"C": f.C}
    if "coefficients" in p and len(p["coefficients"]) == f.n:
        return "dense", {"toeplitz": np.asarray(p["coefficients"], float)}
    raise ValueError(f"factorization {f.family!r} keeps neither C nor its coefficients; it cannot stream")


class NoiseStream:
    """Iterator over the n steps: the d-vector (C^-1 z)_t of step t, with O(K d) / O(w d) / O(n d) state (the K
    buffers of Dvijotham et al. 2024)."""

    def __init__(self, f: Factorization, d: int, sigma: float, *, rng: np.random.Generator | int | None = None,
                 draw: Callable[[int], np.ndarray] | None = None) -> None:
        self.f, self.d, self.sigma = f, check_positive_int(d, "d"), check_positive_number(sigma, "sigma")
        self.kind, self.data = _structure(f)
        if self.kind == "dense" and f.n * self.d * 8 > MAX_DENSE_NOISE_BYTES:
            need = f.n * self.d * 8 / 1024**3
            raise ValueError(f"streaming the noise of a dense C keeps every past step: n d = {f.n} x {self.d} values, "
                             f"about {need:.1f} GiB, above {MAX_DENSE_NOISE_BYTES / 1024**3:.0f} GiB; use a banded "
                             "or BLT factorization (O(w d) or O(K d) memory)")
        if draw is not None:
            self.mode, self._draw = "release", draw
        else:
            gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
            self.mode, self._draw = "research", lambda size: gen.normal(0.0, self.sigma, size)

    def state_values(self) -> int:
        """Numbers of d-vectors kept between steps: K (BLT), w - 1 (banded) or up to n (dense)."""
        if self.kind == "blt":
            return len(self.data["theta"])
        if self.kind == "banded":
            w = len(self.data["toeplitz"]) if "toeplitz" in self.data else int(self.data["w"])
            return w - 1
        return self.f.n

    def z(self) -> np.ndarray:
        """One step's z_t (d values): research N(0, sigma^2) or the release source's draw."""
        return np.asarray(self._draw(self.d), dtype=float).reshape(self.d)

    def __iter__(self) -> Iterator[np.ndarray]:
        return {"blt": self._blt, "banded": self._banded, "dense": self._dense}[self.kind]()

    def _blt(self) -> Iterator[np.ndarray]:
        theta, omega = self.data["theta"], self.data["omega"]
        S = np.zeros((len(theta), self.d))
        for _ in range(self.f.n):
            y = self.z() - omega @ S
            S = theta[:, None] * S + y[None, :]
            yield y

    def _entry(self, t: int, j: int) -> float:
        if "toeplitz" in self.data:
            c = self.data["toeplitz"]
            return float(c[t - j]) if t - j < len(c) else 0.0
        return float(self.data["C"][t, j])

    def _banded(self) -> Iterator[np.ndarray]:
        w = self.state_values() + 1
        past: deque[np.ndarray] = deque(maxlen=max(w - 1, 1))
        for t in range(self.f.n):
            acc = self.z()
            for i, y_j in enumerate(reversed(past)):  # y_(t-1-i)
                acc = acc - self._entry(t, t - 1 - i) * y_j
            y = acc / self._entry(t, t)
            if w > 1:
                past.append(y)
            yield y

    def _dense(self) -> Iterator[np.ndarray]:
        n = self.f.n
        hist = np.zeros((n, self.d))
        if "toeplitz" in self.data:
            c = self.data["toeplitz"]
        for t in range(n):
            row = c[t::-1][:t] if "toeplitz" in self.data else self.data["C"][t, :t]
            diag = c[0] if "toeplitz" in self.data else self.data["C"][t, t]
            hist[t] = (self.z() - row @ hist[:t]) / diag
            yield hist[t]
