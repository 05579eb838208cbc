"""The ledger file (dpopt.release.ledger_file): locking, write-ahead charges, refusal of bad files.

The process tests run the real `dpopt answer` code path (tests/answer_when_started.py calls
dpopt.release_cli.main) in separate processes: 8 started together against a budget for 3 releases,
and one process SIGKILLed at each of the 7 steps of a release.
"""

from __future__ import annotations

import json
import math
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from answer_procs import (
    EPS,
    PROCESS_TIMEOUT,
    answer_args,
    spawn,
    wait_for_files,
    write_table,
)

import dpopt.release as rel
from dpopt.data import Domain, IntegerRange
from dpopt.mechanisms import make_mechanism
from dpopt.privacy import Privacy
from dpopt.queries import identity_workload
from dpopt.release import (
    Charge,
    FileLedger,
    LedgerCorruptError,
    LedgerFileError,
    PrivacyLedger,
    ledger_file,
    read_ledger,
    release,
)
from dpopt.release_cli import EXIT_BAD_INPUT, EXIT_BUDGET, EXIT_OK, main

STEPS = ["before-lock", "locked", "loaded", "temp-written", "renamed", "noise-drawn",
         "answers-written"]
CHARGED_BY = {"renamed", "noise-drawn", "answers-written"}  # steps reached after the charge is on disk


def _charge(eps: float = EPS) -> Charge:
    return Charge(eps, 0.0, eps**2 / 2, "laplace", "earlier release")


def _write_state(path: Path, state: dict) -> None:
    path.write_text(json.dumps(state), encoding="utf-8")


def _ledger_with(path: Path, total: float, n_charges: int) -> None:
    led = PrivacyLedger(total)
    for _ in range(n_charges):
        led.charge(_charge())
    _write_state(path, led.to_dict())


@pytest.fixture
def table(tmp_path: Path) -> Path:
    return write_table(tmp_path / "t.csv")


# -- in one process -------------------------------------------------------------------------------
def test_file_ledger_round_trip_and_charge_outside_block(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    with ledger_file(path, create=(1.0, 0.0, "basic")) as led:
        assert isinstance(led, FileLedger) and led.history == []
        assert not path.exists()  # nothing written until something is charged
        led.charge(_charge())
        assert read_ledger(path).history == led.history  # on disk before charge() returned
    with pytest.raises(LedgerFileError, match="is not locked"):
        led.charge(_charge())
    assert len(read_ledger(path).history) == 1
    with ledger_file(path) as again:
        assert again.history == [_charge()] and again.remaining_epsilon == pytest.approx(0.75)
    with pytest.raises(LedgerFileError, match="not found"):
        with ledger_file(tmp_path / "absent.json"):
            pass
    # The lock is the folder's own (no lock file), so nothing but the ledger was created.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.json"]


def test_release_charges_the_file_before_drawing_noise(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ledger.json"
    dom = Domain([IntegerRange("a", 0, 3)])
    mech = make_mechanism("identity").fit(identity_workload(dom), Privacy(EPS))
    seen: list[int] = []
    plan = rel._noise_plan

    def spying_plan(*a, **k):
        noise, sens, scale, cost, meas = plan(*a, **k)

        def draw(values):
            seen.append(len(read_ledger(path).history))  # what is on disk when noise is drawn
            return meas(values)

        return noise, sens, scale, cost, draw

    monkeypatch.setattr(rel, "_noise_plan", spying_plan)
    with ledger_file(path, create=(2 * EPS, 0.0, "basic")) as led:
        release(mech, np.ones(4), led, domain=dom)
        release(mech, np.ones(4), led, domain=dom)
        with pytest.raises(rel.BudgetExceededError):
            release(mech, np.ones(4), led, domain=dom)
    assert seen == [1, 2]
    assert len(read_ledger(path).history) == 2


def test_lock_excludes_a_second_holder(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    _ledger_with(path, 1.0, 0)
    errors: list[BaseException] = []

    def second_holder() -> None:
        try:
            with ledger_file(path, timeout=0.2):
                pass
        except LedgerFileError as exc:
            errors.append(exc)

    with ledger_file(path):
        t0 = time.monotonic()
        other = threading.Thread(target=second_holder)  # another thread waits, then gives up
        other.start()
        other.join()
        assert time.monotonic() - t0 >= 0.2
        assert len(errors) == 1 and "stayed locked by another process" in str(errors[0])
        # The holding thread itself is refused at once rather than waiting for itself.
        with pytest.raises(LedgerFileError, match="this thread already holds the lock of its folder"):
            with ledger_file(path, timeout=60.0):
                pass
    with ledger_file(path, timeout=0.2) as led:  # free again once the first holder left
        led.charge(_charge())


def test_expected_totals_and_accounting_must_match(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    _ledger_with(path, 1.0, 1)
    with pytest.raises(LedgerFileError, match=r"has total_epsilon=1.0 but 2.0 was given"):
        read_ledger(path, {"total_epsilon": 2.0})
    with pytest.raises(LedgerFileError, match=r"has accounting='basic' but 'zcdp' was given"):
        with ledger_file(path, expect={"accounting": "zcdp"}):
            pass
    assert read_ledger(path, {"total_epsilon": 1.0, "total_delta": None}).spent_epsilon == EPS


# -- refused files --------------------------------------------------------------------------------
def _good_state() -> dict:
    led = PrivacyLedger(1.0, 1e-6)
    led.charge(Charge(0.5, 0.0, 0.125, "laplace", "first"))
    return led.to_dict()


def _mutated(change) -> dict:
    state = _good_state()
    change(state)
    return state


CORRUPT = {
    "overspent": (lambda s: s["history"].extend([s["history"][0]] * 2), "overspends the budget"),
    "negative epsilon": (lambda s: s["history"][0].update(epsilon=-5.0),
                         r"epsilon must be a finite number >= 0, got -5.0"),
    "negative rho": (lambda s: s["history"][0].update(rho=-1.0), "rho must be a finite number"),
    "delta of 1": (lambda s: s["history"][0].update(delta=1.0), r"delta must be .* in \[0, 1\)"),
    "unknown noise": (lambda s: s["history"][0].update(noise="uniform"), "noise must be one of"),
    "bool epsilon": (lambda s: s["history"][0].update(epsilon=True), "must be a number"),
    "unknown accounting": (lambda s: s.update(accounting="renyi"), "accounting must be"),
    "negative total": (lambda s: s.update(total_epsilon=-1.0), "total_epsilon must be"),
    "missing history": (lambda s: s.pop("history"), "expected exactly the keys"),
    "history not a list": (lambda s: s.update(history={}), "history must be a list"),
    "charge missing a key": (lambda s: s["history"][0].pop("rho"), "history entry 0 must be"),
}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_inconsistent_ledger_file_is_refused(tmp_path: Path, case: str) -> None:
    change, pattern = CORRUPT[case]
    path = tmp_path / "ledger.json"
    _write_state(path, _mutated(change))
    with pytest.raises(LedgerCorruptError, match=pattern):
        read_ledger(path)
    with pytest.raises(LedgerCorruptError, match="is corrupt"):
        with ledger_file(path, create=(1.0, 0.0, "basic")):
            pass


def test_non_finite_and_partial_files_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    text = json.dumps(_good_state(), indent=2)
    path.write_text(text.replace('"epsilon": 0.5', '"epsilon": NaN'), encoding="utf-8")
    with pytest.raises(LedgerCorruptError, match="non-finite number NaN"):
        read_ledger(path)
    for cut in (0, 1, len(text) // 3, len(text) // 2, len(text) - 1):  # a partly written file
        path.write_text(text[:cut], encoding="utf-8")
        with pytest.raises(LedgerCorruptError, match="not complete JSON"):
            read_ledger(path)
    path.write_text("[]", encoding="utf-8")
    with pytest.raises(LedgerCorruptError, match="expected a JSON object"):
        read_ledger(path)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["answer", "--quiet", *argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_cli_refuses_corrupt_ledger_and_leaves_it_alone(capsys, tmp_path: Path,
                                                        table: Path) -> None:
    path, out = tmp_path / "ledger.json", tmp_path / "out.csv"
    _write_state(path, _mutated(CORRUPT["overspent"][0]))
    before = path.read_text()
    rc, stdout, err = _run(capsys, *answer_args(table, path, out, 1.0))
    assert rc == EXIT_BAD_INPUT and stdout == "" and err.count("\n") == 1
    assert "ledger file" in err and "is corrupt" in err and "overspends the budget" in err
    assert path.read_text() == before and not out.exists()
    path.write_text(before[: len(before) // 2], encoding="utf-8")
    rc, _, err = _run(capsys, *answer_args(table, path, out, 1.0))
    assert rc == EXIT_BAD_INPUT and "not complete JSON" in err and not out.exists()


def test_cli_ledger_path_that_is_a_directory(capsys, tmp_path: Path, table: Path) -> None:
    adir = tmp_path / "adir"
    adir.mkdir()
    before = sorted(tmp_path.iterdir())
    rc, stdout, err = _run(capsys, *answer_args(table, adir, tmp_path / "out.csv", 1.0))
    assert rc == EXIT_BAD_INPUT and stdout == "" and err.count("\n") == 1
    assert "is a directory; expected the path of a JSON ledger file" in err
    assert sorted(tmp_path.iterdir()) == before and list(adir.iterdir()) == []


def test_ledger_file_api_refuses_a_directory_and_leaves_nothing(tmp_path: Path) -> None:
    adir = tmp_path / "adir"
    adir.mkdir()
    for use in (lambda: ledger_file(adir, create=(1.0, 0.0, "basic")).__enter__(),
                lambda: read_ledger(adir)):
        with pytest.raises(LedgerFileError, match="is a directory; expected the path of a JSON"):
            use()
    # No lock file, temp file or ledger beside it or inside it.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir"] and list(adir.iterdir()) == []


# -- processes ------------------------------------------------------------------------------------
def test_concurrent_cli_runs_never_overspend(tmp_path: Path, table: Path) -> None:
    n_procs, n_fit = 8, 3
    ledger, start = tmp_path / "ledger.json", tmp_path / "start"
    outs = [tmp_path / f"out{i}.csv" for i in range(n_procs)]
    ready = [tmp_path / f"ready{i}" for i in range(n_procs)]
    procs = [spawn(answer_args(table, ledger, outs[i], n_fit * EPS), str(ready[i]), str(start))
             for i in range(n_procs)]
    try:
        wait_for_files(ready, procs)
        start.touch()  # every process is past its imports: release them together
        results = [p.communicate(timeout=PROCESS_TIMEOUT) for p in procs]
    finally:
        for p in procs:
            p.kill()
    codes = [p.returncode for p in procs]
    assert sorted(codes) == [EXIT_OK] * n_fit + [EXIT_BUDGET] * (n_procs - n_fit), results
    for code, out, (_, err) in zip(codes, outs, results, strict=True):
        if code == EXIT_OK:
            assert len(pd.read_csv(out)) == 4
        else:
            assert not out.exists() and "privacy budget exceeded" in err
    led = read_ledger(ledger)
    assert len(led.history) == n_fit and led.spent_epsilon == pytest.approx(n_fit * EPS)
    assert sorted(p.name for p in tmp_path.glob(".ledger.json*")) == []  # no temp file left


def test_kill_at_every_step_leaves_a_ledger_covering_every_release(tmp_path: Path,
                                                                    table: Path) -> None:
    procs, markers, dirs = [], [], []
    for step in STEPS:  # one process per step, all running at once, each on its own ledger
        d = tmp_path / step
        d.mkdir()
        _ledger_with(d / "ledger.json", 1.0, 1)
        marker = d / "paused"
        env = {rel.PAUSE_ENV: step, rel.PAUSE_MARKER_ENV: str(marker)}
        procs.append(spawn(answer_args(table, d / "ledger.json", d / "out.csv", 1.0), env=env))
        markers.append(marker)
        dirs.append(d)
    try:
        wait_for_files(markers, procs)
    finally:
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.communicate(timeout=PROCESS_TIMEOUT)
    for step, d, p in zip(STEPS, dirs, procs, strict=True):
        assert p.returncode == -signal.SIGKILL and (d / "paused").read_text() == step
        led = read_ledger(d / "ledger.json")  # readable and consistent after the kill
        released = (d / "out.csv").exists() and (d / "out.csv").stat().st_size > 0
        assert released == (step == "answers-written"), step
        assert len(led.history) == 1 + (step in CHARGED_BY), step  # spent covers what was released
        assert led.spent_epsilon == pytest.approx(EPS * len(led.history))
        with ledger_file(d / "ledger.json", timeout=5.0) as again:  # the dead holder's lock is gone
            again.charge(_charge())
        assert not list(d.glob(".ledger.json.*.tmp")), step  # a crashed writer's temp file is removed
        assert math.isclose(read_ledger(d / "ledger.json").spent_epsilon,
                            EPS * (2 + (step in CHARGED_BY)))
