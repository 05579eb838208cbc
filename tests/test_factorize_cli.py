"""`dpopt factorize`: the command-line contract ."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dpopt.cli import main
from dpopt.streaming.base import RECORD_KEYS, dense_losses
from dpopt.streaming.families import FAMILIES
from dpopt.streaming.participation import Participation
from dpopt.workloads import Prefix

FAMILY_SPECS = ["sqrt", "toeplitz", "banded:4", "blt:2"]


def _run(argv, capsys):
    code = main(["factorize", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("family", FAMILY_SPECS)
def test_json_has_exactly_the_contract_keys(family, capsys):
    code, out, _ = _run(["--workload", "prefix:64", "--epochs", "4", "--family", family, "--format", "json"], capsys)
    assert code == 0
    rec = json.loads(out)
    assert tuple(rec) == RECORD_KEYS
    assert rec["n"] == 64 and rec["epochs"] == 4 and rec["objective"] == "mean"
    assert rec["lower_bound"] is None and rec["gap"] is None
    assert rec["mean_loss"] > 0 and rec["max_loss"] >= rec["mean_loss"] and rec["sensitivity"] > 0


def test_out_writes_c_and_the_report_and_the_loss_recomputes(tmp_path, capsys):
    out = tmp_path / "f"
    code, _, err = _run(["--workload", "prefix:32", "--epochs", "2", "--family", "toeplitz", "--objective", "max",
                         "--out", str(out)], capsys)
    assert code == 0 and "wrote" in err
    rec = json.loads((out / "report.json").read_text())
    C = np.load(out / "C.npy")
    mean, mx, sens2 = dense_losses(Prefix(32), C, Participation(32, 2))
    assert rec["max_loss"] == pytest.approx(mx, rel=1e-9)  # FFT against triangular solve, see test_streaming_families
    assert rec["sensitivity"] == pytest.approx(sens2, rel=1e-9)


def test_out_writes_params_beyond_8192_steps(tmp_path, capsys):
    code, _, _ = _run(["--workload", "prefix:16384", "--family", "blt:2", "--out", str(tmp_path)], capsys)
    assert code == 0
    assert not (tmp_path / "C.npy").exists()
    params = json.loads((tmp_path / "params.json").read_text())
    assert params["family"] == "blt" and len(params["theta"]) == 2


def test_npy_workload_and_momentum(tmp_path, capsys):
    A = np.tril(np.ones((16, 16)))
    np.save(tmp_path / "A.npy", A)
    code, out, _ = _run(["--workload", f"npy:{tmp_path / 'A.npy'}", "--family", "sqrt", "--format", "json"], capsys)
    assert code == 0
    code2, out2, _ = _run(["--workload", "prefix:16", "--family", "sqrt", "--format", "json"], capsys)
    assert json.loads(out)["mean_loss"] == pytest.approx(json.loads(out2)["mean_loss"], rel=1e-12)
    code, out, _ = _run(["--workload", "prefix:16", "--momentum", "0.9", "--cooldown", "--family", "blt:2"], capsys)
    assert code == 0 and "momentum-prefix(16, beta=0.9, schedule)" in out


@pytest.mark.parametrize(("argv", "needle"), [
    (["--workload", "prefix:10", "--epochs", "3"], "--epochs 3"),
    (["--workload", "prefix:8", "--momentum", "1"], "--momentum"),
    (["--workload", "prefix:8", "--momentum", "-0.1"], "--momentum"),
    (["--workload", "allrange:8"], "--workload"),
    (["--workload", "prefix:100000000", "--family", "toeplitz"], "above"),
    (["--workload", "prefix:4100", "--cooldown", "--family", "toeplitz"], "densely"),
    (["--workload", "npy:/nonexistent/A.npy"], "--workload"),
    (["--family", "banded:0"], "--family"),
    (["--family", "sqrt:3"], "--family"),
    (["--family", "lowrank"], "--family"),
    (["--participation", "b-min-sep"], "b-min-sep"),
    (["--participation", "random-batches"], "random-batches"),
])
def test_bad_input_is_one_line_and_exit_2(argv, needle, capsys):
    code, out, err = _run(argv, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dpopt: error:") and needle in lines[0], err


@pytest.mark.skipif(not FAMILIES.available("optimal"), reason="runs once dpopt.streaming.optimal lands")
def test_optimal_family_bounds_every_family(capsys):
    """--family optimal dispatches to dpopt.streaming.optimal; its lower bound is below every family's loss."""
    code, out, _ = _run(["--workload", "prefix:48", "--epochs", "4", "--family", "optimal", "--format", "json"], capsys)
    assert code == 0
    rec = json.loads(out)
    assert tuple(rec) == RECORD_KEYS and rec["lower_bound"] is not None
    for family in FAMILY_SPECS:
        _, o, _ = _run(["--workload", "prefix:48", "--epochs", "4", "--family", family, "--format", "json"], capsys)
        assert rec["lower_bound"] <= json.loads(o)["mean_loss"]


def test_console_script_runs():
    exe = Path(sys.executable).with_name("dpopt")
    exe = str(exe) if exe.exists() else shutil.which("dpopt")
    root = str(Path(__file__).resolve().parents[1])  # this checkout's dpopt, whichever one the script was installed from
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([exe, "factorize", "--workload", "prefix:32", "--family", "sqrt"], capture_output=True,
                         text=True, env=env)
    assert res.returncode == 0 and "mean_loss" in res.stdout and "fitting" in res.stderr
