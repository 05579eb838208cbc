"""Write the dpopt notebooks from the cell lists below, so they stay reviewable as plain Python.

    .venv/bin/python notebooks/build.py            # (re)write notebooks/*.ipynb without outputs
    .venv/bin/python notebooks/build.py --execute  # and execute them (DPOPT_NB_SCALE decides the size)

Every notebook reads DPOPT_NB_SCALE: "small" (seconds; what the test suite runs), "medium" (the
`dpopt reproduce` default scale) or "full" (the papers' scale; the default).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

SETUP = """\
import os
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import Image, display

SCALE = os.environ.get("DPOPT_NB_SCALE", "full")
assert SCALE in ("small", "medium", "full"), f"DPOPT_NB_SCALE must be small, medium or full, got {SCALE!r}"
SMALL = SCALE == "small"
# dpopt reproduce's names for the same three sizes
RUN_SCALE = {"small": "small", "medium": "default", "full": "full"}[SCALE]
WORKERS = 0 if SMALL else None  # in-process at small size; one process per core otherwise
pd.set_option("display.width", 160)
print("scale:", SCALE)"""


def quickstart() -> list:
    return [
        new_markdown_cell(
            "# dpopt quick start\n\n"
            "dpopt answers a batch of linear counting queries (a **workload** W, m x n, over a histogram x of n "
            "cells) under differential privacy with as little error as it can. Every mechanism measures a "
            "**strategy** A with noise and reconstructs the answers with B, W = B A; mechanisms differ only in "
            "how they choose (B, A). This notebook fits the available mechanisms on one workload, answers "
            "queries on data, releases private marginals of a real survey, and runs a small sweep.\n\n"
            "Set `DPOPT_NB_SCALE=small` for a seconds-long run."
        ),
        new_code_cell(SETUP),
        new_markdown_cell(
            "## A workload and its lower bound\n\n"
            "All range queries over n ordered cells. Under (eps, delta)-DP no factorisation can beat "
            "P(eps, delta) * SVDB(W), Li and Miklau's singular value bound: (1/n)(sum of singular values)^2."
        ),
        new_code_cell(
            "from dpopt.bounds import svd_bound\n"
            "from dpopt.privacy import Privacy\n"
            "from dpopt.workloads import AllRange\n\n"
            "n = 32 if SMALL else 256\n"
            "W = AllRange(n)\n"
            "privacy = Privacy(epsilon=1.0, delta=1e-6)\n"
            "print(W, '| SVDB =', f'{svd_bound(W):.4g}', '| P =', f'{privacy.variance_factor:.4g}')"
        ),
        new_markdown_cell(
            "## Compare mechanisms\n\n"
            "`compare` fits every mechanism, checks that its strategy answers W exactly, and reports the expected "
            "total squared error, the RMSE per query and the ratio to the lower bound (1.0 would be optimal)."
        ),
        new_code_cell(
            "from dpopt.compare import COLUMNS, compare\n\n"
            "mechanisms = ['identity', 'laplace', 'hierarchical', 'wavelet', 'eigen', 'mm-optimal']\n"
            "table = compare(W, privacy, mechanisms)\n"
            "table[COLUMNS]"
        ),
        new_markdown_cell(
            "## Answer queries on data\n\n"
            "Research mode draws the noise from a seeded numpy Generator. The empirical squared error of one "
            "release scatters around the analytic expectation."
        ),
        new_code_cell(
            "from dpopt.mechanisms import make_mechanism\n\n"
            "rng = np.random.default_rng(0)\n"
            "x = rng.poisson(50, size=n).astype(float)\n"
            "mech = make_mechanism('wavelet').fit(W, privacy)\n"
            "truth = W.sparse() @ x\n"
            "trials = np.array([np.sum((mech.answer(x, rng) - truth) ** 2) for _ in range(20 if SMALL else 200)])\n"
            "print(f'expected total error {mech.expected_error_.total:.4g}, '\n"
            "      f'empirical mean {trials.mean():.4g} +- {trials.std(ddof=1) / np.sqrt(len(trials)):.2g}')"
        ),
        new_markdown_cell(
            "## Release mode\n\n"
            "Research mode is for Monte Carlo studies only. A release draws its noise from OpenDP's samplers and "
            "is charged, before any noise is drawn, to a `PrivacyLedger`, which refuses a release that would "
            "overspend its budget. The data: the Fair (1978) survey shipped with statsmodels, counted over the "
            "documented domain of three of its attributes; the queries: two 2-way marginals. The answers are "
            "unbiased, so a small count can come out negative; `std` is each answer's noise standard deviation."
        ),
        new_code_cell(
            "from dpopt.data import histogram\n"
            "from dpopt.datasets import fair_domain, load_fair\n"
            "from dpopt.queries import marginal_workload, stack_workloads\n"
            "from dpopt.release import BudgetExceededError, PrivacyLedger, release\n\n"
            "dom = fair_domain(['rate_marriage', 'religious', 'children'])\n"
            "x, report = histogram(load_fair(), dom)\n"
            "queries = stack_workloads([marginal_workload(dom, ['rate_marriage', 'religious']),\n"
            "                           marginal_workload(dom, ['religious', 'children'])])\n"
            "survey = make_mechanism('mm-optimal').fit(queries, Privacy(epsilon=0.5, delta=1e-7))\n"
            "ledger = PrivacyLedger(total_epsilon=1.0, total_delta=1e-6)\n"
            "answers = release(survey, x, ledger, domain=dom)\n"
            "print(f'{len(answers)} answers from {int(x.sum())} rows over {dom.size} cells;', ledger)\n"
            "answers.head(6)"
        ),
        new_code_cell(
            "release(survey, x, ledger, domain=dom)  # the second half of the budget\n"
            "try:\n"
            "    release(survey, x, ledger, domain=dom)\n"
            "except BudgetExceededError as exc:\n"
            "    print('refused, nothing released:', exc)\n"
            "print(ledger)"
        ),
        new_markdown_cell(
            "## A sweep\n\n"
            "A sweep expands a grid into independent tasks (here workload size x mechanism x eps) and returns "
            "one tidy DataFrame. The same call runs on local processes or, with `scheduler=` or `client=`, on a "
            "Dask cluster; `cache=` makes an interrupted sweep resume."
        ),
        new_code_cell(
            "from dpopt.experiments import SweepConfig, run_sweep\n\n"
            "cfg = SweepConfig.from_mapping({\n"
            "    'workloads': ['allrange:{n}', 'prefix:{n}'],\n"
            "    'sizes': {'n': [16, 32] if SMALL else [64, 128, 256]},\n"
            "    'mechanisms': ['identity', 'hierarchical', 'wavelet', 'eigen'],\n"
            "    'epsilon': [0.1, 0.5, 1.0],\n"
            "    'delta': [1e-6],\n"
            "})\n"
            "df = run_sweep(cfg, max_workers=WORKERS, progress=False)\n"
            "df[['workload_spec', 'mechanism', 'epsilon', 'expected_total_error', 'ratio_to_bound', 'status']].head(8)"
        ),
        new_code_cell(
            "fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))\n"
            "big = df[df['cells'] == df['cells'].max()]\n"
            "for ax, (template, g) in zip(axes, big.groupby('template')):\n"
            "    for mech, gm in g.groupby('mechanism'):\n"
            "        ax.plot(gm['epsilon'], gm['rmse'], 'o-', label=mech)\n"
            "    ax.set(xscale='log', yscale='log', xlabel='epsilon', ylabel='RMSE per query',\n"
            "           title=f\"{template.format(n=int(g['cells'].iloc[0]))}, delta = 1e-6\")\n"
            "    ax.legend(fontsize=8)\n"
            "plt.tight_layout()\n"
            "plt.show()"
        ),
    ]


def range_queries() -> list:
    return [
        new_markdown_cell(
            "# Range queries: identity, hierarchical, wavelet and optimal strategies\n\n"
            "A teaching demo of the matrix mechanism (seed 003, Miklau's slides; seed 004, Li and Miklau). "
            "To answer all range queries W over n cells we measure a strategy A with Gaussian noise scaled to its "
            "L2 sensitivity (its largest column norm) and answer with least squares, B = W A^+. The expected total "
            "squared error is\n\n"
            "    P(eps, delta) * sens2(A)^2 * trace(W^T W (A^T A)^-1),\n\n"
            "so a good strategy has small columns *and* reconstructs W cheaply."
        ),
        new_code_cell(SETUP),
        new_code_cell(
            "from dpopt.baselines import hierarchical_strategy, identity_strategy, wavelet_strategy\n"
            "from dpopt.bounds import svd_bound\n"
            "from dpopt.error import expected_error\n"
            "from dpopt.mechanisms import make_mechanism\n"
            "from dpopt.privacy import Privacy\n"
            "from dpopt.workloads import AllRange\n\n"
            "n = 16 if SMALL else 64\n"
            "W = AllRange(n)\n"
            "privacy = Privacy(1.0, 1e-6)\n"
            "optimal = make_mechanism('mm-optimal').fit(W, privacy)\n"
            "strategies = {\n"
            "    'identity': identity_strategy(n),\n"
            "    'hierarchical': hierarchical_strategy(n),\n"
            "    'wavelet': wavelet_strategy(n),\n"
            "    'optimal (seed 002)': optimal.strategy_,\n"
            "}\n"
            "print(W, '| optimal solver:', optimal.fit_info_.solver, optimal.fit_info_.status)"
        ),
        new_markdown_cell(
            "## What the strategies look like\n\n"
            "Identity measures each cell; the hierarchical strategy measures every node of a binary tree; the "
            "Haar wavelet measures the total and differences of halves. The optimal strategy is dense: a "
            "weighted mix found by the convex program of seed 002 (shown as A with A^T A = X)."
        ),
        new_code_cell(
            "fig, axes = plt.subplots(1, 4, figsize=(14, 3.8))\n"
            "for ax, (name, s) in zip(axes, strategies.items()):\n"
            "    A = s.A.toarray() if hasattr(s.A, 'toarray') else np.asarray(s.A)\n"
            "    lim = np.abs(A).max()\n"
            "    ax.imshow(A, cmap='RdBu_r', vmin=-lim, vmax=lim, aspect='auto', interpolation='nearest')\n"
            "    ax.set_title(f'{name}\\n{A.shape[0]} x {A.shape[1]}, sens2 = {s.sens2:.3g}', fontsize=9)\n"
            "    ax.set_xlabel('cell')\n"
            "axes[0].set_ylabel('measured query')\n"
            "plt.tight_layout()\n"
            "plt.show()"
        ),
        new_markdown_cell(
            "## Total error against the SVD bound\n\n"
            "P * SVDB(W) bounds every strategy's error from below (seed 004, Theorem 4.2). The ratio says how far "
            "from optimal a strategy is; the convex optimum is within a few percent of the bound on ranges."
        ),
        new_code_cell(
            "bound = privacy.variance_factor * svd_bound(W)\n"
            "reports = {name: expected_error(s, W, privacy) for name, s in strategies.items()}\n"
            "pd.DataFrame({\n"
            "    'sens2': {k: s.sens2 for k, s in strategies.items()},\n"
            "    'total error': {k: r.total for k, r in reports.items()},\n"
            "    'RMSE': {k: r.rmse for k, r in reports.items()},\n"
            "    'ratio to P*SVDB': {k: r.total / bound for k, r in reports.items()},\n"
            "})"
        ),
        new_markdown_cell(
            "## Which queries pay\n\n"
            "Per-query variance against range length. Identity's error grows linearly with the length; the tree "
            "and the wavelet pay a logarithmic price on every range; the optimal strategy spreads the error most "
            "evenly. The dashed line is the bound spread evenly over the queries."
        ),
        new_code_cell(
            "i, j = np.triu_indices(n)\n"
            "length = j - i + 1\n"
            "fig, ax = plt.subplots(figsize=(7, 4))\n"
            "for name, r in reports.items():\n"
            "    mean = pd.Series(r.per_query).groupby(length).mean()\n"
            "    ax.plot(mean.index, mean.values, label=name)\n"
            "ax.axhline(bound / W.m, ls='--', color='k', label='P * SVDB / m')\n"
            "ax.set(xlabel='range length', ylabel='variance of the answer', yscale='log',\n"
            "       title=f'AllRange({n}), eps = 1, delta = 1e-6')\n"
            "ax.legend()\n"
            "plt.show()"
        ),
    ]


# The overrides of an experiment's settings, as `dpopt reproduce --repetitions / --epsilon / --max-cells`, read
# from the environment (a notebook run at the paper's sizes with fewer repetitions says so in its output).
OVERRIDES = """\
# DPOPT_NB_REPETITIONS=1, DPOPT_NB_EPSILON=0.1 (or 0.2,1.6), DPOPT_NB_MAX_CELLS=mm-appendix-b=256,
# DPOPT_NB_FIGURE_SCALE=lrm-fig3=medium (a figure run at another scale than DPOPT_NB_SCALE).
REPS = int(os.environ["DPOPT_NB_REPETITIONS"]) if os.environ.get("DPOPT_NB_REPETITIONS") else None
EPS = [float(e) for e in os.environ["DPOPT_NB_EPSILON"].split(",")] if os.environ.get("DPOPT_NB_EPSILON") else None
MAX_CELLS = ({k: int(v) for k, v in (kv.split("=") for kv in os.environ["DPOPT_NB_MAX_CELLS"].split(","))}
             if os.environ.get("DPOPT_NB_MAX_CELLS") else None)
FIGURE_SCALE = dict(kv.split("=") for kv in os.environ.get("DPOPT_NB_FIGURE_SCALE", "").split(",") if kv)
assert set(FIGURE_SCALE.values()) <= {"small", "medium", "full"}, f"bad DPOPT_NB_FIGURE_SCALE: {FIGURE_SCALE}"
print("overrides:", {"repetitions": REPS, "epsilon": EPS, "max_cells": MAX_CELLS, "figure_scale": FIGURE_SCALE})


def run_scale(name):
    return {"small": "small", "medium": "default", "full": "full"}[FIGURE_SCALE.get(name, SCALE)]
"""
OVERRIDE_ARGS = ",\n                    repetitions=REPS, epsilons=EPS, max_cells=MAX_CELLS"


def _runner(subset: list[str], overrides: bool) -> str:
    """The notebook's `show(name)` helper; with overrides, it reads them from DPOPT_NB_* variables."""
    return RUNNER.format(subset=repr(subset), overrides=OVERRIDES if overrides else "",
                         scale="run_scale(name)" if overrides else "RUN_SCALE",
                         override_args=OVERRIDE_ARGS if overrides else "")


def _figure_cells(names_titles: list[tuple[str, str]]) -> list:
    cells = []
    for name, text in names_titles:
        cells.append(new_markdown_cell(f"## {name}\n\n{text}"))
        cells.append(new_code_cell(f"show({name!r})"))
    return cells


RUNNER = """\
from dpopt.reproduce import EXPERIMENTS, reproduce

OUT = Path(tempfile.mkdtemp(prefix="dpopt-nb-"))
# Figures that share tasks (same workload, mechanism, eps) compute them once; DPOPT_NB_CACHE keeps the
# per-task results across runs (e.g. a cache filled by `dpopt reproduce --cache DIR`).
CACHE = Path(os.environ.get("DPOPT_NB_CACHE", OUT / "cache"))
SMALL_SUBSET = {subset}
{overrides}

def show(name):
    if SMALL and name not in SMALL_SUBSET:
        print(f"{{name}}: not run at small scale (see the committed copy for its output)")
        return None
    res = reproduce(name, scale={scale}, out=OUT, cache=CACHE, max_workers=WORKERS, progress=False{override_args})
    display(Image(filename=str(res.files["png"])))
    return res"""


def lrm_experiments() -> list:
    figs = [
        ("lrm-fig2", "Effect of the relaxation gamma of Formula (8) on LRM's error and time, on WDiscrete, WRange "
         "and WRelated. The paper: error insensitive to gamma in [1e-4, 10], larger gamma runs faster."),
        ("lrm-fig3", "Effect of the number r of rows of L, as a multiple of rank(W). The paper: r < rank(W) is far "
         "worse; beyond 1.2 rank(W) the error is stable (its default). Below rank(W), gamma = 0.01 has no solution (a "
         "rank-r B L misses W by at least the Eckart-Young residual of the best rank-r approximation), so there "
         "gamma is 1.2 times that residual and the error includes the data-dependent term it lets in."),
        ("lrm-fig4", "Domain size n on WDiscrete, all mechanisms (MM = the matrix mechanism by Appendix B). The "
         "paper: LM best at small n; LRM's error stops growing past n = 512."),
        ("lrm-fig5", "Domain size n on WRange. The paper: LRM best; the wavelet and the tree beat LM from n = 512."),
        ("lrm-fig6", "Domain size n on WRelated (rank s). The paper: LRM best everywhere, by two orders of "
         "magnitude at n = 8192."),
        ("lrm-fig7", "Number of queries m on WRange. The paper: LRM best while m << n; the wavelet wins at m = n."),
        ("lrm-fig8", "Number of queries m on WRelated. The paper: LRM best for every m."),
        ("lrm-fig9", "Rank s of WRelated as a fraction of min(m, n). The paper: LRM's advantage is over 100x at "
         "low rank and shrinks as s grows."),
    ]
    return [
        new_markdown_cell(
            "# The Low-Rank Mechanism's experiments (seed 000, Section 6)\n\n"
            "Yuan et al. compare LRM with the Laplace mechanism (LM, `laplace`), the wavelet (WM), the hierarchical "
            "tree (HM) and the matrix mechanism (MM, `mm-appendix-b`) under eps-DP on three random workload "
            "families. Each figure below is a registered `dpopt reproduce` experiment: it runs as a sweep, draws "
            "the figure, and prints our table, the paper's stated findings that hold, and those that do not.\n\n"
            "Errors are exact expected errors of the fitted strategies per query (plus the data-dependent bias "
            "of relaxed LRM on the Search Logs histogram when it is available beside the checkout). The paper "
            "averages 20 runs on workloads up to n = 8192; `full` does the same, `medium` runs the `dpopt "
            "reproduce` default scale, `small` a few points of three figures.\n\n"
            "**The committed copy ran every figure at the paper's sizes** (m = 256, n = 1024; "
            "gamma = 1e-4 ... 10; r = 0.8 ... 3.6 rank(W); n = 128 ... 4096; m = 64 ... 1024; s = 0.1 ... 1.0 "
            "min(m, n); eps = 1, 0.1, 0.01 in Figs. 2 and 3) **with one random workload per point instead of the "
            "paper's 20**, MM (Appendix B) up to n = 256 only (its n x n spectral projected gradient takes hours "
            "beyond), and without n = 8192: the Search Logs vector here has 4096 cells "
            "(`benchmarks/results/lrm_paper_scale.md` runs n = 8192 without the data term, `dpopt reproduce "
            "--no-data`). Settings: "
            "`DPOPT_NB_SCALE=full DPOPT_NB_REPETITIONS=1 DPOPT_NB_MAX_CELLS=mm-appendix-b=256`, reading the "
            "per-task results of `dpopt reproduce lrm-figK --full --repetitions 1 --max-cells mm-appendix-b=256 "
            "--cache DIR` through "
            "`DPOPT_NB_CACHE=DIR`. Each paper-size point is one draw, not an average; "
            "`benchmarks/results/lrm_paper_scale.md` discusses the same runs with their tables."
        ),
        new_code_cell(SETUP),
        new_code_cell(_runner(["lrm-fig2", "lrm-fig6", "lrm-fig9"], overrides=True)),
        *_figure_cells(figs),
        new_markdown_cell(
            "## Reading the results\n\n"
            "The printed lists above separate the paper's claims we reproduce from those we do not. Where a "
            "mechanism could not run (a solver that stalled, a strategy that did not support W), the row says "
            "so instead of showing a number."
        ),
    ]


def om_experiments() -> list:
    figs = [
        ("om-fig1", "Average squared error against eps on W_0.2, W_0.4, W_0.8 (m = 200, n = 1000). The paper: OM "
         "best everywhere, every error falls with eps, MM worst."),
        ("om-fig2", "Error against the number of queries m (n = 1000). The paper: OM best at every m and "
         "insensitive to m."),
        ("om-fig3", "Error against the domain size n (m = 200). The paper: OM best, MM worst."),
        ("om-fig4", "Fit CPU time against m for OM, MM and LRM (CPU seconds: the wall time of a shared machine "
         "varies with its load). The paper: OM is the fastest."),
        ("om-fig5", "Fit CPU time against n. The paper: OM ~300 s vs LRM ~2000 s at n = 1000 on its machine."),
    ]
    return [
        new_markdown_cell(
            "# The Orthogonal Mechanism's experiments (seed 001, Section 5)\n\n"
            "Huang et al. build W~ from disjoint-domain queries (Algorithms 1-3) so that its sensitivity is 1 "
            "and W = B W~ exactly, then compare with LM, MM and LRM on tau-sparse random workloads W_tau (each "
            "entry non-zero with probability tau, value uniform). Figures 1-3 are accuracy, 4-5 time. Times here "
            "are this machine's with one BLAS thread; compare their ratios, not their values.\n\n"
            "**The committed copy ran at the paper's sizes** (m = 200, n = 1000; m = 50 ... 300; n = 500 ... "
            "2500; the eight eps of Fig. 1) **with one random W_tau per point instead of the paper's 20** "
            "(`DPOPT_NB_SCALE=full DPOPT_NB_REPETITIONS=1`, reading the per-task results of `dpopt reproduce "
            "om-figK --full --repetitions 1 --cache DIR` through `DPOPT_NB_CACHE=DIR`). Each point is therefore "
            "one draw, not an average. Fig. 1 fits each mechanism once per tau and evaluates that strategy "
            "at every eps, since selection does not depend on eps."
        ),
        new_code_cell(SETUP),
        new_code_cell(_runner(["om-fig2", "om-fig4"], overrides=True)),
        *_figure_cells(figs),
        new_markdown_cell(
            "## Reading the results\n\n"
            "Each figure's report separates the paper's claims we reproduce from those we do not. The "
            "committed run is discussed point by point in `benchmarks/results/om_paper_scale.md`, with its "
            "tables. At one draw per point the picture can change from draw to draw where two mechanisms are "
            "close."
        ),
    ]


def svd_bound_table2() -> list:
    return [
        new_markdown_cell(
            "# The SVD bound and Li and Miklau's Table 2 (seed 004)\n\n"
            "For any strategy A that answers W, the (eps, delta) matrix mechanism's total error is at least "
            "P(eps, delta) * SVDB(W), with SVDB(W) = (1/n)(lambda_1 + ... + lambda_n)^2 over W's singular values "
            "(Theorem 4.2). It depends on W only through W^T W, so it is cheap even for workloads with "
            "millions of rows (AllRange(2048)) or 2^1024 rows (AllPredicate(1024))."
        ),
        new_code_cell(SETUP),
        new_markdown_cell(
            "## How tight is it on ranges?\n\n"
            "Ratio of each baseline's error to the bound as n grows, and the convex optimum (seed 002) where "
            "it is cheap to compute."
        ),
        new_code_cell(
            "from dpopt.experiments import run_sweep, SweepConfig\n\n"
            "ns = [8, 16, 32] if SMALL else [16, 32, 64, 128, 256, 512]\n"
            "cfg = SweepConfig.from_mapping({\n"
            "    'workloads': ['allrange:{n}', 'prefix:{n}'], 'sizes': {'n': ns},\n"
            "    'mechanisms': ['identity', 'hierarchical', 'wavelet', 'eigen', 'mm-optimal'],\n"
            "    'epsilon': [1.0], 'delta': [1e-6],\n"
            "})\n"
            "ratios = run_sweep(cfg, max_workers=WORKERS, progress=False)\n"
            "fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))\n"
            "for ax, (template, g) in zip(axes, ratios.groupby('template')):\n"
            "    for mech, gm in g.groupby('mechanism'):\n"
            "        ax.plot(gm['cells'], gm['ratio_to_bound'], 'o-', label=mech)\n"
            "    ax.set(xscale='log', yscale='log', xlabel='n', ylabel='error / (P * SVDB)', title=template)\n"
            "    ax.legend(fontsize=8)\n"
            "plt.tight_layout()\n"
            "plt.show()"
        ),
        new_markdown_cell(
            "## Table 2\n\n"
            "Four workloads, their SVD bounds and the ratios of four strategies' errors to P * SVDB. "
            "`dpopt reproduce li-miklau-table2` runs it and prints every cell beside the printed one. At small "
            "scale only the AllPredicate row runs (the others need minutes)."
        ),
        new_code_cell(
            "from dpopt.reproduce import TABLE2_ROWS, make_table2, reproduce\n\n"
            "rows = ['ALLPREDICATE(1024)'] if SMALL else list(TABLE2_ROWS)\n"
            "OUT = Path(tempfile.mkdtemp(prefix='dpopt-nb-'))\n"
            "t2 = reproduce(make_table2(rows), out=OUT, max_workers=WORKERS, progress=False)"
        ),
        new_markdown_cell(
            "Where we differ from the printed table: AllPredicate(1024)'s bound is 4.885e310 (the table's "
            "4.885e156 keeps the mantissa but not the exponent; the closed-form Gram 2^(n-2) (I + 1 1^T) of "
            "Corollary 5.4 gives ours), and its hierarchical and wavelet columns look swapped. The binary "
            "hierarchical strategy on AllRange(2048) gives 1.773 where the table prints 1.776. The eigen column "
            "is the completed eigen design (each cell's unused sensitivity spent, X + diag(1 - diag X), dpopt's "
            "default): it gives the printed 1.028 and 1.107, where the converged eigen design alone gives 1.061 "
            "and 1.190."
        ),
        new_code_cell("display(Image(filename=str(t2.files['png'])))"),
    ]


def solver_crossval() -> list:
    return [
        new_markdown_cell(
            "# Solver cross-validation: conic models against hand-written solvers\n\n"
            "Every optimisation in dpopt is stated once as a CVXPY model (`formulations/`) and, where conic "
            "solvers do not scale, solved again by a hand-written first- or second-order method "
            "(`dpopt/solvers/`). `dpopt crossval` solves the same instances both ways and scores both answers "
            "with one independent function of the returned strategy (for the matrix mechanism "
            "max(diag X) * trace(W^T W X^+), for LRM ||B||_F^2 max_j ||L_j||_1^2). Convex pairs must agree to "
            "1e-4 relative; LRM, being non-convex, may not be more than 1% worse than its reference."
        ),
        new_code_cell(SETUP),
        new_code_cell(
            "from dpopt.crossval import format_crossval, run_crossval\n\n"
            "quick = run_crossval(quick=True, pairs=['convex_dp', 'eigen_design', 'appendix_b'] if SMALL else None)\n"
            "print(format_crossval(quick))"
        ),
        new_markdown_cell(
            "## Accuracy and time as n grows\n\n"
            "All range queries with growing n. The conic solvers work on an (n + k) x (n + k) semidefinite "
            "matrix; the hand-written Newton-CG and the eigen-design solver work on n x n matrices and vectors. "
            "Beyond n = 48 the conic solvers need minutes and gigabytes on these models (Clarabel: 3.6 GB and "
            "230 s at n = 64; SCS on the Appendix B model: over 4 minutes), so the comparison stops there."
        ),
        new_code_cell(
            "ns = [4, 8, 16] if SMALL else [8, 16, 24, 32, 48]\n"
            "specs = {p: [f'allrange:{n}' for n in ns] for p in ('convex_dp', 'eigen_design', 'appendix_b')}\n"
            "growth = run_crossval(quick=False, pairs=list(specs), specs=specs)\n"
            "growth = growth[growth['verdict'].astype(str) != ''].dropna(subset=['n'])\n"
            "growth[['pair', 'n', 'conic_solver', 'rel_diff', 'hand_seconds', 'ref_seconds', 'verdict']]"
        ),
        new_code_cell(
            "fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))\n"
            "for (pair, solver), g in growth.groupby(['pair', 'conic_solver']):\n"
            "    axes[0].plot(g['n'], g['ref_seconds'], 'o--', label=f'{pair}: {solver}')\n"
            "    axes[1].plot(g['n'], g['rel_diff'].abs().clip(lower=1e-16), 'o-', label=f'{pair} vs {solver}')\n"
            "for pair, g in growth.groupby('pair'):\n"
            "    g = g.drop_duplicates('n')\n"
            "    axes[0].plot(g['n'], g['hand_seconds'], 's-', lw=2, label=f'{pair}: hand-written')\n"
            "axes[0].set(xscale='log', yscale='log', xlabel='n', ylabel='wall seconds', title='time')\n"
            "axes[1].axhline(1e-4, color='r', ls=':', label='tolerance')\n"
            "axes[1].set(xscale='log', yscale='log', xlabel='n', ylabel='|relative difference|', title='agreement')\n"
            "for ax in axes:\n"
            "    ax.legend(fontsize=6)\n"
            "plt.tight_layout()\n"
            "plt.show()"
        ),
        new_markdown_cell(
            "## The non-convex pair\n\n"
            "LRM's Algorithm 1 (augmented Lagrangian with Nesterov steps) against the same algorithm with each "
            "block solved by a conic solver. Both are local methods from the same start; the check is one-sided."
        ),
        new_code_cell(
            "if SMALL:\n"
            "    print('LRM pair: not run at small scale (its conic reference needs tens of seconds)')\n"
            "else:\n"
            "    lrm = run_crossval(quick=False, pairs=['lrm'])\n"
            "    print(format_crossval(lrm))"
        ),
    ]


def streaming() -> list:
    return [
        new_markdown_cell(
            "# Streaming factorizations: continual counting and training with correlated noise\n\n"
            "A stream of n steps, a data vector x (one value per step: a count, or a clipped gradient sum), and a "
            "workload A that is lower triangular: prefix sums here, the running totals (A x)_t = x_1 + ... + x_t "
            "that continual counting and DP-FTRL release. The matrix mechanism factors A = B C with C lower "
            "triangular too, releases C x + z step by step (step t uses only x_1..x_t) and decodes with B, so the "
            "answers carry the noise B z = A C^-1 z. At unit noise (z ~ N(0, I)) the per-step variance is\n\n"
            "    Var_t = sens^2 ||B_t||^2,    mean loss = sens^2 ||B||_F^2 / n,    max loss = max_t Var_t,\n\n"
            "with sens^2 the largest change of ||C x||^2 one user can cause. A user who contributes once "
            "(k = 1 epoch) moves one step: sens^2 = max_j ||C_j||^2. Over k epochs of b = n / k steps a user "
            "contributes at steps r, r + b, ..., r + (k - 1) b, and sens^2 = max_pi max{<X_pi, Gamma> : Gamma PSD, "
            "diag Gamma <= 1} with X = C^T C and X_pi its k x k block on the pattern pi (Choquette-Choo et "
            "al. 2023).\n\n"
            "This notebook fits dpopt's families on prefix sums: the square root C = A^(1/2), the best Toeplitz C, "
            "the best banded C (BandMF), the buffered linear Toeplitz C (BLT, K buffers) and, where this build has "
            "it, the certified optimum over every factorization. Set `DPOPT_NB_SCALE=small` for a seconds-long run."
        ),
        new_code_cell(SETUP),
        new_code_cell(
            "from dpopt.streaming.base import decoder\n"
            "from dpopt.streaming.families import FAMILIES\n"
            "from dpopt.streaming.participation import Participation\n"
            "from dpopt.workloads import Prefix\n\n"
            "n = 64 if SMALL else 1024\n"
            "K_EPOCHS = 4\n"
            "w = n // K_EPOCHS  # bandwidth w = b = n / k: the banded sensitivity is then exact\n"
            "A = Prefix(n)\n"
            "SPECS = {'sqrt': {}, 'toeplitz': {}, f'banded:{w}': {'bandwidth': w}, 'blt:4': {'buffers': 4}}\n"
            "HAVE_OPTIMAL = FAMILIES.available('optimal')\n"
            "if HAVE_OPTIMAL:\n"
            "    SPECS['optimal'] = {}\n"
            "else:\n"
            "    print('the optimal family is not in this build: its rows and curves are left out')\n\n\n"
            "def fit_all(k):\n"
            "    \"\"\"Every family on prefix sums over n steps and k epochs (mean loss).\"\"\"\n"
            "    p = Participation(n, k)\n"
            "    return {spec: FAMILIES[spec.split(':')[0]](A, p, **opts) for spec, opts in SPECS.items()}\n\n\n"
            "def table(fits):\n"
            "    \"\"\"Losses, sensitivity and the ratio to the optimum (with its certified lower bound) per family.\"\"\"\n"
            "    best = fits.get('optimal')\n"
            "    rows = {}\n"
            "    for name, f in fits.items():\n"
            "        rows[name] = {'mean loss': f.mean_loss, 'max loss': f.max_loss, 'sens^2': f.sensitivity,\n"
            "                      'status': f.status, 'fit seconds': round(f.fit_seconds, 3)}\n"
            "        if best is not None:\n"
            "            rows[name]['ratio to optimum'] = f.mean_loss / best.mean_loss\n"
            "            rows[name]['lower bound'] = best.lower_bound\n"
            "    return pd.DataFrame(rows).T\n\n\n"
            "fits1 = fit_all(1)\n"
            "table(fits1)"
        ),
        new_markdown_cell(
            "## One participation\n\n"
            "The square root (Fichtenberger et al. 2023: C = A^(1/2), coefficients binom(2j, j) / 4^j) is closed "
            "form and within a few percent of the best Toeplitz C on the mean loss; BLT with 4 buffers comes very "
            "close to the best Toeplitz C with 8 numbers instead of n; the optimum over every factorization, where "
            "this build has it, is lower still and certifies how far each family is from it. A band of w steps is "
            "the weak family here: with one participation nothing asks C to forget, and a band that does pays at "
            "every later step."
        ),
        new_markdown_cell(
            "## Per-step error profiles\n\n"
            "Var_t = sens^2 ||B_t||^2 against t, B = A C^-1 from each family's C. The square root's variance grows "
            "like log t. The mean-optimised Toeplitz and BLT lower the early and middle steps and let the last ones "
            "rise above the square root's: a lower mean for a higher maximum (compare the two loss columns). The "
            "band's profile bends at t = w, where a step's noise is no longer cancelled within the band."
        ),
        new_code_cell(
            "def profile(f):\n"
            "    \"\"\"sens^2 ||B_t||^2 for t = 1..n, B = A C^-1.\"\"\"\n"
            "    B = decoder(A.matrix(), f.C)\n"
            "    return f.sensitivity * np.einsum('ij,ij->i', B, B)\n\n\n"
            "def plot_profiles(ax, fits, title):\n"
            "    t = np.arange(1, n + 1)\n"
            "    for name, f in fits.items():\n"
            "        ax.plot(t, profile(f), lw=2 if name == 'optimal' else 1.2, label=f'{name} (mean {f.mean_loss:.4g})')\n"
            "    ax.set(xlabel='step t', ylabel='per-step variance sens^2 ||B_t||^2', title=title)\n"
            "    ax.legend(fontsize=8)\n\n\n"
            "fig, ax = plt.subplots(figsize=(8, 4.2))\n"
            "plot_profiles(ax, fits1, f'prefix sums, n = {n}, one participation (k = 1)')\n"
            "plt.tight_layout()\n"
            "plt.show()\n"
            "assert all(np.isclose(profile(f).mean(), f.mean_loss, rtol=1e-9) for f in fits1.values())"
        ),
        new_markdown_cell(
            "## Several epochs\n\n"
            "With k = 4 epochs a user's contributions are b = n / k steps apart, and the columns of C at those "
            "steps add up in sens^2 as far as they overlap. The square root keeps a long memory and pays for it: its "
            "blocks X_pi are non-negative, so sens^2 = 1^T X_pi 1 counts every overlap in full. The optimised "
            "families learn to forget within about b steps; a band of w = b steps forgets exactly (X_pi is "
            "diagonal, sens^2 = k for unit columns), and here the best Toeplitz C is such a band (the two rows "
            "agree). BLT cannot forget exactly (its coefficients decay geometrically), and pays a little for it."
        ),
        new_code_cell(
            "fits4 = fit_all(K_EPOCHS)\n"
            "table(fits4)"
        ),
        new_code_cell(
            "fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))\n"
            "plot_profiles(axes[0], fits4, f'n = {n}, k = {K_EPOCHS} epochs')\n"
            "t = np.arange(1, n + 1)\n"
            "ref = fits4.get('optimal', fits4['toeplitz'])\n"
            "for name, f in fits4.items():\n"
            "    axes[1].plot(t, profile(f) / profile(ref), label=name)\n"
            "for epoch in range(1, K_EPOCHS):\n"
            "    axes[1].axvline(epoch * n // K_EPOCHS, color='grey', lw=0.5)\n"
            "axes[1].set(xlabel='step t', ylabel='per-step variance / ' + ('optimal' if HAVE_OPTIMAL else 'toeplitz'),\n"
            "            title='the same, relative (epoch boundaries in grey)')\n"
            "axes[1].legend(fontsize=8)\n"
            "plt.tight_layout()\n"
            "plt.show()"
        ),
    ]


NOTEBOOKS = {
    "quickstart": quickstart,
    "range_queries": range_queries,
    "lrm_experiments": lrm_experiments,
    "om_experiments": om_experiments,
    "svd_bound_table2": svd_bound_table2,
    "solver_crossval": solver_crossval,
    "streaming": streaming,
}


def build(name: str) -> nbformat.NotebookNode:
    """The notebook `name` (without outputs)."""
    nb = new_notebook(cells=NOTEBOOKS[name]())
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb


def execute(nb: nbformat.NotebookNode, timeout: int = 3600) -> nbformat.NotebookNode:
    """Run a notebook in a python3 kernel from the notebooks folder (scale from DPOPT_NB_SCALE)."""
    from nbclient import NotebookClient

    NotebookClient(nb, kernel_name="python3", timeout=timeout, resources={"metadata": {"path": str(HERE)}}).execute()
    return nb


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help=f"notebooks to write (default all: {', '.join(NOTEBOOKS)})")
    parser.add_argument("--execute", action="store_true", help="execute after writing (keeps the outputs)")
    args = parser.parse_args(argv)
    names = args.names or list(NOTEBOOKS)
    for name in names:
        if name not in NOTEBOOKS:
            parser.error(f"unknown notebook {name!r}")
        nb = build(name)
        if args.execute:
            print(f"executing {name} at scale {os.environ.get('DPOPT_NB_SCALE', 'full')} ...", file=sys.stderr)
            execute(nb)
        nbformat.write(nb, HERE / f"{name}.ipynb")
    return 0


if __name__ == "__main__":
    sys.exit(main())
