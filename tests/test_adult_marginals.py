"""Adult marginals end to end, spec hooks, and the HDMM-like mechanism's record."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import require_shared, shared_root

from dpopt.data import Domain, records
from dpopt.experiments import research_answers
from dpopt.hdmm import select_strategy
from dpopt.mechanisms.baselines import IdentityMechanism
from dpopt.mechanisms.hdmm import HDMMMechanism
from dpopt.privacy import Privacy
from dpopt.solvers.marginal_opt import residual_planner
from dpopt.specs import SpecError, parse_workload
from dpopt.workloads import AllRange, Kron, Marginals


def _need_adult() -> tuple[Path, Path, Path]:
    """(data folder, domain JSON, CSV) of the shared Adult data; skips (fails under CI=true) without them."""
    base = shared_root() / "data" / "adult"
    domain, csv = base / "adult-domain.json", base / "adult.csv"
    for path in (domain, csv):
        require_shared(str(path.relative_to(shared_root())))
    return shared_root() / "data", domain, csv


def test_adult_two_way_release_matches_expected_error():
    _, DOMAIN, CSV = _need_adult()
    w = parse_workload(f"marginals:{DOMAIN}:2")
    assert w.n_factors == 14 and len(w.subsets) == 91
    assert abs(w.n - 6.4e17) <= 0.05e17  # "6.4e17" to its printed digits
    priv = Privacy(1.0, 1e-6)
    sel = select_strategy(w, priv)
    assert sel.status == "optimal"
    # ResidualPlanner meets the SVD bound: two closed forms over the marginal algebra (hundreds of terms,
    # a few hundred eps at most)
    assert sel.error.total == pytest.approx(sel.bound, rel=1e-10)
    df = pd.read_csv(CSV)
    tables = records(df, Domain.from_json(DOMAIN))[0].table
    # tables come straight from the DataFrame: check one against pandas groupby
    t = tables((0, 8))
    g = df.groupby(["age", "sex"]).size()
    assert t.sum() == len(df)
    assert all(t[a, s] == n for (a, s), n in g.items())
    noisy, rel = research_answers(sel.strategy, w, tables, priv, np.random.default_rng(0))
    assert len(noisy) == 91 and noisy[0].shape == (85, 9)
    # 148,137 noisy cells: the realised total squared error concentrates around its expectation. Its
    # relative SD, over 30 seeds of this release, is 0.59%; 3% is 4 SDs with 25% allowed for the error of
    # an SD estimated from 30 replications.
    assert rel["realised_total_sq_error"] == pytest.approx(sel.error.total, rel=0.03)


def test_adult_eps_dp_release():
    _, DOMAIN, CSV = _need_adult()
    w = parse_workload(f"marginals:{DOMAIN}:2")
    priv = Privacy(1.0)
    sel = select_strategy(w, priv, restarts=1)
    df = pd.read_csv(CSV)
    tables = records(df, Domain.from_json(DOMAIN))[0].table
    _, rel = research_answers(sel.strategy, w, tables, priv, np.random.default_rng(1))
    # Laplace noise has heavier tails: the relative SD over 30 seeds is 1.0%; 5% is 4 SDs with 25% allowed
    # for the error of the SD estimate
    assert rel["realised_total_sq_error"] == pytest.approx(sel.error.total, rel=0.05)


def test_specs(tmp_path, monkeypatch):
    w = parse_workload("kron:prefix:256,identity:256")
    assert isinstance(w, Kron) and w.shape == (65536, 65536)
    small = parse_workload("kron:allrange:64,allrange:32")
    assert isinstance(small, Kron) and small.domain_sizes == (64, 32)  # one class at every size
    m = parse_workload("marginals:2x3x4:2")
    assert isinstance(m, Marginals) and len(m.subsets) == 3
    monkeypatch.setenv("DPOPT_DATA_DIR", str(tmp_path))
    with pytest.raises(SpecError, match="no domain file"):
        parse_workload("marginals:nosuchdata:2")
    with pytest.raises(SpecError, match="no domain file"):
        parse_workload(f"marginals:{tmp_path / 'missing.json'}:2")
    with pytest.raises(SpecError, match="integer"):
        parse_workload("marginals:2x3:two")
    (tmp_path / "toy").mkdir()
    (tmp_path / "toy" / "toy-domain.json").write_text('{"a": 3, "b": 2, "c": 4}')
    toy = parse_workload("marginals:toy:2")
    assert isinstance(toy, Marginals) and toy.domain_sizes == (3, 2, 4) and toy.attribute_names == ["a", "b", "c"]


def test_specs_adult(monkeypatch):
    DATA, DOMAIN, _ = _need_adult()
    monkeypatch.setenv("DPOPT_DATA_DIR", str(DATA))
    w = parse_workload("marginals:adult:2")
    assert isinstance(w, Marginals) and len(w.subsets) == 91
    w3 = parse_workload(f"marginals:{DOMAIN}:3")
    assert isinstance(w3, Marginals) and len(w3.subsets) == 364


def test_mechanism_record_has_the_shared_keys():
    small = AllRange(16)
    priv = Privacy(1.0, 1e-6)
    ref = IdentityMechanism().fit(small, priv).record()
    mech = HDMMMechanism().fit(small, priv)
    rec = mech.record()
    assert set(ref) <= set(rec)
    assert rec["expected_total_error"] <= ref["expected_total_error"]
    assert rec["ratio_to_bound"] >= 1 - 1e-12  # an error over its lower bound, up to round-off
    x = np.arange(16.0)
    assert mech.answer(x, np.random.default_rng(0)).shape == (small.m,)
    marg = Marginals([3, 4, 2], k=2)
    mm = HDMMMechanism().fit(marg, priv)
    strat, unit = residual_planner(marg)
    # the same closed form times the same factor, possibly in another order: a few ulps
    assert mm.record()["expected_total_error"] == pytest.approx(unit * priv.variance_factor, rel=1e-12)
    assert mm.answer(np.ones(24), np.random.default_rng(0)).shape == (marg.m,)
