"""what `dpopt compare` and `dpopt answer` refuse, before any fit
or charge, in one line that names the flag or file the user typed and what was expected."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpopt.cli import main
from dpopt.mechanisms.base import DENSE_MAX_CELLS, Mechanism
from dpopt.mechanisms.hdmm import HDMMMechanism
from dpopt.queries import MAX_LABELLED_QUERIES


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as stop:  # argparse refuses a flag's value itself
        code = int(stop.code or 0)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def refused(code: int, out: str, err: str, *fragments: str) -> str:
    """The one stderr line of an exit-2 refusal, holding every fragment; nothing on stdout, no traceback."""
    assert code == 2, err
    assert out == "" and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def no_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any strategy selection fails the test: a refusal must come before the fit."""

    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("a mechanism was fitted before the refusal")

    monkeypatch.setattr(Mechanism, "_fit", fail)
    monkeypatch.setattr(HDMMMechanism, "_fit_factored", fail)


# -- item 6: answer refuses the extreme eps and delta that compare refuses ----------------------------------------
EXTREME = [
    (["--epsilon=5e-324"], "--epsilon 5e-324 is too small"),
    (["--epsilon=1e-320", "--delta=1e-6"], "--epsilon 1e-320 is too small"),
    (["--epsilon=1e308"], "--epsilon 1e+308 is too large"),
    (["--epsilon=1e308", "--delta", "1e-6"], "--epsilon 1e+308 is too large"),
    (["--epsilon", "1", "--delta=5e-324"], "--delta 5e-324 is too small"),
]


@pytest.mark.parametrize(("flags", "fragment"), EXTREME)
def test_answer_refuses_extreme_privacy_as_compare_does(capsys, tmp_path: Path, no_fit, flags, fragment) -> None:
    ledger = tmp_path / "ledger.json"
    line = refused(*run(capsys, "answer", "--quiet", "--workload", "total", "--ledger", str(ledger), *flags),
                   fragment)
    assert line.startswith("dpopt answer: error:")
    assert not ledger.exists()  # refused before the ledger was touched
    refused(*run(capsys, "compare", "-w", "total:4", "-m", "identity", *flags), fragment)


@pytest.mark.slow  # OpenDP's sigma search takes 64 doublings to give up (about 5 s, more under load)
def test_answer_refuses_a_pair_opendp_cannot_certify(capsys, no_fit) -> None:
    # P(eps, delta) = 2 ln(2/delta) / eps^2 = 5.8e301 is a float64, so compare reports it; OpenDP's search for a
    # Gaussian sigma certifying eps = 1e-150 at delta = 1e-6 finds none, which answer says before the fit.
    refused(*run(capsys, "answer", "--quiet", "--workload", "total", "--epsilon", "1e-150", "--delta", "1e-6"),
            "--epsilon 1e-150 with --delta 1e-06", "OpenDP certifies")


@pytest.mark.parametrize("command", [["compare", "-w", "total:4", "-m", "identity", "-e", "1"],
                                     ["answer", "--quiet", "--workload", "total", "-e", "1"]])
def test_delta_that_rounds_to_zero_is_refused(capsys, no_fit, command) -> None:
    # 1e-400 is below the smallest positive double: read as 0.0 it would silently mean eps-DP
    refused(*run(capsys, *command, "--delta", "1e-400"), "--delta", "1e-400 rounds to 0")


@pytest.mark.slow  # two OpenDP sigma searches from sigma 1e20 down (a few seconds)
def test_tiny_epsilon_gaussian_release_is_certified(capsys, tmp_path: Path) -> None:
    # zcdp_budget's rho = (sqrt(L + eps) - sqrt(L))^2 cancelled to 0 below eps ~ L * 1e-16 (a ZeroDivisionError);
    # eps / (sqrt(L + eps) + sqrt(L)) keeps it, and the release charges what OpenDP certifies (eps 1e-20 or less)
    out = tmp_path / "a.csv"
    code, _, err = run(capsys, "answer", "--quiet", "--workload", "total", "--epsilon", "1e-20", "--delta", "1e-6",
                       "--out", str(out))
    assert code == 0, err
    assert pd.read_csv(out)["epsilon"].iloc[0] == 1e-20


# -- item 10: specs accepted and ignored; sizes that cannot be fitted ------------------------------------------
@pytest.mark.parametrize(("spec", "fragment"), [
    ("total:nan", "total takes no argument"),
    ("identity:3", "identity takes no argument"),
    ("marginals:-0", "must lie in 1..3"),
    ("marginals:1:x", "must be an integer in 1..3"),
    ("range:rate_marriage,children", "range takes one ordinal column"),
])
def test_answer_refuses_specs_it_used_to_ignore(capsys, no_fit, spec: str, fragment: str) -> None:
    refused(*run(capsys, "answer", "--quiet", "-e", "1", "--workload", spec), f"--workload {spec!r}", fragment)


@pytest.mark.parametrize("spec", ["identity:99999999999999999999999", "allrange:100000000", "prefix:20000"])
@pytest.mark.parametrize("mechanisms", [[], ["-m", "hdmm"], ["-m", "identity,mm-optimal"]])
def test_compare_refuses_a_size_no_mechanism_fits(capsys, no_fit, spec: str, mechanisms: list[str]) -> None:
    refused(*run(capsys, "compare", "-w", spec, "-e", "1", *mechanisms), f"--workload {spec}",
            f"at most {DENSE_MAX_CELLS} cells")


def test_compare_skips_before_fitting_only_the_mechanisms_that_cannot_fit(capsys) -> None:
    # 8e6 cells: no dense strategy (laplace has no other form on a union), but mm-optimal's (eps, delta) optimum on
    # marginals is closed form at any size and identity measures I per attribute
    code, out, _ = run(capsys, "compare", "-w", "marginals:200x200x200:2", "-e", "1", "-d", "1e-6",
                       "-m", "laplace,identity,mm-optimal", "-f", "json")
    rows = {r["mechanism"]: r for r in json.loads(out)}
    assert code == 0
    assert rows["laplace"]["status"].startswith("skipped: laplace: 8e+06 cells are too many")
    assert f"expected at most {DENSE_MAX_CELLS} cells" in rows["laplace"]["status"]
    assert rows["mm-optimal"]["expected_total_error"] > 0
    assert rows["identity"]["expected_total_error"] > rows["mm-optimal"]["expected_total_error"]


def test_answer_refuses_a_size_its_mechanism_cannot_fit(capsys, tmp_path: Path, no_fit) -> None:
    data = tmp_path / "ab.csv"
    data.write_text("a,b\n1,0\n3,1\n")
    refused(*run(capsys, "answer", "--quiet", "-e", "1", "--data", str(data), "--domain",
                 "a=int:0..99999;b=int:0..1", "--workload", "total", "--mechanism", "identity"),
            "--mechanism identity", f"at most {DENSE_MAX_CELLS} cells per factor")


# -- item 11: memory errors become messages -------------------------------------------------------------------
@pytest.mark.parametrize("spec", ["identity", "range:a", "marginal:a,b", "marginals:2"])
def test_answer_refuses_workloads_too_large_to_label(capsys, tmp_path: Path, no_fit, spec: str) -> None:
    # 10^12 cells: labelling every query would need terabytes (a MemoryError from numpy before)
    data = tmp_path / "ab.csv"
    data.write_text("a,b\n1,2\n3,4\n")
    refused(*run(capsys, "answer", "--quiet", "-e", "1", "--data", str(data), "--domain",
                 "a=int:0..999999;b=int:0..999999", "--workload", spec),
            f"--workload {spec!r}", f"at most {MAX_LABELLED_QUERIES:,}")


def test_a_memory_error_becomes_one_line(capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    import dpopt.release_cli

    def oom(*args: object, **kwargs: object) -> None:
        raise MemoryError("Unable to allocate 7.28 TiB for an array")

    monkeypatch.setattr(dpopt.release_cli, "records", oom)
    refused(*run(capsys, "answer", "--quiet", "-e", "1"), "out of memory", "7.28 TiB")
    monkeypatch.setattr("dpopt.cli.parse_workload", oom)
    refused(*run(capsys, "compare", "-w", "allrange:8", "-e", "1"), "--workload 'allrange:8'", "not enough memory")


# -- the messages ---------------------------------------------------------------------------------------------
@pytest.fixture
def domain_file(tmp_path: Path) -> Path:
    f = tmp_path / "dom.json"
    f.write_text('{"a": 10, "b": 5}')
    return f


def test_csv_error_names_the_file_the_flag_and_a_row_counted_from_one(capsys, tmp_path, domain_file, no_fit) -> None:
    data = tmp_path / "bad.csv"
    data.write_text("a,b\n1,2\n3,9\n")
    line = refused(*run(capsys, "answer", "--quiet", "-e", "1", "--data", str(data), "--domain", str(domain_file)),
                   f"--data {str(data)!r}", "column 'b': value '9' is outside the domain", "data row 2 (line 3",
                   "--on-invalid drop")
    assert "bucket" not in line and "on_invalid=" not in line


@pytest.mark.parametrize(("text", "fragment"), [('{"a": 10, "b": 5', "is not valid JSON"),
                                                ('{"a": 10, "b": 5, "a": 3}', "key 'a' appears twice")])
def test_bad_domain_json_names_the_file_and_the_flag(capsys, tmp_path: Path, no_fit, text: str, fragment: str) -> None:
    dom = tmp_path / "dom.json"
    dom.write_text(text)
    data = tmp_path / "ok.csv"
    data.write_text("a,b\n1,2\n")
    refused(*run(capsys, "answer", "--quiet", "-e", "1", "--data", str(data), "--domain", str(dom)),
            f"--domain {str(dom)!r}", f"domain file {str(dom)!r}", fragment)


def test_duplicate_csv_column_is_refused(capsys, tmp_path: Path, domain_file: Path, no_fit) -> None:
    data = tmp_path / "dup.csv"
    data.write_text("a,b,a\n1,2,3\n")
    refused(*run(capsys, "answer", "--quiet", "-e", "1", "--data", str(data), "--domain", str(domain_file)),
            f"--data {str(data)!r}", "column 'a' appears 2 times in the header (columns 1, 3)")


def test_domain_columns_keep_the_order_typed(capsys, tmp_path: Path) -> None:
    out = tmp_path / "a.csv"
    code, _, err = run(capsys, "answer", "--quiet", "-e", "1", "--domain", "fair:religious,rate_marriage",
                       "--workload", "identity", "--out", str(out))
    assert code == 0, err
    first = pd.read_csv(out)["query"].iloc[:2].tolist()
    assert first == ["religious=1 & rate_marriage=1", "religious=1 & rate_marriage=2"]


def test_npy_specs_name_what_is_wrong_with_the_file(capsys, tmp_path: Path, no_fit) -> None:
    folder = tmp_path / "w.npy"
    folder.mkdir()
    text = tmp_path / "t.npy"
    text.write_text("hello\n")
    objects = tmp_path / "o.npy"
    np.save(objects, np.array([{"a": 1}], dtype=object))
    for path, fragment in [(folder, "is a folder"), (text, "is not a .npy file"), (objects, "holds Python objects")]:
        line = refused(*run(capsys, "compare", "-w", f"npy:{path}", "-e", "1"), f"--workload 'npy:{path}'", fragment)
        assert "allow_pickle" not in line and "not found" not in line


def test_empty_mechanism_list_and_max_objective_without_mm_optimal_are_refused(capsys, no_fit) -> None:
    refused(*run(capsys, "compare", "-w", "allrange:8", "-e", "1", "-m", ""), "-m/--mechanisms '' names no mechanism")
    refused(*run(capsys, "compare", "-w", "allrange:8", "-e", "1", "-m", "identity", "--objective", "max"),
            "--objective max applies to mm-optimal only")


def test_crossval_help_shows_one_percent_sign(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["crossval", "--help"])
    out = capsys.readouterr().out
    assert "1%" in out and "%%" not in out


def test_sweep_refuses_extreme_privacy_naming_the_config(capsys, tmp_path: Path) -> None:
    cfg = tmp_path / "grid.toml"
    cfg.write_text('workloads = ["allrange:8"]\nmechanisms = ["identity"]\nepsilon = [1e-320]\n')
    refused(*run(capsys, "sweep", str(cfg)), f"sweep config {cfg}", "epsilon=1e-320 is too small")


def test_a_strategy_with_too_many_rows_to_draw_is_refused_before_any_charge(capsys, monkeypatch, tmp_path) -> None:
    # identity on a union measures every cell; beyond MAX_RELEASE_ROWS noisy values the release is refused with the
    # time OpenDP would take, and the ledger is not charged (here the limit is lowered to the Fair survey's size)
    import dpopt.release_cli

    monkeypatch.setattr(dpopt.release_cli, "NOISE_ESTIMATE_ROWS", 5)
    monkeypatch.setattr(dpopt.release_cli, "MAX_RELEASE_ROWS", 10)
    ledger = tmp_path / "ledger.json"
    line = refused(*run(capsys, "answer", "--quiet", "-e", "1", "--workload", "marginals:2", "--mechanism",
                        "identity", "--ledger", str(ledger), "--out", str(tmp_path / "a.csv")),
                   "identity's strategy measures", "more than the 10 noisy measurements", "nothing was released")
    assert "s with OpenDP" in line
    assert not (tmp_path / "a.csv").exists()
    assert not ledger.exists() or json.loads(ledger.read_text())["history"] == []
