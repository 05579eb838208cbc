"""Shared test configuration: one BLAS thread (the CI machine has two cores) and paths to shared data.

Tests that read the shared folder (the papers' reference tables, the Adult data) find it through
`require_shared`. Its root is `../shared` beside the checkout; the environment variable DPOPT_SHARED
overrides it (used by the tests of this very rule). When a needed path is absent the test is skipped
with the path in the message, except under CI (CI=true), which always has the folder: there the
absence fails the run instead of silently skipping the checks that need it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

try:
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)
except ImportError:  # pragma: no cover
    pass

SHARED_ENV = "DPOPT_SHARED"
DEFAULT_SHARED = Path(__file__).resolve().parents[1].parent / "shared"


def shared_root() -> Path:
    """The shared folder: $DPOPT_SHARED when set, else ../shared beside the checkout."""
    env = os.environ.get(SHARED_ENV)
    return Path(env).expanduser().resolve() if env else DEFAULT_SHARED


def under_ci() -> bool:
    """True when the CI environment variable says we run under continuous integration."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def require_shared(relpath: str = "") -> Path:
    """The path `relpath` inside the shared folder; skip (fail under CI=true) when it is absent."""
    root = shared_root()
    path = root / relpath if relpath else root
    if path.exists():
        return path
    what = f"{relpath!r} in the shared folder" if relpath else "the shared folder"
    msg = (
        f"{what} not found: {path} does not exist (the shared folder is ../shared beside the checkout, "
        f"or ${SHARED_ENV})"
    )
    if under_ci():
        pytest.fail(f"CI=true and {msg}", pytrace=False)
    pytest.skip(msg)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The shared reference and data folder (see `require_shared`)."""
    return require_shared()
