"""Fit every applicable mechanism on one workload and tabulate expected errors against the lower bound."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import TextIO

import pandas as pd

from dpopt.mechanisms.base import MechanismError
from dpopt.mechanisms.registry import MECHANISMS, available_mechanisms, make_mechanism
from dpopt.privacy import Privacy
from dpopt.strategy import StrategyError
from dpopt.workloads import Workload, WorkloadTooLargeError

COLUMNS = [
    "mechanism",
    "strategy_rank",
    "sensitivity",
    "expected_total_error",
    "rmse",
    "bound",
    "ratio_to_bound",
    "fit_seconds",
    "solver",
    "status",
]


def compare(
    workload: Workload,
    privacy: Privacy,
    mechanisms: Sequence[str] | None = None,
    progress: TextIO | None = None,
) -> pd.DataFrame:
    """One row per mechanism, sorted by expected total error; a mechanism that cannot run gets status 'skipped: why'."""
    names = list(mechanisms) if mechanisms else available_mechanisms()
    unknown = [n for n in names if n not in MECHANISMS]
    if unknown:
        raise ValueError(f"unknown mechanism(s) {', '.join(unknown)}; expected some of {', '.join(MECHANISMS)}")
    rows = []
    for name in names:
        if progress is not None:
            print(f"fitting {name} on {workload.name} ...", file=progress, flush=True)
        try:
            mech = make_mechanism(name).fit(workload, privacy)
            rows.append(mech.record())
        except (MechanismError, StrategyError, WorkloadTooLargeError, MemoryError) as exc:
            rows.append(
                {
                    "mechanism": name,
                    "workload": workload.name,
                    "expected_total_error": math.nan,
                    "rmse": math.nan,
                    "status": f"skipped: {exc}",
                }
            )
    df = pd.DataFrame(rows)
    for col in COLUMNS:
        if col not in df:
            df[col] = math.nan
    return df.sort_values("expected_total_error", na_position="last").reset_index(drop=True)


def format_table(df: pd.DataFrame, fmt: str) -> str:
    """Render a comparison as 'table' (aligned text), 'markdown', 'csv' or 'json' (list of records)."""
    if fmt == "json":
        return df.to_json(orient="records", indent=2)
    if fmt == "csv":
        return df.to_csv(index=False)
    view = df[COLUMNS].copy()
    if fmt == "markdown":
        return view.to_markdown(index=False)
    if fmt == "table":
        return view.to_string(
            index=False,
            formatters={
                "sensitivity": "{:.4g}".format,
                "expected_total_error": "{:.6g}".format,
                "rmse": "{:.5g}".format,
                "bound": "{:.6g}".format,
                "ratio_to_bound": "{:.4f}".format,
                "fit_seconds": "{:.3f}".format,
            },
        )
    raise ValueError(f"unknown format {fmt!r}; expected table, markdown, csv or json")


def plot_comparison(df: pd.DataFrame, path: str) -> None:
    """Bar chart of expected total error per mechanism (log scale) with the lower bound as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = df[df["expected_total_error"].notna()]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar(ok["mechanism"], ok["expected_total_error"], color="tab:blue")
    bound = ok["bound"].dropna()
    if len(bound):
        ax.axhline(float(bound.iloc[0]), color="tab:red", linestyle="--", label="lower bound")
        ax.legend()
    ax.set_yscale("log")
    ax.set_ylabel("expected total squared error")
    ax.set_title(str(df["workload"].iloc[0]) if "workload" in df else "")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main_compare(workload: Workload, privacy: Privacy, mechanisms: Sequence[str] | None,
                 fmt: str, plot: str | None, out: TextIO | None = None) -> int:
    """Run a comparison and print it; returns the process exit status."""
    df = compare(workload, privacy, mechanisms, progress=sys.stderr)
    print(format_table(df, fmt), file=out if out is not None else sys.stdout)
    if plot:
        plot_comparison(df, plot)
    return 0
