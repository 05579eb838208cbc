"""Euclidean projection of matrix columns onto the L1 ball (the feasible set of LRM's L-step)."""

from __future__ import annotations

import numpy as np


def project_l1_ball_columns(V: np.ndarray, radius: float = 1.0) -> np.ndarray:
    """Sort-based L1-ball projection (Duchi, Shalev-Shwartz, Singer, Chandra, ICML 2008, Fig. 1).

    Projects every column v = V[:, j] onto {l : ||l||_1 <= radius}, i.e. solves Formula (11) of
    seed 000 column by column, vectorised over the columns.

    For a column outside the ball, let u = |v| sorted in decreasing order and c = cumsum(u); with
    rho = max{k : u_k - (c_k - radius) / k > 0} (1-based) and theta = (c_rho - radius) / rho,
    the projection is sign(v) * max(|v| - theta, 0). Cost O(r log r) per column.

    Parameters
    ----------
    V : ndarray, shape (r, n) (or (r,), treated as one column)
        Matrix whose columns are projected.
    radius : float
        Radius of the L1 ball; must be finite and > 0.

    Returns
    -------
    ndarray, same shape as V
        Columns already inside the ball (||v||_1 <= radius) are returned bit-for-bit unchanged;
        the others lie on the sphere ||l||_1 = radius up to rounding.
    """
    V = np.asarray(V, dtype=float)
    if V.ndim not in (1, 2):
        raise ValueError(f"V must be a vector or an (r, n) matrix; got an array with {V.ndim} dims")
    if not np.isfinite(V).all():
        raise ValueError("V must contain only finite values (found NaN or inf)")
    radius = float(radius)
    if not np.isfinite(radius) or radius <= 0.0:
        raise ValueError(f"radius must be a finite number > 0; got {radius!r}")
    if V.size == 0:
        return V.copy()
    if V.ndim == 1:
        return project_l1_ball_columns(V[:, None], radius)[:, 0]

    r = V.shape[0]
    # Work on the transpose, one contiguous row per column of V: numpy sorts and accumulates along
    # the last axis several times faster than along the first.
    VT = np.ascontiguousarray(V.T)  # (n, r)
    X = np.abs(VT)
    outside = X.sum(axis=1) > radius
    if not outside.any():
        return V.copy()
    all_out = bool(outside.all())
    if not all_out:
        X = X[outside]
    u = np.sort(X, axis=1)[:, ::-1].copy()  # each row sorted in decreasing order
    c = np.cumsum(u, axis=1)
    c -= radius
    k = np.arange(1, r + 1, dtype=float)
    # The set {k : u_k > c_k / k} is a prefix {1..rho} (Duchi et al., Lemma 2), so rho = its size.
    rho = np.count_nonzero(u * k > c, axis=1)
    theta = c[np.arange(rho.size), rho - 1] / rho
    np.maximum(theta, 0.0, out=theta)

    X -= theta[:, None]
    np.maximum(X, 0.0, out=X)
    if all_out:
        outT = np.copysign(X, VT)
    else:
        outT = VT
        outT[outside] = np.copysign(X, VT[outside])
    return np.ascontiguousarray(outT.T)
