"""The experiment registry's building blocks: scales, points, the paper's claims, experiments as sweeps."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from dpopt.experiments import Task, resolve_workload
from dpopt.validation import check_choice

SCALES = ("small", "default", "full")

# The matrix mechanism's n x n solver dominates runs beyond this size; only --full runs it there.
MM_MAX_CELLS = {"mm-appendix-b": 128}

# Constructor parameters under which a mechanism runs the papers' own algorithm: by default the optimising
# mechanisms return a baseline strategy whenever it has less error, which would put the baselines' numbers
# in the papers' columns (e.g. identity for eigen under eps-DP). A point's own parameters override these.
# The papers' hierarchical mechanism is the binary tree with its root (Hay et al.'s H_2), not dpopt's default
# (Qardaji et al.'s branching without the root).
PAPER_PARAMS: dict[str, dict[str, Any]] = {
    **{mech: {"baselines": False} for mech in ("eigen", "mm-appendix-b", "lrm", "om")},
    "hierarchical": {"branching": 2},
}


def check_scale(scale: str) -> str:
    """Validate a scale name: 'small' (seconds), 'default' (minutes) or 'full' (the paper's)."""
    check_choice(scale, SCALES, "scale")
    return scale


def by_scale(scale: str, small: Any, default: Any, full: Any) -> Any:
    """The value for `scale` among the three."""
    return {"small": small, "default": default, "full": full}[check_scale(scale)]


@dataclass
class Point:
    """One x-position of one panel: a workload template with its sizes and per-mechanism parameters."""

    panel: str
    x: float
    workload: str
    sizes: dict[str, Any] = field(default_factory=dict)
    params: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class Claim:
    """A statement the paper makes about its figure, checked on our summary."""

    text: str
    check: Callable[[pd.DataFrame], tuple[bool, str]]


@dataclass
class Experiment:
    """A reproducible experiment: its points at each scale (see SCALES), mechanisms, privacy and checks."""

    name: str
    title: str
    source: str
    points: Callable[[str], list[Point]]
    mechanisms: Sequence[str]
    epsilon: Callable[[str], list[float]] = lambda scale: [0.1]
    delta: float = 0.0
    repetitions: Callable[[str], int] = lambda scale: 1
    metric: str = "avg_squared_error"
    xlabel: str = "x"
    ylabel: str = "average squared error per query"
    logx: bool = True
    data: Callable[[], str | None] = lambda: None
    claims: Sequence[Claim] = ()
    summarise: Callable[[pd.DataFrame], pd.DataFrame] | None = None
    compare: Callable[[pd.DataFrame], list[tuple[bool, str]]] | None = None
    plot: Callable[[pd.DataFrame, pd.DataFrame, Path], None] | None = None
    note: str = ""
    # Below the paper's scale, mechanism -> largest n it runs at (slow solvers would dominate the run).
    max_cells: dict[str, int] = field(default_factory=dict)

    def caps(self, scale: str, max_cells: Mapping[str, int] | None = None) -> dict[str, int]:
        """Mechanism -> largest n it runs at: `max_cells`, else the experiment's own below the paper's scale."""
        return dict(max_cells) if max_cells is not None else ({} if scale == "full" else dict(self.max_cells))

    def tasks(self, scale: str = "default", repetitions: int | None = None,
              epsilons: Sequence[float] | None = None,
              max_cells: Mapping[str, int] | None = None, use_data: bool = True,
              xs: Sequence[float] | None = None) -> list[Task]:
        """Every (point, mechanism, eps, repetition) at `scale` as a sweep task.

        repetitions, epsilons: override the experiment's (e.g. the paper's n range with one repetition
        and one eps: pure-DP expected errors scale exactly as 1/eps^2). With several eps the tasks share
        their fits (one selection per point and repetition, evaluated at every eps). max_cells: mechanism -> largest
        n it runs at, at every scale (default: the experiment's caps, below the paper's scale only). use_data=False:
        no data vector, so errors are the noise terms only (no relaxed-LRM bias; runs beyond the data's cells).
        xs: only the points at these x (e.g. one n of a figure); a value no point has is an error.
        """
        scale = check_scale(scale)
        reps = repetitions if repetitions is not None else self.repetitions(scale)
        eps_list = list(epsilons) if epsilons is not None else self.epsilon(scale)
        if not eps_list or any(not (math.isfinite(e) and e > 0) for e in eps_list):
            raise ValueError(f"epsilons must be finite and > 0, got {eps_list}")
        caps = self.caps(scale, max_cells)
        shared = len(eps_list) > 1  # one fit per point serves every eps (experiments.Task.shared_fit)
        data = self.data() if use_data else None
        tasks: list[Task] = []
        points = self.points(scale)
        if xs is not None:
            wanted, have = set(map(float, xs)), {float(pt.x) for pt in points}
            if wanted - have:
                raise ValueError(f"{self.name} has no points at x = {sorted(wanted - have)} at scale {scale!r}; "
                                 f"its x: {sorted(have)}")
            points = [pt for pt in points if float(pt.x) in wanted]
        for pt in points:
            coords = {"panel": pt.panel, "x": pt.x, **pt.sizes}
            for mech in self.mechanisms:
                if int(pt.sizes.get("n", 0)) > caps.get(mech, math.inf):
                    continue
                params = tuple(sorted({**PAPER_PARAMS.get(mech, {}), **pt.params.get(mech, {})}.items()))
                for eps in eps_list:
                    for rep in range(reps):
                        tasks.append(
                            Task(
                                workload=resolve_workload(pt.workload, pt.sizes, rep),
                                mechanism=mech,
                                epsilon=eps,
                                delta=self.delta,
                                params=params,
                                repetition=rep,
                                template=pt.workload,
                                sizes=tuple(sorted(coords.items())),
                                data=data,
                                shared_fit=shared,
                                index=len(tasks),
                            )
                        )
        return tasks


@dataclass
class Reproduction:
    """What a run produced: the tidy rows, the summary, the differences from the paper, and the files."""

    name: str
    results: pd.DataFrame
    summary: pd.DataFrame
    differences: list[str]
    agreements: list[str]
    files: dict[str, Path]

