"""Markdown pipe tables for benchmark results (no optional dependency such as tabulate)."""

from __future__ import annotations

import pandas as pd


def pipe_table(df: pd.DataFrame, cols: list[str]) -> str:
    """The columns `cols` of df as a markdown pipe table; floats with 4 significant digits."""
    out = df[cols].copy()
    for c in cols:
        if out[c].dtype.kind == "f":
            out[c] = out[c].map(lambda v: f"{v:.4g}")
    header = "| " + " | ".join(cols) + " |"
    sep = "|" + "---|" * len(cols)
    body = ["| " + " | ".join(str(v) for v in row) + " |" for row in out.itertuples(index=False)]
    return "\n".join([header, sep, *body])
