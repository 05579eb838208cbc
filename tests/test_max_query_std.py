"""compare's max_query_std through the strategy's structure on every row (Kronecker, marginals,
laplace), and gram-npy workloads with their query count (RMSE) or a row saying why a number is missing."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from dpopt.cli import main
from dpopt.compare import max_query_std
from dpopt.mechanisms import make_mechanism
from dpopt.privacy import Privacy
from dpopt.specs import parse_workload
from dpopt.workloads import AllRange, Identity, Prefix, Total, WidthK, WRange

EPS = np.finfo(float).eps
APPROX = Privacy(1.0, 1e-6)


def compare_rows(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, dict]:
    assert main(["compare", *argv, "-f", "json"]) == 0
    return {r["mechanism"]: r for r in json.loads(capsys.readouterr().out)}


@pytest.mark.parametrize("workload", [Identity(7), Total(7), Prefix(9), AllRange(10), WidthK(12, 4),
                                      WRange(15, 11, seed=1)], ids=lambda w: w.name)
def test_range_families_quadratic_forms_match_their_rows(workload) -> None:
    rng = np.random.default_rng(0)
    n = workload.n
    M = rng.standard_normal((n, n))
    M = M + M.T
    W = workload.matrix()
    direct = np.einsum("ij,jk,ik->i", W, M, W)
    # 2-D prefix sums of n^2 terms of size <= max|M| are each off by at most n^2 eps max|M|; a query combines four
    assert workload.range_bounds() is not None
    np.testing.assert_allclose(workload.row_quadratic_forms(M), direct, rtol=0,
                               atol=8 * n**2 * EPS * np.abs(M).max())


def _dense_max_std(mech) -> tuple[float, float]:
    """(sqrt(max_i Var(q_i)), a tolerance) from dense matrices, independent of the library's structured paths:
    Laplace answers each query directly (variance P sens(W)^2); the others by least squares, W A^+ y."""
    W = mech.workload_.matrix()
    norm = mech.privacy_.norm
    if mech.short_name == "laplace":
        sens = np.abs(W).sum(axis=0).max() if norm == 1 else np.sqrt((W**2).sum(axis=0)).max()
        return math.sqrt(mech.privacy_.variance_factor) * sens, 16 * EPS
    A = mech.strategy_.to_dense().A
    A = np.asarray(A.todense() if hasattr(A, "todense") else A)
    sens = np.abs(A).sum(axis=0).max() if norm == 1 else np.sqrt((A**2).sum(axis=0)).max()
    B = W @ np.linalg.pinv(A)
    var = mech.privacy_.variance_factor * sens**2 * np.einsum("ij,ij->i", B, B)
    # pinv(A) is accurate to about n cond(A) eps relative; the structured path to the same order
    return math.sqrt(var.max()), 10 * A.shape[1] * np.linalg.cond(A) * EPS


@pytest.mark.parametrize("privacy", [Privacy(1.0), APPROX], ids=["eps", "eps-delta"])
@pytest.mark.parametrize("name", ["laplace", "identity", "hierarchical", "wavelet", "eigen", "mm-optimal", "hdmm"])
def test_kron_max_query_std_matches_the_dense_computation(name: str, privacy: Privacy) -> None:
    W = parse_workload("kron:allrange:16,allrange:8")
    mech = make_mechanism(name).fit(W, privacy)
    value, note = max_query_std(mech)
    expected, rtol = _dense_max_std(mech)
    assert note is None
    assert value == pytest.approx(expected, rel=rtol)


def test_every_row_on_a_large_kronecker_workload_reports_max_query_std(capsys) -> None:
    # 8256^2 = 6.8e7 queries: never listed; each factor's largest variance multiplies
    rows = compare_rows(capsys, "-w", "kron:allrange:128,allrange:128", "-e", "1", "-d", "1e-6",
                        "-m", "laplace,identity,wavelet,mm-optimal")
    assert set(rows) == {"laplace", "identity", "wavelet", "mm-optimal"}
    for r in rows.values():
        assert r["max_query_std"] is not None and r["max_query_std"] >= r["rmse"] > 0, r
    mech = make_mechanism("mm-optimal").fit(parse_workload("kron:allrange:128,allrange:128"), APPROX)
    unit, sens, tol = 1.0, 1.0, 0.0
    for factor in mech.strategy_.A.factors:  # each factor alone, dense
        A = np.asarray(factor)
        B = AllRange(128).matrix() @ np.linalg.pinv(A)
        unit *= np.einsum("ij,ij->i", B, B).max()
        sens *= np.sqrt((A**2).sum(axis=0)).max()
        tol += 10 * 128 * np.linalg.cond(A) * EPS
    assert rows["mm-optimal"]["max_query_std"] == pytest.approx(math.sqrt(APPROX.variance_factor * sens**2 * unit),
                                                                rel=tol)


def test_marginals_report_max_query_std(capsys) -> None:
    rows = compare_rows(capsys, "-w", "marginals:16x16x16x16:2", "-e", "1", "-d", "1e-6", "-m", "mm-optimal,hdmm")
    mech = make_mechanism("mm-optimal").fit(parse_workload("marginals:16x16x16x16:2"), APPROX)
    listed = math.sqrt(float(np.max(mech.expected_error_.per_query)))  # the 1536 variances, listed
    for r in rows.values():
        assert r["max_query_std"] == pytest.approx(listed, rel=1e-12)  # the same closed form, one maximum
    small = make_mechanism("mm-optimal").fit(parse_workload("marginals:4x4x4x4:2"), APPROX)
    value, note = max_query_std(small)
    expected, rtol = _dense_max_std(small)
    assert note is None and value == pytest.approx(expected, rel=rtol)


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, Path]:
    W = np.random.default_rng(0).standard_normal((50, 40))
    np.save(tmp_path / "w.npy", W)
    np.save(tmp_path / "g.npy", W.T @ W)
    return tmp_path / "w.npy", tmp_path / "g.npy"


def test_gram_npy_with_its_query_count_has_the_rmse_of_its_rows(capsys, saved) -> None:
    w, g = saved
    rows = compare_rows(capsys, "-w", f"npy:{w}", "-e", "1", "-d", "1e-6", "-m", "identity,wavelet")
    gram = compare_rows(capsys, "-w", f"gram-npy:{g}:m=50", "-e", "1", "-d", "1e-6", "-m", "identity,wavelet")
    for name, r in rows.items():
        # the same trace of W^T W, formed once from the rows and once from the saved Gram: round-off apart
        assert gram[name]["rmse"] == pytest.approx(r["rmse"], rel=1e-12)
        assert gram[name]["max_query_std"] is None and "known only through its Gram" in gram[name]["note"]


def test_gram_npy_without_its_query_count_reports_no_rmse(capsys, saved) -> None:
    _, g = saved
    assert main(["compare", "-w", f"gram-npy:{g}", "-e", "1", "-m", "identity"]) == 0
    out = capsys.readouterr().out
    assert "an unknown number of queries" in out.splitlines()[0]
    rows = compare_rows(capsys, "-w", f"gram-npy:{g}", "-e", "1", "-m", "identity")
    assert rows["identity"]["rmse"] is None and rows["identity"]["expected_total_error"] > 0
