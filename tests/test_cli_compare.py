"""`dpopt compare`: records match the library's numbers, formats, and one-line errors on bad input."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from dpopt.cli import main
from dpopt.workloads import AllRange

REQUIRED = {"mechanism", "expected_total_error", "rmse", "bound", "ratio_to_bound", "fit_seconds", "solver", "status"}


def run(capsys, *args):
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def _haar(n: int) -> np.ndarray:
    """Unnormalised Haar strategy for n a power of 2: the total, then +1 / -1 on the halves of every dyadic node."""
    rows = [np.ones(n)]
    size = n
    while size > 1:
        for start in range(0, n, size):
            r = np.zeros(n)
            r[start:start + size // 2] = 1.0
            r[start + size // 2:start + size] = -1.0
            rows.append(r)
        size //= 2
    return np.array(rows)


def _hb_tree(n: int) -> np.ndarray:
    """Qardaji et al.'s hierarchy for Gaussian noise over n (a power of 2) cells: b minimising Eq. (3) over
    sens2^2 = h, ((b - 1) h^3 - 2 (b + 1) h^2 / 3) / h with b^h >= n, every b-adic interval below the root
    as a 0/1 row (b divides n here; b = n gives the identity)."""
    def height(b: int) -> int:
        return next(h for h in range(1, n + 1) if b**h >= n)

    b = min(range(2, n + 1), key=lambda b: (((b - 1) * height(b) ** 3 - 2 * (b + 1) * height(b) ** 2 / 3)
                                            / height(b), b))
    rows, size = [], n // b
    while size >= 1:
        for start in range(0, n, size):
            r = np.zeros(n)
            r[start:start + size] = 1.0
            rows.append(r)
        size //= b
    return np.array(rows)


def _all_ranges(n: int) -> np.ndarray:
    """Every range [i, j] of n cells as a 0/1 row."""
    return np.array([[1.0 if i <= c <= j else 0.0 for c in range(n)] for i in range(n) for j in range(i, n)])


def _independent_errors(n: int, P: float) -> dict[str, float]:
    """Expected total error of each baseline on all ranges: P sens2(A)^2 ||B||_F^2, B = W A^+ (or I for laplace)."""
    W = _all_ranges(n)
    out = {}
    for name, A in (("identity", np.eye(n)), ("wavelet", _haar(n)), ("hierarchical", _hb_tree(n))):
        sens2 = np.linalg.norm(A, axis=0).max()
        out[name] = P * sens2**2 * np.linalg.norm(W @ np.linalg.pinv(A), "fro") ** 2
    out["laplace"] = P * np.linalg.norm(W, axis=0).max() ** 2 * W.shape[0]  # A = W, B = I_m
    return out


def test_json_records_match_independent_computation(capsys):
    code, out, _ = run(capsys, "compare", "--workload", "allrange:32", "--epsilon", "0.5", "--delta", "1e-6",
                       "--mechanisms", "identity,wavelet,hierarchical,laplace", "--format", "json")
    assert code == 0
    recs = json.loads(out)
    assert {r["mechanism"] for r in recs} == {"identity", "wavelet", "hierarchical", "laplace"}
    P = 2.0 * math.log(2.0 / 1e-6) / 0.5**2  # the classic Gaussian variance factor, written out
    W = _all_ranges(32)
    svdb = P * np.linalg.svd(W, compute_uv=False).sum() ** 2 / 32
    errors = _independent_errors(32, P)
    for r in recs:
        assert REQUIRED <= set(r)
        assert r["expected_total_error"] == pytest.approx(errors[r["mechanism"]], rel=1e-9), r["mechanism"]
        assert r["rmse"] == pytest.approx(math.sqrt(errors[r["mechanism"]] / W.shape[0]), rel=1e-9)
        assert r["bound"] == pytest.approx(svdb, rel=1e-9)
        assert r["ratio_to_bound"] == pytest.approx(errors[r["mechanism"]] / svdb, rel=1e-9)
        assert r["ratio_to_bound"] >= 1.0
    errs = [r["expected_total_error"] for r in recs]
    assert errs == sorted(errs)


def _json_records(capsys, spec: str) -> list[dict]:
    code, out, err = run(capsys, "compare", "-w", spec, "-e", "1", "-f", "json", "-m", "identity,wavelet,hierarchical")
    assert code == 0, err
    return json.loads(out)


NUMERIC = ["strategy_rank", "sensitivity", "expected_total_error", "rmse", "bound", "ratio_to_bound"]


def test_csv_reads_back_to_the_json_records(capsys):
    recs = _json_records(capsys, "prefix:16")
    code, out, err = run(capsys, "compare", "-w", "prefix:16", "-e", "1", "-f", "csv",
                         "-m", "identity,wavelet,hierarchical")
    assert code == 0, err
    df = pd.read_csv(io.StringIO(out))
    assert list(df["mechanism"]) == [r["mechanism"] for r in recs]
    for row, rec in zip(df.to_dict(orient="records"), recs, strict=True):
        for col in NUMERIC:
            assert row[col] == rec[col], col  # full precision: exactly the JSON value
        assert row["solver"] == rec["solver"] and row["status"] == rec["status"]


def _parse_markdown(text: str) -> list[dict[str, str]]:
    lines = [line for line in text.strip().splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True)) for line in lines[2:]]


def _parse_table(text: str) -> list[dict[str, str]]:
    """The aligned table between the streamed row lines and the footer: from its header row to a blank line."""
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.split()[:1] == ["mechanism"])
    header = lines[first].split()
    body = []
    for line in lines[first + 1:]:
        if not line.strip():
            break
        body.append(dict(zip(header, line.split(None, len(header) - 1), strict=True)))
    return body


@pytest.mark.parametrize("fmt, parse, rel", [("markdown", _parse_markdown, 1e-5), ("table", _parse_table, 1e-3)])
def test_text_formats_show_the_json_numbers(capsys, fmt, parse, rel):
    recs = _json_records(capsys, "prefix:16")
    code, out, err = run(capsys, "compare", "-w", "prefix:16", "-e", "1", "-f", fmt, "-m", "identity,wavelet,hierarchical")
    assert code == 0, err
    rows = parse(out)
    assert [r["mechanism"] for r in rows] == [r["mechanism"] for r in recs]
    for row, rec in zip(rows, recs, strict=True):
        for col in NUMERIC:
            assert float(row[col]) == pytest.approx(rec[col], rel=rel), (fmt, col)
        assert row["status"] == rec["status"]


def test_plot(tmp_path, capsys):
    png = tmp_path / "c.png"
    code, _, _ = run(capsys, "compare", "-w", "width:16:4", "-e", "1", "-m", "identity,wavelet", "--plot", str(png))
    assert code == 0 and png.stat().st_size > 1000


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["-w", "nosuch:3", "-e", "1"], "unknown workload family"),
        (["-w", "allrange:0", "-e", "1"], "positive"),
        (["-w", "allrange:8", "-e", "-1"], "epsilon"),
        (["-w", "allrange:8", "-e", "1", "-d", "1.5"], "delta"),
        (["-w", "allrange:8", "-e", "1", "-m", "bogus"], "unknown mechanism"),
        (["-w", "npy:/no/such/file.npy", "-e", "1"], "not found"),
        (["-w", "wrelated:4x8", "-e", "1"], "needs s="),
    ],
)
def test_bad_input_exits_nonzero_with_one_line(capsys, args, fragment):
    code, _, err = run(capsys, "compare", *args)
    assert code == 2
    assert fragment in err
    assert len(err.strip().splitlines()) == 1


def test_console_script_help():
    res = subprocess.run([sys.executable, "-m", "dpopt.cli", "compare", "--help"], capture_output=True, text=True)
    assert res.returncode == 0 and "allrange:N" in res.stdout


def test_npy_and_gram_specs(tmp_path, capsys):
    import numpy as np

    W = AllRange(8).matrix()
    np.save(tmp_path / "w.npy", W)
    np.save(tmp_path / "g.npy", W.T @ W)
    code, out, _ = run(capsys, "compare", "-w", f"npy:{tmp_path / 'w.npy'}", "-e", "1", "-f", "json", "-m", "wavelet")
    code2, out2, _ = run(capsys, "compare", "-w", f"gram-npy:{tmp_path / 'g.npy'}", "-e", "1", "-f", "json",
                         "-m", "wavelet")
    assert code == code2 == 0
    assert json.loads(out)[0]["expected_total_error"] == pytest.approx(json.loads(out2)[0]["expected_total_error"])


def test_marginals_table_prints_each_skip_once_and_names_only_what_ran(capsys):
    # laplace has no strategy over 65,536 cells of a union; identity measures I per attribute (each 2-way marginal
    # query sums 256 cells: 1,536 queries x 256 x Laplace variance 2 = 786,432); hdmm keeps the workload's marginals
    code, out, err = run(capsys, "compare", "-w", "marginals:16x16x16x16:2", "-e", "1", "-m", "identity,laplace,hdmm")
    assert code == 0, err
    assert out.count("too many for a dense strategy") == 1, out  # one line for the one refusal
    assert out.count("skipped: laplace: ") == 1 and "skipped: identity" not in out, out
    assert "skipped (reasons above): laplace" in out
    identity_row = next(line for line in out.splitlines() if line.strip().startswith("identity "))
    assert "786432" in identity_row and "per factor" in identity_row, identity_row
    hdmm_row = next(line for line in out.splitlines() if line.strip().startswith("hdmm "))
    # hdmm's solver names the strategy it kept by what it measures, not a mechanism that was refused here
    assert "workload marginals measured" in hdmm_row and "laplace" not in hdmm_row and "identity" not in hdmm_row
