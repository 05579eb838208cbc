"""Figure experiments' summaries (means over repetitions) and plots."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from dpopt.plotting import saved_figure
from dpopt.reproduce.experiment import Experiment

FAILED_PREFIXES = ("skipped", "error", "unavailable")


def usable(status: pd.Series) -> pd.Series:
    """Rows whose mechanism produced a strategy (converged, closed form, or valid but unconverged)."""
    return ~status.astype(str).str.startswith(FAILED_PREFIXES)


def figure_summary(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Mean of `metric` and of the fit's wall and CPU seconds over repetitions per (panel, eps, x, mechanism).

    Rows without a strategy count as NaN; `status` lists the distinct statuses of the runs.
    """
    d = df.copy()
    cols = list(dict.fromkeys((metric, "fit_seconds", "fit_cpu_seconds")))
    for col in cols:
        if col not in d:
            d[col] = np.nan
    bad = ~usable(d["status"])
    d.loc[bad, cols] = np.nan
    g = d.groupby(["panel", "epsilon", "x", "mechanism"], sort=True, dropna=False)
    out = g.agg(
        value=(metric, "mean"),
        fit_seconds=("fit_seconds", "mean"),
        fit_cpu_seconds=("fit_cpu_seconds", "mean"),
        runs=(metric, "count"),
        status=("status", lambda s: "; ".join(sorted(set(map(str, s))))[:160]),
    )
    return out.reset_index()


def pivot(summary: pd.DataFrame, column: str = "value") -> pd.DataFrame:
    """One row per (panel, eps, x), one column per mechanism."""
    return summary.pivot_table(index=["panel", "epsilon", "x"], columns="mechanism", values=column, aggfunc="first")


def plot_figure(exp: Experiment, summary: pd.DataFrame, path: Path, column: str = "value") -> None:
    """One subplot per (panel, eps), one line per mechanism, log-scale y."""
    groups = list(summary.groupby(["panel", "epsilon"], sort=True))
    k = max(1, len(groups))
    cols = min(3, k)
    rows = math.ceil(k / cols)
    with saved_figure(path, rows, cols, figsize=(4.2 * cols, 3.3 * rows), squeeze=False) as (fig, axes):
        for ax, ((panel, eps), g) in zip(axes.ravel(), groups, strict=False):
            for mech, gm in g.groupby("mechanism", sort=True):
                gm = gm.sort_values("x")
                if gm[column].notna().any():
                    ax.plot(gm["x"], gm[column], marker="o", label=mech)
            ax.set_yscale("log")
            if exp.logx:
                ax.set_xscale("log")
            xs = sorted(set(g["x"]))
            ax.set_xticks(xs, [f"{v:g}" for v in xs], fontsize=7)
            ax.minorticks_off()
            ax.set_title(f"{panel}, eps={eps:g}" if eps > 0 else str(panel), fontsize=9)  # eps 0: eps is the x axis
            ax.set_xlabel(exp.xlabel)
            ax.set_ylabel(exp.ylabel if column == "value" else "fit time (s)", fontsize=8)
            ax.legend(fontsize=7)
        for ax in axes.ravel()[k:]:
            ax.set_visible(False)
        fig.suptitle(f"{exp.title} ({exp.source})", fontsize=10)


