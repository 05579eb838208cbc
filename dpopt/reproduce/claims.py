"""Checks of the papers' stated findings on a figure's summary: each returns (holds, what we measured)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pandas as pd

from dpopt.reproduce.summary import pivot


def best_everywhere(mech: str, panels: Iterable[str] | None = None, column: str = "value",
                    where: Callable[[pd.DataFrame], pd.Series] | None = None) -> Callable[[pd.DataFrame], tuple[bool, str]]:
    """Check: `mech` has the smallest value at every (panel, eps, x) (optionally restricted)."""

    def check(summary: pd.DataFrame) -> tuple[bool, str]:
        t = pivot(summary, column)
        if mech not in t.columns:
            return False, f"{mech} has no results"
        if panels is not None:
            t = t[t.index.get_level_values("panel").isin(list(panels))]
        if where is not None:
            t = t[where(t)]
        t = t.dropna(subset=[mech])
        if t.empty:
            return False, f"no points with a {mech} result"
        best = t.idxmin(axis=1)
        losses = t[best != mech]
        if losses.empty:
            return True, f"{mech} smallest at all {len(t)} points"
        first = losses.index[0]
        return False, (f"{mech} smallest at {len(t) - len(losses)}/{len(t)} points; e.g. at {_key(first)}: "
                       f"{best.loc[first]} = {t.loc[first].min():.4g} vs {mech} = {t.loc[first, mech]:.4g}")

    return check


def _key(index: tuple[Any, ...]) -> str:
    """(panel, eps, x) as text."""
    panel, eps, x = index
    return f"{panel}, eps={float(eps):g}, x={float(x):g}"


def worst_everywhere(mech: str, column: str = "value") -> Callable[[pd.DataFrame], tuple[bool, str]]:
    """Check: `mech` has the largest value at every point where it ran."""

    def check(summary: pd.DataFrame) -> tuple[bool, str]:
        t = pivot(summary, column)
        if mech not in t.columns or t[mech].isna().all():
            return False, f"{mech} has no results"
        t = t.dropna(subset=[mech])
        worst = t.idxmax(axis=1)
        n_ok = int((worst == mech).sum())
        return n_ok == len(t), f"{mech} largest at {n_ok}/{len(t)} points"

    return check


def monotone(mech: str, increasing: bool, panels: Iterable[str] | None = None, column: str = "value",
             slack: float = 0.0) -> Callable[[pd.DataFrame], tuple[bool, str]]:
    """Check: `mech`'s value grows (or falls) with x in every (panel, eps), within a relative slack."""

    def check(summary: pd.DataFrame) -> tuple[bool, str]:
        s = summary[(summary["mechanism"] == mech) & summary[column].notna()]
        if panels is not None:
            s = s[s["panel"].isin(list(panels))]
        if s.empty:
            return False, f"{mech} has no results"
        bad = []
        for key, g in s.groupby(["panel", "epsilon"]):
            v = g.sort_values("x")[column].to_numpy()
            steps = np.diff(v) / np.maximum(np.abs(v[:-1]), 1e-300)
            if (increasing and np.any(steps < -slack)) or (not increasing and np.any(steps > slack)):
                bad.append(f"{key[0]} eps={key[1]:g}: {np.array2string(v, precision=3)}")
        word = "increases" if increasing else "decreases"
        return not bad, (f"{mech} {word} with x everywhere" if not bad else f"{mech} not monotone in " + "; ".join(bad[:2]))

    return check


def ratio_at(num: str, den: str, pick: Callable[[pd.DataFrame], pd.DataFrame], lo: float, hi: float = math.inf,
             column: str = "value") -> Callable[[pd.DataFrame], tuple[bool, str]]:
    """Check: value(num) / value(den) lies in [lo, hi] at the picked points."""

    def check(summary: pd.DataFrame) -> tuple[bool, str]:
        t = pivot(summary, column)
        if num not in t.columns or den not in t.columns:
            return False, f"missing {num} or {den}"
        t = pick(t).dropna(subset=[num, den])
        if t.empty:
            return False, "no points to compare"
        r = (t[num] / t[den]).to_numpy()
        return bool(np.all((r >= lo) & (r <= hi))), f"{num}/{den} = {np.array2string(r, precision=3)}"

    return check


def gap_to_next_best(mech: str, pick: Callable[[pd.DataFrame], pd.DataFrame], lo: float,
                     column: str = "value") -> Callable[[pd.DataFrame], tuple[bool, str]]:
    """Check: the best other mechanism's value over `mech`'s is at least lo at the picked points."""

    def check(summary: pd.DataFrame) -> tuple[bool, str]:
        t = pivot(summary, column)
        if mech not in t.columns or len(t.columns) < 2:
            return False, f"{mech} or the others have no results"
        t = pick(t).dropna(subset=[mech])
        others = t.drop(columns=[mech])
        if t.empty or others.isna().all(axis=None):
            return False, "no points to compare"
        r = others.min(axis=1) / t[mech]
        who = others.idxmin(axis=1)
        parts = [f"{r.loc[i]:.3g}x ({who.loc[i]}) at {_key(i)}" for i in r.index]
        return bool((r >= lo).all()), "next best / " + mech + ": " + "; ".join(parts)

    return check


def endpoint_ratio(mech: str, lo: float, hi: float, column: str = "value", x_from: float | None = None
                   ) -> Callable[[pd.DataFrame], tuple[bool, str]]:
    """Check: in each (panel, eps), value at the largest x over value at `x_from` (default the smallest x) in [lo, hi].

    x_from picks the first x >= x_from; where that is the largest x (a smaller scale's range), the largest x but
    one stands in for it.
    """

    def check(summary: pd.DataFrame) -> tuple[bool, str]:
        s = summary[(summary["mechanism"] == mech) & summary[column].notna()]
        if s.empty:
            return False, f"{mech} has no results"
        ok, parts = True, []
        for (panel, eps), g in s.groupby(["panel", "epsilon"]):
            g = g.sort_values("x")
            if len(g) < 2:
                continue
            later = g[g["x"] >= x_from] if x_from is not None else g
            start = later.iloc[0] if len(later) > 1 else g.iloc[-2]
            r = float(g.iloc[-1][column] / start[column])
            ok &= lo <= r <= hi
            parts.append(f"{panel} eps={eps:g}: x={start['x']:g}->{g.iloc[-1]['x']:g} ratio {r:.3g}")
        return ok and bool(parts), ", ".join(parts) or "not enough points"

    return check


def spread(mech: str, max_ratio: float, where: Callable[[pd.DataFrame], pd.Series] | None = None,
           column: str = "value") -> Callable[[pd.DataFrame], tuple[bool, str]]:
    """Check: within each (panel, eps), max / min of `mech`'s value over x is at most max_ratio."""

    def check(summary: pd.DataFrame) -> tuple[bool, str]:
        s = summary[(summary["mechanism"] == mech) & summary[column].notna()]
        if where is not None:
            s = s[where(s)]
        if s.empty:
            return False, f"{mech} has no results"
        worst = 0.0
        for _, g in s.groupby(["panel", "epsilon"]):
            worst = max(worst, float(g[column].max() / g[column].min()))
        return worst <= max_ratio, f"largest max/min over x = {worst:.3g} (limit {max_ratio:g})"

    return check


def small_x(t: pd.DataFrame, k: int = 2) -> pd.Series:
    """Rows of a pivoted summary at its k smallest x (a claim about "small n" or "low rank")."""
    xs = sorted(set(t.index.get_level_values("x")))
    return pd.Series(t.index.get_level_values("x").isin(xs[:k]), index=t.index)


def large_x(t: pd.DataFrame, k: int = 1) -> pd.Series:
    """Rows of a pivoted summary at its k largest x."""
    xs = sorted(set(t.index.get_level_values("x")))
    return pd.Series(t.index.get_level_values("x").isin(xs[-k:]), index=t.index)
