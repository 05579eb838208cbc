"""Expected error of a strategy on a workload, exactly and by Monte Carlo (seed 004 Prop. 3.3; seed 000 Thm. 3).

Conventions (every report carries them):
- total: expected total squared error of the noise, E ||B z||^2 = var * sens^2 * ||B||_F^2 with
  B = W A^+ for matrix-mechanism strategies, where ||W A^+||_F^2 = trace(W^T W (A^T A)^+);
- per_query: the variance of each query's answer (None when the workload has no listable rows),
  computed on first access: for a least-squares strategy it costs an n x n inverse and an m x n
  product, more than the total itself, and most callers only need the total;
- rmse: sqrt(total / m); NaN when m is unknown (a workload given only by W^T W without its query count);
- bias_sq: for relaxed strategies (W != B A), the data-dependent term ||(W - B A) x||^2 (LRM Theorem 3),
  reported separately and only when x is given.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from dpopt.linalg import row_sq_norms
from dpopt.privacy import Privacy
from dpopt.strategy import Strategy
from dpopt.validation import check_finite_vector
from dpopt.workloads import Workload, _scaled, as_workload


@dataclass
class ErrorReport:
    """Expected error of one strategy on one workload under one privacy setting."""

    strategy: str
    workload: str
    total: float
    rmse: float
    m: int
    sensitivity: float
    sensitivity_norm: int
    noise: str
    convention: str
    bias_sq: float | None = None
    log10_total: float | None = None
    per_query_values: np.ndarray | None = field(default=None, repr=False)
    per_query_fn: Callable[[], np.ndarray] | None = field(default=None, repr=False, compare=False)

    @property
    def per_query(self) -> np.ndarray | None:
        """Variance of each query's answer (m,), computed once on first access; None without rows."""
        if self.per_query_values is None and self.per_query_fn is not None:
            self.per_query_values = np.asarray(self.per_query_fn(), dtype=float)
            self.per_query_fn = None
        return self.per_query_values


def unit_error(strategy: Strategy, workload: Workload) -> float:
    """||B||_F^2 with B = W A^+ (via trace(G X^+), unscaled Gram) or the given B: error per unit noise variance."""
    if strategy.B is not None:
        return float(row_sq_norms(strategy.B).sum())
    # X^+ (a Cholesky inverse at full column rank) is computed once per strategy and serves its answers too
    return float(np.einsum("ij,ji->", workload.gram(), strategy.gram_pinv()))


def expected_error(
    strategy: Strategy,
    workload: Workload | np.ndarray,
    privacy: Privacy,
    x: np.ndarray | None = None,
    rtol: float = 1e-8,
) -> ErrorReport:
    """Exact expected squared error of answering `workload` through `strategy` (seed 004 Prop. 3.3).

    P sens^2 ||B||_F^2 for every strategy form: the support check, the sensitivity, ||B||_F^2 and the
    per-query variances come from the strategy (through the factors for a factored one)."""
    workload = as_workload(workload)
    if not isinstance(privacy, Privacy):
        raise ValueError(f"privacy must be a dpopt.privacy.Privacy, got {type(privacy).__name__}")
    strategy.check_supports(workload, rtol)
    sens = strategy.sensitivity(privacy.norm)
    var = privacy.variance_factor * sens**2
    unit = strategy.unit_error(workload)
    log10_total = (
        math.log10(var * unit) + workload.gram_log_scale / math.log(10) if unit > 0 else -math.inf
    )
    total = _scaled(var * unit, workload.gram_log_scale if strategy.B is None else 0.0)
    m = workload.m
    per_query_fn = None
    if strategy.factored or strategy.B is not None or workload.has_rows:  # the queries can be listed
        per_query_fn = lambda: var * strategy.query_unit_variances(workload)  # noqa: E731
    bias_sq = None
    if x is not None:
        x = check_finite_vector(x, "data vector x", workload.n)
        if strategy.B is not None:
            r = workload.sparse() @ x - strategy.B @ (strategy.A @ x)
            bias_sq = float(r @ r)
        else:
            bias_sq = 0.0
    return ErrorReport(
        strategy=strategy.name,
        workload=workload.name,
        total=total,
        rmse=(math.sqrt(total / m) if math.isfinite(total) else math.inf) if workload.queries_known else math.nan,
        m=m if isinstance(m, int) else int(m),
        sensitivity=sens,
        sensitivity_norm=privacy.norm,
        noise=privacy.noise,
        convention=privacy.convention,
        per_query_fn=per_query_fn,
        bias_sq=bias_sq,
        log10_total=log10_total,
    )


def noisy_answers(
    strategy: Strategy, workload: Workload, privacy: Privacy, x: np.ndarray, rng: np.random.Generator, trials: int = 1,
) -> np.ndarray:
    """Research-mode answers B (A x + z) (`Strategy.answers`), z ~ Laplace/Gaussian from `rng`; shape (trials, m)."""
    r = strategy.shape[0]
    z = privacy.sample_noise(strategy.sensitivity(privacy.norm), trials * r, rng).reshape(trials, r)
    return strategy.answers(strategy.measured(x)[None, :] + z, workload)


def monte_carlo_error(
    strategy: Strategy,
    workload: Workload | np.ndarray,
    privacy: Privacy,
    x: np.ndarray,
    rng: np.random.Generator,
    trials: int = 2000,
    batch: int = 200,
    rtol: float = 1e-8,
) -> pd.DataFrame:
    """Monte Carlo estimate of the total squared error (noise + bias) with its standard error.

    Returns a one-row DataFrame: trials, total_mean, total_se, rmse, per_query_mean (array). `rtol` is
    the support tolerance (a solver's strategy may reproduce W only to its own tolerance).
    """
    workload = as_workload(workload)
    strategy.check_supports(workload, rtol)
    x = check_finite_vector(x, "data vector x", workload.n)
    return monte_carlo_total(
        lambda k: noisy_answers(strategy, workload, privacy, x, rng, k), workload.matvec(x), trials, batch
    )


def monte_carlo_total(
    draw: Callable[[int], np.ndarray], truth: np.ndarray, trials: int = 2000, batch: int = 200
) -> pd.DataFrame:
    """Sample mean and standard error of ||answers - truth||^2 over `trials` draws; draw(k) gives k answer rows.

    Returns a one-row DataFrame: trials, total_mean, total_se, rmse, per_query_mean (array).
    """
    if trials < 2:
        raise ValueError(f"trials must be at least 2, got {trials}")
    truth = np.asarray(truth, dtype=float)
    totals = []
    sq_sum = np.zeros(truth.size)
    done = 0
    while done < trials:
        k = min(batch, trials - done)
        err = np.asarray(draw(k)).reshape(k, truth.size) - truth
        totals.append(np.sum(err**2, axis=1))
        sq_sum += np.sum(err**2, axis=0)
        done += k
    t = np.concatenate(totals)
    return pd.DataFrame(
        {
            "trials": [trials],
            "total_mean": [float(t.mean())],
            "total_se": [float(t.std(ddof=1) / math.sqrt(trials))],
            "rmse": [float(math.sqrt(t.mean() / truth.size))],
        }
    ).assign(per_query_mean=[sq_sum / trials])



def data_samples(X: np.ndarray, n: int, what: str = "data") -> np.ndarray:
    """Data samples (K_s x n) from one data vector (any array of n entries) or a K_s x n array; non-negative
    finite counts, each sample with a positive total (the DPBench error divides by it)."""
    X = np.asarray(X)
    if not np.issubdtype(X.dtype, np.number) or np.issubdtype(X.dtype, np.complexfloating):
        raise ValueError(f"{what} holds {X.dtype} values; expected real counts")
    if X.size == n:
        X = X.reshape(1, n)
    elif not (X.ndim == 2 and X.shape[1] == n):
        raise ValueError(f"{what} has shape {X.shape}; expected {n} cells (one data vector) or K x {n} samples "
                         "for the workload's domain")
    X = X.astype(float)
    if not np.isfinite(X).all() or (X < 0).any():
        raise ValueError(f"{what} has negative or non-finite counts; expected counts >= 0")
    if (X.sum(axis=1) <= 0).any():
        raise ValueError(f"{what} has a sample whose counts sum to 0; the error per record divides by the total")
    return X


def data_error(
    answer: Callable[[np.ndarray, np.random.Generator], np.ndarray],
    workload: Workload | np.ndarray,
    X: np.ndarray,
    trials: int,
    rng: np.random.Generator,
) -> tuple[float, float]:
    """DPBench's scaled error (Hay et al. SIGMOD 2016, Sec. 4): the mean over data samples and noise trials of
    ||W x - answer(x)||_2 / m / sum(x), and its standard error (sample std / sqrt(count); NaN for one draw).

    answer(x, rng) returns the m noisy answers of one run (research mode); X is one data vector or K_s x n
    samples (`data_samples`); every sample gets `trials` runs, drawn in order from rng.
    """
    w = as_workload(workload)
    if isinstance(trials, bool) or not isinstance(trials, (int, np.integer)) or trials < 1:
        raise ValueError(f"trials must be a positive integer, got {trials!r}")
    X = data_samples(X, w.n)
    errs = []
    for x in X:
        truth = np.asarray(w.matvec(x), dtype=float)
        for _ in range(int(trials)):
            est = np.asarray(answer(x, rng), dtype=float).ravel()
            errs.append(float(np.linalg.norm(truth - est)) / w.m / float(x.sum()))
    e = np.asarray(errs)
    se = float(e.std(ddof=1) / math.sqrt(len(e))) if len(e) > 1 else math.nan
    return float(e.mean()), se
