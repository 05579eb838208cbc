"""ARCHITECTURE.md stays true to the code.

- Every `module:qualname` in its tables imports and resolves; the function column holds exactly one and
  no function has two rows.
- Where a row's source cites a seed ("seed 004"), the function's docstring names that seed; a seed marked
  with a star ("seed 004*") is named by the module's docstring instead and not by the function's own.
- Every file or folder named in "Central types" exists, and every name listed after it on the same
  item resolves in that module; every dotted `dpopt.*` / `formulations.*` name in "Direction of
  imports" resolves, and the module-level imports of dpopt and formulations form no cycle.

Nothing here runs a solver: importing the modules is the only cost.
"""

from __future__ import annotations

import importlib
import inspect
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "ARCHITECTURE.md"

TYPES_HEADING = "Central types"
IMPORTS_HEADING = "Direction of imports"
TABLES_HEADING = "Paper equations and algorithms"
COLUMNS = ("source", "what it is", "function", "role")
# The tables list every function that cites a paper; far fewer rows means the parser lost them.
MIN_ROWS = 60
MIN_TYPE_PATHS = 15

REF = re.compile(r"`([A-Za-z_][\w.]*):([A-Za-z_][\w.]*)`")
SEED = re.compile(r"\bseed (\d{3})(\*?)", re.IGNORECASE)
TICKED = re.compile(r"`([^`]+)`")
IDENT = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
PATH = re.compile(r"[\w.-]+(?:/[\w.-]+)*/?")
DOTTED = re.compile(r"(?:dpopt|formulations)(?:\.\w+)+")


@dataclass(frozen=True)
class Row:
    """One table row: its line in ARCHITECTURE.md and its cells by column name."""

    line: int
    cells: dict[str, str]

    @property
    def label(self) -> str:
        return f"ARCHITECTURE.md line {self.line} ({self.cells['source']} / {self.cells['what it is']})"


def _doc_lines() -> list[str]:
    assert DOC.is_file(), f"{DOC} is missing"
    return DOC.read_text(encoding="utf-8").splitlines()


def _section(heading: str) -> list[tuple[int, str]]:
    """(line number, text) of every line under the `## heading` section, up to the next `## `."""
    lines = _doc_lines()
    starts = [i for i, line in enumerate(lines) if line.startswith("## ") and line[3:].strip() == heading]
    assert len(starts) == 1, f"ARCHITECTURE.md must have exactly one '## {heading}' section"
    out = []
    for i in range(starts[0] + 1, len(lines)):
        if lines[i].startswith("## "):
            break
        out.append((i + 1, lines[i]))
    return out


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _rows() -> list[Row]:
    """Every data row of the tables whose header is COLUMNS, in the paper-equations section."""
    rows: list[Row] = []
    header: list[str] | None = None
    for number, line in _section(TABLES_HEADING):
        if not line.startswith("|"):
            header = None
            continue
        cells = _cells(line)
        if header is None:
            header = [c.lower() for c in cells]
            assert tuple(header) == COLUMNS, f"ARCHITECTURE.md line {number}: table header {header}, expected {COLUMNS}"
            continue
        if all(set(c) <= set("-: ") for c in cells):
            continue  # the separator line
        assert len(cells) == len(header), (
            f"ARCHITECTURE.md line {number}: {len(cells)} cells for {len(header)} columns (a '|' inside a cell?)"
        )
        rows.append(Row(number, dict(zip(header, cells, strict=True))))
    return rows


ROWS = _rows()


def _resolve(module: str, qualname: str) -> Any:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _resolve_dotted(name: str) -> Any:
    """`a.b.c.d`: import the longest importable module prefix, then follow attributes."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for part in parts[i:]:
            obj = getattr(obj, part)
        return obj
    raise ModuleNotFoundError(name)


def _function_ref(row: Row) -> tuple[str, str]:
    refs = REF.findall(row.cells["function"])
    assert len(refs) == 1, f"{row.label}: the function column must hold exactly one `module:qualname`, got {refs}"
    return refs[0]


def test_tables_are_parsed() -> None:
    assert len(ROWS) >= MIN_ROWS, f"only {len(ROWS)} table rows parsed from ARCHITECTURE.md; expected >= {MIN_ROWS}"
    seen: dict[tuple[str, str], int] = {}
    for row in ROWS:
        ref = _function_ref(row)
        assert ref not in seen, f"{row.label}: {ref[0]}:{ref[1]} already has a row (line {seen[ref]})"
        seen[ref] = row.line


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"line{r.line}")
def test_every_reference_resolves(row: Row) -> None:
    for column, text in row.cells.items():
        for module, qualname in REF.findall(text):
            try:
                _resolve(module, qualname)
            except (ImportError, AttributeError) as exc:
                pytest.fail(f"{row.label}: {column} names {module}:{qualname}, which does not resolve: {exc}")


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"line{r.line}")
def test_docstring_names_the_seed(row: Row) -> None:
    module, qualname = _function_ref(row)
    try:
        obj = _resolve(module, qualname)
    except (ImportError, AttributeError) as exc:
        pytest.fail(f"{row.label}: {module}:{qualname} does not resolve: {exc}")
    own = inspect.getdoc(obj) or ""
    module_doc = inspect.getdoc(importlib.import_module(module)) or ""
    for seed, star in SEED.findall(row.cells["source"]):
        cites = re.compile(rf"\bseed {seed}\b", re.IGNORECASE)
        if star:
            assert cites.search(module_doc), (
                f"{row.label}: source says seed {seed}*, but the docstring of module {module} does not name seed {seed}"
            )
            assert not cites.search(own), (
                f"{row.label}: {module}:{qualname} now names seed {seed} itself; drop the '*' in the source column"
            )
        else:
            assert cites.search(own), (
                f"{row.label}: source says seed {seed}, but the docstring of {module}:{qualname} does not name it"
            )


def _items(section: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """The section split into bullets and paragraphs: (first line number, joined text)."""
    items: list[tuple[int, list[str]]] = []
    for number, line in section:
        if not line.strip():
            items.append((number, []))
        elif line.startswith("- ") or not items or not items[-1][1]:
            items.append((number, [line]))
        else:
            items[-1][1].append(line)
    return [(n, " ".join(text)) for n, text in items if text]


def _module_of(path: str) -> str | None:
    """The importable module a repository path names, or None when it is not Python."""
    if path.endswith("/"):
        return path.strip("/").replace("/", ".")
    if path.endswith(".py"):
        return path[: -len(".py")].replace("/", ".")
    return None


def test_types_section_names_exist() -> None:
    paths = 0
    for number, text in _items(_section(TYPES_HEADING)):
        context: str | None = None
        for token in TICKED.findall(text):
            if "/" in token and PATH.fullmatch(token):
                paths += 1
                target = ROOT / token
                assert target.exists(), f"ARCHITECTURE.md line {number}: `{token}` does not exist in the repository"
                context = _module_of(token)
            elif IDENT.fullmatch(token):
                assert context is not None, (
                    f"ARCHITECTURE.md line {number}: `{token}` appears before any file path in its item"
                )
                try:
                    _resolve(context, token)
                except (ImportError, AttributeError) as exc:
                    pytest.fail(f"ARCHITECTURE.md line {number}: `{token}` is not in {context}: {exc}")
    assert paths >= MIN_TYPE_PATHS, f"only {paths} file paths found in '{TYPES_HEADING}'"


def test_import_section_names_resolve() -> None:
    names = 0
    for number, text in _items(_section(IMPORTS_HEADING)):
        for token in TICKED.findall(text):
            if DOTTED.fullmatch(token):
                names += 1
                try:
                    _resolve_dotted(token)
                except (ImportError, AttributeError) as exc:
                    pytest.fail(f"ARCHITECTURE.md line {number}: `{token}` does not resolve: {exc}")
    assert names > 0, f"no dotted module names found in '{IMPORTS_HEADING}'"


def _module_level_imports(path: Path, modules: set[str]) -> set[str]:
    """The project modules a file imports at module level (not inside functions or `if TYPE_CHECKING:`)."""
    import ast

    out: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
                 if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else [])
        out |= {n for n in names if n in modules}
    return out


def test_no_module_level_import_cycle() -> None:
    """Importing any module of dpopt or formulations never needs a module that needs it back (lazy imports
    inside functions, listed in "Direction of imports", are outside this graph)."""
    files = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
             for p in [*ROOT.glob("dpopt/**/*.py"), *ROOT.glob("formulations/*.py")]}
    graph = {m: _module_level_imports(p, set(files)) - {m} for m, p in files.items()}
    assert sum(map(len, graph.values())) > len(files)  # the parser sees the imports
    done: set[str] = set()

    def visit(m: str, path: list[str]) -> None:
        if m in path:
            pytest.fail("import cycle: " + " -> ".join(path[path.index(m):] + [m]))
        if m not in done:
            for n in sorted(graph[m]):
                visit(n, path + [m])
            done.add(m)

    for m in sorted(graph):
        visit(m, [])
