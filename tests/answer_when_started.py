"""Run `dpopt answer ARGS` in a test process once a start file exists (a barrier for concurrency tests).

Usage: python answer_when_started.py READY START [dpopt answer arguments...].  The process imports
dpopt, its mechanisms and OpenDP first, then writes READY and waits for START (either may be '-' to
skip), so processes started together reach the ledger together, whatever their import times.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import opendp.prelude  # noqa: F401  (imported before the barrier)

import dpopt.mechanisms  # noqa: F401
import dpopt.release  # noqa: F401
from dpopt.release_cli import main


def wait_for(path: Path, timeout: float = 120.0) -> None:
    """Block until ``path`` exists; SystemExit(9) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(9)
        time.sleep(0.005)


if __name__ == "__main__":
    ready, start, *argv = sys.argv[1:]
    if ready != "-":
        Path(ready).write_text("ready", encoding="utf-8")
    if start != "-":
        wait_for(Path(start))
    sys.exit(main(["answer", *argv]))
