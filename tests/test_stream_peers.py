"""benchmarks/bench_stream_peers.py: dpopt's side runs without the peer, both sides are scored by
one scale-invariant loss, the peer's runner stays free of dpopt, and the committed table agrees with itself."""

from __future__ import annotations

import ast
import signal
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from benchmarks import bench_stream_peers as bench
from benchmarks.child import run_command
from dpopt.streaming.base import dense_losses
from dpopt.streaming.families import FAMILIES
from dpopt.streaming.participation import Participation
from dpopt.workloads import Prefix

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def test_the_peer_runner_imports_nothing_from_dpopt() -> None:
    """It runs under the peer's venv, where neither dpopt nor this repository's benchmarks package is installed."""
    tree = ast.parse((ROOT / "benchmarks" / "peer_jax_privacy.py").read_text())
    names = [a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names]
    names += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert not [m for m in names if m.split(".")[0] in ("dpopt", "benchmarks", "formulations")]
    assert "jax_privacy.matrix_factorization" in names


def test_score_is_dpopt_dense_loss_and_invariant_to_the_scale_of_C() -> None:
    """Scaling C by s scales sens^2 by s^2 and ||A C^-1||^2 by 1 / s^2: a few roundings apart (1e-12 relative)."""
    n, k = 32, 4
    f = FAMILIES["blt"](Prefix(n), Participation(n, k), buffers=2)
    for objective, index in (("mean", 0), ("max", 1)):
        loss, sens2 = bench.score(f.C, n, k, objective)
        assert loss == dense_losses(Prefix(n), f.C, Participation(n, k))[index]
        assert bench.score(3.0 * f.C, n, k, objective)[0] == pytest.approx(loss, rel=1e-12)
        assert sens2 == pytest.approx(f.sensitivity, rel=1e-12)


def test_peer_unavailable_is_reported_with_the_reason(tmp_path: Path) -> None:
    ok, why = bench.peer_available(str(tmp_path / "no-python"))
    assert not ok and "does not exist" in why
    ok, why = bench.peer_available(None)
    assert not ok and "--jax-python" in why


def test_quick_run_without_the_peer_writes_dpopt_side_only(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(bench, "RESULTS", tmp_path)
    monkeypatch.setattr(sys, "argv", ["bench", "--quick", "--classes", "dense,toeplitz",
                                      "--jax-python", str(tmp_path / "no-python")])
    bench.main()
    df = pd.read_csv(tmp_path / "stream_peers.csv")
    assert list(df["n"].unique()) == [128] and sorted(df["epochs"].unique()) == [1, 4]
    assert df["peer_loss"].isna().all() and df["loss_ratio"].isna().all()
    text = (tmp_path / "stream_peers.md").read_text()
    assert "Peer: not run" in text
    for row in df[df["class"] == "toeplitz"].to_dict("records"):
        # the same deterministic fit in the benchmark's child; its L-BFGS stops at a relative decrease of 1e-12
        # of the log loss, so another BLAS thread count may stop it within about 1e-6 of the same loss
        f = FAMILIES["toeplitz"](Prefix(128), Participation(128, int(row["epochs"])))
        assert row["ours_loss"] == pytest.approx(f.mean_loss, rel=1e-6)
    dense = df[df["class"] == "dense"]
    if not FAMILIES.available("optimal"):
        assert (dense["ours_status"] == "not in this build").all()


def test_require_peer_refuses_to_write_a_table_without_it(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(bench, "RESULTS", tmp_path)
    monkeypatch.setattr(sys, "argv", ["bench", "--quick", "--require-peer", "--jax-python", str(tmp_path / "none")])
    with pytest.raises(SystemExit) as exc:
        bench.main()
    assert exc.value.code == 2
    assert "--require-peer" in capsys.readouterr().err
    assert not (tmp_path / "stream_peers.csv").exists()


def test_cpu_limit_ends_a_busy_child_whatever_the_load() -> None:
    run = run_command([sys.executable, "-c", "while True: pass"], budget=600.0, cpu_limit=1.0)
    assert run.returncode in (-signal.SIGXCPU, -signal.SIGKILL)
    # the kernel checks RLIMIT_CPU on its tick-sampled CPU time, and getrusage may read a tick or two less
    assert run.cpu >= 0.5


def _committed() -> pd.DataFrame | None:
    path = RESULTS / "stream_peers.csv"
    return pd.read_csv(path) if path.exists() else None


@pytest.mark.skipif(_committed() is None, reason="no committed stream_peers table")
def test_committed_table_agrees_with_itself() -> None:
    """Ratios and the bound flag are computed from the printed full-precision columns: equal to 1e-12."""
    df = _committed()
    both = df.dropna(subset=["peer_loss", "ours_loss"])
    assert np.allclose(both["loss_ratio"], both["ours_loss"] / both["peer_loss"], rtol=1e-12)
    cpu = df.dropna(subset=["peer_cpu", "ours_cpu", "peer_loss"])  # no ratio for a peer run without a loss
    assert np.allclose(cpu["cpu_ratio"], cpu["peer_cpu"] / cpu["ours_cpu"], rtol=1e-12)
    assert df[df["peer_loss"].isna()]["cpu_ratio"].isna().all()
    flagged = df.dropna(subset=["peer_loss", "bound"])
    assert (flagged["peer_above_bound"].astype(str) == (flagged["peer_loss"] >= flagged["bound"]).astype(str)).all()
    # the certified bound is below every dpopt family's loss on the same instance as well
    ours = df.dropna(subset=["ours_loss", "bound"])
    assert (ours["ours_loss"] >= ours["bound"]).all()


def _our_rows() -> list:
    df = _committed()
    if df is None:
        return []
    cheap = df[df["class"].isin(["banded_toeplitz", "toeplitz", "blt"])].dropna(subset=["ours_loss"])
    return [pytest.param(r, marks=[pytest.mark.slow] if r["n"] > 1024 else [],
                         id=f"{r['class']}-{r['n']}-{r['epochs']}-{r['objective']}") for r in cheap.to_dict("records")]


@pytest.mark.parametrize("row", _our_rows())
def test_committed_dpopt_losses_are_reached_again(row: dict) -> None:
    """The Toeplitz-structured families (a second each; the rest are slow): their L-BFGS stops at a relative decrease
    of 1e-12 of the log loss, so a run may stop a little above or below the committed loss, never 1e-6 above it."""
    name, opts = bench.family_call(str(row["ours"]))
    n, k = int(row["n"]), int(row["epochs"])
    f = FAMILIES[name](Prefix(n), Participation(n, k), objective=row["objective"], **opts)
    assert f.loss <= row["ours_loss"] * (1 + 1e-6)


def test_a_child_error_is_named_by_its_exception_line() -> None:
    # an exception whose message runs over several lines (jax-privacy's BLT optimiser prints the failing BLT after
    # it): the row names the exception, not the message's last line
    from benchmarks.child import ChildRun

    err = ("Traceback (most recent call last):\n  File \"peer.py\", line 9, in <module>\n"
           "RuntimeError: Optimization produced BLT with non-finite loss inf:\nBufferedToeplitz.build(\n"
           "    buf_decay=[0.99, 0.98])\nInitial Toeplitz coefs=[1.00000, 0.50631])")
    assert ChildRun(1, "", err, 1.0, 1.0).last_error_line() == (
        "RuntimeError: Optimization produced BLT with non-finite loss inf:")
    assert ChildRun(1, "", "no traceback here\nlast words", 1.0, 1.0).last_error_line() == "last words"
