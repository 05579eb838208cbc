"""Fit every applicable mechanism on one workload and tabulate expected errors against the lower bound."""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np
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


# Relative slack on the delta check: the Balle-Wang delta is computed to about 1e-12 relative.
DELTA_RTOL = 1e-9


def check_privacy_range(privacy: Privacy) -> float:
    """P(eps, delta), refused unless it is a positive normal float64 (2/eps^2 or the Gaussian sigma^2)."""
    try:
        factor = privacy.variance_factor
    except (OverflowError, ZeroDivisionError, ValueError):
        factor = math.inf if privacy.epsilon < 1 else 0.0
    if not math.isfinite(factor):
        raise ValueError(
            f"epsilon={privacy.epsilon!r} is too small: the noise variance factor P(eps, delta) overflows "
            "float64; expected epsilon of about 1e-150 or more"
        )
    if factor < sys.float_info.min:
        raise ValueError(
            f"epsilon={privacy.epsilon!r} is too large: the noise variance factor P(eps, delta) = {factor!r} "
            "underflows float64; expected epsilon of about 1e150 or less"
        )
    return factor


def calibration_problem(privacy: Privacy) -> str | None:
    """Why the classic Gaussian sigma is not (eps, delta)-DP here (Balle-Wang delta > requested), or None."""
    if privacy.is_pure or privacy.calibration != "classic":
        return None
    achieved = privacy.achieved_delta()
    if achieved <= privacy.delta * (1 + DELTA_RTOL):
        return None
    return (
        f"classic-calibration-invalid: achieves delta={achieved!r} > requested {privacy.delta!r} "
        f"at eps={privacy.epsilon!r} (use --calibration analytic)"
    )


def compare(
    workload: Workload,
    privacy: Privacy,
    mechanisms: Sequence[str] | None = None,
    progress: TextIO | None = None,
) -> pd.DataFrame:
    """One row per mechanism, sorted by expected total error; a mechanism that cannot run gets status 'skipped: why'.

    Under the classic Gaussian calibration at an eps where it is not (eps, delta)-DP, every row keeps its
    numbers and its status starts with 'classic-calibration-invalid: achieves delta=... > requested ...'.
    """
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
    problem = calibration_problem(privacy)
    if problem is not None:
        for row in rows:
            row["status"] = f"{problem}; solver status: {row.get('status')}"
    df = pd.DataFrame(rows)
    for col in COLUMNS:
        if col not in df:
            df[col] = math.nan
    return df.sort_values("expected_total_error", na_position="last").reset_index(drop=True)


def format_table(df: pd.DataFrame, fmt: str) -> str:
    """Render a comparison as 'table' (aligned text), 'markdown', 'csv' or 'json' (list of records)."""
    if fmt == "json":
        return json.dumps([_json_record(r) for r in df.to_dict(orient="records")], indent=2)
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


def _json_value(v: Any) -> Any:
    """A JSON value with a float's full precision (repr round-trip); NaN and infinities become null."""
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v) if math.isfinite(v) else None
    if v is None or isinstance(v, str):
        return v
    return str(v)


def _json_record(record: dict[str, Any]) -> dict[str, Any]:
    """One comparison row as JSON-ready values."""
    return {str(k): _json_value(v) for k, v in record.items()}


def check_plot_path(path: str) -> None:
    """Refuse a plot path whose folder is missing, not a folder or not writable, before any fitting."""
    folder = Path(path).resolve().parent
    if not folder.exists():
        raise ValueError(f"cannot write plot {path}: folder {folder} does not exist")
    if not folder.is_dir():
        raise ValueError(f"cannot write plot {path}: {folder} is not a folder")
    if not os.access(folder, os.W_OK):
        raise ValueError(f"cannot write plot {path}: folder {folder} is not writable")
    if Path(path).is_dir():
        raise ValueError(f"cannot write plot {path}: it is a folder; expected a PNG file name")


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
    try:
        fig.savefig(path, dpi=120)
    except OSError as exc:
        raise ValueError(f"cannot write plot {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)


def main_compare(workload: Workload, privacy: Privacy, mechanisms: Sequence[str] | None,
                 fmt: str, plot: str | None, out: TextIO | None = None) -> int:
    """Run a comparison and print it; returns the process exit status."""
    check_privacy_range(privacy)
    if plot:
        check_plot_path(plot)
    problem = calibration_problem(privacy)
    if problem is not None:
        print(f"dpopt: warning: {problem}; the numbers below use the classic sigma anyway", file=sys.stderr)
    df = compare(workload, privacy, mechanisms, progress=sys.stderr)
    print(format_table(df, fmt), file=out if out is not None else sys.stdout)
    if plot:
        plot_comparison(df, plot)
    return 0
