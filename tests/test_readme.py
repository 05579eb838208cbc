"""Every code example in README.md runs as written.

Each ```python block runs in a fresh namespace in an empty temporary folder. Each shell command (lines of
indented or ```sh-fenced blocks that start with `dpopt` or `make`, backslash continuations joined) runs
there through the installed `dpopt` script, after the Python blocks before it in the same section and with
the section's ```toml blocks written to the file name the text gives them (`grid.toml`). The shared
folder is out of reach (DPOPT_SHARED and DPOPT_DATA_DIR point at a folder that does not exist), as on a
fresh `pip install`. Commands listed in SKIP are not run, each for the reason given; those in SLOW run
only in `make test-slow`; every other command runs in the default test run.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"

# Commands not run, with the reason (each must still appear in README.md, see test_lists_name_readme_commands).
SKIP = {
    "make demo": "the Makefile's own target: builds .venv and installs dpopt; its two commands are "
                 "dpopt compare / dpopt answer runs like the ones tested here",
    "make test": "the test suite itself",
    "dpopt reproduce lrm-fig6 --full --repetitions 1 --epsilon 0.1 --cache runs/":
        "the paper's n range: hours for the full-rank LRM families on two cores (README says so)",
    "dpopt compare -w prefix:4096 -e 0.1 -m identity,hierarchical,wavelet,dawa-opt "
    "--data npy:../shared/data/dpbench/1D/ADULTFRANK.n4096.npy --trials 5":
        "the DPBench vectors are in the shared folder, out of reach here as on a fresh install; "
        "tests/test_data_error.py runs --data on a file it writes",
}
# Commands run only with -m slow, with their cost.
SLOW = {
    "dpopt reproduce li-miklau-table2": "minutes at the default scale",
    "dpopt crossval --quick": "about a minute: every solver pair beside its CVXPY model",
    "dpopt sweep grid.toml --out results.csv": "54 tasks, about 15 s",
}

SHELL_LANGS = ("sh", "bash", "shell", "console")
COMMANDS = ("dpopt", "make")


@dataclass
class Block:
    section: str
    kind: str  # "python", "toml" or "shell"
    text: str
    line: int
    name: str = ""  # file name of a toml block
    commands: list[str] = field(default_factory=list)


def _commands(lines: list[str]) -> list[str]:
    """The commands of a shell block: `dpopt`/`make` lines, continuations joined, comments dropped."""
    out: list[str] = []
    joined = ""
    for raw in lines:
        line = raw.strip()
        if line.endswith("\\"):
            joined += line[:-1] + " "
            continue
        joined += line
        tokens = shlex.split(joined, comments=True)
        if tokens and tokens[0] in COMMANDS:
            out.append(shlex.join(tokens))
        joined = ""
    return out


def parse_readme(text: str) -> list[Block]:
    """The README's code blocks in order, each with its section (## heading)."""
    lines = text.splitlines()
    blocks: list[Block] = []
    section = ""
    prose: list[str] = []  # text since the last block, to find a toml block's file name
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section, prose = line[3:].strip(), []
            i += 1
            continue
        fence = re.match(r"^```\s*(\w*)\s*$", line)
        if fence:
            lang = fence.group(1).lower()
            start = i + 1
            j = start
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            if j == len(lines):
                raise AssertionError(f"README.md line {i + 1}: unclosed code fence")
            body = lines[start:j]
            if lang == "python":
                blocks.append(Block(section, "python", "\n".join(body) + "\n", i + 1))
            elif lang == "toml":
                names = re.findall(r"`([\w./-]+\.toml)`", "\n".join(prose))
                if not names:
                    raise AssertionError(f"README.md line {i + 1}: no `NAME.toml` in the text before this toml block")
                blocks.append(Block(section, "toml", "\n".join(body) + "\n", i + 1, name=names[-1]))
            elif lang in SHELL_LANGS:
                blocks.append(Block(section, "shell", "\n".join(body), i + 1, commands=_commands(body)))
            else:
                raise AssertionError(f"README.md line {i + 1}: code block language {lang!r} is not known to this test")
            prose = []
            i = j + 1
            continue
        if line.startswith("    ") and (i == 0 or not lines[i - 1].strip()):
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                j += 1
            body = [s for s in lines[i:j]]
            while body and not body[-1].strip():
                body.pop()
            first = body[0].split()
            if first and first[0] in COMMANDS:  # a shell block (the layout listing is not one)
                blocks.append(Block(section, "shell", "\n".join(body), i + 1, commands=_commands(body)))
                prose = []
            i = j
            continue
        prose.append(line)
        i += 1
    return blocks


BLOCKS = parse_readme(README.read_text())
PYTHON = [b for b in BLOCKS if b.kind == "python"]
SHELL = [(b, c) for b in BLOCKS if b.kind == "shell" for c in b.commands]


def _dpopt() -> str:
    exe = Path(sys.executable).with_name("dpopt")
    return str(exe) if exe.exists() else (shutil.which("dpopt") or "dpopt")


@pytest.fixture
def fresh_install_env(tmp_path, monkeypatch):
    """An empty working folder, and no shared folder reachable (as after a fresh pip install)."""
    work = tmp_path / "work"
    work.mkdir()
    absent = tmp_path / "no-shared-folder"
    monkeypatch.setenv("DPOPT_SHARED", str(absent))
    monkeypatch.setenv("DPOPT_DATA_DIR", str(absent / "data"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.chdir(work)
    return work


def run_python_block(block: Block) -> dict:
    code = compile(block.text, f"README.md:{block.line}", "exec")
    namespace: dict = {"__name__": "__readme__"}
    exec(code, namespace)  # noqa: S102 - the README's own example
    return namespace


def prepare_section(block: Block, upto_line: int, work: Path) -> None:
    """Write the section's toml blocks and run its Python blocks that come before line `upto_line`."""
    for b in BLOCKS:
        if b.section != block.section:
            continue
        if b.kind == "toml":
            (work / b.name).write_text(b.text)
        elif b.kind == "python" and b.line < upto_line:
            run_python_block(b)


def run_command(command: str, work: Path) -> subprocess.CompletedProcess:
    argv = shlex.split(command)
    assert argv[0] == "dpopt", f"only dpopt commands are run here: {command}"
    return subprocess.run([_dpopt(), *argv[1:]], cwd=work, capture_output=True, text=True, env=os.environ.copy())


def _check_command(block: Block, command: str, work: Path) -> None:
    prepare_section(block, block.line, work)
    res = run_command(command, work)
    assert res.returncode == 0, (
        f"README.md line {block.line}: `{command}` exited {res.returncode}\n{res.stderr[-3000:]}")
    argv = shlex.split(command)
    if "--out" in argv:
        out = argv[argv.index("--out") + 1]
        if out != "-":
            assert (work / out).exists(), f"`{command}` wrote no {out}"


def _id(block: Block, command: str = "") -> str:
    return f"line{block.line}:{command[:60]}" if command else f"line{block.line}"


def test_readme_has_examples():
    assert PYTHON and SHELL
    assert any(b.kind == "toml" for b in BLOCKS)


def test_lists_name_readme_commands():
    """Every skipped or slow command is still in README.md (a changed command must be reconsidered)."""
    commands = {c for _, c in SHELL}
    assert not (set(SKIP) | set(SLOW)) - commands, sorted((set(SKIP) | set(SLOW)) - commands)


@pytest.mark.parametrize("block", PYTHON, ids=[_id(b) for b in PYTHON])
def test_python_block_runs(block, fresh_install_env):
    run_python_block(block)


def test_csv_block_releases_labelled_answers(fresh_install_env):
    """The release example returns release-mode answers for the sex marginal over the five rows written."""
    block = next(b for b in PYTHON if "release(" in b.text)
    ns = run_python_block(block)
    df = ns["release"](ns["mech"], ns["x"], ns["PrivacyLedger"](1.0), domain=ns["dom"])
    assert (df["mode"] == "release").all() and len(df) == 2
    assert ns["x"].sum() == 5


FAST = [(b, c) for b, c in SHELL if c not in SKIP and c not in SLOW]
HEAVY = [(b, c) for b, c in SHELL if c in SLOW]


@pytest.mark.parametrize(("block", "command"), FAST, ids=[_id(b, c) for b, c in FAST])
def test_shell_command_runs(block, command, fresh_install_env):
    if "--family optimal" in command:
        from dpopt.streaming.families import FAMILIES

        if not FAMILIES.available("optimal"):
            pytest.skip("runs once the optimal family (dpopt.streaming.optimal) is in this build")
    _check_command(block, command, fresh_install_env)


@pytest.mark.slow
@pytest.mark.parametrize(("block", "command"), HEAVY, ids=[_id(b, c) for b, c in HEAVY])
def test_slow_shell_command_runs(block, command, fresh_install_env):
    _check_command(block, command, fresh_install_env)
