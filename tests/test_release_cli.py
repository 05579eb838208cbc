"""`dpopt answer` (dpopt.release_cli): specs, exit statuses, one-line errors, the ledger file."""

from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import require_shared

from dpopt.data import Categorical, Domain, IntegerRange, NumericBins, histogram
from dpopt.mechanisms import make_mechanism
from dpopt.privacy import Privacy
from dpopt.release_cli import DEFAULT_FAIR_DOMAIN, CliError, main, parse_domain
from dpopt.specs import parse_workload

COLUMNS = "query,answer,std,noise,noise_scale,mode,mechanism,strategy,epsilon,delta"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["answer", "--quiet", *argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.fixture
def people(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"age": rng.integers(18, 60, 300), "sex": rng.choice(["F", "M"], 300),
                       "income": rng.uniform(0, 9e4, 300)})
    f = tmp_path / "people.csv"
    df.to_csv(f, index=False)
    return f


SPEC = "age=int:18..59;sex=cat:F|M;income=bins:0|20000|50000|inf"


def test_parse_specs() -> None:
    dom = parse_domain(SPEC)
    assert dom.attributes == (IntegerRange("age", 18, 59), Categorical("sex", ["F", "M"]),
                              NumericBins("income", [0, 20000, 50000, np.inf]))
    W = parse_workload("marginal:sex;predicate:age=20..29&sex=F;range:income;total", dom)
    assert W.row_labels()[:3] == ["sex=F", "sex=M", "20 <= age <= 29 & sex=F"]
    assert W.row_labels()[-1] == "total" and W.shape == (2 + 1 + 6 + 1, dom.size)
    assert parse_workload("predicate:sex=F|M", dom).row_labels() == ["sex in {F, M}"]
    fair = parse_domain("fair:children,age")
    assert fair.names == ("children", "age")  # the order typed: the order of the cells and the answers
    assert parse_workload("predicate:age=22..32", fair).row_labels() == ["22 <= age <= 32"]
    for bad, pattern in [("age=int:1..x", "age=int:1..x"), ("age", "must look like"),
                         ("age=real:1..2", "kind must be int, cat or bins"),
                         ("nowhere.json", "not found")]:
        with pytest.raises(CliError, match=pattern):
            parse_domain(bad)
    for bad, pattern in [("cube:2", "expected total, identity"), ("marginals:two", "must be an integer in 1..3"),
                         ("predicate:sex=X", r"'X' is not a level"),
                         ("predicate:age=old", "not an integer"), ("", "empty workload spec"),
                         (" ; ", "is empty")]:
        with pytest.raises(CliError, match=pattern):
            parse_workload(bad, dom)


def test_default_embedded_dataset_and_ledger_file(capsys, tmp_path: Path) -> None:
    out, led = tmp_path / "a.csv", tmp_path / "ledger.json"
    rc, _, err = _run(capsys, "--epsilon", "0.5", "--out", str(out), "--ledger", str(led),
                      "--budget-epsilon", "0.8")
    assert rc == 0, err
    ans = pd.read_csv(out)
    assert ",".join(ans.columns) == COLUMNS
    assert len(ans) == 5 + 6 + 4  # 1-way marginals of rate_marriage, children, religious
    assert (ans["mode"] == "release").all() and (ans["noise_scale"] == 1 / 0.5).all()
    assert json.loads(led.read_text())["history"][0]["epsilon"] == pytest.approx(0.5)
    # A second release of 0.5 would overspend the 0.8 budget: exit 3, nothing written.
    before = led.read_text()
    out2 = tmp_path / "b.csv"
    rc, _, err = _run(capsys, "--epsilon", "0.5", "--out", str(out2), "--ledger", str(led))
    assert rc == 3 and "privacy budget exceeded" in err and "remaining (eps=0.3" in err
    assert not out2.exists() and led.read_text() == before
    rc, _, err = _run(capsys, "--epsilon", "0.1", "--ledger", str(led), "--budget-epsilon", "5")
    assert rc == 2 and "has total_epsilon=0.8 but 5.0 was given" in err and "cannot change" in err


@pytest.mark.parametrize(
    ("extra", "pattern"),
    [
        (["--epsilon", "-1"], "epsilon must be a finite number > 0, got -1.0"),
        (["--epsilon", "1", "--delta", "1.5"], r"delta must lie in \[0, 1\)"),
        (["--epsilon", "1", "--workload", "marginal:height"], "unknown attribute 'height'"),
        (["--epsilon", "1", "--mechanism", "nope"], "unknown mechanism 'nope'"),
        (["--epsilon", "1", "--data", "missing.csv", "--domain", SPEC], "not found"),
    ],
)
def test_bad_input_exits_2_with_one_line(capsys, extra: list[str], pattern: str) -> None:
    rc, out, err = _run(capsys, *extra)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("dpopt answer: error:")
    assert re.search(pattern, err)


def test_csv_with_inline_domain(capsys, people: Path, tmp_path: Path) -> None:
    out = tmp_path / "a.csv"
    rc, _, err = _run(capsys, "--data", str(people), "--domain", SPEC, "--workload",
                      "marginal:sex;predicate:age=20..29&sex=F", "--epsilon", "1", "--delta",
                      "1e-6", "--mechanism", "hierarchical", "--out", str(out))
    assert rc == 0, err
    ans = pd.read_csv(out)
    assert ans["query"].tolist() == ["sex=F", "sex=M", "20 <= age <= 29 & sex=F"]
    assert (ans["noise"] == "gaussian").all() and (ans["delta"] == 1e-6).all()
    # Out-of-domain data: a one-line error naming the column and value, unless asked to drop.
    rc, _, err = _run(capsys, "--data", str(people), "--domain",
                      "age=int:18..40;sex=cat:F|M", "--epsilon", "1", "--out", str(out))
    assert rc == 2 and "column 'age': value" in err and "outside the domain" in err
    rc, _, err = _run(capsys, "--data", str(people), "--domain", "age=int:18..40;sex=cat:F|M",
                      "--epsilon", "1", "--out", str(out), "--on-invalid", "drop")
    assert rc == 0, err
    rc, _, err = _run(capsys, "--data", str(people), "--epsilon", "1")
    assert rc == 2 and "--domain SPEC is required" in err


def _iid_laplace_mismatch(err: np.ndarray, std: float) -> str | None:
    """Why err (n independent answers' errors) is not zero-mean Laplace noise of std ``std``.

    z = err / std: |mean z| must be below 5 standard errors 1/sqrt(n); mean z^2 (E = 1, Var z^2 =
    kurtosis - 1 = 5 for Laplace) within 5 sqrt(5/n) of 1, which a std off by a factor 2 (mean z^2
    of 4 or 1/4) misses for n >= 250.
    """
    n, z = err.size, err / std
    if abs(z.mean()) >= 5 / math.sqrt(n):
        return f"mean error {z.mean():.3f} std is not 0"
    if abs((z**2).mean() - 1) >= 5 * math.sqrt(5 / n):
        return f"mean z^2 {(z**2).mean():.3f} is not 1"
    return None


def test_adult_csv_with_json_domain(capsys, tmp_path: Path) -> None:
    require_shared("data/adult/adult.csv")
    adult = require_shared("data/adult/adult-domain.json").parent
    out = tmp_path / "a.csv"
    rc, _, err = _run(capsys, "--data", str(adult / "adult.csv"), "--domain",
                      f"{adult / 'adult-domain.json'}:sex,race", "--workload", "marginal:sex,race",
                      "--epsilon", "1", "--mechanism", "identity", "--out", str(out))
    assert rc == 0, err
    ans = pd.read_csv(out)
    assert ans["query"].iloc[0] == "sex=0 & race=0" and len(ans) == 10  # the columns in the order typed
    # Every cell of (age, race, sex), 850 independent Laplace answers in one run, against the true
    # counts: a wrong data vector, cell order or noise scale (a factor 2 either way) fails.
    rc, _, err = _run(capsys, "--data", str(adult / "adult.csv"), "--domain",
                      f"{adult / 'adult-domain.json'}:age,race,sex", "--workload", "identity",
                      "--epsilon", "0.5", "--mechanism", "identity", "--out", str(out))
    assert rc == 0, err
    ans = pd.read_csv(out)
    dom = Domain.from_json(adult / "adult-domain.json").project(["age", "race", "sex"])
    truth = histogram(pd.read_csv(adult / "adult.csv"), dom)[0]
    assert ans["query"].tolist() == dom.cell_labels()
    std = ans["std"].to_numpy()
    assert (std == math.sqrt(2) / 0.5).all()  # Laplace b = sens1 / eps = 2, std b sqrt(2)
    err_ = ans["answer"].to_numpy() - truth
    assert _iid_laplace_mismatch(err_, std[0]) is None
    assert _iid_laplace_mismatch(err_, 2 * std[0]) is not None
    assert _iid_laplace_mismatch(err_, std[0] / 2) is not None
    assert _iid_laplace_mismatch(err_ + 0.5 * std[0], std[0]) is not None  # a bias of std / 2


def test_csv_without_rows_is_refused(capsys, tmp_path: Path) -> None:
    data, out, ledger = tmp_path / "empty.csv", tmp_path / "a.csv", tmp_path / "ledger.json"
    data.write_text("age,sex\n", encoding="utf-8")
    rc, stdout, err = _run(capsys, "--data", str(data), "--domain", "age=int:18..59;sex=cat:F|M",
                           "--epsilon", "1", "--out", str(out), "--ledger", str(ledger))
    assert rc == 2 and stdout == "" and "has no rows (only a header)" in err
    assert not out.exists() and not ledger.exists()
    # Rows that are all dropped as invalid leave nothing to count either.
    data.write_text("age,sex\n99,F\n", encoding="utf-8")
    rc, _, err = _run(capsys, "--data", str(data), "--domain", "age=int:18..59;sex=cat:F|M",
                      "--epsilon", "1", "--out", str(out), "--on-invalid", "drop")
    assert rc == 2 and "was counted" in err and not out.exists()


def test_help_is_complete(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["answer", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for needle in ("domain SPEC", "workload SPEC", "exit status", "--ledger", "mode (=release)",
                   "not tracked across runs", "OpenDP certifies"):
        assert needle in text


NOT_TRACKED = "is not tracked across runs"


def test_release_without_ledger_says_it_is_not_tracked(capsys, tmp_path: Path) -> None:
    # Two runs without --ledger both release: nothing tracks them, and stderr says so instead of
    # reporting a "budget left" that no later run would see (also under --quiet, as a warning).
    for _ in range(2):
        rc, _, err = _run(capsys, "--epsilon", "0.5", "--out", str(tmp_path / "a.csv"))
        assert rc == 0 and NOT_TRACKED in err and "--ledger FILE" in err
        assert "budget left" not in err and "spent eps=0.5, delta=0" in err
    # With --ledger the budget left is reported (progress messages on, no --quiet).
    rc = main(["answer", "--epsilon", "0.5", "--out", str(tmp_path / "b.csv"), "--ledger",
               str(tmp_path / "ledger.json"), "--budget-epsilon", "2"])
    err = capsys.readouterr().err
    assert rc == 0 and "budget left: eps=1.5, delta=0" in err and NOT_TRACKED not in err


@pytest.mark.parametrize("flags", [["--budget-epsilon", "2"], ["--budget-delta", "1e-6"],
                                   ["--accounting", "zcdp"]])
def test_budget_options_need_a_ledger(capsys, tmp_path: Path, flags: list[str]) -> None:
    out = tmp_path / "a.csv"
    rc, stdout, err = _run(capsys, "--epsilon", "0.5", "--delta", "1e-6", "--out", str(out), *flags)
    assert rc == 2 and stdout == "" and err.count("\n") == 1 and not out.exists()
    assert f"{flags[0]} needs --ledger FILE" in err


def test_cli_gaussian_charge_covers_opendp_certificate(capsys, tmp_path: Path) -> None:
    # The identity strategy measures each cell once: sens2 = 1.  OpenDP's certificate for the
    # sigma the output reports, recomputed here, must not exceed the eps charged to the ledger.
    import opendp.prelude as dp

    out, led = tmp_path / "a.csv", tmp_path / "ledger.json"
    rc, _, err = _run(capsys, "--epsilon", "1", "--delta", "1e-6", "--mechanism", "identity",
                      "--out", str(out), "--ledger", str(led))
    assert rc == 0, err
    sigma = float(pd.read_csv(out)["noise_scale"].iloc[0])
    dp.enable_features("contrib")
    space = dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.l2_distance(T=float)
    meas = dp.m.make_gaussian(*space, scale=sigma)
    certified = dp.c.make_zCDP_to_approxDP(meas).map(1.0).epsilon(1e-6)
    (charge,) = json.loads(led.read_text())["history"]
    assert charge["epsilon"] >= certified and charge["delta"] == 1e-6
    assert charge["rho"] >= meas.map(1.0)


def test_answers_name_the_strategy_actually_used(capsys: pytest.CaptureFixture[str]) -> None:
    # Under eps-DP, mm-optimal's L2-optimised strategy loses to identity on the Fair 2-way marginals and
    # identity is returned: the CSV says so in its strategy column (the mechanism column keeps the name asked).
    rc, out, _ = _run(capsys, "--epsilon", "1", "--workload", "marginals:2", "--mechanism", "mm-optimal")
    assert rc == 0
    df = pd.read_csv(io.StringIO(out))
    assert (df["mechanism"] == "mm-optimal").all() and (df["strategy"] == "identity").all()
    ident = make_mechanism("identity").fit(parse_workload("marginals:2", parse_domain(DEFAULT_FAIR_DOMAIN)),
                                           Privacy(1.0))
    # identity's per-query std at eps = 1: Laplace b = 1 (sens1 = 1), std sqrt(2) per cell, summed cells
    np.testing.assert_allclose(df["std"] ** 2, ident.query_unit_variances() * 2.0, rtol=1e-12)
    rc, out, _ = _run(capsys, "--epsilon", "1", "--delta", "1e-6", "--workload", "marginals:2",
                      "--mechanism", "mm-optimal")
    assert rc == 0 and (pd.read_csv(io.StringIO(out))["strategy"] == "optimal").all()
