"""`dpopt answer --out`: nothing is charged for answers that cannot be written, the ledger and the
data are never overwritten, and Ctrl-C leaves the answers file whole or absent with one line on stderr.

The refusals and the interrupts run in real processes (tests/answer_when_started.py); the message of
a write that fails after the charge is checked in this process, with the failure injected.
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
from pathlib import Path

import pandas as pd
import pytest
from answer_procs import (
    EPS,
    PROCESS_TIMEOUT,
    answer_args,
    run_together,
    spawn,
    wait_for_files,
    write_table,
)

import dpopt.release as rel
from dpopt.release import Charge, PrivacyLedger, read_ledger
from dpopt.release_cli import EXIT_BAD_INPUT, EXIT_INTERRUPTED, main


def _ledger_with_one_charge(path: Path) -> bytes:
    led = PrivacyLedger(1.0)
    led.charge(Charge(EPS, 0.0, EPS**2 / 2, "laplace", "earlier release"))
    path.write_text(json.dumps(led.to_dict()), encoding="utf-8")
    return path.read_bytes()


def _listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# --out as typed -> a pattern the one-line refusal must contain.  Each case gets its own folder
# holding the data t.csv, the ledger ledger.json (one charge of a budget of 1), link.json (a
# symbolic link to the ledger), a folder adir and a file file.txt.
BAD_OUT = {
    "missing folder": ("nowhere/a.csv", r"--out '.*nowhere/a.csv': folder '.*nowhere' does not exist"),
    "a folder": ("adir", r"--out '.*adir' is a folder; expected the path of a CSV file"),
    "under a file": ("file.txt/a.csv", r"--out '.*file.txt/a.csv': '.*file.txt' is not a folder"),
    "the ledger": ("ledger.json", r"--out '.*ledger.json' is the --ledger file"),
    "a link to the ledger": ("link.json", r"--out '.*link.json' is the --ledger file"),
    "the data": ("t.csv", r"--out '.*t.csv' is the --data file"),
}


def _bad_out_case(folder: Path, case: str) -> tuple[list[str], tuple]:
    """The folder of one BAD_OUT case, its `dpopt answer` arguments and a snapshot of the folder."""
    folder.mkdir()
    write_table(folder / "t.csv")
    _ledger_with_one_charge(folder / "ledger.json")
    (folder / "link.json").symlink_to(folder / "ledger.json")
    (folder / "adir").mkdir()
    (folder / "file.txt").write_text("not a folder")
    args = answer_args(folder / "t.csv", folder / "ledger.json", folder / BAD_OUT[case][0], 1.0)
    return args, _snapshot(folder)


def _snapshot(folder: Path) -> tuple:
    """Every name in the folder and the bytes of the ledger and the data."""
    return _listing(folder), (folder / "ledger.json").read_bytes(), (folder / "t.csv").read_bytes()


def test_out_in_a_missing_folder_is_refused_before_the_charge_in_a_process(tmp_path: Path) -> None:
    args, before = _bad_out_case(tmp_path / "case", "missing folder")
    ((code, stdout, err),) = run_together([args], tmp_path / "barrier")
    assert code == EXIT_BAD_INPUT and stdout == "" and err.count("\n") == 1, err
    assert re.search(BAD_OUT["missing folder"][1], err), err
    assert _snapshot(tmp_path / "case") == before  # nothing charged, no file created (lock, temp, answers)


@pytest.mark.parametrize("case", sorted(BAD_OUT))
def test_bad_out_is_refused_before_anything_is_charged(tmp_path: Path, case: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    args, before = _bad_out_case(tmp_path / "case", case)
    rc = main(["answer", *args])
    cap = capsys.readouterr()
    assert rc == EXIT_BAD_INPUT and cap.out == "" and cap.err.count("\n") == 1, cap.err
    assert re.search(BAD_OUT[case][1], cap.err), cap.err
    assert _snapshot(tmp_path / "case") == before  # nothing charged, written or created


def test_unwritable_out_folder_is_refused_before_the_charge(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    table, ledger, locked = write_table(tmp_path / "t.csv"), tmp_path / "ledger.json", tmp_path / "locked"
    before = _ledger_with_one_charge(ledger)
    locked.mkdir()
    locked.chmod(0o500)
    try:
        probe = locked / "probe"
        try:  # a process that may write anywhere (root) cannot be refused a folder
            probe.touch()
            probe.unlink()
            pytest.skip("this process can write into a read-only folder (running as root)")
        except PermissionError:
            pass
        rc = main(["answer", *answer_args(table, ledger, locked / "a.csv", 1.0)])
        err = capsys.readouterr().err
    finally:
        locked.chmod(0o700)
    assert rc == EXIT_BAD_INPUT and err.count("\n") == 1 and "--out" in err and "cannot write" in err, err
    assert ledger.read_bytes() == before and list(locked.iterdir()) == []


def _fail_to_csv(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_write_failing_after_the_charge_says_what_was_charged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    # The folder is writable (checked before the charge) but the disk fills while writing.
    table, ledger, out = write_table(tmp_path / "t.csv"), tmp_path / "ledger.json", tmp_path / "a.csv"
    monkeypatch.setattr(pd.DataFrame, "to_csv", _fail_to_csv)
    args = answer_args(table, ledger, out, 1.0)
    rc = main(["answer", *args])
    err = capsys.readouterr().err
    assert rc == EXIT_BAD_INPUT and err.count("\n") == 1 and "No space left on device" in err, err
    assert f"the ledger '{ledger}' was charged eps=0.25" in err and len(read_ledger(ledger).history) == 1
    # Without --ledger no ledger was charged and nothing was released: the message must not say otherwise.
    no_ledger = [*args[: args.index("--budget-epsilon")], "--out", str(out)]
    rc = main(["answer", *no_ledger])
    err = capsys.readouterr().err
    assert rc == EXIT_BAD_INPUT and err.count("\n") == 1 and "ledger" not in err and "nothing was released" in err
    assert not out.exists() and list(tmp_path.glob(".*.tmp")) == []


# -- Ctrl-C --------------------------------------------------------------------------------------------
# The steps of a release at which a process is interrupted (rel._pause_point), and those reached
# after its charge is on disk.
INT_STEPS = ["locked", "temp-written", "renamed", "noise-drawn", "answers-temp-written", "answers-written"]
CHARGED_BY = {"renamed", "noise-drawn", "answers-temp-written", "answers-written"}


def test_ctrl_c_at_every_step_leaves_whole_answers_or_none_and_says_so(tmp_path: Path) -> None:
    procs, markers, dirs = [], [], []
    for step in INT_STEPS:  # one process per step, all at once, each on its own ledger
        d = tmp_path / step
        d.mkdir()
        write_table(d / "t.csv")
        _ledger_with_one_charge(d / "ledger.json")
        markers.append(d / "paused")
        dirs.append(d)
        procs.append(spawn(answer_args(d / "t.csv", d / "ledger.json", d / "a.csv", 1.0),
                           env={rel.PAUSE_ENV: step, rel.PAUSE_MARKER_ENV: str(markers[-1])}))
    try:
        wait_for_files(markers, procs)
    finally:
        for p in procs:
            p.send_signal(signal.SIGINT)
        results = [p.communicate(timeout=PROCESS_TIMEOUT) for p in procs]
        for p in procs:
            p.kill()
    for step, d, p, (stdout, err) in zip(INT_STEPS, dirs, procs, results, strict=True):
        charged, written = step in CHARGED_BY, step == "answers-written"
        assert p.returncode == EXIT_INTERRUPTED and stdout == "", (step, err)
        assert err.count("\n") == 1 and "Traceback" not in err and "interrupted" in err, (step, err)
        ledger = d / "ledger.json"
        assert len(read_ledger(ledger).history) == 1 + charged, step
        assert (f"the ledger '{ledger}' was charged eps=0.25" in err) == charged, (step, err)
        assert (f"the ledger '{ledger}' was not charged" in err) == (not charged), (step, err)
        assert (d / "a.csv").exists() == written, step
        if written:  # whole: every query answered
            assert pd.read_csv(d / "a.csv")["query"].tolist() == ["a=0", "a=1", "a=2", "a=3"]
            assert f"answers were written to '{d / 'a.csv'}'" in err, (step, err)
        else:
            assert "no answers were written" in err, (step, err)
        assert list(d.glob(".*.tmp")) == [], step  # neither the ledger's nor the answers' temp file stays


def test_ctrl_c_inside_a_deferred_block_takes_effect_at_its_end() -> None:
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with rel.sigint_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            reached.append("end of block")
    assert reached == ["end of block"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
