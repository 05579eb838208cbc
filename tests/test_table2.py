"""Li and Miklau Table 2 (seed 004): SVD bounds and baseline error ratios, reproduced from the definitions.

Readings used (the library's definitions, stated once here):
- SVDB(W) = (1/n)(sum of singular values)^2 (Def. 4.1), computed from the closed-form Gram matrix;
- ratio = sens2(A)^2 ||W A^+||_F^2 / SVDB(W) (the (eps, delta) error over P * SVDB; P cancels);
- hierarchical = binary tree of 0/1 node sums down to single cells; wavelet = Haar with unnormalised +-1
  rows plus the total; multi-dimensional = Kronecker products of the 1-D strategies;
- ALLPREDICATE(n): Gram 2^(n-2) (I + 1 1^T) (Cor. 5.4).

Where the printed table differs from these readings the test states it:
- ALLPREDICATE(1024)'s SVD bound prints as 4.885e156; the definition gives 4.885e310 (the mantissa agrees;
  the value exceeds float64, so it is checked in log10), consistent with Cor. 5.4's closed form.
- ALLPREDICATE(1024)'s hierarchical and wavelet ratios are printed as 3.464 and 6.292; under the readings
  above the hierarchical strategy gives 6.292 and the wavelet 3.464: the two columns are swapped in print.
- ALLRANGE(2048)'s hierarchical ratio prints as 1.776; the binary hierarchical strategy gives 1.773.
- Eigen Design (last column): the eigen-design program (weights on the eigenvectors of W^T W, seed 003),
  solved to a certified relative gap <= 1e-8, gives 1.061 for ALLRANGE(2048) and 1.190 for
  ALLRANGE(64, 32). The printed 1.028 and 1.107 are reproduced by Li and Miklau's completion of that
  strategy (`complete_strategy`: one extra query per cell spends the sensitivity the weighted eigenvectors
  leave unused), 1.0278 and 1.1071. The gap between 1.061 and 1.028 was the definition, not the solver:
  the solver converges on both rows, and the numbers agree to all digits shown at gap 1e-6 and 1e-10.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpopt.baselines import (
    hierarchical_strategy,
    identity_strategy,
    kron_strategy,
    wavelet_strategy,
)
from dpopt.bounds import log10_svd_bound, svd_bound, svd_bound_from_gram
from dpopt.error import unit_error
from dpopt.solvers.eigen_design import solve_eigen_design
from dpopt.strategy import Strategy
from dpopt.workloads import AllPredicate, AllRange, Workload, all_range_nd


def ratio(strategy, workload: Workload) -> float:
    return strategy.sens2**2 * unit_error(strategy, workload) / svd_bound_from_gram(workload.gram())


def assert_prints_as(x: float, printed: float, digits: int = 4) -> None:
    """x shown to `digits` significant digits is `printed`: |x - printed| <= half a unit in its last digit.

    Every value checked here lies >= 0.019 units of that last digit (>= 8e-6 relative) from a rounding
    boundary, far beyond its own error (dense Cholesky/eigen at n <= 2048: n * cond * eps_mach <= 1e-9; the
    SVD bound's deliberate round-off lowering, <= 2e-7 relative; the eigen-design gap 1e-8), so the outcome
    does not depend on the last bits.
    """
    unit = 10.0 ** (math.floor(math.log10(abs(printed))) - digits + 1)
    assert abs(x - printed) <= 0.5 * unit, f"{x!r} does not print as {printed} to {digits} digits"


def baselines(sizes):
    if len(sizes) == 1:
        n = sizes[0]
        return identity_strategy(n), hierarchical_strategy(n), wavelet_strategy(n)
    n = math.prod(sizes)
    return (
        identity_strategy(n),
        kron_strategy([hierarchical_strategy(s) for s in sizes]),
        kron_strategy([wavelet_strategy(s) for s in sizes]),
    )


@pytest.mark.parametrize(
    "sizes, svdb, ident, hier, wave",
    [
        ([2048], 3.034e7, 47.25, 1.773, 1.545),  # printed hierarchical: 1.776 (see module docstring)
        ([64, 32], 2.261e7, 12.11, 2.996, 1.899),
        ([2] * 10, 5.242e5, 2.000, 2.000, 2.000),
    ],
)
def test_allrange_rows(sizes, svdb, ident, hier, wave):
    w = AllRange(sizes[0]) if len(sizes) == 1 else all_range_nd(sizes)
    assert_prints_as(svd_bound(w), svdb)
    i, h, v = baselines(sizes)
    assert_prints_as(ratio(i, w), ident)
    r_h = ratio(h, w)
    assert_prints_as(r_h, hier)
    if sizes == [2048]:
        assert abs(r_h / 1.776 - 1) < 0.005  # the printed value, within half a percent
    assert_prints_as(ratio(v, w), wave)


def test_allpredicate_1024_row():
    w = AllPredicate(1024)
    lg = log10_svd_bound(w)
    mantissa = 10 ** (lg - math.floor(lg))
    assert_prints_as(mantissa, 4.885)
    assert math.floor(lg) == 310  # printed exponent 156; see module docstring (lg = 310.689)
    n = 1024  # Cor. 5.4 closed form, in log10
    closed = (n - 2) * math.log10(2) - math.log10(n) + 2 * math.log10(n - 1 + math.sqrt(n + 1))
    # The bound is computed from the Gram's eigenvalues and only lowered by round-off: each of the n - 1
    # small eigenvalues carries an absolute error up to n * eps_mach * ||G||, relative n * eps_mach *
    # cond(G) = 1024 * 2.2e-16 * 1025 = 2.3e-10, i.e. ~1e-10 in log10. Below by at most 1e-9; above by no
    # more than the closed form's own round-off (~ 310 * eps_mach in log10 terms, within 1e-12).
    assert closed - 1e-9 <= lg <= closed + 1e-12
    assert math.isinf(svd_bound(w))  # beyond float64, reported as inf, never as a wrong finite number
    i, h, v = baselines([1024])
    assert_prints_as(ratio(i, w), 1.884)
    assert_prints_as(ratio(h, w), 6.292)  # printed under "Wavelet"
    assert_prints_as(ratio(v, w), 3.464)  # printed under "Hierarchical"


@pytest.mark.parametrize(
    "sizes, eigen, completed",
    [
        ([2048], 1.061, 1.028),  # printed 1.028; the solver used to stall here at gap 1.8e-8 > 1e-8
        pytest.param([64, 32], 1.190, 1.107, marks=pytest.mark.slow),  # printed 1.107
    ],
)
def test_eigen_design_column(sizes, eigen, completed):
    w = AllRange(sizes[0]) if len(sizes) == 1 else all_range_nd(sizes)
    G = w.gram()
    res = solve_eigen_design(G, tol=1e-8)
    assert res.success and 0.0 <= res.gap <= 1e-8, res.message
    lam = np.clip(res.extra["eigenvalues"], 0.0, None)
    svdb = float(np.sqrt(lam).sum() ** 2 / G.shape[0])  # Def. 4.1; the SVDB column is checked above
    assert_prints_as(res.fun / svdb, eigen)  # the converged eigen-design program
    # The completed strategy [A; diag(sqrt(c))], its error recomputed through Strategy like the other columns.
    A = np.vstack([res.extra["A"], np.diag(np.sqrt(res.extra["completion"]))])
    completed_strategy = Strategy(A, name="eigen-design, completed")
    # Column norms are 1 by construction (c = 1 - diag(A^T A)); two summations of n + k squares differ
    # by at most ~ 2n * eps_mach = 1e-12 relative at n = 2048.
    assert completed_strategy.sens2 == pytest.approx(1.0, rel=1e-12)
    # The same trace(G X^-1) two ways (Strategy's Cholesky on the true G vs the solver's on V^T V = G):
    # cond(X) ~ 1.3e3 at n = 2048, so n * cond * eps_mach ~ 6e-10 relative; compared at 1e-8. Compared
    # before dividing by an SVD bound, since svd_bound_from_gram is a deliberately lowered bound (here
    # 1.8e-7 below the eigenvalue sum the other svdb uses).
    unit = completed_strategy.sens2**2 * unit_error(completed_strategy, w)
    assert unit == pytest.approx(res.extra["completed_fun"], rel=1e-8)
    assert_prints_as(ratio(completed_strategy, w), completed)  # the printed value
