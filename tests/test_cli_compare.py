"""`dpopt compare`: records match the library's numbers, formats, and one-line errors on bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dpopt.baselines import wavelet_strategy
from dpopt.bounds import svd_bound
from dpopt.cli import main
from dpopt.error import expected_error
from dpopt.privacy import Privacy
from dpopt.workloads import AllRange

REQUIRED = {"mechanism", "expected_total_error", "rmse", "bound", "ratio_to_bound", "fit_seconds", "solver", "status"}


def run(capsys, *args):
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_records_match_library(capsys):
    code, out, _ = run(capsys, "compare", "--workload", "allrange:32", "--epsilon", "0.5", "--delta", "1e-6",
                       "--mechanisms", "identity,wavelet,hierarchical,laplace", "--format", "json")
    assert code == 0
    recs = json.loads(out)
    assert {r["mechanism"] for r in recs} == {"identity", "wavelet", "hierarchical", "laplace"}
    for r in recs:
        assert REQUIRED <= set(r)
        assert r["ratio_to_bound"] == pytest.approx(r["expected_total_error"] / r["bound"])
        assert r["ratio_to_bound"] >= 1.0
    p = Privacy(0.5, 1e-6)
    w = AllRange(32)
    wav = next(r for r in recs if r["mechanism"] == "wavelet")
    assert wav["expected_total_error"] == pytest.approx(expected_error(wavelet_strategy(32), w, p).total)
    assert wav["bound"] == pytest.approx(p.variance_factor * svd_bound(w))
    errs = [r["expected_total_error"] for r in recs]
    assert errs == sorted(errs)


@pytest.mark.parametrize("fmt", ["table", "csv", "markdown"])
def test_formats(capsys, fmt):
    code, out, err = run(capsys, "compare", "-w", "prefix:16", "-e", "1", "-f", fmt, "-m", "identity,wavelet")
    assert code == 0, err
    assert "wavelet" in out and "identity" in out


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
