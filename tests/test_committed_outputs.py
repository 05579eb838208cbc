"""Committed outputs agree with the code at their committed sizes (quality numbers, never timings).

Every committed table and executed notebook has a command that regenerates it (benchmarks/committed.py,
`make outputs`); the checks below recompute committed errors and ratios to the bound and fail when the
code no longer gives them. Tolerances: a closed-form strategy's ratio is a few thousand rounded
operations (REL_EXACT = 1e-9 is far above their rounding); a certified solver stops anywhere within its
relative gap tol = 1e-8 of the optimum, so two runs differ by at most SOLVER_REL; a printed number is
exact to half a unit of its last printed digit.
"""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from benchmarks.committed import OUTPUTS
from dpopt.compare import compare
from dpopt.mechanisms import make_mechanism
from dpopt.privacy import Privacy
from dpopt.workloads import AllRange

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
REL_EXACT = 1e-9
SOLVER_REL = 2e-8  # two iterates each within the certified relative gap 1e-8 of the optimum
ITERATIVE = {"eigen", "mm-optimal"}
# The papers' figures at full size (days of CPU, `dpopt reproduce --full`); their headers give the commands.
NOT_REGENERATED = ("benchmarks/results/lrm_paper_scale", "benchmarks/results/om_paper_scale")


def _rel(mechanism: str) -> float:
    return SOLVER_REL if mechanism in ITERATIVE else REL_EXACT


def test_every_committed_output_has_a_regenerating_command() -> None:
    try:
        listed = subprocess.run(["git", "ls-files", "benchmarks/results", "notebooks"], cwd=ROOT, check=True,
                                capture_output=True, text=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the committed files cannot be listed")
    committed = [f for f in listed if f.endswith((".md", ".csv", ".ipynb"))]
    covered = {f for o in OUTPUTS for f in o.files}
    missing = [f for f in committed if f not in covered and not f.startswith(NOT_REGENERATED)]
    assert not missing, f"committed outputs without a command in benchmarks/committed.py: {missing}"
    assert all((ROOT / f).exists() for f in covered), "an entry names a file that is not there"


def _ranges_table() -> pd.DataFrame:
    return pd.read_csv(RESULTS / "mechanisms_ranges.csv")


@pytest.mark.parametrize("row", _ranges_table().to_dict("records"),
                         ids=lambda r: f"{r['mechanism']}-{r['n']}")
def test_mechanisms_ranges_table_matches_the_code(row: dict) -> None:
    # the table replicates seed 004's Table 2, whose hierarchy is the binary tree with its root (branching 2)
    params = {"branching": 2} if row["mechanism"] == "hierarchical" else {}
    rec = make_mechanism(row["mechanism"], **params).fit(AllRange(int(row["n"])),
                                                         Privacy(row["epsilon"], row["delta"])).record()
    assert rec["ratio_to_bound"] == pytest.approx(row["ratio_to_bound"], rel=_rel(row["mechanism"]) + REL_EXACT)


def test_mechanisms_summary_prints_the_ranges_table() -> None:
    # the markdown summary's ratio table is the CSV's numbers at 4 significant digits
    df = _ranges_table()
    md = (RESULTS / "mechanisms_summary.md").read_text()
    section = md.split("on AllRange (seed 004, Table 2)", 1)[1]
    lines = [ln for ln in section.splitlines() if ln.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    for ln in lines[2:]:
        cells = dict(zip(head, (c.strip() for c in ln.strip("|").split("|")), strict=True))
        for mech in ("eigen", "hierarchical", "identity", "mm-optimal", "wavelet"):
            value = df[(df["n"] == int(cells["n"])) & (df["mechanism"] == mech)]["ratio_to_bound"].iloc[0]
            assert cells[mech] == format(float(value), ".4g"), (cells["n"], mech)


def _notebook_output(name: str, marker: str) -> str:
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code" and marker in cell.source:
            return "".join(o.get("text", "") or o.get("data", {}).get("text/plain", "")
                           for o in cell.get("outputs", []))
    raise AssertionError(f"no cell with {marker!r} in {name}.ipynb")


def test_quickstart_compare_table_matches_the_code() -> None:
    text = _notebook_output("quickstart", "table = compare(W, privacy, mechanisms)")
    block = text.split("\n\n")[0].splitlines()  # pandas wraps wide tables into blocks; the first has the ratio
    col = block[0].split().index("ratio_to_bound") + 1  # rows start with the index
    rows = [ln.split() for ln in block[1:] if re.match(r"^\d+\s", ln)]
    assert _notebook_output("quickstart", "SCALE = os.environ").strip().endswith("full")  # n = 256
    printed = {r[1]: float(r[col]) for r in rows}
    assert len(printed) >= 5
    df = compare(AllRange(256), Privacy(1.0, 1e-6), sorted(printed), time_limit=None).set_index("mechanism")
    for mech, ratio in printed.items():
        got = float(df.loc[mech, "ratio_to_bound"])
        # printed to 6 decimals: half a unit is 5e-7, plus the solver's stopping tolerance
        assert math.isclose(got, ratio, rel_tol=_rel(mech), abs_tol=5e-7 + 1e-12), (mech, got, ratio)


SPEC = {"all-range": "allrange:{n}", "allrange": "allrange:{n}", "prefix": "prefix:{n}", "width32": "width:{n}:32"}


def _gram(workload: str, n: int) -> np.ndarray:
    from dpopt.specs import parse_workload

    return parse_workload(SPEC[workload].format(n=n)).gram()


def _cheap(df: pd.DataFrame, n_max: int = 256) -> list[dict]:
    return df[df["n"] <= n_max].to_dict("records")


@pytest.mark.parametrize("row", _cheap(pd.read_csv(RESULTS / "convex_dp.csv").query("method == 'dual'")),
                         ids=lambda r: f"{r['workload']}-{r['n']}")
def test_convex_dp_table_matches_the_code(row: dict) -> None:
    # the committed rmse = sqrt(fun / m) and a new solve at the benchmark's tol (1e-6) are both within their
    # certified relative gaps of the same optimum: they differ by at most the sum of the gaps (halved by sqrt)
    from dpopt.solvers.convex_dp import solve_convex_dp

    res = solve_convex_dp(_gram(row["workload"], int(row["n"])), tol=1e-6)
    rmse = math.sqrt(res.fun / row["m"])
    assert rmse == pytest.approx(row["rmse"], rel=(row["gap"] + res.gap) / 2 + REL_EXACT)


@pytest.mark.parametrize("row", _cheap(pd.read_csv(RESULTS / "eigen_design.csv").query("method == 'newton-cg'")),
                         ids=lambda r: f"{r['workload']}-{r['n']}")
def test_eigen_design_table_matches_the_code(row: dict) -> None:
    # the design objective at the committed tol 1e-8, without completion (the table's `complete=False`):
    # both values lie within their certified gaps of the optimum
    from dpopt.solvers.eigen_design import solve_eigen_design

    res = solve_eigen_design(_gram(row["workload"], int(row["n"])), tol=1e-8, complete=False)
    assert res.fun == pytest.approx(row["fun"], rel=abs(row["gap"]) + abs(res.gap) + REL_EXACT)


def _stream_family_rows() -> list[dict]:
    path = RESULTS / "stream_families.csv"
    if not path.exists():
        return []
    df = pd.read_csv(path)
    return df[df["table"] == "family"].to_dict("records")


@pytest.mark.parametrize("row", _stream_family_rows(), ids=lambda r: f"{r['family']}-{r['n']}-{r['epochs']}")
def test_stream_families_table_matches_the_code(row: dict) -> None:
    """The square root is closed form (REL_EXACT); an optimised family must still reach its committed loss: its
    L-BFGS run stops at a relative decrease of 1e-12 of the log loss, so 1e-6 above the committed value fails."""
    from dpopt.streaming.families import FAMILIES
    from dpopt.streaming.participation import Participation
    from dpopt.workloads import Prefix

    name, _, arg = str(row["family"]).partition(":")
    if name == "optimal":
        pytest.skip("the optimal family's rows are checked by its own tests")
    opts = {"bandwidth": int(arg)} if name == "banded" else ({"buffers": int(arg)} if name == "blt" else {})
    n, k = int(row["n"]), int(row["epochs"])
    f = FAMILIES[name](Prefix(n), Participation(n, k), **opts)
    if name == "sqrt":
        assert f.mean_loss == pytest.approx(row["mean_loss"], rel=REL_EXACT)
    else:
        assert f.mean_loss <= row["mean_loss"] * (1 + 1e-6)


STREAMING_OPTIMAL = RESULTS / "streaming_optimal.csv"


def test_streaming_optimal_table_is_certified() -> None:
    """Every converged row of the certified-optimum table: its lower bound is below its loss, its gap
    is the two's relative difference (the CSV keeps full precision) and at most the tol it was asked for."""
    df = pd.read_csv(STREAMING_OPTIMAL)
    done = df[df["status"] == "converged"]
    assert len(done) > 0
    assert (done["lower"] <= done["loss"]).all()
    assert (done["gap"] <= done["tol"]).all()
    np.testing.assert_allclose((done["loss"] - done["lower"]) / done["loss"], done["gap"], rtol=1e-9, atol=1e-15)


@pytest.mark.slow
def test_streaming_optimal_smallest_rows_match_the_code() -> None:
    """The committed rows at n = 1024 (mean loss, k > 1) solved again: each run's certified lower bound is below the
    other's loss (both bracket the one optimum), so the code still reaches the committed optimum."""
    from dpopt.solvers.participation_dual import solve_participation
    from dpopt.workloads import Prefix

    df = pd.read_csv(STREAMING_OPTIMAL)
    rows = df[(df["objective"] == "mean") & (df["n"] == 1024) & (df["epochs"] > 1) & (df["status"] == "converged")]
    assert len(rows) > 0
    for row in rows.to_dict("records"):
        n, k = int(row["n"]), int(row["epochs"])
        res = solve_participation(Prefix(n).gram(), np.arange(n).reshape(k, n // k).T, tol=float(row["tol"]))
        assert res.dual_bound / n <= row["loss"] and row["lower"] <= res.fun / n
