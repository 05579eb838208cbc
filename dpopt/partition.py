"""Private partition of a 1-D domain into intervals whose counts are near-uniform (DAWA's first stage).

Li, Hay and Miklau (PVLDB 2014, "A data- and workload-aware algorithm for range queries under differential
privacy", Sec. 3) choose the partition of the cells into intervals B that minimises

    sum over buckets B of  dev(B) + c,    dev(B) = sum_{i in B} |x_i - mean_B(x)|

(the L1 bias of answering B's cells by its mean, plus c, the expected absolute noise of measuring one more
bucket), with every candidate bucket's cost perturbed by independent Laplace noise, by dynamic programming.

Privacy. Neighbouring data differ by 1 in one cell i; dev(B) then moves by at most
Delta_B = 2 (1 - 1/|B|) (x_i's own term by 1 - 1/|B|, the others' together by (|B| - 1)/|B|), and only for
buckets that contain i. Every partition holds exactly one bucket B containing i, so with the noise of all
other buckets fixed, the output is the arg min over B containing i of (noisy cost of B) + F(B), F(B) the best
completion left and right of B (independent of x_i): a report-noisy-min over those buckets. The winner's
threshold moves by at most Delta_B* + max_B Delta_B <= Delta_B* + Delta_max between neighbours, so Laplace
noise of scale (Delta_B + Delta_max) / eps1 on each candidate B makes the partition eps1-DP (the winner's
Laplace CDF changes by at most e^{shift / scale}). Clipping a noisy cost at c (a cost is never below it) is
monotone and 1-Lipschitz, so the argument holds for the clipped costs. DAWA's paper adds noise of scale
about Delta_max / eps1 to every bucket but a single cell (none there); we use the scale this argument proves,
from Delta_max / eps1 (single cells) to 2 Delta_max / eps1 (the longest buckets).

Candidate buckets: every interval whose length is in `candidate_lengths(n)` (all lengths up to 16, then a
geometric grid of ratio 2^(1/4)); the family does not depend on the data, as the argument requires. DAWA's
own fast variant uses the powers of 2 only.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dpopt.validation import check_positive_int

# All interval lengths up to this are candidates; longer ones follow a geometric grid of ratio LENGTH_RATIO.
ALL_LENGTHS_UP_TO = 16
LENGTH_RATIO = 2 ** 0.25
# Elements of one block of the sliding-window deviation computation (bounds its memory to about 8 * this B).
DEV_BLOCK_ELEMENTS = 4_000_000


def candidate_lengths(n: int) -> np.ndarray:
    """The bucket lengths the partition may use over n cells: 1..ALL_LENGTHS_UP_TO, then round(16 r^j) <= n."""
    n = check_positive_int(n, "n")
    out = set(range(1, min(n, ALL_LENGTHS_UP_TO) + 1))
    length = float(ALL_LENGTHS_UP_TO)
    while True:
        length *= LENGTH_RATIO
        if round(length) > n:
            break
        out.add(int(round(length)))
    out.add(n)
    return np.array(sorted(out), dtype=np.int64)


def interval_deviations(x: np.ndarray, length: int) -> np.ndarray:
    """dev(B) = sum_{i in B} |x_i - mean_B(x)| for every interval B of `length` cells, by start (n - length + 1,)
    (Li, Hay and Miklau 2014, Sec. 3: the L1 deviation of a bucket)."""
    x = np.asarray(x, dtype=float)
    n = x.size
    if not 1 <= length <= n:
        raise ValueError(f"length must lie in 1..{n}, got {length}")
    if length == 1:
        return np.zeros(n)
    csum = np.concatenate([[0.0], np.cumsum(x)])
    means = (csum[length:] - csum[:-length]) / length
    windows = np.lib.stride_tricks.sliding_window_view(x, length)
    out = np.empty(windows.shape[0])
    step = max(1, DEV_BLOCK_ELEMENTS // length)
    for lo in range(0, windows.shape[0], step):
        hi = min(lo + step, windows.shape[0])
        out[lo:hi] = np.abs(windows[lo:hi] - means[lo:hi, None]).sum(axis=1)
    return out


def partition_sensitivity(lengths: np.ndarray) -> float:
    """Delta_max = 2 (1 - 1 / max length): the most one cell's change moves any candidate's dev (module docstring)."""
    return 2.0 * (1.0 - 1.0 / float(np.max(lengths)))


def noise_sensitivity(length: int, lengths: np.ndarray) -> float:
    """Delta_B + Delta_max for a bucket of `length` cells: the sensitivity its cost noise is calibrated to
    (Laplace scale (Delta_B + Delta_max) / eps1; module docstring)."""
    return 2.0 * (1.0 - 1.0 / float(length)) + partition_sensitivity(lengths)


def l1_partition(
    x: np.ndarray,
    bucket_cost: float,
    perturb: Callable[[np.ndarray, float], np.ndarray],
    lengths: np.ndarray | None = None,
) -> np.ndarray:
    """DAWA's private L1 partition (Li, Hay and Miklau 2014, Sec. 3, Algorithm 1 over a fixed family of buckets).

    x: data vector (n,); bucket_cost: c, the cost of one more bucket (DAWA: 1/eps2, the expected absolute
    Laplace noise of a bucket's count); perturb(costs, sensitivity): adds the partition's noise (research:
    `dpopt.privacy.research_perturb(Privacy(eps1), rng)`; release: OpenDP's Laplace), called once with every
    candidate's cost and `noise_sensitivity(lengths)`. Returns the bucket edges e_0 = 0 < e_1 < ... < e_k = n
    (bucket j is cells e_j .. e_{j+1} - 1), from which x's data enters only through the noisy costs.
    """
    x = np.asarray(x, dtype=float).ravel()
    n = x.size
    lengths = candidate_lengths(n) if lengths is None else np.asarray(lengths, dtype=np.int64)
    cost = np.full((len(lengths), n), np.inf)  # cost[j, s]: the bucket of lengths[j] cells starting at s
    for j, L in enumerate(lengths):
        dev = interval_deviations(x, int(L)) + bucket_cost
        noisy = np.asarray(perturb(dev, noise_sensitivity(int(L), lengths)), dtype=float)
        cost[j, :dev.size] = np.maximum(noisy, bucket_cost)  # a cost is at least c: clipping is post-processing
    rows = np.arange(len(lengths))
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    choice = np.zeros(n + 1, dtype=np.int64)
    for end in range(1, n + 1):
        starts = np.maximum(end - lengths, 0)  # lengths above `end` get start 0 and cost inf (masked below)
        totals = np.where(lengths <= end, best[starts] + cost[rows, starts], np.inf)
        k = int(np.argmin(totals))
        best[end], choice[end] = totals[k], lengths[k]
    edges = [n]
    while edges[-1] > 0:
        edges.append(edges[-1] - int(choice[edges[-1]]))
    return np.array(edges[::-1], dtype=np.int64)


def bucket_sums(x: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The reduced data x_bar: each bucket's total (k,) (a partition's reduction has sensitivity 1)."""
    x = np.asarray(x, dtype=float).ravel()
    return np.add.reduceat(x, edges[:-1]) if len(edges) > 1 else np.zeros(0)


def expansion(edges: np.ndarray, n: int):
    """P (n x k, sparse): P[i, b] = 1 / |B_b| for cell i in bucket b, so P x_bar spreads each bucket's total
    uniformly over its cells and W P is the workload on the buckets (DAWA's reduced workload)."""
    import scipy.sparse as sp

    sizes = np.diff(edges)
    cols = np.repeat(np.arange(sizes.size), sizes)
    return sp.csr_matrix((1.0 / sizes[cols], (np.arange(n), cols)), shape=(n, sizes.size))
