"""Every example in `dpopt ... --help` runs on a fresh install: no shared data folder, only what ships.

The examples are read from the help texts themselves, so a new or changed example is tested as it stands:

- command lines: lines that start with `dpopt ` (backslash continuations joined), run as written;
- workload specs after "e.g." in a help text (`e.g. kron:allrange:64,allrange:32`): `dpopt compare` on that
  spec with cheap mechanisms;
- `e.g. --workload "..."` in `dpopt answer --help`: `dpopt answer` on its default (embedded) data with it;
- the sweep config after "config file (TOML or JSON), e.g.:" in `dpopt sweep --help`: run by `dpopt sweep`.

Every other "e.g." must be listed in NOT_RUNNABLE with the reason. Each run has DPOPT_SHARED and DPOPT_DATA_DIR
pointing at a folder that does not exist, so nothing can read ../shared beside the checkout.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SUBCOMMANDS = ("", "compare", "answer", "reproduce", "crossval", "sweep", "factorize")

# "e.g." values that are not examples one can run on their own, with the reason.
NOT_RUNNABLE = {
    "tcp://host:8786": "a Dask scheduler address; needs a running cluster",
    "--x 8192": "a flag value for `dpopt reproduce NAME`; which figures have x = 8192 depends on NAME "
                "(tests/test_reproduce.py covers --x)",
}
# Examples that are known to fail on a fresh install until their help text changes (text owned elsewhere):
# run, and expected to fail, so the test notices when the text is fixed (then delete the entry).
NEEDS_NEW_TEXT: dict[str, str] = {}
# Placeholder lines of the sweep config example, left out when it runs, with the reason.
SWEEP_PLACEHOLDERS = {
    'data = "npy:PATH"': "an optional data vector at a PATH the reader supplies",
}


def _dpopt() -> str:
    exe = Path(sys.executable).with_name("dpopt")
    return str(exe) if exe.exists() else (shutil.which("dpopt") or "dpopt")


def _env(tmp: Path) -> dict[str, str]:
    absent = tmp / "no-shared-folder"
    return dict(os.environ, DPOPT_SHARED=str(absent), DPOPT_DATA_DIR=str(absent / "data"), COLUMNS="200",
                MPLBACKEND="Agg")


def _help(sub: str) -> str:
    """`dpopt [sub] --help` as the console script prints it (in this process: one import for all of them)."""
    from dpopt.cli import main

    out = io.StringIO()
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "200"  # no wrapping inside an example
    try:
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
            main([*([sub] if sub else []), "--help"])
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved
    assert exit_.value.code in (0, None)
    return out.getvalue()


HELP = {sub: _help(sub) for sub in SUBCOMMANDS}


def command_lines(text: str) -> list[str]:
    """Lines starting with `dpopt ` (continuations joined), normalised by shlex."""
    out, joined = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not joined and not line.startswith("dpopt "):
            continue
        if line.endswith("\\"):
            joined += line[:-1] + " "
            continue
        out.append(shlex.join(shlex.split(joined + line, comments=True)))
        joined = ""
    return out


def eg_values(text: str) -> list[str]:
    """What follows each "e.g." up to the end of the example: a quoted flag fragment, or one token."""
    vals = []
    for m in re.finditer(r"e\.g\.(:?)[ \t]*(.*)", text):
        if m.group(1) == ":":
            continue  # "e.g.:" introduces a block (the sweep config), read by sweep_config
        rest = m.group(2)
        flag = re.match(r"(--[\w-]+)\s+(\"[^\"]*\"|'[^']*'|\S+?)(?=[\s:,)]|$)", rest)
        if flag:
            vals.append(shlex.join(shlex.split(f"{flag.group(1)} {flag.group(2)}")))
        else:
            vals.append(re.match(r"\S+", rest).group(0).rstrip(").,;"))
    return vals


def is_workload_spec(value: str) -> bool:
    return re.fullmatch(r"[a-z][a-z-]*:\S+", value) is not None and "://" not in value


def sweep_config(text: str) -> str:
    """The config example of `dpopt sweep --help`: the indented lines after "e.g.:"."""
    lines = text.split("config file (TOML or JSON), e.g.:", 1)[1].splitlines()[1:]
    body = []
    for line in lines:
        if not line.startswith("  "):
            break
        body.append(line[2:])
    return "\n".join(body) + "\n"


EXAMPLES: list[tuple[str, str, str]] = []  # (subcommand, kind, example)
for _sub, _text in HELP.items():
    EXAMPLES += [(_sub, "command", c) for c in command_lines(_text)]
    for _v in eg_values(_text):
        if _v in NOT_RUNNABLE:
            kind = "not-runnable"
        elif _v.startswith("--workload ") and _sub == "answer":
            kind = "answer-workload"
        elif is_workload_spec(_v):
            kind = "workload-spec"
        else:
            kind = "unknown"
        EXAMPLES.append((_sub, kind, _v))


def _run(argv: list[str], tmp: Path) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=tmp, capture_output=True, text=True, env=_env(tmp))


def _expect(example: str, res: subprocess.CompletedProcess) -> None:
    if example in NEEDS_NEW_TEXT:
        assert res.returncode != 0, f"{example!r} runs now: delete its NEEDS_NEW_TEXT entry"
        pytest.xfail(NEEDS_NEW_TEXT[example])
    assert res.returncode == 0, f"help example {example!r} failed on a fresh install:\n{res.stderr[-3000:]}"


def test_examples_are_found():
    kinds = {k for _, k, _ in EXAMPLES}
    assert {"command", "workload-spec", "answer-workload"} <= kinds
    assert "marginals:adult:2" not in {v for _, _, v in EXAMPLES}


def test_every_example_is_classified():
    unknown = [(s, v) for s, k, v in EXAMPLES if k == "unknown"]
    assert not unknown, f"'e.g.' values this test does not know how to run (add a rule or NOT_RUNNABLE): {unknown}"


def _ids(items):
    return [f"{s or 'dpopt'}:{v[:50]}" for s, _, v in items]


COMMANDS = [e for e in EXAMPLES if e[1] == "command"]
SPECS = [e for e in EXAMPLES if e[1] == "workload-spec"]
ANSWER_WORKLOADS = [e for e in EXAMPLES if e[1] == "answer-workload"]


@pytest.mark.parametrize(("sub", "kind", "example"), COMMANDS, ids=_ids(COMMANDS))
def test_command_example_runs(sub, kind, example, tmp_path):
    argv = shlex.split(example)
    res = _run([_dpopt(), *argv[1:]], tmp_path)
    _expect(example, res)


@pytest.mark.parametrize(("sub", "kind", "example"), SPECS, ids=_ids(SPECS))
def test_workload_spec_example_runs(sub, kind, example, tmp_path):
    # identity on dense workloads, hdmm on the implicit ones (where identity is skipped): both cheap
    res = _run([_dpopt(), "compare", "--workload", example, "--epsilon", "1", "--mechanisms", "identity,hdmm",
                "--format", "json"], tmp_path)
    _expect(example, res)
    rows = [r for r in json.loads(res.stdout) if r.get("expected_total_error") is not None]
    assert rows and all(r["expected_total_error"] > 0 for r in rows), res.stdout[:2000]


@pytest.mark.parametrize(("sub", "kind", "example"), ANSWER_WORKLOADS, ids=_ids(ANSWER_WORKLOADS))
def test_answer_workload_example_runs(sub, kind, example, tmp_path):
    res = _run([_dpopt(), "answer", *shlex.split(example), "--epsilon", "1", "--quiet", "--out", "a.csv"], tmp_path)
    _expect(example, res)
    assert (tmp_path / "a.csv").stat().st_size > 0


@pytest.mark.slow
def test_sweep_config_example_runs(tmp_path):
    """Slow: 192 tasks, about 15 s."""
    config = sweep_config(HELP["sweep"])
    assert "workloads" in config and "[sizes]" in config
    lines = config.splitlines()
    for placeholder in SWEEP_PLACEHOLDERS:
        assert sum(line.split("#")[0].strip() == placeholder for line in lines) == 1, placeholder
    kept = [line for line in lines if line.split("#")[0].strip() not in SWEEP_PLACEHOLDERS]
    (tmp_path / "grid.toml").write_text("\n".join(kept) + "\n")
    res = _run([_dpopt(), "sweep", "grid.toml", "--workers", "0", "--no-progress", "--out", "out.csv"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    import pandas as pd

    df = pd.read_csv(tmp_path / "out.csv")
    assert len(df) > 0 and (df["expected_total_error"] > 0).all()
