"""Release mode: answers meant for publication, with secure noise and a privacy budget ledger.

Research mode (``Mechanism.answer(x, rng)``, ``dpopt.error``) draws noise from a seeded numpy
Generator so experiments repeat exactly; that noise is fine for measuring error and unfit for
publishing (a Mersenne-style generator and textbook floating-point Laplace sampling leak).  Release
mode is this module and nothing else:

- noise comes from OpenDP's samplers (``opendp.measurements.make_laplace`` / ``make_gaussian`` on a
  vector of floats), which draw from a cryptographically secure source and sample exactly on a
  fine grid, so the floating-point attacks on naive samplers do not apply;
- every release is charged to a ``PrivacyLedger`` *before* any noise is drawn; a release that would
  overspend raises ``BudgetExceededError``, charges nothing and releases nothing;
- what is charged is what OpenDP certifies for the measurement that draws the noise (its own
  privacy map, and for Gaussian noise its own zCDP to (eps, delta) conversion), never less than
  what was requested; the Gaussian sigma is the smallest OpenDP certifies at the requested
  (eps, delta), which is larger than the continuous Gaussian's exact calibration;
- ``ledger_file(path)`` keeps the ledger in a JSON file shared by processes on one machine: an
  exclusive lock (flock on the folder of the real file, symbolic links resolved, so that deleting
  or renaming files beside the ledger cannot split it) is held from read to write, and each charge
  is written atomically (``AtomicFile``) and fsynced before ``charge`` returns (write-ahead), so a
  crash at any instant can lose budget but never leaves a release unrecorded; a corrupt,
  inconsistent, non-UTF-8 or hard-linked file is refused;
- if OpenDP cannot be imported, release mode refuses (``ReleaseUnavailableError``); it never falls
  back to numpy;
- every row of the output says ``mode="release"``.

OpenDP features enabled: only ``"contrib"``, which OpenDP requires for every measurement whose
proof has not finished its external vetting; the Laplace and Gaussian measurements used here come
with proof documents (linked from their docstrings).  ``"floating-point"`` (samplers open to
floating-point attacks) and ``"honest-but-curious"`` are *not* enabled and not needed in OpenDP
0.16: float inputs are rounded to the noise grid inside the measurement and the noise is discrete
on that grid.  ``enable_features`` sets a process-wide flag in OpenDP.

What OpenDP does not cover: the measured values A x are computed here in float64 before OpenDP sees
them, and the sensitivity handed to it is sens1(A) or sens2(A) of the strategy in exact arithmetic.
Rounding in A x can move a neighbour's answer by a few ulps of |A x|, far below the noise grid for
counts, but it is outside OpenDP's proof.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import secrets
import signal
import stat
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, TextIO

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

import numpy as np
import pandas as pd

from dpopt.data import Domain, Records
from dpopt.privacy import Perturb, Privacy
from dpopt.queries import DomainMismatchError, check_domain
from dpopt.validation import check_choice, check_finite_vector, check_number, check_positive_number

RELEASE = "release"
# Relative slack when comparing spent budget with the total: sums of decimal epsilons such as
# 0.1 + 0.2 exceed 0.3 in binary floating point, and OpenDP rounds its privacy maps up by one ulp.
BUDGET_RTOL = 1e-12


class ReleaseUnavailableError(RuntimeError):
    """Release mode cannot run (OpenDP missing or unusable); nothing was released or charged."""


class BudgetExceededError(RuntimeError):
    """A release would overspend the ledger; nothing was released and nothing was charged."""


class LedgerFileError(ValueError):
    """A ledger file cannot be used (wrong path, locked too long, totals that differ from those given)."""


class LedgerCorruptError(LedgerFileError):
    """A stored ledger is unreadable or inconsistent; it is refused, never replaced by a fresh one."""


# -- OpenDP samplers ------------------------------------------------------------------------------
def require_opendp() -> Any:
    """``opendp.prelude`` with the "contrib" feature enabled; ReleaseUnavailableError otherwise."""
    try:
        import opendp.prelude as dp
    except Exception as exc:  # ImportError, or a broken native library
        raise ReleaseUnavailableError(
            "release mode needs OpenDP (pip install opendp) for its secure noise samplers and "
            f"refuses to fall back to numpy; import failed: {exc}"
        ) from exc
    dp.enable_features("contrib")
    return dp


def _values(values: np.ndarray) -> list[float]:
    v = np.asarray(values, dtype=float)
    if v.ndim != 1 or v.size == 0:
        raise ValueError(f"values must be a non-empty 1-D vector, got shape {v.shape}")
    if not np.all(np.isfinite(v)):
        raise ValueError("values have NaN or infinite entries; expected only finite numbers")
    return v.tolist()


def _measurement(scale: float, gaussian: bool) -> Any:
    """OpenDP's Laplace (L1 distance) or Gaussian (L2 distance) measurement on a vector of floats."""
    dp = require_opendp()
    make, distance = (dp.m.make_gaussian, dp.l2_distance) if gaussian else (dp.m.make_laplace, dp.l1_distance)
    return make(dp.vector_domain(dp.atom_domain(T=float, nan=False)), distance(T=float), scale=scale)


# The sampler below adds noise without charging a ledger: it stays private to this module, which
# draws release noise only inside ``release`` after the ledger has been charged.
def _secure_noise(values: np.ndarray, scale: float, gaussian: bool) -> np.ndarray:
    """values + Laplace(0, scale) or N(0, scale^2) noise per entry, drawn by OpenDP (shape of values, (r,))."""
    scale = check_positive_number(scale, "Gaussian sigma" if gaussian else "Laplace scale")
    return np.asarray(_measurement(scale, gaussian)(_values(values)), dtype=float)


def noise_seconds(count: int, gaussian: bool, probe: int = 2000) -> float:
    """Estimated wall seconds for OpenDP to draw `count` noise values (its secure samplers, timed on a probe)."""
    meas = _measurement(1.0, gaussian)
    t0 = time.perf_counter()
    meas(_values(np.zeros(probe)))
    return (time.perf_counter() - t0) * count / probe


# -- what OpenDP certifies ------------------------------------------------------------------------
# Relative width of the bracket around the smallest sigma OpenDP certifies when the search stops;
# the sigma returned is the bracket's upper end, which OpenDP has certified.
SIGMA_RTOL = 1e-9


def _gaussian_certificate(sigma: float, sens2: float, delta: float) -> tuple[Any, float, float]:
    """(measurement, rho, epsilon) OpenDP proves for its Gaussian measurement of scale ``sigma``.

    rho: the measurement's own privacy map at d_in = sens2 (zCDP, floats rounded to OpenDP's noise
    lattice included).  epsilon: OpenDP's conversion of that guarantee to (epsilon, delta)-DP at
    the given delta (make_zCDP_to_approxDP, then make_fix_delta).
    """
    dp = require_opendp()
    meas = _measurement(sigma, gaussian=True)
    rho = float(meas.map(sens2))
    eps, fixed_delta = dp.c.make_fix_delta(dp.c.make_zCDP_to_approxDP(meas), delta).map(sens2)
    if fixed_delta != delta:  # make_fix_delta reports the delta it was given
        raise ReleaseUnavailableError(f"OpenDP fixed delta={fixed_delta!r}, not {delta!r}")
    return meas, rho, float(eps)


def certified_gaussian_sigma(sens2: float, epsilon: float, delta: float) -> float:
    """Smallest Gaussian sigma (to relative SIGMA_RTOL) for which OpenDP certifies (epsilon, delta).

    The oracle is OpenDP's own privacy map for the measurement release mode runs, converted to
    (epsilon, delta) by OpenDP (``_gaussian_certificate``); the result is certified by it.  The
    continuous Gaussian's exact calibration (Balle and Wang) would be smaller, but OpenDP does not
    prove it for its measurement.  Bisection on log sigma, starting from the Bun-Steinke sigma
    sens2 / sqrt(2 zcdp_budget(epsilon, delta)), which OpenDP's tighter conversion certifies.
    """
    sens2 = check_positive_number(sens2, "L2 sensitivity")
    if not (math.isfinite(epsilon) and epsilon > 0) or not 0 < delta < 1:
        raise ValueError(f"need epsilon > 0 and 0 < delta < 1, got {epsilon}, {delta}")
    return _certified_gaussian_sigma(sens2, float(epsilon), float(delta))


@functools.lru_cache(maxsize=256)
def _certified_gaussian_sigma(sens2: float, epsilon: float, delta: float) -> float:
    """certified_gaussian_sigma without validation, cached: each search asks OpenDP ~30 times
    (about 10 ms each), and repeated releases of one strategy ask the same question."""
    dp = require_opendp()

    def certified(sigma: float) -> bool:
        try:
            return _gaussian_certificate(sigma, sens2, delta)[2] <= epsilon
        except dp.OpenDPException:  # e.g. e^eps overflows for a tiny sigma: nothing certified
            return False

    hi = sens2 / math.sqrt(2.0 * zcdp_budget(epsilon, delta))
    for _ in range(64):
        if certified(hi):
            break
        hi *= 2.0
    else:
        raise ReleaseUnavailableError(f"OpenDP certifies (eps={epsilon}, delta={delta}) for no "
                                      f"Gaussian sigma up to {hi:g}; nothing released")
    lo = hi / 2.0
    for _ in range(64):
        if not certified(lo):
            break
        hi, lo = lo, lo / 2.0
    else:
        raise ReleaseUnavailableError(f"OpenDP certifies (eps={epsilon}, delta={delta}) for every "
                                      f"sigma down to {lo:g}; its privacy map is not usable here")
    while hi > lo * (1.0 + SIGMA_RTOL):
        mid = math.sqrt(lo * hi)
        if certified(mid):
            hi = mid
        else:
            lo = mid
    return hi


def least_certified_epsilon(sigma: float, sens2: float, delta: float) -> float:
    """The least epsilon at which a release (at this delta) draws Gaussian noise of at most `sigma`.

    OpenDP's certified epsilon for its Gaussian measurement at sigma (1 - 2 SIGMA_RTOL): at that epsilon
    `certified_gaussian_sigma` returns at most sigma (its search overshoots by SIGMA_RTOL at most), and at
    any smaller epsilon OpenDP certifies no sigma that small (its epsilon decreases as sigma grows).
    """
    sigma = check_positive_number(sigma, "Gaussian sigma")
    sens2 = check_positive_number(sens2, "L2 sensitivity")
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    return float(_gaussian_certificate(sigma * (1.0 - 2.0 * SIGMA_RTOL), sens2, float(delta))[2])


# -- privacy arithmetic ---------------------------------------------------------------------------
def zcdp_to_dp_epsilon(rho: float, delta: float) -> float:
    """epsilon = rho + 2 sqrt(rho ln(1/delta)): rho-zCDP implies (epsilon, delta)-DP (Bun and
    Steinke, TCC 2016, Prop. 1.3), for every 0 < delta < 1."""
    if rho < 0 or not 0 < delta < 1:
        raise ValueError(f"need rho >= 0 and 0 < delta < 1, got rho={rho}, delta={delta}")
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


def zcdp_budget(epsilon: float, delta: float) -> float:
    """Largest rho whose conversion ``zcdp_to_dp_epsilon(rho, delta)`` is at most epsilon.

    Solving rho + 2 sqrt(rho L) = epsilon with L = ln(1/delta) for sqrt(rho):
    sqrt(rho) = sqrt(L + epsilon) - sqrt(L) = epsilon / (sqrt(L + epsilon) + sqrt(L)), the second form
    without the cancellation that makes the first 0 for epsilon below L * 1e-16.
    """
    if not epsilon > 0 or not 0 < delta < 1:
        raise ValueError(f"need epsilon > 0 and 0 < delta < 1, got {epsilon}, {delta}")
    L = math.log(1.0 / delta)
    return (epsilon / (math.sqrt(L + epsilon) + math.sqrt(L))) ** 2


# -- ledger ---------------------------------------------------------------------------------------
NOISE_KINDS = ("laplace", "gaussian")


def _cost_number(value: Any, what: str, *, below_one: bool = False) -> float:
    """A finite, non-negative number (and < 1 if below_one), or ValueError naming what was wrong."""
    v = check_number(value, f"charge {what}")
    if not math.isfinite(v) or v < 0 or (below_one and v >= 1):
        expected = "a finite number in [0, 1)" if below_one else "a finite number >= 0"
        raise ValueError(f"charge {what} must be {expected}, got {v}")
    return v


@dataclass(frozen=True)
class Charge:
    """The privacy cost of one release.

    epsilon, delta: the (eps, delta)-DP guarantee of the release on its own; rho: its zCDP cost
    (Gaussian: sens2^2 / (2 sigma^2), Bun and Steinke Prop. 1.6; Laplace: eps^2 / 2, Prop. 1.4);
    noise: "laplace" or "gaussian"; label: free text for the history.  Costs must be finite and
    non-negative (a negative cost would give budget back); ValueError otherwise.
    """

    epsilon: float
    delta: float
    rho: float
    noise: str
    label: str = ""

    def __post_init__(self) -> None:
        """Validates the costs, noise kind and label (costs stored as float)."""
        object.__setattr__(self, "epsilon", _cost_number(self.epsilon, "epsilon"))
        object.__setattr__(self, "delta", _cost_number(self.delta, "delta", below_one=True))
        object.__setattr__(self, "rho", _cost_number(self.rho, "rho"))
        check_choice(self.noise, NOISE_KINDS, "charge noise")
        if not isinstance(self.label, str):
            raise ValueError(f"charge label must be a string, got {self.label!r}")


class PrivacyLedger:
    """A total privacy budget and the releases charged against it.

    accounting="basic": (eps, delta) add up (basic composition); a release is allowed while
    sum eps <= total_epsilon and sum delta <= total_delta.
    accounting="zcdp": releases are charged in zCDP (rho adds up, Bun and Steinke Lemma 2.3); the
    total (eps, delta) becomes the rho budget ``zcdp_budget(total_epsilon, total_delta)`` and the
    spent rho is reported back as (zcdp_to_dp_epsilon(rho, total_delta), total_delta).  Needs
    total_delta > 0.  Gaussian releases are much cheaper under this accounting when there are many.

    ``charge`` is atomic: it either records the whole charge or raises BudgetExceededError and
    leaves the ledger exactly as it was.  Comparisons allow a relative slack of BUDGET_RTOL.
    """

    def __init__(
        self,
        total_epsilon: float,
        total_delta: float = 0.0,
        accounting: Literal["basic", "zcdp"] = "basic",
    ) -> None:
        check_positive_number(total_epsilon, "total_epsilon")
        check_number(total_delta, "total_delta")
        if not math.isfinite(total_delta) or not 0 <= total_delta < 1:
            raise ValueError(f"total_delta must lie in [0, 1), got {total_delta}")
        if accounting not in ("basic", "zcdp"):
            raise ValueError(f"accounting must be 'basic' or 'zcdp', got {accounting!r}")
        if accounting == "zcdp" and total_delta == 0:
            raise ValueError("accounting='zcdp' needs total_delta > 0 (zCDP converts to "
                             "(eps, delta)-DP only for delta > 0); use accounting='basic'")
        self.total_epsilon = float(total_epsilon)
        self.total_delta = float(total_delta)
        self.accounting = accounting
        self.total_rho = zcdp_budget(self.total_epsilon, self.total_delta) if accounting == "zcdp" \
            else math.inf
        self._history: list[Charge] = []
        self._lock = threading.Lock()

    # -- state -----------------------------------------------------------------------------------
    @property
    def history(self) -> list[Charge]:
        """The charges so far, oldest first (a copy)."""
        return list(self._history)

    @property
    def spent_epsilon(self) -> float:
        """Epsilon spent: sum of eps (basic) or the conversion of the spent rho (zcdp)."""
        if self.accounting == "zcdp":
            return zcdp_to_dp_epsilon(self.spent_rho, self.total_delta)
        return math.fsum(c.epsilon for c in self._history)

    @property
    def spent_delta(self) -> float:
        """Delta spent: sum of delta (basic); total_delta once anything is spent (zcdp)."""
        if self.accounting == "zcdp":
            return self.total_delta if self._history else 0.0
        return math.fsum(c.delta for c in self._history)

    @property
    def spent_rho(self) -> float:
        """Sum of the releases' zCDP costs (meaningful for accounting="zcdp")."""
        return math.fsum(c.rho for c in self._history)

    @property
    def remaining_epsilon(self) -> float:
        """Epsilon a further pure-DP release may still use (zcdp: sqrt(2 remaining rho))."""
        if self.accounting == "zcdp":
            return math.sqrt(2.0 * self.remaining_rho)
        return max(self.total_epsilon - self.spent_epsilon, 0.0)

    @property
    def remaining_delta(self) -> float:
        """Delta still available (basic accounting; zcdp reports total_delta)."""
        if self.accounting == "zcdp":
            return self.total_delta
        return max(self.total_delta - self.spent_delta, 0.0)

    @property
    def remaining_rho(self) -> float:
        """zCDP budget left (accounting="zcdp"; inf under basic accounting)."""
        return max(self.total_rho - self.spent_rho, 0.0)

    def remaining(self) -> dict[str, float]:
        """{"epsilon", "delta", "rho"} still available."""
        return {"epsilon": self.remaining_epsilon, "delta": self.remaining_delta,
                "rho": self.remaining_rho}

    # -- charging --------------------------------------------------------------------------------
    def _refusal(self, c: Charge) -> str | None:
        """Why the charge would overspend (None if it fits)."""
        if self.accounting == "zcdp":
            if c.rho > self.remaining_rho + BUDGET_RTOL * self.total_rho:
                return (f"requested rho={c.rho:.6g} (eps={c.epsilon:g}, delta={c.delta:g}, "
                        f"{c.noise}) but remaining rho={self.remaining_rho:.6g} of total "
                        f"rho={self.total_rho:.6g} for (eps={self.total_epsilon:g}, "
                        f"delta={self.total_delta:g})")
            return None
        eps_ok = c.epsilon <= self.remaining_epsilon + BUDGET_RTOL * self.total_epsilon
        delta_ok = c.delta <= self.remaining_delta + BUDGET_RTOL * max(self.total_delta,
                                                                         np.finfo(float).tiny)
        if c.delta > 0 and self.total_delta == 0:
            delta_ok = False
        if eps_ok and delta_ok:
            return None
        return (f"requested (eps={c.epsilon:g}, delta={c.delta:g}) but remaining "
                f"(eps={self.remaining_epsilon:g}, delta={self.remaining_delta:g}) of total "
                f"(eps={self.total_epsilon:g}, delta={self.total_delta:g})")

    def can_afford(self, charge: Charge) -> bool:
        """True if ``charge`` fits in the remaining budget."""
        return self._refusal(charge) is None

    def charge(self, charge: Charge) -> None:
        """Record ``charge``, or raise BudgetExceededError and change nothing."""
        if not isinstance(charge, Charge):
            raise ValueError(f"expected a Charge, got {type(charge).__name__}")
        with self._lock:
            why = self._refusal(charge)
            if why is not None:
                raise BudgetExceededError(f"privacy budget exceeded, nothing released: {why}")
            self._commit([*self._history, charge])

    def _commit(self, history: list[Charge]) -> None:
        """Make ``history`` the ledger's state (a file ledger first makes it durable)."""
        self._history = history

    def _state(self, history: Sequence[Charge]) -> dict[str, Any]:
        """JSON-friendly state with the given history."""
        return {"total_epsilon": self.total_epsilon, "total_delta": self.total_delta,
                "accounting": self.accounting, "history": [asdict(c) for c in history]}

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly state (totals, accounting, history)."""
        return self._state(self._history)

    @classmethod
    def from_dict(cls, d: Any) -> PrivacyLedger:
        """Inverse of ``to_dict``, replaying the history under the budget; LedgerCorruptError if
        the state is malformed, has an invalid charge or overspends."""
        if not isinstance(d, dict):
            raise LedgerCorruptError(f"expected a JSON object with {sorted(_STATE_KEYS)}, got "
                                     f"{type(d).__name__}")
        if set(d) != _STATE_KEYS:
            raise LedgerCorruptError(f"expected exactly the keys {sorted(_STATE_KEYS)}, got "
                                     f"{sorted(map(str, d))}")
        try:
            led = PrivacyLedger(d["total_epsilon"], d["total_delta"], d["accounting"])
        except ValueError as exc:
            raise LedgerCorruptError(str(exc)) from None
        for i, c in enumerate(_history_entries(d["history"])):
            why = led._refusal(c)
            if why is not None:
                raise LedgerCorruptError(f"history entry {i} overspends the budget: {why}")
            led._history.append(c)
        return led

    def __repr__(self) -> str:
        return (f"PrivacyLedger({self.accounting}: spent eps={self.spent_epsilon:.6g}, "
                f"delta={self.spent_delta:.3g} of eps={self.total_epsilon:g}, "
                f"delta={self.total_delta:g}; {len(self._history)} releases)")


_STATE_KEYS = frozenset({"total_epsilon", "total_delta", "accounting", "history"})
_CHARGE_KEYS = frozenset({"epsilon", "delta", "rho", "noise", "label"})


def _history_entries(history: Any) -> list[Charge]:
    """The Charges of a stored history; LedgerCorruptError naming the first bad entry."""
    if not isinstance(history, list):
        raise LedgerCorruptError(f"history must be a list of charges, got {type(history).__name__}")
    out = []
    for i, c in enumerate(history):
        if not isinstance(c, dict) or set(c) != _CHARGE_KEYS:
            raise LedgerCorruptError(f"history entry {i} must be an object with exactly the keys "
                                     f"{sorted(_CHARGE_KEYS)}, got {c!r}")
        try:
            out.append(Charge(**c))
        except ValueError as exc:
            raise LedgerCorruptError(f"history entry {i}: {exc}") from None
    return out


# -- ledger file ----------------------------------------------------------------------------------
# Test-only hook: when the environment names a step here, the process writes the step's name to the
# file DPOPT_TEST_PAUSE_MARKER (if set) and sleeps, so a test can SIGKILL or interrupt it at exactly
# that step.  Steps in order: before-lock, locked, loaded, temp-written, renamed, noise-drawn, and in
# `dpopt answer` answers-temp-written, answers-written.
PAUSE_ENV = "DPOPT_TEST_PAUSE_AT"
PAUSE_MARKER_ENV = "DPOPT_TEST_PAUSE_MARKER"
LOCK_TIMEOUT = 120.0  # seconds to wait for another process's release to finish


def _pause_point(step: str) -> None:
    """Test-only: stop at ``step`` if DPOPT_TEST_PAUSE_AT names it (writes the marker, sleeps)."""
    if os.environ.get(PAUSE_ENV) != step:
        return
    marker = os.environ.get(PAUSE_MARKER_ENV)
    if marker:
        Path(marker).write_text(step, encoding="utf-8")
    time.sleep(600)


@contextmanager
def sigint_deferred() -> Iterator[None]:
    """Ctrl-C (SIGINT) during the block takes effect when the block ends: the block runs whole.

    Python runs signal handlers in the main thread only: elsewhere this does nothing (an interrupt
    is raised in the main thread, not in the block), and so it does when the SIGINT handler was not
    installed from Python.  On leaving the block the previous handler is restored and, if SIGINT
    arrived, run (Python's default one raises KeyboardInterrupt).
    """
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or previous is None:
        yield
        return
    arrived: list[Any] = []
    signal.signal(signal.SIGINT, lambda signum, frame: arrived.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if arrived and callable(previous):
            previous(signal.SIGINT, arrived[-1])
        elif arrived and previous == signal.SIG_DFL:
            signal.raise_signal(signal.SIGINT)


def _temp_pattern(name: str) -> re.Pattern[str]:
    """Names of AtomicFile's temp files for ``name``: '.NAME.PID.HEX8.tmp' (PID: the writer's)."""
    return re.compile(rf"\.{re.escape(name)}\.(\d+)\.[0-9a-f]{{8}}\.tmp")


class AtomicFile:
    """A file that appears whole or not at all: a temp file beside it, fsynced, renamed over it.

    folder_fd: an open descriptor of the folder (every step goes through it, so a rename of the
    folder's path cannot split the write); name: the file's name in it; mode: its permissions.  The
    temp file '.NAME.PID.HEX8.tmp' is created at once, which shows the folder takes a new file
    before anything depends on it.  ``text()`` streams into it, ``flush()`` fsyncs it, ``replace()``
    renames it over NAME and fsyncs the folder, ``discard()`` (also on leaving a ``with``) removes it
    unless renamed.  A reader, or a crash at any instant, sees the old file or the new one.
    """

    def __init__(self, folder_fd: int, name: str, mode: int = 0o644, *, owns_folder: bool = False) -> None:
        self.folder_fd, self.name = folder_fd, name
        self.temp = f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        self._owns_folder = owns_folder
        self._fd: int | None = None
        self._pending = False  # a temp file of ours exists and has not been renamed
        try:
            self._fd = os.open(self.temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=folder_fd)
            self._pending = True
            os.fchmod(self._fd, mode)
        except BaseException:
            self.discard()
            raise

    @classmethod
    def beside(cls, path: Path, mode: int = 0o644) -> AtomicFile:
        """An AtomicFile for ``path`` (its folder opened here and closed by ``discard``, also when the
        temp file cannot be created)."""
        return cls(os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY), path.name, mode, owns_folder=True)

    def text(self) -> TextIO:
        """A UTF-8 text stream on the temp file (close it before ``flush``)."""
        if self._fd is None:
            raise ValueError(f"the temp file of {self.name!r} is closed")
        return open(self._fd, "w", encoding="utf-8", newline="", closefd=False)

    def flush(self) -> os.stat_result:
        """fsync the temp file; returns its stat (the file's own once renamed)."""
        if self._fd is None:
            raise ValueError(f"the temp file of {self.name!r} is closed")
        os.fsync(self._fd)
        return os.fstat(self._fd)

    def replace(self) -> None:
        """Rename the temp file over the name, then fsync the folder so the rename is durable."""
        os.replace(self.temp, self.name, src_dir_fd=self.folder_fd, dst_dir_fd=self.folder_fd)
        self._pending = False
        os.fsync(self.folder_fd)

    def discard(self) -> None:
        """Close the temp file and remove it unless it was renamed (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._pending:
            self._pending = False
            with suppress(OSError):
                os.unlink(self.temp, dir_fd=self.folder_fd)
        if self._owns_folder:
            self._owns_folder = False
            os.close(self.folder_fd)

    def __enter__(self) -> AtomicFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.discard()


def _shown(given: str | os.PathLike[str], real: Path) -> str:
    """The path as typed, quoted, and the real file it leads to when that differs."""
    typed = os.fspath(given)
    same = os.path.abspath(typed) == str(real)
    return repr(typed) if same else f"{typed!r} (the real file {str(real)!r})"


def _ledger_path(path: str | os.PathLike[str]) -> Path:
    """The ledger's real path, symbolic links resolved (a charge locks and replaces the file they lead
    to, never a link); refused if it is a folder, in a folder that does not exist, or not a regular file."""
    typed = os.fspath(path)
    target = Path(os.path.realpath(typed))
    if target.is_symlink():
        raise LedgerFileError(f"ledger path {typed!r}: its symbolic links form a loop")
    if target.is_dir():
        raise LedgerFileError(f"ledger path {_shown(typed, target)} is a directory; expected the path "
                              "of a JSON ledger file (created if absent)")
    if not target.parent.is_dir():
        raise LedgerFileError(f"ledger path {typed!r}: directory {str(target.parent)!r} does not exist")
    if target.exists() and not target.is_file():
        raise LedgerFileError(f"ledger path {_shown(typed, target)} is not a regular file")
    return target


def _check_expected(led: PrivacyLedger, expect: Mapping[str, Any] | None, shown: str) -> None:
    """Refuse a stored ledger whose totals or accounting differ from values the caller gave."""
    for key, given in (expect or {}).items():
        if key not in ("total_epsilon", "total_delta", "accounting"):
            raise ValueError(f"expect may name total_epsilon, total_delta or accounting, got {key!r}")
        stored = getattr(led, key)
        if given is not None and given != stored:
            raise LedgerFileError(
                f"ledger file {shown} has {key}={stored!r} but {given!r} was given; an "
                "existing ledger's totals and accounting cannot change (start a new ledger file "
                "for a new budget)"
            )


def _check_one_name(st: os.stat_result, shown: str) -> None:
    """Refuse a ledger that is not a regular file or has more than one name (hard links)."""
    if not stat.S_ISREG(st.st_mode):
        raise LedgerFileError(f"ledger path {shown} is not a regular file")
    if st.st_nlink > 1:
        raise LedgerFileError(
            f"ledger file {shown} has {st.st_nlink} names (hard links); a charge replaces the file "
            "by a rename, after which the other names would keep the old budget: keep one name "
            "(a symbolic link is followed to the real file)"
        )


def _parse_ledger(data: bytes, shown: str) -> PrivacyLedger:
    """The ledger stored as ``data`` (UTF-8 JSON); LedgerCorruptError naming the file otherwise."""
    refusal = "refusing to use it or to start a fresh ledger over it"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LedgerCorruptError(f"ledger file {shown} is corrupt (not UTF-8 text: {exc.reason} at "
                                 f"byte {exc.start}); {refusal}") from None
    try:
        state = json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:
        raise LedgerCorruptError(f"ledger file {shown} is corrupt (not complete JSON: {exc}); "
                                 f"{refusal}") from None
    try:
        return PrivacyLedger.from_dict(state)
    except LedgerCorruptError as exc:
        raise LedgerCorruptError(f"ledger file {shown} is corrupt: {exc}; {refusal}") from None


def _read_in(folder_fd: int, name: str, shown: str) -> tuple[PrivacyLedger | None, os.stat_result | None]:
    """(ledger, its stat) of the file ``name`` in the open folder; (None, None) if absent."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=folder_fd)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        raise LedgerFileError(f"ledger file {shown} cannot be read: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        _check_one_name(st, shown)
        return _parse_ledger(fh.read(), shown), st


def _open_folder(folder: Path, shown: str) -> int:
    """A descriptor of the ledger's folder; LedgerFileError if it cannot be opened."""
    try:
        return os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise LedgerFileError(f"ledger path {shown}: cannot open its folder: {exc.strerror}") from None


def read_ledger(
    path: str | os.PathLike[str], expect: Mapping[str, Any] | None = None
) -> PrivacyLedger | None:
    """The validated ledger stored at ``path`` (None if absent), read without locking.

    Symbolic links are followed to the real file.  Writes are atomic renames, so a read sees one
    whole version.  LedgerCorruptError if the file is not UTF-8 text holding a complete, consistent
    ledger; LedgerFileError if it has several names (hard links) or if ``expect``
    ({"total_epsilon": ..., "total_delta": ..., "accounting": ...}, None values ignored) differs
    from what is stored.
    """
    target = _ledger_path(path)
    shown = _shown(path, target)
    folder_fd = _open_folder(target.parent, shown)
    try:
        led, _ = _read_in(folder_fd, target.name, shown)
    finally:
        os.close(folder_fd)
    if led is not None:
        _check_expected(led, expect, shown)
    return led


def _reject_constant(name: str) -> float:
    """json parse_constant hook: NaN and Infinity are not valid ledger numbers."""
    raise ValueError(f"non-finite number {name}")


def _identity(st: os.stat_result | None) -> tuple[int, int, int, int] | None:
    """What tells one version of a file from another: device, inode, size, modification time."""
    return None if st is None else (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _same_inode(a: os.stat_result, b: os.stat_result) -> bool:
    """True if the two stats are of one file (same device and inode)."""
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


class FileLedger(PrivacyLedger):
    """A PrivacyLedger kept in a JSON file; obtained from ``ledger_file``, usable inside its block.

    ``charge`` writes the new history to the file atomically and durably (write-ahead) before it
    returns, so a release draws noise only after its cost is on disk; the rename and the update of
    the history in memory run under ``sigint_deferred``, so after Ctrl-C ``history`` says whether
    the charge is on disk.  It refuses (LedgerFileError, nothing charged) when the file is no longer
    the version it loaded (replaced, removed or given a second name by something that does not take
    the lock).  Outside the ``with`` block (the lock released) it refuses to charge.
    """

    def __init__(self, path: Path, ledger: PrivacyLedger, folder_fd: int, loaded: os.stat_result | None,
                 shown: str) -> None:
        super().__init__(ledger.total_epsilon, ledger.total_delta, ledger.accounting)
        self.path = path
        self._history = ledger.history
        self._folder_fd = folder_fd
        self._version = _identity(loaded)
        self._mode = 0o644 if loaded is None else stat.S_IMODE(loaded.st_mode)
        self._shown = shown
        self._open = False

    def charge(self, charge: Charge) -> None:
        """Record ``charge`` in the file (see the class), or raise and change nothing."""
        super().charge(charge)
        _pause_point("renamed")

    def _check_unchanged(self) -> None:
        """Refuse to write unless the file is still the version loaded (or written) under the lock, in
        the folder its path names."""
        try:
            st = os.stat(self.path.name, dir_fd=self._folder_fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if _identity(st) != self._version or (st is not None and st.st_nlink != 1):
            raise LedgerFileError(
                f"ledger file {self._shown} was replaced, removed or linked while this process held "
                "its lock, by something that does not take the lock; nothing charged"
            )
        try:
            moved = not _same_inode(os.stat(self.path.parent), os.fstat(self._folder_fd))
        except FileNotFoundError:
            moved = True
        if moved:  # later readers of the path would not see this charge
            raise LedgerFileError(f"the folder of ledger file {self._shown} was moved or removed while "
                                  "this process held its lock; nothing charged")

    def _commit(self, history: list[Charge]) -> None:
        """Write ``history`` to the ledger file (atomic, fsynced) while the lock is held."""
        if not self._open:
            raise LedgerFileError(f"ledger file {self._shown} is not locked; charge inside "
                                  "'with ledger_file(path) as ledger:'")
        self._check_unchanged()
        text = json.dumps(self._state(history), indent=2, allow_nan=False) + "\n"
        with AtomicFile(self._folder_fd, self.path.name, self._mode) as out:
            with out.text() as fh:
                fh.write(text)
            written = out.flush()
            _pause_point("temp-written")
            with sigint_deferred():
                out.replace()
                self._history, self._version = history, _identity(written)

    def __repr__(self) -> str:
        return f"File{super().__repr__()[:-1]}; {str(self.path)!r})"


def _alive(pid: int) -> bool:
    """True unless no process with this pid exists (a pid that cannot exist counts as ended)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OverflowError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _remove_stale_temps(folder_fd: int, name: str) -> None:
    """Remove the temp files a crashed writer of ``name`` left in the folder (call with the lock held).

    A file is removed only when both hold: it is named '.NAME.PID.HEX8.tmp' as AtomicFile names
    them, and no process with that PID exists (os.kill(PID, 0) fails with ProcessLookupError).
    Under the lock no writer of this ledger is between creating and renaming its temp file, so the
    second rule only matters if something bypassed the lock; a reused PID keeps its file (so a
    live writer's file is never removed, at worst a dead one's stays until its PID is free again).
    """
    pattern = _temp_pattern(name)
    for entry in os.listdir(folder_fd):
        found = pattern.fullmatch(entry)
        if found and not _alive(int(found.group(1))):
            with suppress(OSError):
                os.unlink(entry, dir_fd=folder_fd)


# Folders whose ledger lock a thread of this process holds: (st_dev, st_ino) -> thread id.
_HELD: dict[tuple[int, int], int] = {}
_HELD_GUARD = threading.Lock()


@contextmanager
def _exclusive_lock(folder: Path, timeout: float, shown: str) -> Iterator[int]:
    """Hold flock(LOCK_EX) on the ledger's folder itself; yields the folder's open descriptor.

    A folder cannot be removed while it holds the ledger, nor replaced under an open descriptor, so
    deleting or renaming files beside the ledger cannot split the lock (a sidecar lock file could be
    deleted and re-created, letting a second process lock a new inode).  Ledgers in one folder share
    the lock; a thread that already holds it is refused at once instead of waiting for itself.
    """
    if fcntl is None:  # pragma: no cover
        raise LedgerFileError("ledger files need POSIX file locks (fcntl), unavailable here")
    fd = _open_folder(folder, shown)
    try:
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        with _HELD_GUARD:
            if _HELD.get(key) == threading.get_ident():
                raise LedgerFileError(f"ledger {shown}: this thread already holds the lock of its folder "
                                      f"{str(folder)!r} (ledgers in one folder share one lock); use one "
                                      "ledger_file block at a time there")
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise LedgerFileError(
                        f"ledger file {shown} stayed locked by another process for "
                        f"{timeout:g} s; try again when that release has finished") from None
                time.sleep(0.01)
        with _HELD_GUARD:
            _HELD[key] = threading.get_ident()
        try:
            yield fd
        finally:
            with _HELD_GUARD:
                _HELD.pop(key, None)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@contextmanager
def ledger_file(
    path: str | os.PathLike[str],
    *,
    create: tuple[float, float, Literal["basic", "zcdp"]] | None = None,
    expect: Mapping[str, Any] | None = None,
    timeout: float = LOCK_TIMEOUT,
) -> Iterator[FileLedger]:
    """Exclusive access to the ledger stored at ``path``: lock, load, yield a FileLedger.

    ``path`` may be a symbolic link: the real file is locked, read and replaced, the link stays.  The
    lock (flock on the real file's folder, see ``_exclusive_lock``) is held for the whole block, so
    concurrent processes on one machine charge one after the other; each charge is on disk before
    ``charge`` returns.  A file with several names (hard links) is refused.  Temp files of crashed
    writers are removed (``_remove_stale_temps``).  create: (total_epsilon, total_delta,
    accounting) of a new ledger if the file is absent (None: an absent file is an error).  expect:
    totals the stored ledger must have (see read_ledger).  A corrupt file raises
    LedgerCorruptError; it is never replaced by a fresh ledger.
    """
    target = _ledger_path(path)
    shown = _shown(path, target)
    _pause_point("before-lock")
    with _exclusive_lock(target.parent, timeout, shown) as folder_fd:
        if _ledger_path(path) != target or not _same_inode(os.stat(target.parent), os.fstat(folder_fd)):
            raise LedgerFileError(f"ledger path {shown} changed while waiting for its lock (a link or "
                                  "its folder was moved); nothing charged, try again")
        _pause_point("locked")
        _remove_stale_temps(folder_fd, target.name)
        led, loaded = _read_in(folder_fd, target.name, shown)
        if led is None:
            if create is None:
                raise LedgerFileError(f"ledger file {shown} not found")
            led = PrivacyLedger(*create)
        _check_expected(led, expect, shown)
        fled = FileLedger(target, led, folder_fd, loaded, shown)
        _pause_point("loaded")
        fled._open = True
        try:
            yield fled
        finally:
            fled._open = False


# -- release --------------------------------------------------------------------------------------
def _noise_plan(strategy: Any, privacy: Privacy) -> tuple[str, float, float, Charge, Any]:
    """(noise, sensitivity, scale, charge, OpenDP measurement) for one release.

    What is charged is what OpenDP certifies for the measurement that draws the noise, never less
    than what was requested.  Laplace: scale b = sens1(A)/eps; OpenDP's epsilon at d_in = sens1
    must not exceed eps (beyond the float slack BUDGET_RTOL); charged max(certified, eps), rho
    eps^2 / 2.  Gaussian: sigma is the smallest OpenDP certifies at (eps, delta) for sens2(A)
    (``certified_gaussian_sigma``; the Privacy's calibration is not used, it only models error in
    research mode); charged (max(certified eps at delta, eps), delta) and OpenDP's rho.
    """
    eps, delta = float(privacy.epsilon), float(privacy.delta)
    if not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"epsilon must be a finite number > 0, got {eps}")
    if not (math.isfinite(delta) and 0 <= delta < 1):
        raise ValueError(f"delta must lie in [0, 1), got {delta}")
    slack = eps * BUDGET_RTOL + 4 * np.finfo(float).eps * eps
    if delta == 0:
        sens = float(strategy.sens1)
        scale = sens / eps
        meas = _measurement(scale, gaussian=False)
        certified = float(meas.map(sens))
        if certified > eps + slack:
            raise ReleaseUnavailableError(
                f"OpenDP certifies eps={certified!r} for Laplace scale {scale!r} and sensitivity "
                f"{sens!r}, more than the requested eps={eps!r}; nothing released"
            )
        eps_charged = max(certified, eps)
        return "laplace", sens, scale, Charge(eps_charged, 0.0, eps_charged**2 / 2, "laplace"), meas
    sens = float(strategy.sens2)
    sigma = certified_gaussian_sigma(sens, eps, delta)
    meas, rho, certified = _gaussian_certificate(sigma, sens, delta)
    if certified > eps + slack:  # certified_gaussian_sigma returns a certified sigma
        raise ReleaseUnavailableError(
            f"OpenDP certifies eps={certified!r} at delta={delta!r} for Gaussian sigma {sigma!r} "
            f"and sensitivity {sens!r}, more than the requested eps={eps!r}; nothing released"
        )
    return "gaussian", sens, sigma, Charge(max(certified, eps), delta, rho, "gaussian"), meas


def streaming_noise_source(sens2: float, privacy: Privacy, ledger: PrivacyLedger, label: str = "streaming"
                           ) -> tuple[float, Any]:
    """(sigma, draw) for a streaming release of C x at L2 sensitivity sens2, ledger charged first.

    The charge is `_noise_plan`'s for one Gaussian measurement of sensitivity sens2 at (epsilon, delta): OpenDP's
    certified sigma and its certified cost, charged before anything is drawn (BudgetExceededError otherwise).
    draw(size) returns `size` N(0, sigma^2) values from OpenDP's measurement (applied to zeros). Every draw of one
    source belongs to the one release charged here (the noise z of every step of the stream); amplification by
    sampling is not modelled. Laplace (delta = 0) is refused: multi-participation sensitivity is an L2 notion here.
    """
    if not isinstance(ledger, PrivacyLedger):
        raise ValueError(f"ledger must be a PrivacyLedger, got {type(ledger).__name__}")
    if privacy.delta == 0:
        raise ValueError("streaming release draws Gaussian noise: give delta > 0")
    sens = check_positive_number(sens2, "L2 sensitivity")

    class _Sens:
        sens1 = sens2 = sens

    noise, _, sigma, cost, meas = _noise_plan(_Sens(), privacy)
    ledger.charge(Charge(cost.epsilon, cost.delta, cost.rho, cost.noise, label))

    def draw(size: int) -> np.ndarray:
        return np.asarray(meas([0.0] * int(size)), dtype=float)

    return sigma, draw


def _check_release_domain(workload: Any, domain: Any | None) -> None:
    """Refuse a domain-bound workload without ``domain=``, or one bound to another Domain."""
    bound = getattr(workload, "domain", None)
    if domain is None:
        if isinstance(bound, Domain):
            raise DomainMismatchError(
                f"workload {workload.name!r} is bound to {bound!r}; pass domain= the Domain the data "
                "vector x was built over (histogram's report.domain) so release can check they "
                "are the same"
            )
        return
    if not isinstance(domain, Domain):
        raise ValueError(f"domain must be a dpopt.data.Domain, got {type(domain).__name__}")
    if isinstance(bound, Domain) and bound != domain:
        raise DomainMismatchError(
            f"workload {workload.name!r} is over {bound!r} but the data are over {domain!r}; they "
            f"differ in {bound.difference(domain)}; build the workload and the histogram from the "
            "same Domain"
        )
    check_domain(workload, domain)


def release(
    mechanism_fitted: Any,
    x: np.ndarray,
    ledger: PrivacyLedger,
    *,
    labels: Sequence[str] | None = None,
    domain: Any | None = None,
    label: str = "",
) -> pd.DataFrame:
    """Publishable noisy answers to the fitted workload: B (A x + z), z from OpenDP.

    mechanism_fitted: any fitted dpopt mechanism (``strategy_`` with sens1/sens2, ``privacy_``,
    ``workload_``, ``answers_with(x, perturb)`` and ``query_unit_variances()``): A x is measured
    through the strategy's own form (dense, Kronecker or marginal tables), never a dense copy, and
    the noise is OpenDP's measurement applied to the exact measurements in one call.
    x: data vector (n,), or ``Records`` (a table's rows as codes, see ``dpopt.data.records``): a
    strategy measured through marginals then never forms the data vector.  ledger: charged
    before any noise is drawn (a FileLedger from ``ledger_file`` has the charge on disk by then).  labels: m query labels (default the
    workload's row labels).  domain: the Domain x was built over (``histogram``'s report.domain);
    required when the workload is bound to a Domain, which must then be the same one: x alone
    cannot show which domain it came from, so release refuses to guess.

    Returns a DataFrame with one row per query: query, answer, std (standard deviation of that
    answer's noise, from the scale actually drawn), noise ("laplace"/"gaussian"), noise_scale
    (per measurement: Laplace b = sens1/eps, or the Gaussian sigma OpenDP certifies at (epsilon,
    delta) for sens2), mode ("release"), mechanism, strategy (the strategy it selected: a
    baseline's name when the mechanism kept a baseline with less error), epsilon, delta (requested;
    the ledger holds the charge).
    """
    for attr in ("strategy_", "privacy_", "workload_"):
        if not hasattr(mechanism_fitted, attr):
            raise ValueError(f"release needs a fitted mechanism with {attr}; call fit(workload, "
                             "privacy) first")
    if not isinstance(ledger, PrivacyLedger):
        raise ValueError(f"ledger must be a PrivacyLedger, got {type(ledger).__name__}")
    strategy = mechanism_fitted.strategy_
    privacy = mechanism_fitted.privacy_
    # the workload as given (bound to a Domain, with its row labels), else the one fitted
    workload = getattr(mechanism_fitted, "input_workload_", None) or mechanism_fitted.workload_
    if isinstance(x, Records):  # the rows themselves carry their Domain
        if domain is not None and domain != x.domain:
            raise DomainMismatchError(f"the records are over {x.domain!r} but domain= is {domain!r}")
        domain = x.domain
    _check_release_domain(workload, domain)
    m, n = workload.shape
    if not isinstance(x, Records):
        x = check_finite_vector(x, "data vector x", n)
    if labels is None:
        labels = workload.row_labels()
    labels = [str(s) for s in labels]
    if len(labels) != m:
        raise ValueError(f"labels has {len(labels)} entries but the workload has {m} queries")
    if hasattr(mechanism_fitted, "answers_with"):  # a dpopt mechanism, of any strategy form
        mechanism_fitted.expected_error()  # raises MechanismError unless the strategy supports the workload
        unit_var = np.asarray(mechanism_fitted.query_unit_variances(), dtype=float)

        def answer(p: Perturb) -> np.ndarray:
            return mechanism_fitted.answers_with(x, p)
    else:  # a bare fitted record (strategy_, privacy_, workload_) holding a dense Strategy
        strategy.check_supports(workload, getattr(mechanism_fitted, "support_rtol", 1e-8))
        unit_var = strategy.query_unit_variances(workload)

        def answer(p: Perturb) -> np.ndarray:  # the strategy reads only the norm (1 when delta = 0) from it
            return strategy.answer(x, Privacy(float(privacy.epsilon), float(privacy.delta)), None, workload,
                                   perturb=p)

    noise, sens, scale, cost, meas = _noise_plan(strategy, privacy)
    name = getattr(mechanism_fitted, "short_name", type(mechanism_fitted).__name__)
    cost = Charge(cost.epsilon, cost.delta, cost.rho, cost.noise,
                  label or f"{name} on {workload.name}")
    ledger.charge(cost)  # raises BudgetExceededError before any noise is drawn

    def perturb(y: np.ndarray, sensitivity: float) -> np.ndarray:
        """OpenDP's measurement on the exact measurements, calibrated for `sens` (checked)."""
        if not math.isclose(sensitivity, sens, rel_tol=1e-12):
            raise ReleaseUnavailableError(
                f"the strategy measured with sensitivity {sensitivity!r} but the noise was calibrated "
                f"for {sens!r}; nothing released"
            )
        y = np.asarray(y, dtype=float)
        return np.asarray(meas(_values(y.ravel())), dtype=float).reshape(y.shape)

    # A x measured through the strategy's own structure (dense, Kronecker or marginal tables)
    answers = np.asarray(answer(perturb), dtype=float).ravel()
    _pause_point("noise-drawn")
    std_one = scale * math.sqrt(2.0) if noise == "laplace" else scale
    std = std_one * np.sqrt(unit_var)
    out = pd.DataFrame({
        "query": labels,
        "answer": answers,
        "std": std,
        "noise": noise,
        "noise_scale": scale,
        "mode": RELEASE,
        "mechanism": name,
        "strategy": getattr(strategy, "name", ""),
        "epsilon": float(privacy.epsilon),
        "delta": float(privacy.delta),
    })
    out.attrs.update({"mode": RELEASE, "strategy": getattr(strategy, "name", ""),
                      "workload": workload.name, "ledger": repr(ledger)})
    return out
