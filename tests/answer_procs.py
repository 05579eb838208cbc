"""Helpers for tests that run `dpopt answer` in real processes (through tests/answer_when_started.py).

The processes import dpopt from this checkout: PYTHONPATH names its root, so an editable install of
another checkout (which a script run from tests/ would otherwise import) is not what is tested.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).with_name("answer_when_started.py")
DOMAIN_SPEC = "a=int:0..3"  # 4 cells: the identity workload has 4 answers
EPS = 0.25  # per release; budgets are multiples of it (exact in binary)
PROCESS_TIMEOUT = 120.0


def checkout_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a child process that imports dpopt from this checkout."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else ""), **(extra or {})}


def write_table(path: Path) -> Path:
    """A 20-row CSV with one column a in 0..3 (DOMAIN_SPEC)."""
    pd.DataFrame({"a": np.arange(20) % 4}).to_csv(path, index=False)
    return path


def answer_args(table: Path, ledger: Path | str, out: Path | str, budget: float) -> list[str]:
    """`dpopt answer` arguments: identity workload at EPS on `table`, charged to `ledger`."""
    return ["--quiet", "--data", str(table), "--domain", DOMAIN_SPEC, "--workload", "identity",
            "--epsilon", str(EPS), "--budget-epsilon", str(budget), "--ledger", str(ledger),
            "--out", str(out)]


def spawn(args: list[str], ready: str = "-", start: str = "-",
          env: dict[str, str] | None = None) -> subprocess.Popen:
    """`dpopt answer ARGS` in a new process, after the READY/START barrier (see answer_when_started.py)."""
    return subprocess.Popen([sys.executable, str(SCRIPT), ready, start, *args], env=checkout_env(env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_python(code: str, *argv: str) -> subprocess.CompletedProcess:
    """`python -c CODE ARGV...` importing dpopt from this checkout; waits for it to end."""
    return subprocess.run([sys.executable, "-c", code, *argv], env=checkout_env(), capture_output=True,
                          text=True, timeout=PROCESS_TIMEOUT)


def wait_for_files(paths: list[Path], procs: list[subprocess.Popen]) -> None:
    """Block until every path exists; fail if a process ends first without writing its path."""
    deadline = time.monotonic() + PROCESS_TIMEOUT
    while not all(p.exists() for p in paths):
        dead = [q for q, p in zip(procs, paths, strict=True) if q.poll() is not None and not p.exists()]
        if dead:
            raise AssertionError(f"a process exited early: {dead[0].communicate()}")
        assert time.monotonic() < deadline, "processes did not reach the expected step in time"
        time.sleep(0.02)


def run_together(arglists: list[list[str]], barrier: Path) -> list[tuple[int, str, str]]:
    """Start one `dpopt answer` process per argument list, release them together once all have
    imported everything, and return (exit status, stdout, stderr) of each, in order."""
    barrier.mkdir()
    ready = [barrier / f"ready{i}" for i in range(len(arglists))]
    start = barrier / "start"
    procs = [spawn(args, str(r), str(start)) for args, r in zip(arglists, ready, strict=True)]
    try:
        wait_for_files(ready, procs)
        start.touch()
        outputs = [p.communicate(timeout=PROCESS_TIMEOUT) for p in procs]
    finally:
        for p in procs:
            p.kill()
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outputs, strict=True)]
