"""No way around the ledger file: deleted lock files, symbolic and hard links, other writers' temp
files, a file that is not UTF-8.

Every test here runs real processes (the `dpopt answer` code path through tests/answer_when_started.py,
or `python -c` on the Python API): the lock is only worth what it excludes in another process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from answer_procs import (
    EPS,
    PROCESS_TIMEOUT,
    answer_args,
    checkout_env,
    run_python,
    run_together,
    spawn,
    wait_for_files,
    write_table,
)

import dpopt.release as rel
from dpopt.release import (
    Charge,
    LedgerCorruptError,
    LedgerFileError,
    PrivacyLedger,
    ledger_file,
    read_ledger,
)
from dpopt.release_cli import EXIT_BAD_INPUT, EXIT_BUDGET, EXIT_OK, main


def _charge(label: str = "earlier release") -> Charge:
    return Charge(EPS, 0.0, EPS**2 / 2, "laplace", label)


def _ledger_with(path: Path, total: float, n_charges: int) -> None:
    led = PrivacyLedger(total)
    for _ in range(n_charges):
        led.charge(_charge())
    path.write_text(json.dumps(led.to_dict()), encoding="utf-8")


@pytest.fixture
def table(tmp_path: Path) -> Path:
    return write_table(tmp_path / "t.csv")


# -- item 1: the lock survives the deletion of any file beside the ledger ----------------------------
SECOND_HOLDER = """
import sys
from dpopt.release import Charge, LedgerFileError, ledger_file
try:
    with ledger_file(sys.argv[1], timeout=0.5) as led:
        led.charge(Charge(0.25, 0.0, 0.03125, "laplace", "second holder"))
    print("charged")
except LedgerFileError as exc:
    print("locked out" if "stayed locked" in str(exc) else f"refused: {exc}")
"""


def test_deleting_the_lock_file_does_not_let_a_second_process_in(tmp_path: Path, table: Path) -> None:
    # A release holds the ledger (paused after loading it, room for one more charge); every *.lock
    # file beside the ledger is deleted; a second process must still find the ledger locked.
    ledger, marker = tmp_path / "ledger.json", tmp_path / "paused"
    _ledger_with(ledger, 2 * EPS, 1)
    holder = spawn(answer_args(table, ledger, tmp_path / "a.csv", 2 * EPS),
                   env={rel.PAUSE_ENV: "loaded", rel.PAUSE_MARKER_ENV: str(marker)})
    try:
        wait_for_files([marker], [holder])
        for lock in tmp_path.glob("*.lock"):
            lock.unlink()
        second = run_python(SECOND_HOLDER, str(ledger))
    finally:
        holder.kill()
        holder.communicate(timeout=PROCESS_TIMEOUT)
    assert second.returncode == 0 and second.stdout.strip() == "locked out", second
    assert len(read_ledger(ledger).history) == 1


DELETER = """
import os, sys, time
folder, stop = sys.argv[1], sys.argv[2]
while not os.path.exists(stop):
    for name in os.listdir(folder):
        if name.endswith(".lock"):
            try:
                os.unlink(os.path.join(folder, name))
            except OSError:
                pass
    time.sleep(0.001)
"""


def test_concurrent_releases_while_lock_files_are_deleted_in_a_loop(tmp_path: Path, table: Path) -> None:
    # 8 releases started together on a budget for 3, while another process deletes every *.lock
    # file in the ledger's folder as fast as it can: 3 answer files, 3 charges, nothing overspent.
    n_procs, n_fit = 8, 3
    work = tmp_path / "work"
    work.mkdir()
    ledger, stop = work / "ledger.json", tmp_path / "stop"
    outs = [tmp_path / f"out{i}.csv" for i in range(n_procs)]
    deleter = subprocess.Popen([sys.executable, "-c", DELETER, str(work), str(stop)], env=checkout_env())
    try:
        results = run_together([answer_args(table, ledger, out, n_fit * EPS) for out in outs],
                               tmp_path / "barrier")
    finally:
        stop.touch()
        deleter.wait(timeout=PROCESS_TIMEOUT)
    codes = sorted(code for code, _, _ in results)
    assert codes == [EXIT_OK] * n_fit + [EXIT_BUDGET] * (n_procs - n_fit), results
    for code, _, err in results:
        assert code == EXIT_OK or "privacy budget exceeded" in err, err
    written = [out for out in outs if out.exists()]
    led = read_ledger(ledger)
    assert len(written) == len(led.history) == n_fit
    assert led.spent_epsilon == pytest.approx(n_fit * EPS) and led.remaining_epsilon >= 0
    assert all(len(pd.read_csv(out)) == 4 for out in written)


def test_cleanup_spares_the_temp_file_of_a_live_process(tmp_path: Path) -> None:
    # Temp files beside the ledger carry their writer's pid: one of a live process stays, one of a
    # process that has ended is removed (by a holder of the lock).
    ledger = tmp_path / "ledger.json"
    _ledger_with(ledger, 1.0, 0)
    ended = run_python("import os; print(os.getpid())")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        live_tmp = tmp_path / f".ledger.json.{live.pid}.0123abcd.tmp"
        dead_tmp = tmp_path / f".ledger.json.{int(ended.stdout)}.4567cdef.tmp"
        live_tmp.write_text("a write in progress")
        dead_tmp.write_text("left by a crash")
        with ledger_file(ledger) as led:
            led.charge(_charge())
        assert live_tmp.exists() and not dead_tmp.exists()
    finally:
        live.kill()
        live.wait(timeout=PROCESS_TIMEOUT)
    assert len(read_ledger(ledger).history) == 1


# -- item 2: links ------------------------------------------------------------------------------------
def test_symlinked_ledger_is_locked_and_charged_through_its_real_file(tmp_path: Path, table: Path) -> None:
    # Four releases started together, two through a symbolic link in another folder and two
    # through the real name, on a budget with room for two: both names share one lock and one file.
    real_dir, link_dir = tmp_path / "real", tmp_path / "links"
    real_dir.mkdir()
    link_dir.mkdir()
    ledger, link = real_dir / "ledger.json", link_dir / "ledger.json"
    _ledger_with(ledger, 3 * EPS, 1)
    link.symlink_to(ledger)
    outs = [tmp_path / f"out{i}.csv" for i in range(4)]
    results = run_together([answer_args(table, link if i % 2 else ledger, out, 3 * EPS)
                            for i, out in enumerate(outs)], tmp_path / "barrier")
    codes = sorted(code for code, _, _ in results)
    assert codes == [EXIT_OK] * 2 + [EXIT_BUDGET] * 2, results
    assert link.is_symlink() and link.resolve() == ledger  # the link is still a link to the ledger
    assert sorted(p.name for p in link_dir.iterdir()) == ["ledger.json"]  # nothing beside the link
    assert len(read_ledger(ledger).history) == 3 == 1 + sum(out.exists() for out in outs)


def test_hard_linked_ledger_is_refused_under_both_names(tmp_path: Path, table: Path) -> None:
    # A charge replaces the ledger by a rename, which would leave the other name with the old
    # budget: a ledger with two names is refused (exit 2, one line naming the file) and left alone.
    (tmp_path / "other").mkdir()
    ledger, second = tmp_path / "ledger.json", tmp_path / "other" / "copy.json"
    _ledger_with(ledger, 1.0, 1)
    os.link(ledger, second)
    before, inode = ledger.read_bytes(), ledger.stat().st_ino
    outs = [tmp_path / "a.csv", tmp_path / "b.csv"]
    results = run_together([answer_args(table, name, out, 1.0) for name, out in zip((ledger, second), outs,
                                                                                    strict=True)],
                           tmp_path / "barrier")
    for (code, stdout, err), name in zip(results, (ledger, second), strict=True):
        assert code == EXIT_BAD_INPUT and stdout == "" and err.count("\n") == 1, err
        assert str(name) in err and "2 names (hard links)" in err, err
    for name in (ledger, second):
        assert name.read_bytes() == before and name.stat().st_ino == inode
    assert not any(out.exists() for out in outs)
    with pytest.raises(LedgerFileError, match="hard links"):
        with ledger_file(second):
            pass


# -- a file that is not a UTF-8 ledger ----------------------------------------------------------------
def test_ledger_not_in_utf8_is_refused_naming_the_file(tmp_path: Path, table: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    ledger = tmp_path / "ledger.json"
    led = PrivacyLedger(1.0)
    led.charge(_charge("café census"))  # a label with a two-byte UTF-8 character, written unescaped
    text = json.dumps(led.to_dict(), ensure_ascii=False)
    encoded = text.encode("utf-8")
    cut = encoded.index("é".encode()) + 1  # truncated in the middle of that character
    for content in (text.encode("utf-16"), encoded[:cut]):
        ledger.write_bytes(content)
        with pytest.raises(LedgerCorruptError, match=f"ledger file '{ledger}' is corrupt"):
            read_ledger(ledger)
        rc = main(["answer", *answer_args(table, ledger, tmp_path / "a.csv", 1.0)])
        err = capsys.readouterr().err
        assert rc == EXIT_BAD_INPUT and err.count("\n") == 1 and str(ledger) in err and "UTF-8" in err, err
        assert ledger.read_bytes() == content and not (tmp_path / "a.csv").exists()


def test_sigkilled_holder_of_a_symlinked_ledger_leaves_it_usable(tmp_path: Path, table: Path) -> None:
    # A release through a link killed right after writing its temp file: the temp sits beside the
    # real file (not the link) and the next holder removes it and charges the real file.
    (tmp_path / "links").mkdir()
    ledger, link, marker = tmp_path / "ledger.json", tmp_path / "links" / "l.json", tmp_path / "paused"
    _ledger_with(ledger, 1.0, 1)
    link.symlink_to(ledger)
    proc = spawn(answer_args(table, link, tmp_path / "a.csv", 1.0),
                 env={rel.PAUSE_ENV: "temp-written", rel.PAUSE_MARKER_ENV: str(marker)})
    try:
        wait_for_files([marker], [proc])
        assert len(list(tmp_path.glob(".ledger.json.*.tmp"))) == 1
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=PROCESS_TIMEOUT)
    with ledger_file(link) as led:
        led.charge(_charge())
    assert not list(tmp_path.glob(".ledger.json.*.tmp")) and link.is_symlink()
    assert len(read_ledger(ledger).history) == 2
