"""Low-Rank Mechanism solver on seed 000's WRelated and WRange workloads (Section 6, Table 1).

For n in 64..1024 with m = n / 2 this times `dpopt.solvers.lrm.solve_lrm` (Algorithm 1 with the
Nesterov L-step of Algorithm 2; rank r = ceil(1.2 rank W), Table 1's default) and compares the
expected error of its decomposition with noise on data (identity strategy), noise on queries
(Laplace on W itself) and the SVD lower bound 2 SVDB(W) / eps^2 (seed 004, Def. 4.1; valid for
every Laplace strategy since the L1 sensitivity is at least the L2 one). WRelated uses
s = 0.2 min(m, n). Two relaxations: gamma = 0 (exact W = B L, relative residual <= 1e-6) and
gamma = 0.01 (Table 1's default, an absolute bound on ||W - B L||_F, for n <= 256; the
structural error it allows is data-dependent and not in the error columns).

Errors: total expected squared error at eps = 1 (everything scales as 1 / eps^2), Laplace noise of
variance 2 b^2, b = L1 sensitivity / eps, checked against `dpopt.error.expected_error`. Times: the
median of `--repeats` runs (one workload instance per row; the solver is deterministic given its
seed, so repeats only measure time), BLAS limited to one thread; a configuration whose first run
exceeds `--budget` seconds is not repeated (column runs).

    .venv/bin/python -m benchmarks.bench_lrm [--repeats 3] [--budget 120] [--max-n 1024] [--quick]

writes benchmarks/results/lrm.csv and benchmarks/results/lrm.md.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from dpopt.error import expected_error
from dpopt.privacy import Privacy
from dpopt.solvers.lrm import numerical_rank, solve_lrm
from dpopt.strategy import Strategy
from dpopt.workloads import WRange, WRelated

RESULTS = Path(__file__).resolve().parent / "results"
SIZES_N = (64, 128, 256, 512, 1024)
GAMMAS = (0.0, 0.01)
RELAXED_MAX_N = 256  # gamma = 0.01 is shown for n <= 256 only: there ||W||_F is in the hundreds, so
# the paper's absolute bound is nearly exact and the numbers barely differ from gamma = 0
TIME_LIMIT = 1800.0  # seconds per solver run; a run that hits it is reported as time_limit


def _workload(kind: str, m: int, n: int, seed: int) -> tuple[np.ndarray, int | None]:
    if kind == "WRelated":
        s = max(1, round(0.2 * min(m, n)))
        return WRelated(m, n, s, seed=seed).matrix(), s
    return WRange(m, n, seed=seed).matrix(), None


def _time_solve(W: np.ndarray, gamma: float, repeats: int, budget: float):
    walls, cpus, res = [], [], None
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        res = solve_lrm(W, gamma=gamma, seed=0, time_limit=TIME_LIMIT)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        if walls[0] > budget:
            break
    return float(np.median(walls)), float(np.median(cpus)), len(walls), res


def measure(kind: str, m: int, n: int, gamma: float, repeats: int, budget: float) -> dict:
    """One workload instance: solver time, status and residual, and the four total errors at eps = 1."""
    W, s = _workload(kind, m, n, seed=0)
    wall, cpu, runs, res = _time_solve(W, gamma, repeats, budget)
    B, L = res.x
    eps = 1.0
    lrm_total = 2.0 * res.extra["error_factor"] / eps**2
    # Independent check of Lemma 1 against the library's generic error formula (W = B L within
    # the solver's tolerance for gamma = 0; for gamma > 0 the noise error of answering B L).
    target = W if gamma == 0.0 else B @ L
    generic = expected_error(Strategy(L, B=B, name="lrm"), target, Privacy(eps), rtol=2e-6).total
    if not np.isclose(lrm_total, generic, rtol=1e-9):
        raise RuntimeError(f"Lemma 1 error {lrm_total} differs from the generic formula {generic}")
    sigma = np.linalg.svd(W, compute_uv=False)
    return {
        "workload": kind,
        "m": m,
        "n": n,
        "s": s,
        "gamma": gamma,
        "rank_W": numerical_rank(W),
        "r": res.extra["rank"],
        "status": res.status,
        "outer_it": res.nit,
        "inner_it": res.ninner,
        "runs": runs,
        "wall_s": wall,
        "cpu_s": cpu,
        "residual": res.extra["residual"],
        "rel_residual": res.extra["rel_residual"],
        "max_col_l1": res.extra["max_col_l1"],
        "revived_rows": res.extra["revived_rows"],
        "lrm_total": lrm_total,
        "nod_total": 2.0 * float(np.sum(W * W)) / eps**2,
        "noq_total": 2.0 * m * float(np.abs(W).sum(axis=0).max()) ** 2 / eps**2,
        "lower_total": 2.0 * float(sigma.sum()) ** 2 / n / eps**2,
    }


def run(repeats: int, budget: float, max_n: int, quick: bool) -> pd.DataFrame:
    sizes = [n for n in SIZES_N if n <= max_n]
    if quick:
        sizes = sizes[:2]
    rows = []
    with threadpool_limits(1):
        for gamma in GAMMAS:
            for kind in ("WRelated", "WRange"):
                for n in sizes:
                    if gamma > 0.0 and n > RELAXED_MAX_N:
                        continue
                    rec = measure(kind, n // 2, n, gamma, repeats, budget)
                    rows.append(rec)
                    print(f"{kind} m={n // 2} n={n} gamma={gamma:g}: {rec['status']}, "
                          f"{rec['cpu_s']:.1f} s cpu, lrm/nod={rec['lrm_total'] / rec['nod_total']:.3f}",
                          flush=True)
    table = pd.DataFrame(rows)
    table["lrm_over_nod"] = table["lrm_total"] / table["nod_total"]
    table["lrm_over_noq"] = table["lrm_total"] / table["noq_total"]
    table["lrm_over_lower"] = table["lrm_total"] / table["lower_total"]
    table["lrm_avg"] = table["lrm_total"] / table["m"]
    return table


def _fmt(df: pd.DataFrame, cols: list[str]) -> str:
    out = df[cols].copy()
    for c in cols:
        if out[c].dtype.kind == "f":
            out[c] = out[c].map(lambda v: f"{v:.4g}")
    header = "| " + " | ".join(cols) + " |"
    sep = "|" + "---|" * len(cols)
    body = ["| " + " | ".join(str(v) for v in row) + " |" for row in out.itertuples(index=False)]
    return "\n".join([header, sep, *body])


def write(table: pd.DataFrame, repeats: int, budget: float) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    table.to_csv(RESULTS / "lrm.csv", index=False)
    cols = ["m", "n", "rank_W", "r", "status", "outer_it", "inner_it", "runs", "wall_s", "cpu_s",
            "rel_residual", "max_col_l1", "lrm_avg", "lrm_over_nod", "lrm_over_noq", "lrm_over_lower"]
    lines = [
        "# Low-Rank Mechanism solver on WRelated and WRange (seed 000, Section 6)",
        "",
        f"One instance per row (seed 0), m = n / 2; times: median of up to {repeats} runs (fewer when the",
        f"first run exceeds {budget:g} s: column runs), BLAS 1 thread, machine shared with other jobs",
        "(cpu_s is the steadier figure). Errors: total expected squared error at eps = 1, Laplace",
        "noise of variance 2 b^2; lrm_avg = total / m. Ratios < 1 in lrm_over_nod / lrm_over_noq mean",
        "LRM beats noise on data / noise on queries; lrm_over_lower is LRM over 2 SVDB(W) / eps^2.",
        "gamma = 0 requires ||W - B L||_F <= 1e-6 ||W||_F; gamma = 0.01 (Table 1's default) bounds",
        "||W - B L||_F by 0.01 (run for n <= 256 only: with ||W||_F in the hundreds it is nearly",
        "exact) and its error columns are the noise part only (Theorem 3).",
        "",
    ]
    for gamma in GAMMAS:
        for kind in ("WRelated", "WRange"):
            part = table[(table.workload == kind) & (table.gamma == gamma)]
            if len(part):
                extra = ", s = 0.2 min(m, n)" if kind == "WRelated" else ""
                lines += [f"## {kind}{extra}, gamma = {gamma:g}", "", _fmt(part, cols), ""]
    (RESULTS / "lrm.md").write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per configuration")
    parser.add_argument("--budget", type=float, default=120.0,
                        help="seconds; a configuration whose first run is longer is not repeated")
    parser.add_argument("--max-n", type=int, default=1024, help="largest domain size n")
    parser.add_argument("--quick", action="store_true", help="only the two smallest n")
    args = parser.parse_args()
    if args.repeats < 1 or args.budget <= 0 or args.max_n < SIZES_N[0]:
        parser.error(f"--repeats >= 1, --budget > 0 and --max-n >= {SIZES_N[0]} are required")
    table = run(args.repeats, args.budget, args.max_n, args.quick)
    write(table, args.repeats, args.budget)
    print((RESULTS / "lrm.md").read_text())


if __name__ == "__main__":
    main()
