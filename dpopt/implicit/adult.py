"""All k-way marginals over the UCI Adult domain: the workload, its tables, and research-mode answers on the table.

The domain (14 attributes, about 6.4e17 cells) comes from a JSON file {attribute: size}; the data from a CSV
of integer codes. Marginal tables are counted straight from the DataFrame (one bincount per measured
subset); the full data vector is never formed.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from dpopt.implicit.marginal_strategy import MarginalStrategy, TableFn
from dpopt.implicit.optimize import ImplicitSelection
from dpopt.implicit.workloads import MarginalsWorkload
from dpopt.privacy import Privacy

# The shared data folder beside the checkout (override with DPOPT_DATA_DIR).
DEFAULT_DATA_DIR = Path(
    os.environ.get("DPOPT_DATA_DIR", Path(__file__).resolve().parents[2].parent / "shared" / "data")
)


def load_domain(path: str | Path) -> tuple[list[str], list[int]]:
    """Attribute names and sizes from a domain JSON file {"name": size, ...} (order kept)."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"domain file not found: {p}")
    try:
        dom = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"domain file {p} is not valid JSON: {exc}") from None
    if not isinstance(dom, dict) or not dom:
        raise ValueError(f"domain file {p} must hold a non-empty object {{attribute: size}}")
    sizes = []
    for k, v in dom.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"domain file {p}: size of {k!r} must be a positive integer, got {v!r}")
        sizes.append(v)
    return list(dom), sizes


def adult_paths(data_dir: str | Path = DEFAULT_DATA_DIR) -> tuple[Path, Path]:
    """(domain JSON, CSV) of the Adult data under data_dir."""
    base = Path(data_dir) / "adult"
    return base / "adult-domain.json", base / "adult.csv"


def marginals_workload(domain_path: str | Path, k: int) -> MarginalsWorkload:
    """All k-way marginals over the domain in `domain_path`."""
    names, sizes = load_domain(domain_path)
    return MarginalsWorkload(sizes, k=k, attribute_names=names, name=f"marginals({k}-way over {Path(domain_path).stem})")


def table_counter(df: pd.DataFrame, names: Sequence[str], sizes: Sequence[int]) -> TableFn:
    """tables(attrs) -> count array over those attributes, by bincount on the integer codes.

    Raises ValueError when a column is missing or holds a code outside 0..n_i - 1 (no row is dropped silently).
    """
    missing = [c for c in names if c not in df.columns]
    if missing:
        raise ValueError(f"data lacks attribute columns {missing}")
    codes = []
    for c, n in zip(names, sizes, strict=True):
        v = df[c].to_numpy()
        if not np.issubdtype(v.dtype, np.integer):
            raise ValueError(f"column {c!r} must hold integer codes, got dtype {v.dtype}")
        if v.size and (v.min() < 0 or v.max() >= n):
            raise ValueError(f"column {c!r} has codes outside 0..{n - 1} (min {v.min()}, max {v.max()})")
        codes.append(v.astype(np.int64))
    rows = len(df)

    def tables(attrs: tuple[int, ...]) -> np.ndarray:
        if not attrs:
            return np.array(float(rows))
        dims = tuple(sizes[i] for i in attrs)
        flat = np.ravel_multi_index(tuple(codes[i] for i in attrs), dims)
        return np.bincount(flat, minlength=math.prod(dims)).reshape(dims).astype(float)

    return tables


def research_answers(
    selection: ImplicitSelection,
    workload: MarginalsWorkload,
    tables: TableFn,
    privacy: Privacy,
    rng: np.random.Generator,
) -> tuple[list[np.ndarray], dict[str, float]]:
    """Research mode: noisy answers to every workload marginal with numpy noise from rng (no secure sampler, no
    budget accounting), and their realised total squared error against the truth, for checking the expected
    error on real tables. A release goes through `dpopt.release.release` (`dpopt answer`)."""
    strat = selection.strategy
    if not isinstance(strat, MarginalStrategy):
        raise ValueError("research_answers needs a marginal strategy")
    t0 = time.perf_counter()
    noisy = strat.release(tables, workload, privacy, rng)
    wall = time.perf_counter() - t0
    sq = 0.0
    for s, w, est in zip(workload.subsets, workload.weights, noisy, strict=True):
        sq += float(w) ** 2 * float(np.sum((est - tables(s)) ** 2))
    return noisy, {"release_seconds": wall, "realised_total_sq_error": sq}
