"""Run one measurement in a fresh Python process with a wall-clock budget and an optional memory cap.

Benchmarks measure each solve in its own process (clean imports, peak memory of that solve only). The
child runs in its own process group, BLAS limited to one thread through the environment; at the budget
the whole group is killed (SIGKILL), so solver threads or grandchildren cannot outlive it.
"""

from __future__ import annotations

import math
import os
import re
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
MEMORY_MARKERS = ("MemoryError", "memory allocation of", "Cannot allocate memory", "std::bad_alloc",
                  "Unable to allocate")


@dataclass
class ChildRun:
    """What a child run produced: exit code (None if killed at the budget), output, wall and CPU seconds."""

    returncode: int | None
    stdout: str
    stderr: str
    wall: float
    cpu: float

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    @property
    def out_of_memory(self) -> bool:
        """The child failed in a way an address-space cap produces (an allocation error or SIGABRT)."""
        return self.returncode not in (None, 0) and (
            any(m in self.stderr for m in MEMORY_MARKERS) or self.returncode == -signal.SIGABRT)

    def last_error_line(self, width: int = 120) -> str:
        """The exception line of the child's traceback (`Name...Error: message`; an exception message can run on
        over more lines), else its last stderr line."""
        lines = self.stderr.strip().splitlines() or ["?"]
        raised = [ln for ln in lines if re.match(r"[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b:?", ln)]
        return (raised or lines)[-1][:width]


def _children_cpu() -> float:
    """User + system CPU seconds of all waited-for children so far (the delta around one run is its CPU)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_module(module: str, args: list[str], budget: float, mem_limit_bytes: int = 0,
               python: str | None = None) -> ChildRun:
    """`python -m module *args` from the repository root; killed with its process group after `budget` s.

    mem_limit_bytes > 0 caps the child's address space (RLIMIT_AS), so a run that would exhaust a shared
    machine fails instead. CPU seconds are counted also for a killed run. python: another interpreter (a
    benchmark-only environment) instead of this one.
    """
    return run_command([python or sys.executable, "-m", module, *args], budget, mem_limit_bytes)


def run_command(cmd: list[str], budget: float, mem_limit_bytes: int = 0, env: dict[str, str] | None = None,
                cpu_limit: float = 0.0) -> ChildRun:
    """Any command (another interpreter, a script) from the repository root, as `run_module` runs a module.

    env is added to the one-thread environment; cpu_limit > 0 sets RLIMIT_CPU, so the kernel ends the child after
    that many CPU seconds (SIGXCPU, then SIGKILL 10 s later) whatever the machine's load.
    """
    env = dict(os.environ, **ONE_THREAD, **(env or {}))

    def limits() -> None:
        if mem_limit_bytes > 0:
            resource.setrlimit(resource.RLIMIT_AS, (mem_limit_bytes, mem_limit_bytes))
        if cpu_limit > 0:
            soft = max(1, math.ceil(cpu_limit))
            resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 10))

    t0, cpu0 = time.perf_counter(), _children_cpu()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                            start_new_session=True,
                            preexec_fn=limits if (mem_limit_bytes > 0 or cpu_limit > 0) else None)
    try:
        out, err = proc.communicate(timeout=budget)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        code = None
    return ChildRun(code, out or "", err or "", time.perf_counter() - t0, _children_cpu() - cpu0)


def checkout_commit() -> str:
    """The checkout's commit (short hash), for a table's header; "unknown" outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT,
                             check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip()
