"""`make bench` (`python -m benchmarks.run_all`) runs every benchmark at its quick setting and
exits 0; here the two benchmarks that exited 2 on --quick (kronecker, minimax), in their own processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_all(tmp_path: Path, names: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "benchmarks.run_all", "--only", names, "--out", str(tmp_path),
                           "--budget", "600"], cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_kronecker_benchmark_runs_at_its_quick_setting(tmp_path: Path) -> None:
    res = run_all(tmp_path, "kronecker")
    assert res.returncode == 0, res.stdout + (tmp_path / "kronecker.log").read_text()
    assert (tmp_path / "kronecker.csv").is_file()


@pytest.mark.slow  # solve_minimax and the conic model on five workloads at n = 64 (about 10 s, more under load)
def test_minimax_benchmark_runs_at_its_quick_setting(tmp_path: Path) -> None:
    res = run_all(tmp_path, "minimax")
    assert res.returncode == 0, res.stdout + (tmp_path / "minimax.log").read_text()
    assert (tmp_path / "minimax.csv").is_file()
