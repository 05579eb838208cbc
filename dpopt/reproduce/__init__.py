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
(seed 001), `runner` (the registry and `reproduce`). The package exports the registry, `reproduce` and
Table 2; everything else is imported from its module.
"""

from dpopt.reproduce.runner import EXPERIMENTS, reproduce
from dpopt.reproduce.table2 import TABLE2_ROWS, make_table2

__all__ = ["EXPERIMENTS", "TABLE2_ROWS", "make_table2", "reproduce"]
