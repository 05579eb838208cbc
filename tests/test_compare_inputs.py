"""`dpopt compare` on bad or extreme input: one-line refusals, full-precision output, invalid calibrations flagged."""

from __future__ import annotations

import io
import json
import math

import pandas as pd
import pytest

from dpopt.cli import main
from dpopt.mechanisms.registry import make_mechanism
from dpopt.privacy import Privacy, gaussian_delta
from dpopt.specs import SpecError, parse_workload
from dpopt.workloads import Prefix


def run(capsys, *args):
    code = main(["compare", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_one_line_refusal(code, out, err, fragment):
    assert code == 2
    assert out == ""
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dpopt: error:"), err
    assert fragment in lines[0]


@pytest.mark.parametrize("eps, fragment", [("1e-300", "too small"), ("1e308", "too large"),
                                           ("1e-200", "too small"), ("1e200", "too large")])
@pytest.mark.parametrize("delta", ["0", "1e-6"])
def test_extreme_epsilon_refused_in_one_line(capsys, eps, fragment, delta):
    assert_one_line_refusal(*run(capsys, "-w", "prefix:4", "-e", eps, "-d", delta, "-m", "identity"), fragment)


def test_large_but_representable_epsilon_still_runs(capsys):
    code, out, _ = run(capsys, "-w", "prefix:4", "-e", "1e100", "-m", "identity", "-f", "json")
    rec = json.loads(out)[0]
    assert code == 0 and rec["bound"] > 0 and math.isfinite(rec["ratio_to_bound"])


def test_plot_under_missing_folder_refused_before_fitting(capsys, tmp_path):
    png = tmp_path / "no" / "such" / "c.png"
    assert_one_line_refusal(*run(capsys, "-w", "prefix:4", "-e", "1", "-m", "identity", "--plot", str(png)),
                            "does not exist")


def test_plot_under_a_file_refused(capsys, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    assert_one_line_refusal(*run(capsys, "-w", "prefix:4", "-e", "1", "-m", "identity", "--plot", str(f / "c.png")),
                            "is not a folder")


def test_plot_onto_a_folder_refused(capsys, tmp_path):
    assert_one_line_refusal(*run(capsys, "-w", "prefix:4", "-e", "1", "-m", "identity", "--plot", str(tmp_path)),
                            "it is a folder")


BAD_SPECS = [
    ("allrange:16:extra", "trailing 'extra'"),
    ("prefix:8:", "trailing"),
    ("width:8:2:x", "trailing"),
    ("marginals:3x4x5:0", "must lie in 1..3"),
    ("marginals:3x4x5:4", "must lie in 1..3"),
    ("marginals:3x4x5:-1", "must lie in 1..3"),
    ("marginals:3x4x5:1.5", "must be an integer"),
    ("marginals:3x4x5:2:junk", "trailing"),
    ("marginals:3x0x5:1", "must be positive"),
    ("marginals:3x4.5x5:1", "must be a positive integer"),
    ("marginals:300x300x300:4", "must lie in 1..3"),  # the implicit path (too large for a dense Gram)
    ("marginals:300x300x300:0", "must lie in 1..3"),
    ("prefix:0", "must be positive"),
    ("prefix:-3", "must be positive"),
    ("prefix:2.5", "positive integer"),
    ("prefix:1_0", "positive integer"),
    ("width:8:9", "K <= N"),
    ("wrange:4x8:seed=-1", "non-negative integer"),
    ("wrange:4x8:seed=1:seed=2", "given twice"),
    ("wrange:4x8:bogus=1", "unknown option 'bogus'"),
    ("wrange:4x8:5", "KEY=VALUE"),
    ("wrange:4x0", "must be positive"),
    ("wrelated:4x8:s=5", "at most min(M, N) = 4"),
    ("wtau:4x8:tau=1.5", "[0, 1]"),
    ("wdiscrete:4x8:off=2", "off must be -1 or 0"),
    ("kron:allrange:4", "two or more"),
    ("kron:allrange:4,,prefix:2", "two or more"),
    ("kron:allrange:4,prefix:3:x", "trailing"),
]


@pytest.mark.parametrize("spec, fragment", BAD_SPECS)
def test_bad_spec_refused_by_parser(spec, fragment):
    with pytest.raises(SpecError) as info:
        parse_workload(spec)
    assert fragment in str(info.value)


@pytest.mark.parametrize("spec, fragment", BAD_SPECS[:4])
def test_bad_spec_refused_by_cli(capsys, spec, fragment):
    assert_one_line_refusal(*run(capsys, "-w", spec, "-e", "1", "-m", "identity"), fragment)


@pytest.mark.parametrize("spec, n", [("wtau:4x8:tau=0.3:seed=2", 8), ("wdiscrete:4x8:off=0", 8),
                                     ("marginals:3x4x5:3", 60), ("marginals:3x4x5:1", 60), ("width:8:8", 8)])
def test_good_specs_still_parse(spec, n):
    assert parse_workload(spec).n == n


def _identity_prefix4_eps1000():
    return make_mechanism("identity").fit(Prefix(4), Privacy(1000.0))


def _eps_dp_bound_prefix4_eps1000() -> float:
    """The eps-DP bound compare reports: P_eps times the certified L2-optimum bound (same computation)."""
    from dpopt.compare import eps_dp_bound

    value, kind = eps_dp_bound(Prefix(4), Privacy(1000.0), None)
    assert kind == "l2-optimum"
    return value


def test_json_carries_full_double_precision(capsys):
    code, out, _ = run(capsys, "-w", "prefix:4", "-e", "1000", "-m", "identity", "-f", "json")
    rec = json.loads(out)[0]
    lib = _identity_prefix4_eps1000()
    bound = _eps_dp_bound_prefix4_eps1000()
    assert round(bound, 10) != bound  # 10 decimal places would lose this bound's digits
    assert code == 0
    assert rec["bound"] == bound and rec["bound_kind"] == "l2-optimum"
    assert rec["expected_total_error"] == lib.expected_error_.total
    assert rec["ratio_to_bound"] == lib.expected_error_.total / bound


def test_csv_carries_full_double_precision(capsys):
    code, out, _ = run(capsys, "-w", "prefix:4", "-e", "1000", "-m", "identity", "-f", "csv")
    row = pd.read_csv(io.StringIO(out)).iloc[0]
    lib = _identity_prefix4_eps1000()
    assert code == 0
    assert float(row["bound"]) == _eps_dp_bound_prefix4_eps1000()
    assert float(row["expected_total_error"]) == lib.expected_error_.total


def test_invalid_classic_calibration_flagged(capsys):
    """eps = 20, delta = 1e-6: the classic sigma gives delta about 1e-4 (Balle-Wang), 100 times too much."""
    code, out, err = run(capsys, "-w", "prefix:8", "-e", "20", "-d", "1e-6", "-m", "identity,wavelet", "-f", "json")
    assert code == 0
    sigma = math.sqrt(2 * math.log(2 / 1e-6)) / 20  # classic sigma for unit sens2, written out here
    achieved = gaussian_delta(sigma, 1.0, 20.0)
    assert achieved > 1e-5
    warnings = [line for line in err.splitlines() if line.startswith("dpopt: warning:")]
    assert len(warnings) == 1 and "classic-calibration-invalid" in warnings[0]
    for rec in json.loads(out):
        assert rec["status"].startswith("classic-calibration-invalid: achieves delta=")
        assert "> requested 1e-06" in rec["status"]
        reported = float(rec["status"].split("delta=")[1].split()[0])
        assert reported == pytest.approx(achieved, rel=1e-9)
        assert rec["status"].endswith("solver status: optimal")


@pytest.mark.parametrize("args", [["-e", "1", "-d", "1e-6"], ["-e", "20", "-d", "1e-6", "--calibration", "analytic"],
                                  ["-e", "20"]])
def test_valid_calibrations_not_flagged(capsys, args):
    code, out, err = run(capsys, "-w", "prefix:8", *args, "-m", "identity", "-f", "json")
    assert code == 0 and "warning" not in err
    assert json.loads(out)[0]["status"] == "optimal"
