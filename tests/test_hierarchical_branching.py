"""hierarchical chooses its branching as Qardaji, Yang and Li 2013 do (HB), and says which.

Qardaji et al. report b = 16 as the optimal branching for large 1-D domains under eps-DP; Eq. (3) is evaluated
here by hand at two sizes. The HB strategy leaves the root out, so its rows are the nodes below the root.
"""

from __future__ import annotations

import pytest

from dpopt.baselines import (
    hierarchical_strategy,
    qardaji_branching,
    qardaji_hierarchy,
    qardaji_variance,
)
from dpopt.mechanisms import make_mechanism
from dpopt.privacy import Privacy
from dpopt.workloads import AllRange, Kron, Prefix


def test_eq3_by_hand():
    # n = 4096: b = 16 has h = 3: 15 * 27 - 2 * 17 * 9 / 3 = 303; b = 2 has h = 12: 1728 - 2 * 3 * 144 / 3 = 1440
    assert qardaji_variance(4096, 16) == 15 * 27 - 2 * 17 * 9 / 3
    assert qardaji_variance(4096, 2) == 1728 - 2 * 3 * 144 / 3
    assert qardaji_variance(4096, 16, gaussian=True) == (15 * 27 - 2 * 17 * 9 / 3) / 3


@pytest.mark.parametrize("n", [256, 4096, 65536])
def test_large_domains_branch_16(n):
    assert qardaji_branching(n) == 16


def test_hb_strategy_at_4096():
    s = qardaji_hierarchy(Prefix(4096), gaussian=False)
    assert s.name == "hierarchical(b=16, no root)"
    assert s.shape == (16 + 256 + 4096, 4096)
    assert s.sens1 == 3.0


def test_mechanism_builds_hb_and_names_it():
    mech = make_mechanism("hierarchical").fit(Prefix(256), Privacy(1.0))
    assert mech.strategy_.name == "hierarchical(b=16, no root)"
    assert mech.strategy_.shape == (16 + 256, 256)
    assert "Qardaji" in mech.fit_info_.message


def test_given_branching_keeps_the_rooted_tree():
    mech = make_mechanism("hierarchical", branching=2).fit(Prefix(64), Privacy(1.0))
    assert mech.strategy_.name == "hierarchical(b=2)"
    assert mech.strategy_.shape[0] == 127


@pytest.mark.parametrize("workload", [Prefix(256), AllRange(256)])
def test_hb_beats_the_binary_tree_under_eps_dp(workload):
    # both errors are exact closed forms; HB's is below the binary tree's by a factor > 1.5 at n = 256
    hb = make_mechanism("hierarchical").fit(workload, Privacy(1.0)).expected_error_.total
    binary = hierarchical_strategy(256, 2).expected_error(workload, Privacy(1.0)).total
    assert hb < binary / 1.5


def test_per_dimension_on_kron():
    # Eq. (3) picks b = n (one level: the cells) at n = 32 and b = 16 at n = 16
    mech = make_mechanism("hierarchical").fit(Kron([Prefix(32), Prefix(16)]), Privacy(1.0))
    assert mech.strategy_.name == "kron(hierarchical(b=32, no root),hierarchical(b=16, no root))"
    with pytest.raises(ValueError, match="branching"):
        make_mechanism("hierarchical", branching=1)
