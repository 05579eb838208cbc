"""`dpopt sweep` exits non-zero when every task failed, and every output path of sweep,
reproduce, crossval and --plot is checked before the work (one line, exit 2), never creating a folder for a file
nor one at the file system root."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from dpopt.cli import main

# A folder no process can create files in, whoever runs the tests (root included): the proc pseudo file system.
UNWRITABLE = Path("/proc")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as stop:
        code = int(stop.code or 0)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def refused(code: int, err: str, *fragments: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Running a sweep, an experiment or the cross-validation fails the test: the refusal must come first."""

    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("the work started before the output path was checked")

    monkeypatch.setattr("dpopt.experiments.run_sweep", fail)
    monkeypatch.setattr("dpopt.reproduce.runner.run_sweep", fail)
    monkeypatch.setattr("dpopt.crossval.run_crossval", fail)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    f = tmp_path / "grid.toml"
    f.write_text('workloads = ["allrange:{n}"]\nmechanisms = ["identity"]\nepsilon = [1.0]\n[sizes]\nn = [8]\n')
    return f


def test_sweep_exits_1_when_every_task_failed(capsys, tmp_path: Path) -> None:
    # every task refused: prefix:20000 is beyond a dense strategy, and the grid names only dense mechanisms
    cfg = tmp_path / "grid.toml"
    cfg.write_text('workloads = ["prefix:{n}"]\nmechanisms = ["identity", "wavelet"]\n[sizes]\nn = [20000]\n')
    out = tmp_path / "r.csv"
    code, _, err = run(capsys, "sweep", str(cfg), "--out", str(out), "--workers", "0", "--no-progress")
    assert code == 1
    assert "every task failed" in err and "skipped: 2" in err
    assert out.is_file()  # the table of what failed is still written


def test_sweep_exits_0_when_some_task_finished(capsys, config: Path, tmp_path: Path) -> None:
    code, _, err = run(capsys, "sweep", str(config), "--out", str(tmp_path / "r.csv"), "--workers", "0",
                       "--no-progress")
    assert code == 0, err


def test_sweep_refuses_an_unknown_mechanism_naming_the_config(capsys, tmp_path: Path, no_work) -> None:
    cfg = tmp_path / "grid.toml"
    cfg.write_text('workloads = ["allrange:8"]\nmechanisms = ["identity", "nope"]\n')
    code, _, err = run(capsys, "sweep", str(cfg))
    refused(code, err, f"sweep config {cfg}", "unknown mechanism(s) 'nope'")


def test_sweep_out_checked_before_the_work(capsys, config: Path, tmp_path: Path, no_work) -> None:
    code, _, err = run(capsys, "sweep", str(config), "--out", str(tmp_path))
    refused(code, err, "--out", "it is a folder")
    missing = tmp_path / "no" / "such" / "r.csv"
    code, _, err = run(capsys, "sweep", str(config), "--out", str(missing))
    refused(code, err, "--out", "does not exist")
    assert not (tmp_path / "no").exists()  # no folder is created for an output file
    code, _, err = run(capsys, "sweep", str(config), "--plot", str(UNWRITABLE / "s.png"))
    refused(code, err, "--plot", "not writable")


def test_sweep_out_never_creates_a_folder_at_the_root(capsys, config: Path, no_work) -> None:
    top = Path("/") / f"dpopt-test-{uuid.uuid4().hex}"
    code, _, err = run(capsys, "sweep", str(config), "--out", str(top / "x.csv"))
    refused(code, err, "--out", "does not exist")
    assert not top.exists()


def test_reproduce_outputs_checked_before_the_work(capsys, tmp_path: Path, no_work) -> None:
    afile = tmp_path / "file"
    afile.write_text("x")
    code, _, err = run(capsys, "reproduce", "li-miklau-table2", "--out", str(afile))
    refused(code, err, "--out", "it is a file; expected a folder")
    code, _, err = run(capsys, "reproduce", "li-miklau-table2", "--out", str(UNWRITABLE / "dpopt-out"))
    refused(code, err, "--out", "not writable")
    code, _, err = run(capsys, "reproduce", "li-miklau-table2", "--out", str(tmp_path / "a" / "b"))
    refused(code, err, "--out", "not an existing folder")
    top = Path("/") / f"dpopt-test-{uuid.uuid4().hex}"
    code, _, err = run(capsys, "reproduce", "li-miklau-table2", "--out", str(top))
    refused(code, err, "--out", "at the file system root")
    assert not top.exists()
    code, _, err = run(capsys, "reproduce", "li-miklau-table2", "--out", str(tmp_path / "r"), "--plot",
                       str(tmp_path / "missing" / "f.png"))
    refused(code, err, "--plot", "does not exist")


def test_crossval_out_checked_before_the_work(capsys, tmp_path: Path, no_work) -> None:
    code, _, err = run(capsys, "crossval", "--quick", "--out", str(UNWRITABLE / "c.csv"))
    refused(code, err, "--out", "not writable")
    code, _, err = run(capsys, "crossval", "--quick", "--plot", str(tmp_path))
    refused(code, err, "--plot", "it is a folder")
