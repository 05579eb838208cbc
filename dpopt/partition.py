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

Median deviation (deviation="median"): dev(B) = min_c sum_{i in B} |x_i - c|, the L1 bias of the best constant,
moves by at most Delta_B = 1 (a minimum over c of functions each 1-Lipschitz in x_i), so its noise scale is
2 / eps1 whatever the bucket's length; it lies between half of DAWA's dev(B) and all of it (the mean's bias is at most
twice the median's).

Candidate buckets (`candidate_family`): every interval of up to 2R - 1 cells, and every interval of j g cells
(g = 2^k, j = R .. 2R - 1) starting at a multiple of g (R = 16 by default): every length to within 1/R, a
boundary anywhere to within 1/R of the buckets beside it, about 2 R n candidates, found by a dynamic program over
the ends. The family does not depend on the data, as the argument requires (the data-aware mechanism picks R
from noisy statistics, already private, before the partition); DAWA's exact variant uses every interval
(n^2 / 2), its fast one the powers of 2 only. Fewer candidates make the noisy minimum less often won by noise.
A family may stop at a longest bucket (max_length): the data-aware mechanism stops at a quarter of the domain
(`dpopt.mechanisms.data_aware.MAX_BUCKET_FRACTION`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from dpopt.validation import check_positive_int

# Bucket candidates (`candidate_family`): every length below 2 * RESOLUTION at every start; a length L in
# [RESOLUTION g, 2 RESOLUTION g), g = 2^k, at starts that are multiples of g (both ends then lie on that grid).
RESOLUTION = 16
# Elements of one block of the window deviation computation (bounds its memory to about 8 * this B).
DEV_BLOCK_ELEMENTS = 4_000_000
DEVIATIONS = ("mean", "median")


def candidate_family(n: int, resolution: int = RESOLUTION,
                     max_length: int | None = None) -> list[tuple[int, np.ndarray]]:
    """The data-independent bucket family over n cells as (step g, lengths) pairs: g = 1 with every length
    1 .. 2R - 1, then g = 2^k with lengths j g, j = R .. 2R - 1, all starts multiples of g (R = resolution),
    and the whole domain; lengths above max_length (default n) left out. Every length is a candidate to within
    1/R of itself, and a boundary may fall at any multiple of 1/R of the adjacent buckets' lengths, with about
    2 R n candidates in all. Single cells are always candidates, so every family tiles the domain."""
    n = check_positive_int(n, "n")
    resolution = check_positive_int(resolution, "resolution")
    top = n if max_length is None else min(n, check_positive_int(max_length, "max_length"))
    family = [(1, np.arange(1, min(top, 2 * resolution - 1) + 1, dtype=np.int64))]
    g = 2
    while resolution * g <= top:
        lengths = g * np.arange(resolution, 2 * resolution, dtype=np.int64)
        family.append((g, lengths[lengths <= top]))
        g *= 2
    if top == n and not any(n in lengths for _, lengths in family):
        family.append((n, np.array([n], dtype=np.int64)))
    return family


def family_lengths(family: list[tuple[int, np.ndarray]]) -> np.ndarray:
    """The distinct bucket lengths of a candidate family (sorted)."""
    return np.unique(np.concatenate([lengths for _, lengths in family]))


def interval_deviations(x: np.ndarray, length: int, step: int = 1, deviation: str = "mean") -> np.ndarray:
    """dev(B) of every interval B of `length` cells starting at a multiple of `step`, by start: the L1 deviation
    sum_{i in B} |x_i - mean_B(x)| (Li, Hay and Miklau 2014, Sec. 3), or with deviation="median" the least L1
    deviation min_c sum_{i in B} |x_i - c| (attained at a median of B's counts)."""
    x = np.asarray(x, dtype=float)
    n = x.size
    if not 1 <= length <= n:
        raise ValueError(f"length must lie in 1..{n}, got {length}")
    if deviation not in DEVIATIONS:
        raise ValueError(f"deviation must be one of {DEVIATIONS}, got {deviation!r}")
    windows = np.lib.stride_tricks.sliding_window_view(x, length)[::step]
    if length == 1:
        return np.zeros(windows.shape[0])
    out = np.empty(windows.shape[0])
    block = max(1, DEV_BLOCK_ELEMENTS // length)
    for lo in range(0, windows.shape[0], block):
        w = windows[lo:lo + block]
        centre = w.mean(axis=1) if deviation == "mean" else np.median(w, axis=1)
        out[lo:lo + block] = np.abs(w - centre[:, None]).sum(axis=1)
    return out


def deviation_sensitivity(length: int, deviation: str = "mean") -> float:
    """Delta_B: the most one record (one cell's count moving by 1) moves dev(B) of a `length`-cell bucket:
    2 (1 - 1/|B|) for the mean deviation (x_i's own term by 1 - 1/|B|, the others' together by (|B| - 1)/|B|);
    1 for the median deviation (a minimum over c of functions each 1-Lipschitz in x_i); 0 for one cell."""
    if length <= 1:
        return 0.0
    return 2.0 * (1.0 - 1.0 / float(length)) if deviation == "mean" else 1.0


def partition_sensitivity(lengths: np.ndarray, deviation: str = "mean") -> float:
    """Delta_max: the most one record moves any candidate's dev (module docstring)."""
    return max(deviation_sensitivity(int(L), deviation) for L in np.atleast_1d(lengths))


def noise_sensitivity(length: int, lengths: np.ndarray, deviation: str = "mean") -> float:
    """Delta_B + Delta_max for a bucket of `length` cells: the sensitivity its cost noise is calibrated to
    (Laplace scale (Delta_B + Delta_max) / eps1; module docstring)."""
    return deviation_sensitivity(int(length), deviation) + partition_sensitivity(lengths, deviation)


def l1_partition(
    x: np.ndarray,
    bucket_cost: float,
    perturb: Callable[[np.ndarray, float], np.ndarray],
    family: list[tuple[int, np.ndarray]] | None = None,
    deviation: str = "mean",
) -> np.ndarray:
    """DAWA's private L1 partition (Li, Hay and Miklau 2014, Sec. 3, Algorithm 1) over a fixed bucket family.

    x: data vector (n,); bucket_cost: c, the cost of one more bucket (DAWA: 1/eps2, the expected absolute
    Laplace noise of a bucket's count); perturb(costs, sensitivity): adds the partition's noise (research:
    `dpopt.privacy.research_perturb(Privacy(eps1), rng)`; release: OpenDP's Laplace), called once per candidate
    length with its candidates' costs and `noise_sensitivity`; family: `candidate_family(n)` by default;
    deviation: "mean" (DAWA's) or "median". Returns the bucket edges e_0 = 0 < e_1 < ... < e_k = n (bucket j is
    cells e_j .. e_{j+1} - 1), from which x's data enters only through the noisy costs.
    """
    x = np.asarray(x, dtype=float).ravel()
    n = x.size
    family = candidate_family(n) if family is None else family
    lengths_all = family_lengths(family)
    if lengths_all.max() > n:
        raise ValueError(f"the candidate family has buckets of {lengths_all.max()} cells; the data has {n}")
    dmax = partition_sensitivity(lengths_all, deviation)
    # costs[k][j, s // g]: the bucket of lengths[j] cells starting at s (a multiple of g) in family entry k
    costs = []
    for g, lengths in family:
        table = np.full((len(lengths), n // g + 1), np.inf)
        for j, L in enumerate(lengths):
            dev = interval_deviations(x, int(L), g, deviation) + bucket_cost
            sens = deviation_sensitivity(int(L), deviation) + dmax
            noisy = np.asarray(perturb(dev, sens), dtype=float)
            table[j, :dev.size] = np.maximum(noisy, bucket_cost)  # a cost is at least c: clipping is post-processing
        costs.append(table)
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    choice = np.zeros(n + 1, dtype=np.int64)
    for end in range(1, n + 1):
        for (g, lengths), table in zip(family, costs, strict=True):
            if end % g:
                continue
            ok = lengths <= end
            if not ok.any():
                continue
            starts = end - lengths[ok]
            totals = best[starts] + table[np.flatnonzero(ok), starts // g]
            k = int(np.argmin(totals))
            if totals[k] < best[end]:
                best[end], choice[end] = totals[k], lengths[ok][k]
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


# One record changes the total by 1 and moves one cell, so at most the two differences beside it.
SIGNAL_STATISTICS_SENSITIVITY = 3.0


def signal_statistics(x: np.ndarray, tau: float) -> np.ndarray:
    """(N, C): the total count of x and the number of adjacent cells whose counts differ by more than tau, the
    statistics the data-aware policy reads (L1 sensitivity SIGNAL_STATISTICS_SENSITIVITY: neighbours differ by 1
    in one cell i, which moves N by 1 and can change only the differences x_i - x_{i-1} and x_{i+1} - x_i).
    With tau the cost of one more bucket, 1 + C is about the number of buckets a partition keeps when the
    partition's noise is small against the counts (two cells closer than tau are cheaper merged)."""
    x = np.asarray(x, dtype=float).ravel()
    if not (math.isfinite(tau) and tau >= 0):
        raise ValueError(f"tau must be a finite number >= 0, got {tau!r}")
    return np.array([float(x.sum()), float(np.count_nonzero(np.abs(np.diff(x)) > tau))])


def dense_for_partition(buckets: float, n: int, stage_share: float) -> bool:
    """True when a partition that leaves about `buckets` buckets cannot pay for its budget under the model of
    the second stage's error as Qardaji's hierarchy, (log k)^3 / eps2^2 over k cells: (log k / log n)^3 >=
    stage_share^2, stage_share = eps2 / eps (the error of the best fixed mechanism on all n cells at the whole
    eps is the other side)."""
    if n <= 1:
        return True
    k = min(max(float(buckets), 2.0), float(n))
    return (math.log(k) / math.log(n)) ** 3 >= stage_share**2


def hilbert_order(shape: tuple[int, int]) -> np.ndarray:
    """The cells of an n1 x n2 grid (row-major index i * n2 + j) in the order of the Hilbert curve over the
    smallest 2^q x 2^q square that holds it, cells outside the grid left out: neighbours along the order are
    neighbours in the grid wherever the curve stays inside it, so intervals of the order are compact regions
    (the 1-D reduction DAWA applies to 2-D data, Li, Hay and Miklau 2014, Sec. 3.3). Returns a permutation of
    range(n1 n2)."""
    if len(shape) != 2:
        raise ValueError(f"hilbert_order takes a 2-D grid shape, got {shape!r}")
    n1, n2 = (check_positive_int(v, "grid side") for v in shape)
    side = 1
    while side < max(n1, n2):
        side *= 2
    t = np.arange(side * side, dtype=np.int64)
    x = np.zeros_like(t)
    y = np.zeros_like(t)
    s = 1
    while s < side:  # the curve position's base-4 digits, lowest first: place, then rotate the quadrant so far
        rx = (t // 2) & 1
        ry = (t ^ rx) & 1
        flip = (ry == 0) & (rx == 1)
        x = np.where(flip, s - 1 - x, x)
        y = np.where(flip, s - 1 - y, y)
        swap = ry == 0
        x, y = np.where(swap, y, x), np.where(swap, x, y)
        x += s * rx
        y += s * ry
        t //= 4
        s *= 2
    inside = (x < n1) & (y < n2)
    return (x[inside] * n2 + y[inside]).astype(np.int64)
