"""A data-aware mechanism: DAWA's private partition, then dpopt's optimum on the reduced workload (short name dawa-opt).

Li, Hay and Miklau (PVLDB 2014, DAWA) answer range queries in two stages: a private partition of the cells into
intervals of near-uniform counts (`dpopt.partition.l1_partition`, budget ratio * eps), then a workload-aware
strategy measured on the bucket totals x_bar with the rest of the budget, the answers spread uniformly within
each bucket: W x ~ W P x_bar_hat, P the uniform expansion (`dpopt.partition.expansion`). DAWA's second stage is
a greedy hierarchy; here it is dpopt's own selection on the reduced workload W P (m x k): under eps-DP hdmm (its
Laplace-error optimum and baselines) up to MAX_HDMM_BUCKETS buckets; else the certified convex optimum
`mm-optimal` with its baseline candidates (identity, noise on queries, Qardaji's hierarchy, wavelet) up to
MAX_OPTIMAL_BUCKETS buckets, the least-error baseline beyond, ranked by exact expected error under the
second stage's privacy. Inference on the buckets is least squares (the default), certified non-negative least squares
(`dpopt.solvers.nnls.solve_nnls`, inference="nnls"), or the rule `use_nnls` (inference="auto": NNLS when a tenth
or more of the least-squares bucket estimates are negative). On the DPBench table (benchmarks/results/dpbench.md,
columns dawa-opt:ls, dawa-opt:nnls and dawa-opt, which is the rule) the rule was above least squares on some
rows, so it is not the default.

Signal-adaptive policy (`policy`, the default; `adaptive=False` keeps DAWA's fixed plan). A share STATS_SHARE of
eps measures two noisy statistics of x, its total N and the number C of adjacent cells whose counts differ by more
than the bucket cost c (`dpopt.partition.signal_statistics`, L1 sensitivity 3), and from them alone
(post-processing) chooses:
- the candidate family's resolution (`dpopt.partition.candidate_family`): where the partition's noise dominates the
  counts (signal s = N eps / n below LOW_SIGNAL), R = LOW_SIGNAL_RESOLUTION. The partition is a noisy minimum over
  the candidates, and with fewer candidates it is less often won by a bucket's noise. On DPBench's 72 rows at
  1,000 records (10 runs each, ratio to DAWA's error): R = 16 has geometric mean 0.905, 51 rows at or below
  DAWA, 4 above it by 2 standard errors; R = 2: 0.794, 50, 6; R = 4: 0.796, 52, 2; R = 8: 0.839, 52, 3. R = 4
  gains most on the sets with structure (RejectStats, MEDCOST) and loses on the near-uniform bids sets.
- whether to partition at all: at high signal (s >= HIGH_SIGNAL) the partition's noise is small against the
  counts, and it keeps about k = 1 + C buckets (two neighbours further apart than c are cheaper kept apart); with
  Qardaji's hierarchy as the model of the second stage's error ((log k)^3 / eps2^2 for k cells) it cannot pay for
  its budget unless (log k / log n)^3 < (1 - ratio)^2 (`dpopt.partition.dense_for_partition`). Where the model
  says it cannot, the exact expected errors decide (`partition_cannot_pay`): the second stage on k equal
  buckets at eps2 against the dense stage on all n cells (the second stage's p-Identity beats the model's
  hierarchy: on INCOME and MEDCOST at 10^7 records, eps 1, prefix sums, the partition the model skipped gave
  2.20e-8 and 2.11e-8 (6 runs each) against 2.60e-8 and 2.19e-8 skipped). When it cannot, by a margin of
  DENSE_MARGIN Laplace scales of the noisy C (`dense`), the whole rest of the budget goes to the second stage's
  own choice on all n cells (`dense_stage`: at 4096 cells the best baseline, as p-Identity of size 16 only ties
  with Qardaji's hierarchy there). With STATS_SHARE = 0.02 that scale is 150 / eps cells, so on
  4096 cells the test can skip at eps 1 and almost never at eps 0.1. The model is 1-D's: on a 2-D grid (cells in
  Hilbert-curve order) it is left out, and the stage on k equal buckets enters through a lower bound on every
  stage's error, P(eps2) SVDB(W P) (`stage_lower_bound`; its exact error would cost k^3 for up to 8,192
  buckets), so a grid skips its partition only where no stage on that many buckets could match the dense one.
Privacy: the statistics are (STATS_SHARE eps)-DP, the partition ((ratio - STATS_SHARE) eps)-DP (see
`dpopt.partition`), the second stage ((1 - ratio) eps, delta)-DP on x_bar (each record lies in one bucket, so the
reduction has sensitivity 1), or ((1 - STATS_SHARE) eps, delta)-DP on x when the partition is skipped; the
budgets are chosen from the statistics' noisy output only and always sum to (eps, delta), so they compose to it
(sequential composition with adaptively chosen budgets and a fixed total). A release (`release`) charges the
ledger once per step, each before any of its noise is drawn: statistics, partition, second stage (two charges
when the partition is skipped, two with adaptive=False).

2-D data (a product of two workloads or a union of them such as `dpopt.workloads.boxes`, or grid=(n1, n2)): the
cells are taken in Hilbert-curve order (`dpopt.partition.hilbert_order`, DAWA's Sec. 3.3), so the partition's
intervals are compact regions; W P then reads W's columns in that order.

After the partition (`cells_stage`, post-processing of its edges): when it kept more buckets than the second stage
decomposes (MAX_STAGE_BUCKETS; 10,600 of 65,536 cells on BeijingTaxiE at 10^7 records, eps 1), and on a 2-D grid
whenever its expected error is at most the bucket stage's, the second stage is the stage on all cells at the
same budget (1 - ratio) eps (`dense_stage`; on a grid, Qardaji's hierarchy on each axis and the other baselines,
through their Kronecker factors). The partition's budget is then spent without use, but the release is made and
its expected squared error is no larger than the bucket stage's, whose bias comes on top of its noise.

Error: the mechanism has no data-independent expected error. Its record leaves expected_total_error, rmse
and bound null and says why; compare's data_error (`dpopt compare --data`) is the number it is judged by.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import scipy.linalg
import scipy.sparse as sp

from dpopt.bounds import (
    EPS,
    eigenvalue_singular_value_lower_bounds,
    gram_singular_value_lower_bounds,
    svdb_from_singular_value_bounds,
)
from dpopt.hdmm import laplace_factor
from dpopt.mechanisms.base import FitInfo, Mechanism, MechanismError, Selection
from dpopt.partition import (
    DEVIATIONS,
    RESOLUTION,
    SIGNAL_STATISTICS_SENSITIVITY,
    bucket_sums,
    candidate_family,
    dense_for_partition,
    expansion,
    family_lengths,
    hilbert_order,
    l1_partition,
    noise_sensitivity,
    signal_statistics,
)
from dpopt.privacy import Perturb, Privacy, research_perturb
from dpopt.solvers.nnls import solve_nnls
from dpopt.strategy import StrategyError
from dpopt.validation import check_choice, check_finite_vector
from dpopt.workloads import MAX_DENSE_ENTRIES, ExplicitWorkload, Workload, as_workload

# The partition's cost: DAWA's mean deviation, or the median deviation (half its sensitivity; module docstring).
DEFAULT_DEVIATION = "mean"
# DAWA's budget share of the partition (Li, Hay and Miklau 2014 and DPBench run it at 0.25).
DEFAULT_RATIO = 0.25
# Up to this many buckets the second stage solves the convex optimum on W P (a k x k problem); beyond it, the
# baselines' closed forms only (the optimum's fixed cost grows as k^3 and is paid again for every partition).
MAX_OPTIMAL_BUCKETS = 512
# Under eps-DP, up to this many buckets the second stage is hdmm, whose objective is the Laplace (L1) error that
# mm-optimal's L2 optimum does not target: on DPBench's prefix sums over 64 / 128 / 256 random buckets its error
# is 0.41 / 0.32 / 0.65 of mm-optimal's, in 2.8 / 7.7 / 15.5 CPU s (one core); at 512 buckets it took over 90 s.
MAX_HDMM_BUCKETS = 256
# Beyond it, up to MAX_LARGE_HDMM_BUCKETS, hdmm's p-Identity with p = LARGE_HDMM_P (HDMM's own p at 256 cells) and
# OPT_0 only (no further rounds): on Prefix(k)'s Gram its unit error is 0.63 / 0.62 / 0.63 of the best baseline's
# (Qardaji's hierarchy) at k = 512 / 1024 / 2048, in 1.3 / 3.1 / 11.6 CPU s (single runs, one thread). The
# baselines on the buckets are far from it when the buckets differ in length: prefix sums of
# GrossCompenMDSalary2_filtered at 10^7 records, eps 1, over 823 buckets: unit error 1.15e5 against 4.85e5 for the
# best hierarchy, which there was above the hierarchy over all 4096 cells (at the stage's eps), so dawa-opt trailed
# the best fixed mechanism.
MAX_LARGE_HDMM_BUCKETS = 2048
LARGE_HDMM_P = 16
# The partition's longest candidate bucket, as a fraction of the domain. DAWA's cost dev(B) is the bias of B's single
# cells; a range or prefix query ending inside B carries up to dev(B) / 2, and about |B| / n of the queries do, so
# one noisy merge into a long bucket (a count of 69 spread over 1,728 empty cells, GrossCompenMDSalary1 at 10^7
# records) can outweigh the stage's noise. On 14 DPBench rows (20 runs at 1,000 records, 10 at 10^7) the cap n / 4
# lowered the mean error on 9 (ADULTFRANK ranges at eps 1: 1.22e-4 to 7.8e-5; GrossCompenMDSalary2_filtered ranges
# at 10^7, eps 1: 2.9e-8 to 2.2e-8), left 4 within a standard error and raised NETTRACE ranges at eps 0.1 (4.3e-4 to
# 5.2e-4, 1.3 standard errors); n / 8 and n / 2 were each worse than n / 4 on most of them.
MAX_BUCKET_FRACTION = 0.25
# "both" answers as "auto" but always computes the NNLS estimate too (the benchmark compares the two).
INFERENCES = ("ls", "nnls", "auto", "both")
# `use_nnls`: NNLS replaces least squares when at least this fraction of the least-squares bucket estimates
# is negative (measured on the DPBench table: see NNLS_RULE_SOURCE).
NNLS_NEGATIVE_FRACTION = 0.1
NNLS_RULE_SOURCE = "benchmarks/results/dpbench.md (inference columns)"
# The signal-adaptive policy (module docstring): the statistics' share of eps (taken from the partition's share),
# the signal s = N eps / n below which the coarse family is used, and above which a dense data set skips the
# partition. On DPBench (18 data sets, 4096 cells) s is 0.024 / 0.24 at 1,000 records (eps 0.1 / 1), 2.4 / 24
# at 10^5 and 244 / 2441 at 10^7: the partition led the best fixed mechanism on every measured row up to s = 24
# and trailed it by 1.2-1.3x at s >= 244 except on the sparsest set (ADULTFRANK, 2% of cells non-empty);
# LOW_SIGNAL and HIGH_SIGNAL lie between those scales.
STATS_SHARE = 0.02
LOW_SIGNAL = 1.0
LOW_SIGNAL_RESOLUTION = 4
HIGH_SIGNAL = 100.0
# The dense test's margin, in Laplace scales of the noisy C (see `policy`).
DENSE_MARGIN = 2.0
# Certified NNLS: stop at this relative duality gap (the noise it leaves is far below the privacy noise).
NNLS_TOL = 1e-9
BASELINE_STAGES = ("identity", "hierarchical", "wavelet")
# The second stage eigendecomposes the k x k Gram of W P: at most this many buckets (k^3 flops, 8 k^2 bytes; a 1-D
# domain of 4096 cells never exceeds it, a 2-D grid of 65,536 cells at high signal can).
MAX_STAGE_BUCKETS = 8192


def use_nnls(x_ls: np.ndarray, negative_fraction: float = NNLS_NEGATIVE_FRACTION) -> bool:
    """The inference rule: NNLS when at least `negative_fraction` of the least-squares estimates x_ls are below 0
    (a post-processing of the noisy measurements: no privacy cost)."""
    x_ls = np.asarray(x_ls, dtype=float)
    return bool(x_ls.size) and float(np.mean(x_ls < 0)) >= negative_fraction


class ReducedStage:
    """The second stage: a strategy over the k buckets, fitted on a k x k factor V of W P (V^T V = (W P)^T W P:
    the least-squares error depends on the workload only through that Gram, seed 004), answering W P's m queries
    from bucket totals x_bar by least squares or certified NNLS; `release` takes it as a fitted mechanism."""

    def __init__(self, inner: Mechanism, reduced: Workload, inference: str, negative_fraction: float) -> None:
        self.inner = inner
        self.inference = inference
        self.negative_fraction = negative_fraction
        self.short_name = inner.short_name
        # a strategy held through its factors is formed when it fits (hdmm's on k <= MAX_HDMM_BUCKETS buckets; NNLS
        # reads A); the skipped partition's baseline on a large domain (a 2-D grid) stays factored and answers by
        # least squares through its factors
        r, n = inner.strategy_.shape
        self.strategy_ = (inner.strategy_.to_dense() if inner.strategy_.factored and r * n <= MAX_DENSE_ENTRIES
                          else inner.strategy_)
        self.privacy_ = inner.privacy_
        self.workload_ = reduced
        self.support_rtol = inner.support_rtol
        self.answer_info_: dict[str, Any] = {}

    def expected_error(self) -> Any:
        """The least-squares noise error on W P (the uniform spread's bias within buckets depends on the data)."""
        return self.strategy_.expected_error(self.workload_, self.privacy_, rtol=self.support_rtol)

    def query_unit_variances(self) -> np.ndarray:
        return self.strategy_.query_unit_variances(self.workload_)

    def estimates(self, y: np.ndarray) -> dict[str, np.ndarray]:
        """Answers W P x_bar_hat from measurements y: {"ls": ..., "nnls": ...} and the rule's choice "auto";
        the strategy's own reconstruction B y when it has one (noise on queries)."""
        s = self.strategy_
        x_ls = np.asarray(s.answers(y, None), dtype=float)
        ls = np.asarray(self.workload_.matvec(x_ls), dtype=float)
        out = {"ls": ls}
        if self.inference == "ls":
            self.answer_info_ = {"inference": "ls"}
            return out
        rule = use_nnls(x_ls, self.negative_fraction)
        if self.inference == "nnls" and s.factored:
            r, n = s.shape
            raise MechanismError(f"{self.short_name}: NNLS inference reads the strategy's matrix, and {s.name} "
                                 f"({r} x {n}) is held through its factors; use inference='ls' or 'auto'")
        if s.factored:  # "auto" and "both": least squares, with no NNLS estimate beside it
            self.answer_info_ = {"inference": "ls", "negative_fraction": float(np.mean(x_ls < 0)),
                                 "nnls": "not computed: the strategy is held through its factors"}
        elif self.inference == "nnls" or rule or self.inference == "both":
            res = solve_nnls(s.matrix(), y, tol=NNLS_TOL)
            if res.status != "converged":
                raise MechanismError(f"{self.short_name}: NNLS inference did not certify its optimum ({res.message})")
            out["nnls"] = np.asarray(self.workload_.matvec(res.x), dtype=float)
            self.answer_info_ = {"inference": "nnls" if (self.inference == "nnls" or rule) else "ls",
                                 "nnls_gap": res.gap, "nnls_iterations": res.nit,
                                 "negative_fraction": float(np.mean(x_ls < 0))}
        else:
            self.answer_info_ = {"inference": "ls", "negative_fraction": float(np.mean(x_ls < 0))}
        out["auto"] = out["nnls"] if self.answer_info_["inference"] == "nnls" else ls
        return out

    def answers_with(self, x: np.ndarray, perturb: Perturb) -> np.ndarray:
        """Answers to W P's queries from the bucket totals x (k,), the noise drawn by perturb."""
        s = self.strategy_
        y = perturb(np.asarray(s.measured(x), dtype=float), s.sensitivity(self.privacy_.norm))
        est = self.estimates(np.asarray(y, dtype=float))
        return est["nnls"] if self.answer_info_.get("inference") == "nnls" else est["ls"]


class DataAwareMechanism(Mechanism):
    """DAWA's private L1 partition (Li, Hay and Miklau 2014), then dpopt's optimum on the reduced workload."""

    short_name: ClassVar[str] = "dawa-opt"
    data_dependent: ClassVar[bool] = True

    def __init__(self, ratio: float = DEFAULT_RATIO, inference: str = "ls",
                 max_optimal_buckets: int = MAX_OPTIMAL_BUCKETS,
                 negative_fraction: float = NNLS_NEGATIVE_FRACTION, deviation: str = DEFAULT_DEVIATION,
                 cost_scale: float = 1.0, max_hdmm_buckets: int = MAX_HDMM_BUCKETS, adaptive: bool = True,
                 grid: tuple[int, int] | None = None,
                 max_large_hdmm_buckets: int = MAX_LARGE_HDMM_BUCKETS,
                 max_bucket_fraction: float = MAX_BUCKET_FRACTION) -> None:
        if not (isinstance(ratio, (int, float)) and 0 < float(ratio) < 1):
            raise ValueError(f"ratio must lie strictly between 0 and 1, got {ratio!r}")
        if not isinstance(adaptive, bool):
            raise ValueError(f"adaptive must be True or False, got {adaptive!r}")
        if adaptive and not float(ratio) > STATS_SHARE:
            raise ValueError(f"ratio must exceed the statistics' share {STATS_SHARE} of eps when adaptive=True "
                             f"(it is taken from the partition's share), got {ratio!r}")
        self.adaptive = adaptive
        if grid is not None:
            if not (isinstance(grid, (tuple, list)) and len(grid) == 2
                    and all(isinstance(v, (int, np.integer)) and v >= 1 for v in grid)):
                raise ValueError(f"grid must be two positive integers (n1, n2) of a 2-D domain, got {grid!r}")
            grid = (int(grid[0]), int(grid[1]))
        self.grid = grid
        if not (isinstance(cost_scale, (int, float)) and 0 < float(cost_scale) < math.inf):
            raise ValueError(f"cost_scale must be a positive number, got {cost_scale!r}")
        check_choice(inference, INFERENCES, "inference")
        check_choice(deviation, DEVIATIONS, "deviation")
        self.deviation = deviation
        self.cost_scale = float(cost_scale)
        self.ratio = float(ratio)
        self.inference = inference
        self.max_optimal_buckets = int(max_optimal_buckets)
        self.max_hdmm_buckets = int(max_hdmm_buckets)
        self.max_large_hdmm_buckets = int(max_large_hdmm_buckets)
        if not (isinstance(max_bucket_fraction, (int, float)) and 0 < float(max_bucket_fraction) <= 1):
            raise ValueError(f"max_bucket_fraction must lie in (0, 1], got {max_bucket_fraction!r}")
        self.max_bucket_fraction = float(max_bucket_fraction)
        self.negative_fraction = float(negative_fraction)

    def _select(self, workload: Workload, privacy: Privacy) -> Selection:
        raise MechanismError(f"{self.short_name}: the strategy depends on the data; use answer(x, rng) or release")

    def fit(self, workload: Workload | np.ndarray, privacy: Privacy) -> DataAwareMechanism:
        """Check the workload (1-D, with rows) and split the budget; the strategy is chosen per data set."""
        t0, c0 = time.perf_counter(), time.process_time()
        given = as_workload(workload)
        if not isinstance(privacy, Privacy):
            raise MechanismError(f"{self.short_name}: privacy must be a dpopt.privacy.Privacy")
        shape = self.grid
        sizes = tuple(given.domain_sizes)
        if len(sizes) > 1:  # a product, or a union of products (e.g. rectangles, `dpopt.workloads.boxes`)
            if len(sizes) > 2:
                raise MechanismError(f"{self.short_name}: the interval partition orders 1-D and 2-D domains; "
                                     f"{given.name} is over {len(sizes)} attributes {sizes}")
            kron_shape = (int(sizes[0]), int(sizes[1]))
            if shape is not None and shape != kron_shape:
                raise MechanismError(f"{self.short_name}: grid={shape} but the workload is over {kron_shape}")
            shape = kron_shape
        if shape is not None and shape[0] * shape[1] != given.n:
            raise MechanismError(f"{self.short_name}: grid {shape} has {shape[0] * shape[1]} cells; the workload "
                                 f"{given.name} has {given.n}")
        if not given.has_rows:
            raise MechanismError(f"{self.short_name}: workload {given.name} has no rows to reduce (known only "
                                 "through its Gram matrix)")
        eps = privacy.epsilon
        eps0 = STATS_SHARE * eps if self.adaptive else 0.0
        eps1 = self.ratio * eps - eps0
        self.workload_ = given
        self.input_workload_ = given
        self.privacy_ = privacy
        self.stats_privacy_ = Privacy(eps0) if self.adaptive else None
        self.partition_privacy_ = Privacy(eps1)
        self.stage_privacy_ = Privacy(eps - self.ratio * eps, privacy.delta, calibration=privacy.calibration)
        # the second stage's privacy when the policy skips the partition: everything but the statistics
        self.dense_privacy_ = Privacy(eps - eps0, privacy.delta, calibration=privacy.calibration)
        resolutions = (RESOLUTION, LOW_SIGNAL_RESOLUTION) if self.adaptive else (RESOLUTION,)
        longest = max(1, math.ceil(self.max_bucket_fraction * given.n))
        self.families_ = {R: candidate_family(given.n, R, longest) for R in resolutions}
        # 2-D: cells in Hilbert-curve order, so the partition's intervals are compact regions (DAWA, Sec. 3.3)
        self.order_ = hilbert_order(shape) if shape is not None and min(shape) > 1 else None
        self._W = given.sparse()  # W P is formed once per partition, from W's stored rows (columns in order_)
        if self.order_ is not None:
            self._W = sp.csr_matrix(self._W[:, self.order_])
        self._dense_stages: dict[tuple[float, float], ReducedStage] = {}
        self._uniform_stage_errors: dict[int, float] = {}
        self.policy_: dict[str, Any] = {}
        self.strategy_ = None  # chosen for each data set (see answer and release)
        self.expected_error_ = None
        self.bound_ = math.nan
        self.fit_info_ = FitInfo(
            solver="l1-partition + hdmm (eps-DP) or mm-optimal on W P", status="data-dependent",
            wall_seconds=time.perf_counter() - t0, cpu_seconds=time.process_time() - c0,
            message=(f"statistics eps {eps0:g}, " if self.adaptive else "")
            + f"partition eps {eps1:g}, second stage eps {self.stage_privacy_.epsilon:g}"
            + (f" ({self.dense_privacy_.epsilon:g} when the partition is skipped)" if self.adaptive else ""))
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "stage_privacy_"):
            raise MechanismError(f"{self.short_name}: call fit(workload, privacy) before using the mechanism")

    def bucket_cost(self) -> float:
        """c: the expected absolute noise of one bucket's count in the second stage (1/eps2 for Laplace, as DAWA;
        sigma sqrt(2/pi) for Gaussian noise)."""
        p = self.stage_privacy_
        return self.cost_scale * p.noise_scale(1.0) * (1.0 if p.is_pure else math.sqrt(2.0 / math.pi))

    def policy(self, stats: np.ndarray) -> dict[str, Any]:
        """The signal-adaptive choice (module docstring) from the noisy statistics (N, C) alone: {"signal": s =
        N eps / n, "resolution": the candidate family's R, "dense": skip the partition}."""
        self._check_fitted()
        n, eps = self.workload_.n, self.privacy_.epsilon
        total, changes = (float(v) for v in np.asarray(stats, dtype=float).ravel()[:2])
        signal = max(total, 0.0) * eps / n
        # skip only when C is above the threshold by DENSE_MARGIN of its Laplace scale b: a data set that needs its
        # partition is skipped with probability below exp(-DENSE_MARGIN) / 2 (where b is large, it never is)
        b = SIGNAL_STATISTICS_SENSITIVITY / self.stats_privacy_.epsilon if self.stats_privacy_ is not None else 0.0
        dense = signal >= HIGH_SIGNAL and self.partition_cannot_pay(1.0 + changes - DENSE_MARGIN * b)
        return {"signal": signal, "resolution": LOW_SIGNAL_RESOLUTION if signal < LOW_SIGNAL else RESOLUTION,
                "dense": bool(dense), "total_hat": total, "changes_hat": changes}

    def partition_cannot_pay(self, buckets: float) -> bool:
        """The dense test for a partition expected to keep about `buckets` buckets: the hierarchy model
        (`dpopt.partition.dense_for_partition`) first; where it says skip, the exact expected errors decide: the
        second stage (`stage`) on equal buckets, their number `buckets` rounded up to a power of 2^(1/4), at the
        stage's eps, against the dense stage on all cells at its eps. Both are data-independent (cached per
        number of buckets); the partition's bias is left out (at high signal it is small against the noise). On a
        2-D grid the model is left out and `stage_lower_bound` stands for the stage's exact error."""
        n = self.workload_.n
        two_d = self.order_ is not None
        if not two_d and not dense_for_partition(buckets, n, 1.0 - self.ratio):
            return False
        if buckets >= n:
            return True
        k = min(n, math.ceil(2.0 ** (math.ceil(4.0 * math.log2(max(buckets, 2.0))) / 4.0) - 1e-9))
        if k > MAX_STAGE_BUCKETS:
            return True  # the second stage could not take that many buckets
        if k not in self._uniform_stage_errors:
            edges = np.unique(np.round(np.linspace(0.0, n, k + 1)).astype(np.int64))
            self._uniform_stage_errors[k] = (self.stage_lower_bound(edges) if two_d
                                             else float(self.stage(edges).inner.expected_error_.total))
        return self._uniform_stage_errors[k] >= float(self.dense_stage().inner.expected_error_.total)

    def stage_lower_bound(self, edges: np.ndarray) -> float:
        """A lower bound on the expected total squared error of every second stage on these buckets at the stage's
        privacy: P(eps2, delta) SVDB(W P) (seed 004 Prop. 4.3, singular values lowered by their round-off bounds;
        under eps-DP too, since sens1(A) >= sens2(A)). It reads the smaller Gram of W P (m x m or k x k), so it
        costs min(m, k)^3, where the stage's exact error costs k^3 (the 2-D dense test)."""
        WP = self._reduced_matrix(edges)
        m, k = WP.shape
        G = (WP @ WP.T) if m <= k else (WP.T @ WP)
        G = G.toarray() if sp.issparse(G) else np.asarray(G)
        svdb = svdb_from_singular_value_bounds(gram_singular_value_lower_bounds(G), k, term_rel_err=EPS)
        return float(self.stage_privacy_.variance_factor * svdb)

    def ordered(self, x: np.ndarray) -> np.ndarray:
        """x's cells in the partition's order (the Hilbert curve on a 2-D grid, else as given)."""
        x = np.asarray(x, dtype=float).ravel()
        return x if self.order_ is None else x[self.order_]

    def partition(self, x: np.ndarray, perturb: Perturb, resolution: int = RESOLUTION) -> np.ndarray:
        """The bucket edges (over `ordered` cells) from `dpopt.partition.l1_partition` over the family of that
        resolution, with the partition's noise drawn by perturb."""
        self._check_fitted()
        x = check_finite_vector(x, "data vector x", self.workload_.n)
        if resolution not in self.families_:
            raise MechanismError(f"{self.short_name}: no candidate family of resolution {resolution!r} was fitted "
                                 f"(fitted: {sorted(self.families_)})")
        return l1_partition(self.ordered(x), self.bucket_cost(), perturb, self.families_[resolution], self.deviation)

    def _reduced_matrix(self, edges: np.ndarray) -> sp.csr_matrix:
        """W P (m x k, sparse) from W's stored rows (columns in the partition's order)."""
        return sp.csr_matrix(self._W @ expansion(edges, self.workload_.n))

    def reduced_workload(self, edges: np.ndarray) -> ExplicitWorkload:
        """W P (m x k): the workload on the buckets, each bucket's total spread uniformly over its cells."""
        WP = self._reduced_matrix(edges)
        m, k = WP.shape
        dense = WP.toarray() if m * k <= 50_000_000 else WP
        return ExplicitWorkload(dense, name=f"{self.workload_.name} on {k} buckets")

    def stage(self, edges: np.ndarray) -> ReducedStage:
        """The second stage fitted on a k x k factor of W P under the second stage's privacy: under eps-DP hdmm
        (L1 sensitivity, its baselines included) up to max_hdmm_buckets buckets, and its p-Identity of size
        LARGE_HDMM_P (OPT_0 only) up to max_large_hdmm_buckets; under (eps, delta) mm-optimal (with its
        baselines; its objective is the L2 one) up to max_optimal_buckets; else the least-error baseline
        (identity, Qardaji's hierarchy, wavelet); noise on queries is no candidate (it would measure W P's m
        rows, not the factor's)."""
        k = len(edges) - 1
        if k > MAX_STAGE_BUCKETS:
            raise MechanismError(f"{self.short_name}: the partition kept {k} buckets; the second stage decomposes a "
                                 f"k x k Gram matrix and takes at most {MAX_STAGE_BUCKETS} buckets (about "
                                 f"{8 * k * k / 2**30:.1f} GiB and k^3 = {float(k) ** 3:.1e} flops here)")
        wp = self.reduced_workload(edges)
        factor = _ReducedFactor(wp.gram(), name=f"factor of {wp.name}")
        best = self._least_error(*self._stage_choice(k, self.stage_privacy_), factor, self.stage_privacy_,
                                 f"{k} buckets")
        return ReducedStage(best, wp, self.inference, self.negative_fraction)

    def _stage_choice(self, k: int, privacy: Privacy) -> tuple[tuple[str, ...], dict[str, Any]]:
        """The second stage's candidates on k cells or buckets and their options (`stage`)."""
        if privacy.is_pure and k <= self.max_hdmm_buckets:
            return ("hdmm",), {}  # its eps-DP optimum, never above its baselines
        if privacy.is_pure and k <= self.max_large_hdmm_buckets:
            # p-Identity of a fixed size, OPT_0 only; never above its baselines either
            return ("hdmm",), {"factor_solver": functools.partial(laplace_factor, p=LARGE_HDMM_P, rounds=0)}
        return (("mm-optimal",) if k <= self.max_optimal_buckets else BASELINE_STAGES), {}

    def _least_error(self, names: tuple[str, ...], options: dict[str, Any], workload: Workload, privacy: Privacy,
                     what: str) -> Mechanism:
        """The named mechanisms (constructed with options) fitted on workload under privacy, the least expected
        error kept (a failed fit is a MechanismError naming the stage)."""
        from dpopt.mechanisms.registry import make_mechanism

        best: Mechanism | None = None
        for name in names:
            try:
                mech = make_mechanism(name, **options).fit(workload, privacy)
            except (MechanismError, StrategyError) as exc:
                raise MechanismError(f"{self.short_name}: second stage {name} on {what} failed: {exc}") from None
            if best is None or mech.expected_error_.total < best.expected_error_.total:
                best = mech
        assert best is not None
        return best

    def dense_stage(self, privacy: Privacy | None = None) -> ReducedStage:
        """The second stage on all n cells of the whole workload at `privacy` (dense_privacy_ when the policy skips
        the partition; stage_privacy_ for `cells_stage`), data-independent and fitted once per budget: on a 1-D
        domain the stage's own choice for n cells (`_stage_choice`), on a 2-D grid the least-error baseline
        (identity, Qardaji's hierarchy, wavelet), held through its Kronecker factors when the workload is a
        product or a union of products over the grid."""
        privacy = self.dense_privacy_ if privacy is None else privacy
        key = (privacy.epsilon, privacy.delta)
        if key not in self._dense_stages:
            n = self.workload_.n
            choice = self._stage_choice(n, privacy) if self.order_ is None else (BASELINE_STAGES, {})
            best = self._least_error(*choice, self.workload_, privacy, f"{n} cells")
            self._dense_stages[key] = ReducedStage(best, self.workload_, self.inference, self.negative_fraction)
        return self._dense_stages[key]

    def cells_stage(self, edges: np.ndarray) -> tuple[ReducedStage, str]:
        """The second stage after a partition with these edges, and why: the stage on the buckets (`stage`), or
        the stage on all cells at the same privacy (`dense_stage(stage_privacy_)`, the partition's output left
        unused) when the partition kept more than MAX_STAGE_BUCKETS buckets or, on a 2-D grid (where the policy's
        dense test does not apply), when that stage's expected error is at most the bucket stage's. The choice
        reads the partition's edges only (post-processing). Where it compares, taking the cells never raises the
        expected squared error: the bucket stage's is its noise error plus the squared bias of the uniform spread,
        the cells' stage has no bias."""
        k = len(edges) - 1
        if k > MAX_STAGE_BUCKETS:
            return self.dense_stage(self.stage_privacy_), (f"the partition kept {k} buckets, more than the "
                                                           f"{MAX_STAGE_BUCKETS} the bucket stage decomposes")
        bucket = self.stage(edges)
        if self.order_ is not None:
            cells = self.dense_stage(self.stage_privacy_)
            e_cells, e_buckets = cells.inner.expected_error_.total, bucket.inner.expected_error_.total
            if e_cells <= e_buckets:
                return cells, (f"expected error on all cells {e_cells:.4g} <= {e_buckets:.4g} on the {k} buckets "
                               "(noise only)")
        return bucket, ""

    def _run(self, x: np.ndarray, partition_noise: Perturb, stats_noise: Perturb | None = None,
             before_partition: Any = None) -> tuple[np.ndarray, np.ndarray, ReducedStage]:
        """Statistics (adaptive), policy, partition (unless skipped), second stage; before_partition() is called
        once the partition is certain to run, before its noise is drawn (release charges it there)."""
        if self.adaptive:
            if stats_noise is None:
                raise MechanismError(f"{self.short_name}: the adaptive policy needs the statistics' noise source")
            stats = stats_noise(signal_statistics(self.ordered(x), self.bucket_cost()), SIGNAL_STATISTICS_SENSITIVITY)
            self.policy_ = self.policy(stats)
        else:
            self.policy_ = {"signal": math.nan, "resolution": RESOLUTION, "dense": False}
        n = self.workload_.n
        if self.policy_["dense"]:  # the second stage measures x itself, in the workload's own cell order
            edges = np.arange(n + 1, dtype=np.int64)
            stage = self.dense_stage()
            xb = np.asarray(x, dtype=float).ravel()
        else:
            if before_partition is not None:
                before_partition()
            edges = self.partition(x, partition_noise, self.policy_["resolution"])
            stage, why = self.cells_stage(edges)
            self.policy_["cells_stage"] = why
            xb = (np.asarray(x, dtype=float).ravel() if why  # the cells' stage measures x in the workload's order
                  else bucket_sums(self.ordered(x), edges))
        self.partition_ = edges
        self.stage_ = stage
        self.strategy_ = stage.strategy_
        return edges, xb, stage

    def answer_variants(self, x: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
        """Research mode, one run: {"ls", "nnls" (when computed), "auto"} answers (m,) from one partition and one
        draw of the second stage's noise, and the run's "buckets" and "negative_fraction"."""
        self._check_fitted()
        if not isinstance(rng, np.random.Generator):
            raise MechanismError(f"{self.short_name}: rng must be a numpy.random.Generator (research mode)")
        x = check_finite_vector(x, "data vector x", self.workload_.n)
        stats_noise = research_perturb(self.stats_privacy_, rng) if self.adaptive else None
        _, xb, stage = self._run(x, research_perturb(self.partition_privacy_, rng), stats_noise)
        s = stage.strategy_
        y = research_perturb(stage.privacy_, rng)(np.asarray(s.measured(xb), dtype=float),
                                                  s.sensitivity(stage.privacy_.norm))
        out: dict[str, Any] = dict(stage.estimates(np.asarray(y, dtype=float)))
        out["buckets"] = int(len(self.partition_) - 1)
        out["dense"] = bool(self.policy_["dense"])
        out["cells_stage"] = bool(self.policy_.get("cells_stage"))
        out["resolution"] = int(self.policy_["resolution"])
        out["negative_fraction"] = stage.answer_info_.get("negative_fraction")
        out["stage"] = s.name
        return out

    def answer(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Research mode: noisy answers to every workload query (m,): partition, reduce, measure, infer."""
        out = self.answer_variants(x, rng)
        return out["auto"] if "auto" in out else out[self.inference]

    def release(self, x: np.ndarray, ledger: Any, *, labels: list[str] | None = None, domain: Any | None = None,
                label: str = "") -> pd.DataFrame:
        """Release mode through the ledger: charge and draw the signal statistics (adaptive), then charge and draw the
        partition (OpenDP Laplace) unless the policy skips it, then `dpopt.release.release` the second stage on the
        bucket totals (its own charge). The charges sum to the fitted budget."""
        from dpopt.data import Records
        from dpopt.release import (
            Charge,
            PrivacyLedger,
            _check_release_domain,
            _noise_plan,
            _values,
            release,
        )

        self._check_fitted()
        if not isinstance(ledger, PrivacyLedger):
            raise ValueError(f"ledger must be a PrivacyLedger, got {type(ledger).__name__}")
        if isinstance(x, Records):
            if domain is not None and domain != x.domain:
                raise ValueError(f"the records are over {x.domain!r} but domain= is {domain!r}")
            domain, x = x.domain, x.vector()
        _check_release_domain(self.input_workload_, domain)
        x = check_finite_vector(x, "data vector x", self.workload_.n)
        # one OpenDP Laplace measurement per bucket length of every fitted family, each at its own scale; the
        # partition as a whole is eps1-DP (dpopt.partition), charged once, before any of its noise is drawn
        sens = {float(noise_sensitivity(int(L), lengths, self.deviation))
                for lengths in map(family_lengths, self.families_.values()) for L in lengths}
        plans = {s: _noise_plan(_Sensitivity(s), self.partition_privacy_) for s in sens}
        cost = max((p[3] for p in plans.values()), key=lambda c: c.epsilon)
        stats_plan = (_noise_plan(_Sensitivity(SIGNAL_STATISTICS_SENSITIVITY), self.stats_privacy_)
                      if self.adaptive else None)
        stats_eps = stats_plan[3].epsilon if stats_plan is not None else 0.0
        name = label or f"{self.short_name} on {self.workload_.name}"
        # refuse before any charge when the ledger cannot hold the whole budget: the first steps would be spent for
        # nothing (the last charge is at least (eps - eps1 - eps0, delta); its rho is known only later)
        whole = Charge(stats_eps + cost.epsilon + self.stage_privacy_.epsilon, self.stage_privacy_.delta,
                       cost.rho, "laplace")
        if not ledger.can_afford(whole):
            from dpopt.release import BudgetExceededError

            raise BudgetExceededError(f"{name}: the ledger cannot hold eps={whole.epsilon:.6g}, "
                                      f"delta={whole.delta:.3g} (statistics, partition and second stage); "
                                      "nothing charged")

        def measured_by(plan_of: dict[float, Any], what: str) -> Perturb:
            def noise(y: np.ndarray, sensitivity: float) -> np.ndarray:
                if float(sensitivity) not in plan_of:
                    raise ValueError(f"{what} noise asked for sensitivity {sensitivity!r}; no measurement calibrated")
                y = np.asarray(y, dtype=float)
                meas = plan_of[float(sensitivity)][4]
                return np.asarray(meas(_values(y.ravel())), dtype=float).reshape(y.shape)

            return noise

        stats_noise = None
        if stats_plan is not None:
            sc = stats_plan[3]
            ledger.charge(Charge(sc.epsilon, sc.delta, sc.rho, sc.noise,
                                 f"{name}: signal statistics (total and count changes)"))
            stats_noise = measured_by({SIGNAL_STATISTICS_SENSITIVITY: stats_plan}, "statistics")

        def charge_partition() -> None:
            ledger.charge(Charge(cost.epsilon, cost.delta, cost.rho, cost.noise, f"{name}: private partition"))

        _, xb, stage = self._run(x, measured_by(plans, "partition"), stats_noise, before_partition=charge_partition)
        if labels is None:
            labels = self.workload_.row_labels()
        if self.policy_["dense"]:
            what = f"second stage on all {len(xb)} cells (partition skipped: dense data)"
        elif self.policy_.get("cells_stage"):
            what = f"second stage on all {len(xb)} cells ({self.policy_['cells_stage']})"
        else:
            what = f"second stage on {len(xb)} buckets"
        out = release(stage, xb, ledger, labels=labels, label=f"{name}: {what}")
        out["mechanism"] = self.short_name
        charges = 1 + (stats_plan is not None) + (not self.policy_["dense"])
        out.attrs.update({"charges": charges, "partition_edges": self.partition_.tolist(),
                          "partition_skipped": bool(self.policy_["dense"]),
                          "cells_stage": self.policy_.get("cells_stage", ""),
                          "resolution": int(self.policy_["resolution"]),
                          "inference": stage.answer_info_.get("inference", "ls"),
                          "std_note": "std is the second stage's noise only; the uniform spread within a bucket "
                                      "adds a data-dependent bias"})
        return out

    def record(self) -> dict[str, Any]:
        """One comparison row: expected_total_error, rmse and bound left null (the error depends on the data)."""
        self._check_fitted()
        why = ("data-dependent: expected_total_error, rmse and bound are null (the error depends on the data "
               "through the private partition; compare by data_error)")
        return {
            "mechanism": self.short_name, "workload": self.workload_.name, "epsilon": self.privacy_.epsilon,
            "delta": self.privacy_.delta, "noise": self.privacy_.noise, "calibration": self.privacy_.convention,
            "strategy_rows": math.nan, "strategy_rank": math.nan, "sensitivity": math.nan,
            "expected_total_error": math.nan, "rmse": math.nan, "bound": math.nan, "ratio_to_bound": math.nan,
            "bound_kind": "none (data-dependent)", "fit_seconds": self.fit_info_.wall_seconds,
            "fit_cpu_seconds": self.fit_info_.cpu_seconds, "solver": self.fit_info_.solver, "status": why,
            "iterations": 0, "gap": None,
        }


class _ReducedFactor(ExplicitWorkload):
    """V (k x k) with V^T V = G = (W P)^T W P: the Cholesky factor V = L^T (G = L L^T) when G is positive definite
    beyond round-off (W P of full column rank, as prefix sums over buckets are), else V = diag(lam)^1/2 U^T from
    G = U diag(lam) U^T. The candidates' errors depend on V only through V^T V, so either factor serves (1,396
    buckets of prefix sums, one BLAS thread, medians of 3: eigh 0.32 s, eigvalsh 0.13 s, Cholesky 0.02 s). It
    keeps G and SVDB(W P) = (1/k)(sum_i sqrt(lam_i))^2 from the eigenvalues (seed 004 Prop. 4.3, each lowered by
    its round-off bound by `dpopt.bounds.eigenvalue_singular_value_lower_bounds`), so the candidates read them
    instead of forming V^T V and decomposing it again."""

    def __init__(self, G: np.ndarray, name: str) -> None:
        G = (G + G.T) / 2
        lam = np.linalg.eigvalsh(G)
        V = None
        # positive definite beyond the eigenvalues' round-off (the bound of eigenvalue_singular_value_lower_bounds):
        # W P has full column rank and the Cholesky factor loses no direction of it
        if lam.size and lam[0] > 2.0 * lam.size * EPS * float(np.max(np.abs(lam))):
            try:
                V = scipy.linalg.cholesky(G, lower=False, check_finite=False)  # upper triangular: G = V^T V
            except np.linalg.LinAlgError:
                V = None
        if V is None:
            lam, U = np.linalg.eigh(G)
            V = (U * np.sqrt(np.clip(lam, 0.0, None))).T
        super().__init__(V, name=name)
        self._G = G
        self._svdb = svdb_from_singular_value_bounds(eigenvalue_singular_value_lower_bounds(lam), G.shape[0],
                                                     term_rel_err=EPS)

    def gram(self) -> np.ndarray:
        return self._G.copy()

    def svd_bound(self) -> float:
        return self._svdb


class _Sensitivity:
    """What `dpopt.release._noise_plan` reads of a strategy: its L1 sensitivity (the partition's cost noise)."""

    def __init__(self, sens1: float) -> None:
        self.sens1 = sens1
        self.sens2 = math.nan

