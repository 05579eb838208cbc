"""`dpopt reproduce NAME`: the source papers' tables and figures, rerun as sweeps and set beside the papers.

Every experiment is a registry entry (`EXPERIMENTS`): the tasks it runs at three scales ("small": seconds,
for notebooks in CI; "default": minutes; "full": the paper's parameter ranges and repetitions), how its rows are summarised, how it is drawn, and what the paper reports
(numbers where the paper prints them, its stated findings where the figure is only a picture). A run
writes `<out>/<name>.csv` (one row per task), `<out>/<name>-summary.csv` and `<out>/<name>.png`, and
prints every place where our numbers differ from the paper's.

Conventions: errors are the exact expected errors of the fitted strategies (not sampled), plus the
data-dependent bias ||(W - B L) x||^2 for relaxed LRM strategies when the experiment has data. The LRM and
OM papers plot "average squared error"; here that is the expected total squared error over m (per query).

Modules: `experiment` (scales, points, claims, experiments as sweep tasks), `summary` (means and plots),
`claims` (checks of the papers' findings), `table2` (seed 004), `lrm_figures` (seed 000), `om_figures`
(seed 001), `runner` (the registry and `reproduce`).
"""

from dpopt.reproduce.claims import (
    best_everywhere,
    endpoint_ratio,
    gap_to_next_best,
    large_x,
    monotone,
    ratio_at,
    small_x,
    spread,
    worst_everywhere,
)
from dpopt.reproduce.experiment import (
    MM_MAX_CELLS,
    SCALES,
    Claim,
    Experiment,
    Point,
    Reproduction,
    check_scale,
)
from dpopt.reproduce.lrm_figures import (
    LRM_BASELINES,
    LRM_DEFAULT,
    LRM_FAMILIES,
    LRM_NS,
    LRM_TRUNCATION_SLACK,
    lrm_fig3_points,
    searchlogs_data,
)
from dpopt.reproduce.om_figures import OM_EPS, OM_MECHANISMS
from dpopt.reproduce.runner import EXPERIMENTS, list_experiments, reproduce
from dpopt.reproduce.summary import figure_summary, pivot, plot_figure, usable
from dpopt.reproduce.table2 import TABLE2_ROWS, TABLE2_STRATEGIES, make_table2

__all__ = [
    "EXPERIMENTS", "LRM_BASELINES", "LRM_DEFAULT", "LRM_FAMILIES", "LRM_NS", "LRM_TRUNCATION_SLACK", "MM_MAX_CELLS",
    "OM_EPS", "OM_MECHANISMS", "SCALES", "TABLE2_ROWS", "TABLE2_STRATEGIES", "Claim", "Experiment", "Point",
    "Reproduction", "best_everywhere", "check_scale", "endpoint_ratio", "figure_summary", "gap_to_next_best",
    "large_x", "list_experiments", "lrm_fig3_points", "make_table2", "monotone", "pivot", "plot_figure",
    "ratio_at", "reproduce", "searchlogs_data", "small_x", "spread", "usable", "worst_everywhere",
]
