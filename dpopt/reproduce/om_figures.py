"""The Orthogonal Mechanism paper's experiments (seed 001, Section 5, Figs. 1-5)."""

from __future__ import annotations

import pandas as pd

from dpopt.reproduce.claims import best_everywhere, large_x, monotone, ratio_at, worst_everywhere
from dpopt.reproduce.experiment import MM_MAX_CELLS, Claim, Experiment, Point, by_scale
from dpopt.reproduce.summary import figure_summary

OM_TAUS = (0.2, 0.4, 0.8)
OM_EPS = [0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.4, 1.6]
OM_MS = [50, 100, 150, 200, 250, 300]
OM_NS = [500, 1000, 1500, 2000, 2500]
OM_DEFAULT = {"m": 200, "n": 1000}
OM_QUICK = {"m": 40, "n": 200}
OM_SMALL = {"m": 8, "n": 24}
OM_MECHANISMS = ("om", "laplace", "mm-appendix-b", "lrm")


def _om_point(tau: float, x: float, m: int, n: int) -> Point:
    return Point(panel=f"W_{tau:g}", x=x, workload="wtau:{m}x{n}:tau={tau}", sizes={"m": m, "n": n, "tau": tau})


def _om_sizes(scale: str) -> dict[str, int]:
    return {"small": OM_SMALL, "default": OM_QUICK, "full": OM_DEFAULT}[scale]


def om_eps_points(scale: str) -> list[Point]:
    d = _om_sizes(scale)
    return [_om_point(t, 0, d["m"], d["n"]) for t in OM_TAUS]


def om_vary_m(scale: str) -> list[Point]:
    n = _om_sizes(scale)["n"]
    ms = by_scale(scale, [4, 8], [10, 20, 40, 60], OM_MS)
    return [_om_point(t, m, m, n) for t in OM_TAUS for m in ms]


def om_vary_n(scale: str) -> list[Point]:
    m = _om_sizes(scale)["m"]
    ns = by_scale(scale, [12, 24], [100, 200, 300, 400], OM_NS)
    return [_om_point(t, n, m, n) for t in OM_TAUS for n in ns]


def _om_reps(scale: str) -> int:
    return 20 if scale == "full" else 1


def _eps_as_x(exp: Experiment) -> Experiment:
    """Fig. 1 varies eps: the summary's x is eps (each point is run at every eps)."""
    base = exp.summarise

    def summarise(df: pd.DataFrame) -> pd.DataFrame:
        d = df.copy()
        d["x"] = d["epsilon"]
        d["epsilon"] = 0.0
        return base(d) if base else figure_summary(d, exp.metric)

    exp.summarise = summarise
    return exp


def om_experiments() -> list[Experiment]:
    common = dict(source="seed 001, Section 5", repetitions=_om_reps, logx=False, max_cells=MM_MAX_CELLS)
    return [
        _eps_as_x(Experiment(
            name="om-fig1", title="Accuracy vs eps on W_tau", points=om_eps_points, mechanisms=OM_MECHANISMS,
            epsilon=lambda scale: by_scale(scale, [0.4, 1.6], [0.2, 0.8, 1.6], OM_EPS), xlabel="eps", **common,
            claims=[
                Claim("OM has the smallest error for every tau and eps", best_everywhere("om")),
                Claim("every mechanism's error falls as eps grows", lambda s: _all_monotone(s, False)),
                Claim("MM has the largest error", worst_everywhere("mm-appendix-b")),
            ],
        )),
        Experiment(
            name="om-fig2", title="Accuracy vs m on W_tau", points=om_vary_m, mechanisms=OM_MECHANISMS,
            epsilon=lambda scale: [1.0], xlabel="m", **common,
            claims=[
                Claim("OM has the smallest error at every m", best_everywhere("om")),
                Claim("errors grow with m (LM)", monotone("laplace", increasing=True)),
            ],
        ),
        Experiment(
            name="om-fig3", title="Accuracy vs n on W_tau", points=om_vary_n, mechanisms=OM_MECHANISMS,
            epsilon=lambda scale: [1.0], xlabel="n", **common,
            claims=[
                Claim("OM has the smallest error at every n", best_everywhere("om")),
                Claim("MM has the largest error", worst_everywhere("mm-appendix-b")),
            ],
        ),
        Experiment(
            name="om-fig4", title="Execution time vs m on W_tau", points=om_vary_m,
            mechanisms=("om", "mm-appendix-b", "lrm"), epsilon=lambda scale: [1.0], xlabel="m",
            metric="fit_cpu_seconds", ylabel="fit CPU time (s), one BLAS thread", **common,
            claims=[Claim("OM is the fastest at every m", best_everywhere("om"))],
        ),
        Experiment(
            name="om-fig5", title="Execution time vs n on W_tau", points=om_vary_n,
            mechanisms=("om", "mm-appendix-b", "lrm"), epsilon=lambda scale: [1.0], xlabel="n",
            metric="fit_cpu_seconds", ylabel="fit CPU time (s), one BLAS thread", **common,
            claims=[
                Claim("OM is faster than LRM at every n", best_everywhere("om")),
                Claim("LRM is slower than OM at the largest n (at n = 1000: LRM ~2000 s vs OM ~300 s, ratio ~6.7)",
                      ratio_at("lrm", "om", lambda t: t[large_x(t)], 1.0)),
            ],
        ),
    ]


def _all_monotone(summary: pd.DataFrame, increasing: bool) -> tuple[bool, str]:
    msgs, ok = [], True
    for mech in sorted(summary["mechanism"].unique()):
        good, msg = monotone(mech, increasing)(summary)
        ok &= good
        if not good:
            msgs.append(msg)
    return ok, "; ".join(msgs) if msgs else "all monotone"

