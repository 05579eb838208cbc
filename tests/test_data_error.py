"""data_error (DPBench's scaled error) against a plain numpy recomputation, and `dpopt compare --data`.

The identity mechanism under eps-DP answers W (x + z) with z_i ~ Laplace(1/eps) drawn by rng.laplace in cell
order (`Privacy.sample_noise`), so the same seed redraws the same z here; both sides are the same few
floating-point sums, so they agree to 1e-12 relative.
"""

from __future__ import annotations

import contextlib
import io
import json
import math

import numpy as np
import pytest

from dpopt.cli import main
from dpopt.error import data_error, data_samples
from dpopt.mechanisms import make_mechanism
from dpopt.privacy import Privacy
from dpopt.workloads import Prefix

RTOL = 1e-12


def _plain(W: np.ndarray, X: np.ndarray, trials: int, seed: int, eps: float) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    errs = []
    for x in X:
        for _ in range(trials):
            z = rng.laplace(0.0, 1.0 / eps, size=x.size)
            errs.append(np.sqrt(np.sum((W @ x - W @ (x + z)) ** 2)) / W.shape[0] / x.sum())
    errs = np.array(errs)
    return errs.mean(), errs.std(ddof=1) / np.sqrt(errs.size)


def test_identity_data_error_matches_numpy():
    n, eps = 16, 0.5
    X = np.random.default_rng(1).integers(0, 20, size=(3, n)).astype(float)
    mech = make_mechanism("identity").fit(Prefix(n), Privacy(eps))
    got = data_error(mech.answer, Prefix(n), X, 4, np.random.default_rng(7))
    W = np.tril(np.ones((n, n)))
    want = _plain(W, X, 4, 7, eps)
    assert got[0] == pytest.approx(want[0], rel=RTOL)
    assert got[1] == pytest.approx(want[1], rel=RTOL)


def test_one_draw_has_no_standard_error():
    mean, se = data_error(lambda x, rng: np.zeros(4), Prefix(4), np.array([1.0, 0, 0, 3]), 1,
                          np.random.default_rng(0))
    # W x = (1, 1, 1, 4): ||W x|| / m / sum(x) = sqrt(19) / 4 / 4
    assert mean == pytest.approx(math.sqrt(19) / 16, rel=RTOL)
    assert math.isnan(se)


@pytest.mark.parametrize("bad, why", [(np.array([1.0, -1, 2, 3]), "negative"), (np.zeros(4), "sum to 0"),
                                      (np.ones(5), "shape")])
def test_bad_data_refused(bad, why):
    with pytest.raises(ValueError, match=why):
        data_samples(bad, 4)


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_compare_data_flag(tmp_path):
    n = 16
    X = np.random.default_rng(2).integers(0, 9, size=(2, n))
    path = tmp_path / "x.npy"
    np.save(path, X)
    code, out, _ = _run("compare", "-w", f"prefix:{n}", "-e", "1", "-m", "identity,wavelet", "-f", "json",
                        "--data", f"npy:{path}", "--trials", "3", "--seed", "5")
    assert code == 0
    recs = {r["mechanism"]: r for r in json.loads(out)}
    want = _plain(np.tril(np.ones((n, n))), X.astype(float), 3, 5, 1.0)
    assert recs["identity"]["data_error"] == pytest.approx(want[0], rel=RTOL)
    assert recs["identity"]["data_error_se"] == pytest.approx(want[1], rel=RTOL)
    assert recs["wavelet"]["data_error"] > 0


def test_compare_data_flag_refusals(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.ones(5))
    code, _, err = _run("compare", "-w", "prefix:16", "-e", "1", "-m", "identity", "--data", f"npy:{path}")
    assert code == 2 and "--data" in err and "expected 16 cells" in err
    code, _, err = _run("compare", "-w", "prefix:16", "-e", "1", "-m", "identity", "--data", str(path))
    assert code == 2 and "npy:PATH" in err
    code, _, err = _run("compare", "-w", "prefix:5", "-e", "1", "-m", "identity", "--data", f"npy:{path}",
                        "--trials", "0")
    assert code == 2 and "--trials" in err


def test_compare_reports_each_data_run_to_its_progress():
    # a data-dependent mechanism chooses its strategy in every run: each of the K_s x trials runs is reported
    from dpopt.compare import DataRuns, _fit_row

    class Recorder:
        def __init__(self) -> None:
            self.events: list[dict] = []

        def start(self, name: str) -> None: ...
        def note(self, text: str) -> None: ...
        def finish(self) -> None: ...

        def event(self, info: dict) -> None:
            self.events.append(info)

    rec = Recorder()
    X = np.random.default_rng(0).integers(0, 5, (3, 16)).astype(float)
    row = _fit_row("dawa-opt", Prefix(16), Privacy(1.0), None, lambda n: 0.0, rec, data=DataRuns(X, trials=2))
    assert np.isfinite(row["data_error"])
    runs = [e["stage"] for e in rec.events if str(e.get("stage", "")).startswith("data run")]
    assert runs == [f"data run {i} of 6" for i in range(1, 7)]
