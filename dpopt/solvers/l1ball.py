"""Euclidean projection of matrix columns onto the L1 ball (the feasible set of LRM's L-step)."""

from __future__ import annotations

import numpy as np

from dpopt.validation import check_choice

METHODS = ("michelot", "sort")

# A pass of the pivot iteration runs on the columns that still move; once at most this fraction of
# the current working columns moves, those columns are gathered into a smaller array.
_COMPACT_FRACTION = 0.25


def project_l1_ball_columns(V: np.ndarray, radius: float = 1.0, *, method: str = "michelot") -> np.ndarray:
    """Projection onto the L1 ball, Formula (11) of seed 000 (LRM L-step feasible set), column by column.

    Projects every column v = V[:, j] onto {l : ||l||_1 <= radius}. For a column outside the ball
    the projection is sign(v) * max(|v| - theta, 0) with the unique theta > 0 such that
    sum_i max(|v_i| - theta, 0) = radius. Two ways of finding theta, vectorised over the columns:

    - "michelot" (default): the pivot iteration of Michelot (J. Optim. Theory Appl. 50, 1986),
      theta_{k+1} = (sum_{|v_i| > theta_k} |v_i| - radius) / #{i : |v_i| > theta_k}, started below
      theta; no sort, a few O(r) passes per column (see `_michelot_columns`).
    - "sort": the sort-based rule of Duchi, Shalev-Shwartz, Singer, Chandra (ICML 2008, Fig. 1),
      O(r log r) per column; kept as the reference.

    Both give the same result up to rounding (the thresholds are sums of the same numbers taken in
    different orders).

    Parameters
    ----------
    V : ndarray, shape (r, n) (or (r,), treated as one column)
        Matrix whose columns are projected.
    radius : float
        Radius of the L1 ball; must be finite and > 0.
    method : {"michelot", "sort"}
        How theta is found.

    Returns
    -------
    ndarray, same shape as V, C-contiguous float64
        Columns already inside the ball (||v||_1 <= radius) are returned bit-for-bit unchanged;
        the others lie on the sphere ||l||_1 = radius up to rounding.
    """
    check_choice(method, METHODS, "method")
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
        return project_l1_ball_columns(V[:, None], radius, method=method)[:, 0]
    if method == "sort":
        return _sort_columns(V, radius)
    return _michelot_columns(V, radius)


def _sort_columns(V: np.ndarray, radius: float) -> np.ndarray:
    """Sort-based L1-ball projection (Duchi, Shalev-Shwartz, Singer, Chandra, ICML 2008, Fig. 1).

    For a column outside the ball, let u = |v| sorted in decreasing order and c = cumsum(u); with
    rho = max{k : u_k - (c_k - radius) / k > 0} (1-based) and theta = (c_rho - radius) / rho,
    the projection is sign(v) * max(|v| - theta, 0). Cost O(r log r) per column.
    V: validated (r, n) float array with r, n >= 1; returns the (r, n) projection.
    """
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


def _michelot_columns(V: np.ndarray, radius: float) -> np.ndarray:
    """Michelot's pivot algorithm for the L1 ball (Michelot 1986; Condat, Math. Program. 158, 2016).

    Per column x = |v| (r entries) outside the ball, with theta* the projection threshold:
    theta_0 = max((sum x - radius) / r, max x - radius) <= theta*; then with S_k = {i : x_i > theta_k},
    theta_{k+1} = (sum_{S_k} x - radius) / |S_k|. If theta_k <= theta*, S_k holds the support of the
    projection, so theta_k <= theta_{k+1} <= theta*: the S_k shrink, and a column has converged
    (theta_{k+1} = theta*) at the first pass where |S_k| equals |S_{k-1}|; at most r + 1 passes.
    Entries at or below theta_k are zeroed in place (they never re-enter), so a converged column is
    a fixed point bit for bit. In floating point theta_{k+1} is kept >= theta_k (monotone, hence
    finite) and below max x (so S_k is never empty). Columns inside the ball keep theta = 0 and
    are returned unchanged (|v| - 0 and copysign are exact).

    V: validated (r, n) float array with r, n >= 1; returns the (r, n) projection, C-contiguous.
    Each pass costs a few vectorised O(r n_k) operations on the n_k columns still moving.
    """
    r, n = V.shape
    X = np.empty((r, n))
    np.abs(V, out=X)  # workspace, then the output
    s = X.sum(axis=0)
    if not (s > radius).any():
        return np.ascontiguousarray(V).copy()
    xmax = X.max(axis=0)
    theta = np.maximum((s - radius) / r, xmax - radius)
    np.maximum(theta, 0.0, out=theta)  # columns inside the ball: theta = 0
    cap = np.nextafter(xmax, 0.0)  # largest double below max x: the largest entry stays in S_k
    np.minimum(theta, cap, out=theta)

    cols = np.arange(n)  # columns of V held by the working array Xw
    Xw, th, cap_w = X, theta.copy(), cap
    prev = np.full(n, -1, dtype=np.intp)  # |S_{k-1}| per working column
    mask = np.empty((r, n), dtype=bool)
    for _ in range(r + 2):
        np.greater(Xw, th, out=mask)
        np.multiply(Xw, mask, out=Xw)
        count = np.add.reduce(mask, axis=0, dtype=np.intp)
        new = Xw.sum(axis=0)
        new -= radius
        new /= np.maximum(count, 1)  # count = 0 only for an all-zero column inside the ball
        np.maximum(new, th, out=new)
        np.minimum(new, cap_w, out=new)
        moving = count != prev
        th, prev = new, count
        n_moving = int(np.count_nonzero(moving))
        if n_moving == 0:
            break
        if n_moving <= _COMPACT_FRACTION * cols.size:
            theta[cols] = th
            keep = np.flatnonzero(moving)
            cols, th, prev, cap_w = cols[keep], th[keep], prev[keep], cap_w[keep]
            Xw = Xw[:, keep]  # a copy: X keeps entries the later passes would zero, harmlessly
            mask = np.empty(Xw.shape, dtype=bool)
    else:  # pragma: no cover - |S_k| decreases at every pass that does not stop
        raise RuntimeError("Michelot pivot iteration did not terminate within r + 2 passes")
    theta[cols] = th

    X -= theta
    np.maximum(X, 0.0, out=X)
    np.copysign(X, V, out=X)
    return X
