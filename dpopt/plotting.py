"""Figures written to a file: one headless matplotlib set-up, layout, save and close for every plot of dpopt."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def saved_figure(path: str | os.PathLike[str], *grid: int, dpi: int = 110, **subplots: Any) -> Iterator[tuple[Any, Any]]:
    """(fig, axes) of plt.subplots(*grid, **subplots) on the Agg backend; laid out and saved to path at dpi when
    the block ends, and closed even when it raises."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(*grid, **subplots)
    try:
        yield fig, axes
        fig.tight_layout()
        fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)
