"""The registry of every experiment, and the runner: sweep, summarise, check the paper's claims, report."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TextIO

import pandas as pd

from dpopt.experiments import Task, run_sweep
from dpopt.reproduce.experiment import Experiment, Reproduction, check_scale
from dpopt.reproduce.lrm_figures import lrm_experiments
from dpopt.reproduce.om_figures import om_experiments
from dpopt.reproduce.summary import figure_summary, pivot, plot_figure, usable
from dpopt.reproduce.table2 import TABLE2_STRATEGIES, make_table2
from dpopt.validation import check_output_folder, check_time_limit


def _registry() -> dict[str, Experiment]:
    exps = [make_table2(), *lrm_experiments(), *om_experiments()]
    return {e.name: e for e in exps}


EXPERIMENTS: dict[str, Experiment] = _registry()


def reproduce(
    name: str | Experiment,
    full: bool = False,
    out: str | os.PathLike[str] | None = "reproduce",
    scale: str | None = None,
    *,
    max_workers: int | None = None,
    scheduler: str | None = None,
    cache: str | os.PathLike[str] | None = None,
    repetitions: int | None = None,
    epsilons: Sequence[float] | None = None,
    max_cells: Mapping[str, int] | None = None,
    use_data: bool = True,
    xs: Sequence[float] | None = None,
    progress: bool = True,
    report: bool = True,
    stream: TextIO | None = None,
    time_limit: float | None = None,
) -> Reproduction:
    """Run an experiment, write its CSVs and plot under `out` (None: write nothing), print the comparison.

    scale: 'small', 'default' or 'full' (default: 'full' if full else 'default').
    repetitions, epsilons, max_cells, use_data, xs: overrides of the experiment's (see `Experiment.tasks`).
    The report goes to `stream` (default sys.stdout) unless report=False. time_limit: wall-clock seconds
    per fit (None: no limit); a capped fit keeps its best valid strategy and says so in its status.
    """
    exp = name if isinstance(name, Experiment) else EXPERIMENTS.get(name)
    if exp is None:
        raise ValueError(f"unknown experiment {name!r}; expected one of {', '.join(EXPERIMENTS)}")
    scale = check_scale(scale or ("full" if full else "default"))
    tasks = exp.tasks(scale, repetitions, epsilons, max_cells, use_data, xs)
    if out is not None:
        check_output_folder(out, "output folder")  # before the work, not after it
    if time_limit is not None:
        tasks = [replace(t, time_limit=check_time_limit(time_limit)) for t in tasks]
    df = run_sweep(tasks, max_workers=max_workers, scheduler=scheduler, cache=cache, progress=progress,
                   desc=exp.name)
    summary = exp.summarise(df) if exp.summarise else figure_summary(df, exp.metric)
    diffs: list[str] = []
    agrees: list[str] = []
    if exp.compare is not None:
        for ok, text in exp.compare(summary):
            (agrees if ok else diffs).append(text)
    for claim in exp.claims:
        ok, detail = claim.check(summary)
        (agrees if ok else diffs).append(f"paper: {claim.text} -- ours: {detail}")
    flagged = ~usable(df["status"]) | df["status"].astype(str).str.contains("not certified")
    unavailable = sorted({f"{m}: {s}" for m, s in zip(df["mechanism"][flagged], df["status"][flagged], strict=True)})
    files: dict[str, Path] = {}
    if out is not None:
        d = Path(out)
        d.mkdir(exist_ok=True)
        files["csv"] = d / f"{exp.name}.csv"
        files["summary"] = d / f"{exp.name}-summary.csv"
        files["png"] = d / f"{exp.name}.png"
        df.to_csv(files["csv"], index=False)
        summary.to_csv(files["summary"], index=False)
        if exp.plot is not None:
            exp.plot(df, summary, files["png"])
        else:
            plot_figure(exp, summary, files["png"])
    if report:
        settings = _settings(exp, scale, tasks, exp.caps(scale, max_cells), repetitions, epsilons, use_data, xs)
        _report(exp, scale, settings, summary, diffs, agrees, unavailable, files, stream or sys.stdout)
    return Reproduction(exp.name, df, summary, diffs, agrees, files)


def _settings(exp: Experiment, scale: str, tasks: Sequence[Task], caps: Mapping[str, int],
              repetitions: int | None, epsilons: Sequence[float] | None, use_data: bool = True,
              xs: Sequence[float] | None = None) -> list[str]:
    """How the run departs from the paper's settings: repetitions, eps, mechanisms capped in n, no data, some x."""
    out = []
    if xs is not None:
        out.append(f"only the points at {exp.xlabel} = {', '.join(f'{x:g}' for x in xs)}")
    if repetitions is not None and repetitions != exp.repetitions("full"):
        out.append(f"{repetitions} repetition(s) per point (the paper's setting: {exp.repetitions('full')})")
    if epsilons is not None and list(epsilons) != exp.epsilon("full"):
        out.append(f"eps = {', '.join(f'{e:g}' for e in epsilons)} (the paper's: "
                   f"{', '.join(f'{e:g}' for e in exp.epsilon('full'))})")
    ns = {int(dict(t.sizes).get("n", 0)) for t in tasks}  # the points' n, without rebuilding the points
    for mech, cap in sorted(caps.items()):
        beyond = sorted(n for n in ns if n > cap)
        if mech in exp.mechanisms and beyond:
            out.append(f"{mech} runs only up to n = {cap} cells (not at n = {', '.join(map(str, beyond))})")
    if not use_data and exp.data() is not None:
        out.append("without the data vector: errors are the noise terms only (no ||(W - B L) x||^2 for relaxed LRM)")
    if any(t.shared_fit for t in tasks):
        out.append("one fit per point serves every eps (selection does not depend on eps)")
    return out


def _report(exp: Experiment, scale: str, settings: Sequence[str], summary: pd.DataFrame, diffs: list[str],
            agrees: list[str], unavailable: list[str], files: Mapping[str, Path], stream: TextIO) -> None:
    p = lambda *a: print(*a, file=stream)  # noqa: E731
    p(f"== {exp.name}: {exp.title} ({exp.source}; {'paper' if scale == 'full' else scale} scale)")
    if exp.note:
        p(exp.note)
    for line in settings:
        p(f"setting: {line}")
    if exp.name == "li-miklau-table2":
        cols = ["workload", "svdb", "paper_svdb"] + [c for s in TABLE2_STRATEGIES for c in (s, f"paper_{s}")]
        p(summary[cols].to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    else:
        t = pivot(summary)
        p(t.to_string(float_format=lambda v: f"{v:.4g}"))
    if unavailable:
        p("not run or not converged:")
        for u in unavailable[:20]:
            p(f"  {u[:200]}")
    p("agrees with the paper:" if agrees else "agrees with the paper: (nothing checked agrees)")
    for a in agrees:
        p(f"  {a}")
    p("differs from the paper:" if diffs else "differs from the paper: nothing")
    for d in diffs:
        p(f"  {d}")
    for k, v in files.items():
        p(f"wrote {k}: {v}")
