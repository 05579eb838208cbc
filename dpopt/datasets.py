"""The embedded real dataset: Fair's extramarital affairs survey, shipped inside statsmodels.

``load_fair()`` reads it through statsmodels' own API (``statsmodels.datasets.fair.load_pandas``,
the same module as ``statsmodels.api.datasets.fair``, imported directly to skip loading every
statistical model), which reads a file bundled in the statsmodels wheel, so it works offline after ``pip install``: 6,366
rows, 8 ordinal survey attributes and the continuous ``affairs`` measure (left out of the domain).
Source: Fair, R. (1978), "A Theory of Extramarital Affairs", Journal of Political Economy 86(1),
45-61; data from a 1974 Redbook magazine survey of married women.

``fair_domain()`` fixes every attribute's levels from the survey's documented coding (the
statsmodels description of the dataset and Fair 1978), never from the values that happen to occur,
so the domain (and hence every query's sensitivity) does not depend on the private rows:

================  =====================================  ==========================================
attribute         levels                                 coding
================  =====================================  ==========================================
rate_marriage     1..5                                   1 very poor, 2 poor, 3 fair, 4 good, 5 very
                                                         good
age               17.5, 22, 27, 32, 37, 42               age brackets, each coded by one age inside
                                                         it (17.5 the youngest bracket, 42 the
                                                         oldest; brackets as in Fair 1978)
yrs_married       0.5, 2.5, 6, 9, 13, 16.5, 23           years married in seven brackets, coded by
                                                         "interval approximations" (statsmodels'
                                                         description; brackets as in Fair 1978)
children          0, 1, 2, 3, 4, 5.5                     number of children, 5.5 for five or more
religious         1..4                                   1 not, 2 mildly, 3 fairly, 4 strongly
educ              9, 12, 14, 16, 17, 20                  grade school, high school, some college,
                                                         college graduate, some graduate school,
                                                         advanced degree
occupation        1..6                                   1 student; 2 farming, semi-skilled or
                                                         unskilled; 3 white-collar; 4 teacher,
                                                         nurse, artist, technician, skilled; 5
                                                         managerial, business; 6 professional with
                                                         advanced degree
occupation_husb   1..6                                   husband's occupation, same coding
================  =====================================  ==========================================

Bracket-coded attributes are ordered categoricals whose levels are the codes (so ``Between("age",
22, 32)`` selects the brackets coded 22, 27 and 32); 1..k scales are integer ranges.  The full domain has
5*6*7*6*4*6*6*6 = 1,088,640 cells; most uses take a few attributes (``fair_domain([...])``).
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from dpopt.data import Attribute, Categorical, Domain, IntegerRange

FAIR_ROWS = 6366

FAIR_ATTRIBUTES: tuple[Attribute, ...] = (
    IntegerRange("rate_marriage", 1, 5),
    Categorical("age", (17.5, 22.0, 27.0, 32.0, 37.0, 42.0), ordered=True),
    Categorical("yrs_married", (0.5, 2.5, 6.0, 9.0, 13.0, 16.5, 23.0), ordered=True),
    Categorical("children", (0.0, 1.0, 2.0, 3.0, 4.0, 5.5), ordered=True),
    IntegerRange("religious", 1, 4),
    Categorical("educ", (9.0, 12.0, 14.0, 16.0, 17.0, 20.0), ordered=True),
    IntegerRange("occupation", 1, 6),
    IntegerRange("occupation_husb", 1, 6),
)


def load_fair() -> pd.DataFrame:
    """The Fair (1978) survey as a DataFrame (6366 rows x 9 columns), via statsmodels, offline.

    Raises RuntimeError naming the fix if statsmodels is not installed.
    """
    try:
        from statsmodels.datasets import fair
    except ImportError as exc:  # pragma: no cover - statsmodels is a declared dependency
        raise RuntimeError(
            f"the embedded 'fair' dataset ships with statsmodels (pip install statsmodels): {exc}"
        ) from exc
    df = fair.load_pandas().data
    return pd.DataFrame(df).reset_index(drop=True)


def fair_domain(attributes: Sequence[str] | None = None) -> Domain:
    """Domain of the Fair survey on ``attributes`` (default all 8, in the table's column order).

    Attributes are kept in the order of FAIR_ATTRIBUTES whatever order they are given in.
    """
    full = Domain(FAIR_ATTRIBUTES)
    if attributes is None:
        return full
    if isinstance(attributes, str):
        attributes = [attributes]
    return full.project(list(attributes))
