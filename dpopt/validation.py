"""Input checks shared by the public API: each failure names what was wrong and what was expected."""

from __future__ import annotations

import math
import numbers
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp


def check_finite_matrix(M: object, what: str, keep_sparse: bool = False) -> np.ndarray | sp.csr_matrix:
    """Return M as a 2-D float array with at least one row and column and only finite entries.

    M may be an array, a scipy sparse matrix or an object with a .matrix() method (a Workload). With
    keep_sparse, a sparse M comes back as a checked CSR matrix instead of a dense array.
    """
    if keep_sparse and sp.issparse(M):
        A = sp.csr_matrix(M, dtype=float)
        values = A.data
    else:
        if hasattr(M, "matrix") and callable(M.matrix):
            M = M.matrix()
        if hasattr(M, "toarray") and callable(M.toarray):
            M = M.toarray()
        try:
            A = values = np.asarray(M, dtype=float)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{what} must be a numeric 2-D matrix; could not convert it: {exc}") from exc
        if A.ndim != 2:
            raise ValueError(f"{what} must be a 2-D matrix, got an array with {A.ndim} dimension(s)")
    if A.shape[0] == 0 or A.shape[1] == 0:
        raise ValueError(f"{what} must have at least one row and one column, got shape {A.shape}")
    if not np.all(np.isfinite(values)):
        bad = int(np.size(values) - np.count_nonzero(np.isfinite(values)))
        raise ValueError(f"{what} has {bad} NaN or infinite entries; expected only finite numbers")
    return A


def check_finite_vector(x: object, what: str, length: int | None = None) -> np.ndarray:
    """Return x as a 1-D float array of the given length with only finite entries."""
    v = np.asarray(x, dtype=float)
    if v.ndim != 1:
        raise ValueError(f"{what} must be a 1-D vector, got shape {v.shape}")
    if length is not None and v.shape[0] != length:
        raise ValueError(f"{what} has length {v.shape[0]}, expected {length} (one entry per cell)")
    if not np.all(np.isfinite(v)):
        raise ValueError(f"{what} has NaN or infinite entries; expected only finite numbers")
    return v


def check_positive_int(v: object, what: str) -> int:
    """Return v as an int >= 1."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or int(v) < 1:
        raise ValueError(f"{what} must be a positive integer, got {v!r}")
    return int(v)


def check_choice(value: Any, choices: Sequence[Any], what: str) -> Any:
    """Return value if it is one of choices; ValueError naming what and the choices otherwise."""
    if value not in choices:
        raise ValueError(f"{what} must be one of {choices}, got {value!r}")
    return value


def check_number(v: object, what: str) -> float:
    """Return v as a float; v must be a real number (Python's or numpy's), not a bool."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise ValueError(f"{what} must be a number, got {v!r}")
    return float(v)


def check_positive_number(v: object, what: str) -> float:
    """Return v as a float; v must be a finite real number > 0."""
    x = check_number(v, what)
    if not math.isfinite(x) or x <= 0:
        raise ValueError(f"{what} must be a finite number > 0, got {v}")
    return x


def check_time_limit(time_limit: object) -> float | None:
    """time_limit as a float of seconds > 0, or None; anything else raises ValueError."""
    if time_limit is None:
        return None
    if isinstance(time_limit, bool) or not isinstance(time_limit, numbers.Real) or not (
        math.isfinite(time_limit) and time_limit > 0
    ):
        raise ValueError(f"time_limit must be None or a finite number of seconds > 0; got {time_limit!r}")
    return float(time_limit)


def parse_time_limit(value: object) -> float | None:
    """A time limit given as text or a number: None, 'none' or 'inf' for no limit, else `check_time_limit`'s seconds."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "inf")):
        return None
    return check_time_limit(float(value) if isinstance(value, str) else value)


def as_generator(seed: int | np.random.Generator | None) -> np.random.Generator:
    """A numpy Generator from a seed, an existing Generator (used as is) or None (fresh entropy)."""
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is None or (isinstance(seed, numbers.Integral) and not isinstance(seed, bool)):
        return np.random.default_rng(seed)
    raise ValueError(f"seed must be an int, a numpy Generator or None, got {type(seed).__name__}")


def check_psd(lam: np.ndarray, what: str, rtol: float, scale: float) -> None:
    """Refuse a symmetric matrix with eigenvalues lam unless min(lam) >= -rtol * scale (PSD up to round-off)."""
    low = float(np.min(lam))
    if low < -rtol * scale:
        raise ValueError(f"{what} must be positive semidefinite (W^T W); smallest eigenvalue {low:.3e} "
                         f"< -{rtol:g} * {scale:.3e}")


def check_gram(G: np.ndarray, *, name: str = "G", sym_rtol: float = 1e-10, allow_zero: bool = False,
               psd_rtol: float | None = None) -> np.ndarray:
    """Validate a Gram matrix G = W^T W and return it as a symmetric float64 array, shape (n, n).

    Raises ValueError for a non-array shape, non-square, empty, NaN/inf, non-symmetric (beyond
    sym_rtol * max|G|), or all-zero input (unless allow_zero: a bound of the zero workload is 0); with
    psd_rtol, also for an eigenvalue below -psd_rtol * max|G| (`check_psd`; PSD is scale-free, so is the test).
    """
    try:
        G = np.asarray(G, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a real (n, n) array; could not convert it: {exc}") from None
    if G.ndim != 2 or G.shape[0] != G.shape[1]:
        raise ValueError(f"{name} must be a square (n, n) matrix W^T W; got shape {G.shape}")
    if G.shape[0] == 0:
        raise ValueError(f"{name} must be non-empty; got shape {G.shape}")
    if not np.isfinite(G).all():
        raise ValueError(f"{name} must contain only finite values (found NaN or inf)")
    scale = float(np.max(np.abs(G)))
    if scale == 0.0 and not allow_zero:
        raise ValueError(f"{name} is the zero matrix; it must be non-zero (the workload needs a non-zero query)")
    asym = float(np.max(np.abs(G - G.T)))
    if asym > sym_rtol * scale:
        raise ValueError(
            f"{name} must be symmetric (W^T W); max |G - G^T| = {asym:.3e} exceeds "
            f"{sym_rtol:g} * max|G| = {sym_rtol * scale:.3e}"
        )
    G = (G + G.T) / 2.0
    if psd_rtol is not None:
        check_psd(np.linalg.eigvalsh(G), name, psd_rtol, scale)
    return G


def _probe_writable(folder: Path) -> bool:
    """True when a file can be created in `folder` (tried, not inferred from permission bits: root, read-only
    mounts and pseudo file systems such as /proc answer differently than os.access says)."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def check_output_file(path: str | os.PathLike[str], what: str) -> Path:
    """Refuse, before any work, an output file that cannot be written: its folder missing (no folder is created
    for it), not a folder or not writable, or the path itself a folder. `what` names it (a flag such as --out)."""
    p = Path(path)
    folder = p.resolve().parent
    if p.is_dir():
        raise ValueError(f"cannot write {what} {path}: it is a folder; expected a file name")
    if not folder.exists():
        raise ValueError(f"cannot write {what} {path}: folder {folder} does not exist; expected an existing folder")
    if not folder.is_dir():
        raise ValueError(f"cannot write {what} {path}: {folder} is not a folder")
    if p.exists():
        try:
            with open(p, "ab"):
                pass
        except OSError as exc:
            raise ValueError(f"cannot write {what} {path}: {exc.strerror or exc}") from None
    elif not _probe_writable(folder):
        raise ValueError(f"cannot write {what} {path}: folder {folder} is not writable")
    return p


def check_output_folder(path: str | os.PathLike[str], what: str) -> Path:
    """Refuse, before any work, an output folder that cannot be used: a file, not writable, or missing with a
    missing or unwritable parent; a missing folder is created later only inside an existing one, never at the
    file system root."""
    p = Path(path)
    if p.exists():
        if not p.is_dir():
            raise ValueError(f"cannot write into {what} {path}: it is a file; expected a folder")
        if not _probe_writable(p):
            raise ValueError(f"cannot write into {what} {path}: the folder is not writable")
        return p
    parent = p.resolve().parent
    if not parent.is_dir():
        raise ValueError(f"cannot create {what} {path}: its parent {parent} is not an existing folder; expected an "
                         "existing folder or a new one inside an existing folder")
    if parent == Path(parent.anchor):
        raise ValueError(f"cannot create {what} {path}: it would be a new folder at the file system root; create it "
                         "first or choose a folder below an existing one")
    if not _probe_writable(parent):
        raise ValueError(f"cannot create {what} {path}: its parent {parent} is not writable")
    return p


def count_text(k: int) -> str:
    """A count for a message: exact below a million ('524800'), else to three significant digits ('1.08e+09'),
    also beyond float64 ('about 10^308')."""
    if k < 10**6:
        return str(k)
    return f"{k:.3g}" if k < 10**300 else f"about 10^{len(str(int(k))) - 1}"
