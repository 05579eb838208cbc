"""From a table to a data vector: attributes, domains and the histogram x.

A ``Domain`` is an ordered list of attributes; its cells are the Cartesian product of the attributes'
levels, numbered in row-major (C) order over the attributes *as listed*: the last attribute varies
fastest.  For a domain ``(sex: 2, race: 5)`` cell ``i`` is ``(sex=i // 5, race=i % 5)``, exactly
``numpy.ravel_multi_index`` / ``numpy.unravel_index`` on ``domain.shape``.

``histogram(df, domain)`` turns a DataFrame into the vector x (n = domain.size cell counts) that every
mechanism answers queries over.  Missing values, values outside an attribute's range or bins and
unseen categories are an error by default; ``on_invalid="drop"`` drops such rows and
``on_invalid="bucket"`` sends them to an attribute's declared catch-all level (``other=...``).  Both
count what they did in the returned ``HistogramReport``.  The report describes the raw data and is
meant for the data curator; it is not differentially private and must not be published.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd

from dpopt.validation import check_choice, check_finite_vector, check_positive_int

# Reasons a value is not in its attribute's domain (keys of HistogramReport.invalid[column]).
MISSING = "missing"
OUTSIDE = "outside_domain"
UNSEEN = "unseen_category"

_MAX_SHOWN = 12  # levels listed in an error message before eliding


def _show_levels(levels: Sequence[Any]) -> str:
    shown = [repr(v) for v in levels[:_MAX_SHOWN]]
    if len(levels) > _MAX_SHOWN:
        shown.append(f"... ({len(levels)} levels)")
    return "[" + ", ".join(shown) + "]"


class Attribute:
    """One column of the table and its finite list of levels (codes 0..k-1).

    Subclasses define ``levels`` (the values, in code order), ``encode`` (values -> codes, -1 for
    values outside the domain) and ``expected`` (a phrase describing the valid values, for errors).
    ``other``: if not None, a catch-all level with this label is appended as the last code
    (``size`` includes it); only ``histogram(..., on_invalid="bucket")`` sends values there.
    """

    name: str
    other: str | None
    kind: str = "attribute"
    ordinal: bool = False

    @property
    def levels(self) -> tuple[Any, ...]:
        raise NotImplementedError

    @property
    def size(self) -> int:
        """Number of codes, including the catch-all level if declared."""
        return self.n_regular + (self.other is not None)

    @property
    def n_regular(self) -> int:
        """Number of codes excluding the catch-all level."""
        return len(self.levels)

    def expected(self) -> str:
        raise NotImplementedError

    def _encode_present(self, values: pd.Series) -> tuple[np.ndarray, str]:
        """Codes for non-missing values (-1 if invalid) and the reason name for invalid ones."""
        raise NotImplementedError

    def encode(self, values: pd.Series | Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
        """Codes (int64, shape (len,)) and reasons (object array: None, MISSING, OUTSIDE, UNSEEN).

        A valid value gets its code in 0..n_regular-1; an invalid one gets -1 and its reason.
        """
        s = pd.Series(values, copy=False) if not isinstance(values, pd.Series) else values
        s = s.reset_index(drop=True)
        codes = np.full(len(s), -1, dtype=np.int64)
        reasons = np.full(len(s), None, dtype=object)
        missing = s.isna().to_numpy()
        reasons[missing] = MISSING
        if (~missing).any():
            present = s[~missing]
            c, why = self._encode_present(present)
            codes[~missing] = c
            bad = np.flatnonzero(~missing)[c < 0]
            reasons[bad] = why
        return codes, reasons

    def code_of(self, value: Any) -> int:
        """Code of one value; ValueError naming the attribute, value and expected domain if invalid.

        The catch-all label (if declared) maps to the last code.
        """
        if self.other is not None and isinstance(value, str) and value == self.other:
            return self.n_regular
        codes, reasons = self.encode(pd.Series([value], dtype=object))
        if codes[0] < 0:
            raise ValueError(
                f"attribute {self.name!r}: value {value!r} is not in the domain "
                f"({reasons[0]}); expected {self.expected()}"
            )
        return int(codes[0])

    def value_of(self, code: int) -> Any:
        """The level (value) with this code; the catch-all label for the last code if declared."""
        code = int(code)
        if not 0 <= code < self.size:
            raise ValueError(
                f"attribute {self.name!r}: code {code} out of range; expected 0..{self.size - 1}"
            )
        if code == self.n_regular:
            return self.other
        return self.levels[code]

    def label(self, code: int) -> str:
        """Human-readable text of a level, as used in query labels ("F", "3", "[20, 30)")."""
        return str(self.value_of(code))

    def describe(self) -> dict[str, Any]:
        """JSON-friendly description (kind, levels, other)."""
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        """Same class, name and description (levels or bounds, order, catch-all label)."""
        return (type(other) is type(self) and self.name == other.name
                and self.describe() == other.describe())

    def __hash__(self) -> int:
        return hash((self.kind, self.name, self.size))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, size={self.size})"


class Categorical(Attribute):
    """Unordered (or, with ``ordered=True``, ordinal) categories given explicitly.

    Values match levels by equality (``1.0`` matches level ``1``; ``"1"`` does not).
    """

    kind = "categorical"

    def __init__(
        self, name: str, levels: Iterable[Any], *, ordered: bool = False, other: str | None = None
    ) -> None:
        _check_name(name)
        lv = tuple(levels)
        if not lv:
            raise ValueError(f"attribute {name!r}: levels must be non-empty")
        if len(set(lv)) != len(lv):
            raise ValueError(f"attribute {name!r}: levels must be distinct, got {list(lv)}")
        if any(_is_missing(v) for v in lv):
            raise ValueError(f"attribute {name!r}: a level cannot be missing (None/NaN)")
        if other is not None and other in lv:
            raise ValueError(f"attribute {name!r}: catch-all label {other!r} is also a level")
        self.name = name
        self._levels = lv
        self._index = pd.Index(lv)
        self.ordinal = bool(ordered)
        self.other = other

    @property
    def levels(self) -> tuple[Any, ...]:
        return self._levels

    def expected(self) -> str:
        return f"one of {_show_levels(self._levels)}"

    def label(self, code: int) -> str:
        v = self.value_of(code)
        if isinstance(v, float | np.floating):
            return _fmt_num(float(v))
        return str(v)

    def _encode_present(self, values: pd.Series) -> tuple[np.ndarray, str]:
        codes = self._index.get_indexer(pd.Index(values.to_numpy(dtype=object)))
        return codes.astype(np.int64), UNSEEN

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "levels": list(self._levels), "ordered": self.ordinal,
                "other": self.other}


class IntegerRange(Attribute):
    """Integers low..high inclusive (code = value - low); integer-valued floats are accepted."""

    kind = "integer"
    ordinal = True

    def __init__(self, name: str, low: int, high: int, *, other: str | None = None) -> None:
        _check_name(name)
        if int(low) != low or int(high) != high:
            raise ValueError(f"attribute {name!r}: low and high must be integers, got {low}, {high}")
        if high < low:
            raise ValueError(f"attribute {name!r}: need low <= high, got low={low}, high={high}")
        self.name = name
        self.low = int(low)
        self.high = int(high)
        self.other = other

    @property
    def levels(self) -> tuple[Any, ...]:
        return tuple(range(self.low, self.high + 1))

    @property
    def n_regular(self) -> int:
        return self.high - self.low + 1

    def value_of(self, code: int) -> Any:
        code = int(code)
        if 0 <= code < self.n_regular:
            return self.low + code
        return super().value_of(code)

    def expected(self) -> str:
        return f"an integer in [{self.low}, {self.high}]"

    def _encode_present(self, values: pd.Series) -> tuple[np.ndarray, str]:
        v = pd.to_numeric(values, errors="coerce").to_numpy(dtype=float)
        ok = np.isfinite(v) & (v == np.floor(v)) & (v >= self.low) & (v <= self.high)
        codes = np.full(len(v), -1, dtype=np.int64)
        codes[ok] = v[ok].astype(np.int64) - self.low
        return codes, OUTSIDE

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "low": self.low, "high": self.high, "other": self.other}


class NumericBins(Attribute):
    """Numeric values cut at explicit edges e_0 < e_1 < ... < e_k into k bins.

    Bin j is [e_j, e_{j+1}) and the last bin is closed [e_{k-1}, e_k]; values below e_0 or above
    e_k are outside the domain.  Edges may be +-inf to make open-ended bins explicit.
    """

    kind = "bins"
    ordinal = True

    def __init__(self, name: str, edges: Sequence[float], *, other: str | None = None) -> None:
        _check_name(name)
        e = np.asarray(edges, dtype=float)
        if e.ndim != 1 or e.size < 2:
            raise ValueError(f"attribute {name!r}: need at least 2 bin edges, got {list(edges)}")
        if np.isnan(e).any() or not np.all(np.diff(e) > 0):
            raise ValueError(
                f"attribute {name!r}: bin edges must be strictly increasing numbers, got {list(edges)}"
            )
        self.name = name
        self.edges = e
        self.other = other

    @property
    def levels(self) -> tuple[Any, ...]:
        k = self.edges.size - 1
        return tuple(
            pd.Interval(self.edges[j], self.edges[j + 1], closed="both" if j == k - 1 else "left")
            for j in range(k)
        )

    def label(self, code: int) -> str:
        v = self.value_of(code)
        if not isinstance(v, pd.Interval):
            return str(v)
        right = "]" if v.closed == "both" else ")"
        return f"[{_fmt_num(v.left)}, {_fmt_num(v.right)}{right}"

    def expected(self) -> str:
        return f"a number in [{_fmt_num(self.edges[0])}, {_fmt_num(self.edges[-1])}]"

    def code_of(self, value: Any) -> int:
        """Code of a number (its bin) or of a bin given as its ``pd.Interval`` level."""
        if isinstance(value, pd.Interval):
            try:
                return self.levels.index(value)
            except ValueError:
                raise ValueError(
                    f"attribute {self.name!r}: interval {value} is not one of the bins "
                    f"{[self.label(j) for j in range(self.n_regular)]}"
                ) from None
        return super().code_of(value)

    def _encode_present(self, values: pd.Series) -> tuple[np.ndarray, str]:
        v = pd.to_numeric(values, errors="coerce").to_numpy(dtype=float)
        codes = np.searchsorted(self.edges, v, side="right").astype(np.int64) - 1
        k = self.edges.size - 1
        codes[v == self.edges[-1]] = k - 1  # the last bin is closed on the right
        bad = np.isnan(v) | (v < self.edges[0]) | (v > self.edges[-1])
        codes[bad] = -1
        return codes, OUTSIDE

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "edges": [float(x) for x in self.edges], "other": self.other}


def _first_difference(a: Sequence[Any], b: Sequence[Any]) -> str:
    """Where two level lists first differ, e.g. "3 vs 4 levels" or "level 2: 'C' vs 'D'"."""
    for i, (u, v) in enumerate(zip(a, b, strict=False)):
        if u != v:
            return f"level {i}: {u!r} vs {v!r}"
    return f"{len(a)} vs {len(b)} levels"


def _attribute_difference(a: Attribute, b: Attribute) -> str:
    """One attribute's difference between two domains, e.g. "'age': low 0 vs 1, high 73 vs 74"."""
    da, db = a.describe(), b.describe()
    if da["kind"] != db["kind"]:
        return f"attribute {a.name!r}: kind {da['kind']} vs {db['kind']}"
    diffs = []
    for key in da:
        if da[key] == db.get(key):
            continue
        if key == "levels":
            diffs.append(f"levels ({_first_difference(da[key], db[key])})")
        elif key == "edges":
            diffs.append(f"bin edges {_show_levels(da[key])} vs {_show_levels(db[key])}")
        else:
            diffs.append(f"{key} {da[key]!r} vs {db[key]!r}")
    return f"attribute {a.name!r}: {', '.join(diffs)}"


def _fmt_num(v: float) -> str:
    return str(int(v)) if math.isfinite(v) and float(v).is_integer() else repr(float(v))


def _read_domain_json(path: str) -> dict[str, Any]:
    """The {column: size} object of a domain file; ValueError naming the file when it is not one (invalid or
    truncated JSON, another type, a column given twice)."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in items:
            if key in seen:
                raise ValueError(f"domain file {path!r}: key {key!r} appears twice; expected each column once")
            seen[key] = value
        return seen

    try:
        with open(path, encoding="utf-8") as fh:
            sizes = json.load(fh, object_pairs_hook=pairs)
    except json.JSONDecodeError as exc:
        raise ValueError(f"domain file {path!r} is not valid JSON ({exc}); expected an object "
                         "{column: size}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"domain file {path!r} is not UTF-8 text ({exc.reason} at byte {exc.start}); expected a "
                         "JSON object {column: size}") from None
    if not isinstance(sizes, dict):
        raise ValueError(f"domain file {path!r} must hold a JSON object {{column: size}}, got "
                         f"{type(sizes).__name__}")
    return sizes


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"attribute name must be a non-empty string, got {name!r}")


def _is_missing(v: Any) -> bool:
    try:
        return bool(pd.isna(v))
    except (TypeError, ValueError):
        return False


class Domain:
    """Ordered attributes; cells numbered in row-major (C) order over the attributes as listed.

    shape = (k_1, ..., k_d) level counts; size n = prod(shape) is the length of x and the number of
    columns of every workload over this domain.
    """

    def __init__(self, attributes: Sequence[Attribute]) -> None:
        attrs = tuple(attributes)
        if not attrs:
            raise ValueError("a Domain needs at least one attribute")
        for a in attrs:
            if not isinstance(a, Attribute):
                raise ValueError(f"Domain attributes must be Attribute objects, got {a!r}")
        names = [a.name for a in attrs]
        if len(set(names)) != len(names):
            raise ValueError(f"Domain attribute names must be distinct, got {names}")
        self.attributes = attrs

    # -- construction ----------------------------------------------------------------------------
    @classmethod
    def from_json(cls, spec: str | os.PathLike[str] | Mapping[str, int]) -> Domain:
        """Domain from an Adult-style size map ``{"age": 85, "sex": 2, ...}`` (codes 0..k-1).

        ``spec`` is such a dict or the path of a JSON file holding one.  Attribute order is the
        order of the keys in the file.
        """
        if isinstance(spec, Mapping):
            sizes = dict(spec)
        else:
            sizes = _read_domain_json(os.fspath(spec))
        attrs = []
        for name, k in sizes.items():
            attrs.append(IntegerRange(str(name), 0, check_positive_int(k, f"domain size of column {name!r}") - 1))
        return cls(attrs)

    # -- shape -----------------------------------------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.attributes)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(a.size for a in self.attributes)

    @property
    def size(self) -> int:
        return int(math.prod(self.shape))

    def __len__(self) -> int:
        return len(self.attributes)

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def __getitem__(self, name: str) -> Attribute:
        return self.attribute(name)

    def attribute(self, name: str) -> Attribute:
        """The attribute called ``name``; ValueError listing the domain's attributes if unknown."""
        for a in self.attributes:
            if a.name == name:
                return a
        raise ValueError(f"unknown attribute {name!r}; the domain has {list(self.names)}")

    def project(self, names: Sequence[str]) -> Domain:
        """Sub-domain on the given attributes, kept in this domain's order."""
        wanted = list(names)
        for n in wanted:
            self.attribute(n)
        if len(set(wanted)) != len(wanted):
            raise ValueError(f"attribute names must be distinct, got {wanted}")
        return Domain([a for a in self.attributes if a.name in wanted])

    # -- cells -----------------------------------------------------------------------------------
    def cell_to_values(self, index: int) -> dict[str, Any]:
        """Attribute values of cell ``index`` (0..size-1), as {name: level}."""
        if isinstance(index, bool) or not isinstance(index, int | np.integer):
            raise ValueError(f"cell index must be an integer, got {index!r}")
        if not 0 <= int(index) < self.size:
            raise ValueError(f"cell index {index} out of range; expected 0..{self.size - 1}")
        codes = np.unravel_index(int(index), self.shape)
        return {a.name: a.value_of(int(c)) for a, c in zip(self.attributes, codes, strict=True)}

    def values_to_cell(self, values: Mapping[str, Any] | None = None, /, **kw: Any) -> int:
        """Cell index of one combination of values, given as a mapping and/or keywords.

        Every attribute must be given exactly once; unknown names and invalid values raise.
        """
        vals = dict(values or {})
        overlap = set(vals) & set(kw)
        if overlap:
            raise ValueError(f"attributes given twice: {sorted(overlap)}")
        vals.update(kw)
        unknown = [k for k in vals if k not in self.names]
        if unknown:
            raise ValueError(f"unknown attributes {unknown}; the domain has {list(self.names)}")
        absent = [n for n in self.names if n not in vals]
        if absent:
            raise ValueError(f"values_to_cell needs a value for every attribute; missing {absent}")
        codes = [a.code_of(vals[a.name]) for a in self.attributes]
        return int(np.ravel_multi_index(codes, self.shape))

    def cell_labels(self) -> list[str]:
        """Label "a=v & b=w" of every cell, in cell order (length size)."""
        per_attr = [[f"{a.name}={a.label(c)}" for c in range(a.size)] for a in self.attributes]
        grid = np.array(np.meshgrid(*[np.arange(k) for k in self.shape], indexing="ij"))
        flat = grid.reshape(len(self.shape), -1).T
        return [" & ".join(per_attr[i][c] for i, c in enumerate(row)) for row in flat]

    # -- identity --------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """JSON-friendly description of every attribute, in order."""
        return {a.name: a.describe() for a in self.attributes}

    def difference(self, other: Domain) -> str:
        """What differs from ``other`` (attributes, their order, levels, bins), "" if equal."""
        if not isinstance(other, Domain):
            raise ValueError(f"can only compare with a Domain, got {type(other).__name__}")
        mine, theirs = list(self.names), list(other.names)
        if set(mine) != set(theirs):
            only_a = [n for n in mine if n not in theirs]
            only_b = [n for n in theirs if n not in mine]
            return f"attributes: {only_a} only in the first, {only_b} only in the second"
        if mine != theirs:
            return f"attribute order: ({', '.join(mine)}) vs ({', '.join(theirs)})"
        parts = [_attribute_difference(a, b)
                 for a, b in zip(self.attributes, other.attributes, strict=True) if a != b]
        return "; ".join(parts)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Domain) and self.attributes == other.attributes

    def __hash__(self) -> int:
        return hash(self.attributes)

    def __repr__(self) -> str:
        inner = ", ".join(f"{a.name}:{a.size}" for a in self.attributes)
        return f"Domain({inner})"


@dataclass
class HistogramReport:
    """What ``histogram`` did with the rows (for the curator; raw-data facts, not private).

    n_rows: rows in the input; n_counted: rows added to x (= x.sum()); n_dropped / n_bucketed: rows
    dropped or sent to a catch-all level; invalid[column][reason] = number of rows with that
    problem in that column (a row can be counted in several columns); examples[column] = a few
    offending values.
    """

    domain: Domain
    n_rows: int
    n_counted: int
    n_dropped: int = 0
    n_bucketed: int = 0
    on_invalid: str = "error"
    invalid: dict[str, dict[str, int]] = field(default_factory=dict)
    examples: dict[str, list[Any]] = field(default_factory=dict)

    def summary(self) -> str:
        """One-paragraph text of the counts."""
        parts = [f"{self.n_rows} rows, {self.n_counted} counted"]
        if self.n_dropped:
            parts.append(f"{self.n_dropped} dropped")
        if self.n_bucketed:
            parts.append(f"{self.n_bucketed} bucketed")
        for col, reasons in self.invalid.items():
            txt = ", ".join(f"{k}: {v}" for k, v in reasons.items())
            parts.append(f"column {col!r} ({txt})")
        return "; ".join(parts)


class InvalidValueError(ValueError):
    """A missing, out-of-domain or unseen value met by ``records(..., on_invalid="error")``: which column,
    value and row (``position`` counts rows from 0, ``label`` is the DataFrame's index), and what was expected."""

    def __init__(self, attr: Attribute, value: Any, reason: str, position: int, label: Any) -> None:
        self.column, self.value, self.position, self.label = attr.name, value, position, label
        self.what = {MISSING: f"missing value ({value!r})", OUTSIDE: f"value {value!r} is outside the domain",
                     UNSEEN: f"unseen category {value!r}"}[reason]
        self.expected = attr.expected()
        self.catch_all = attr.other
        bucket = f", or 'bucket' to count them as {attr.other!r}" if attr.other is not None else ""
        super().__init__(f"column {attr.name!r}: {self.what} at row {position + 1} (counted from 1; index "
                         f"{label!r}); expected {self.expected}; pass on_invalid='drop' to leave such rows "
                         f"out{bucket}")


# Largest domain whose data vector x is formed (float64: 400 MB).
MAX_CELLS = 50_000_000


@dataclass(frozen=True)
class Records:
    """A table's rows as level codes over a Domain (d x N), the data vector x = histogram never formed.

    Marginal tables are counted straight from the codes (one bincount over the sub-domain), so a
    strategy measured through marginals answers on domains far too large for x (Adult: 6.4e17 cells).
    """

    domain: Domain
    codes: np.ndarray

    def table(self, attrs: Sequence[int]) -> np.ndarray:
        """The count table over the attribute indices attrs (sorted), shape (k_i for i in attrs)."""
        attrs = tuple(int(i) for i in attrs)
        if not attrs:
            return np.array(float(self.codes.shape[1]))
        dims = tuple(self.domain.shape[i] for i in attrs)
        flat = np.ravel_multi_index(tuple(self.codes[i] for i in attrs), dims)
        return np.bincount(flat, minlength=math.prod(dims)).reshape(dims).astype(np.float64)

    def vector(self, max_cells: int = MAX_CELLS) -> np.ndarray:
        """The data vector x (float64, (domain.size,), cell order of the domain); refused beyond max_cells."""
        if self.domain.size > max_cells:
            raise ValueError(
                f"domain {self.domain!r} has {self.domain.size} cells, more than max_cells={max_cells}; "
                "this strategy needs the data vector: use fewer attributes or coarser levels "
                "(Domain.project), or a mechanism that measures marginals (hdmm)"
            )
        if not self.codes.shape[1]:
            return np.zeros(self.domain.size)
        flat = np.ravel_multi_index(tuple(self.codes), self.domain.shape)
        return np.bincount(flat, minlength=self.domain.size).astype(np.float64)


def data_vector(data: np.ndarray | Records, n: int) -> np.ndarray:
    """The data vector x (n,) of a vector or of Records over n cells (formed only here, and refused when too large)."""
    if isinstance(data, Records):
        if data.domain.size != n:
            raise ValueError(f"the records are over {data.domain.size} cells, the workload over {n}")
        return data.vector()
    return check_finite_vector(data, "data vector x", n)


def marginal_tables(data: np.ndarray | Records, sizes: Sequence[int]) -> Callable[[tuple[int, ...]], np.ndarray]:
    """tables(attrs): the count table over sorted attribute indices, from Records (never forming x) or from x."""
    sizes = [int(k) for k in sizes]
    if isinstance(data, Records):
        if list(data.domain.shape) != sizes:
            raise ValueError(f"the records are over a domain of shape {data.domain.shape}, expected {tuple(sizes)}")
        return data.table
    T = data_vector(data, math.prod(sizes)).reshape(sizes)

    def tables(attrs: tuple[int, ...]) -> np.ndarray:
        axes = tuple(i for i in range(len(sizes)) if i not in attrs)
        return T.sum(axis=axes) if axes else T

    return tables


def histogram(
    df: pd.DataFrame,
    domain: Domain,
    *,
    on_invalid: Literal["error", "drop", "bucket"] = "error",
    max_cells: int = MAX_CELLS,
) -> tuple[np.ndarray, HistogramReport]:
    """Data vector x (float64, shape (domain.size,), cell order of ``domain``) of a DataFrame.

    Each row adds 1 to the cell of its attribute values; columns not in the domain are ignored.
    on_invalid: see ``records``.  max_cells: refuse domains with more cells than this (x is dense).
    """
    if isinstance(domain, Domain) and domain.size > max_cells:
        raise ValueError(
            f"domain {domain!r} has {domain.size} cells, more than max_cells={max_cells}; "
            "use fewer attributes or coarser levels (Domain.project)"
        )
    recs, report = records(df, domain, on_invalid=on_invalid)
    return recs.vector(max_cells), report


def records(
    df: pd.DataFrame,
    domain: Domain,
    *,
    on_invalid: Literal["error", "drop", "bucket"] = "error",
) -> tuple[Records, HistogramReport]:
    """The rows of a DataFrame as level codes over ``domain`` (no data vector is formed).

    Columns not in the domain are ignored.  on_invalid: "error" (default) raises ValueError at the
    first column with a missing value, a value outside the domain or an unseen category, naming the
    column, the value and the expected domain; "drop" leaves such rows out; "bucket" sends each
    invalid value to its attribute's catch-all level (attributes without one raise).  The report
    counts what was done.
    """
    if not isinstance(df, pd.DataFrame):
        raise ValueError(f"histogram needs a pandas DataFrame, got {type(df).__name__}")
    if not isinstance(domain, Domain):
        raise ValueError(f"histogram needs a Domain, got {type(domain).__name__}")
    check_choice(on_invalid, ("error", "drop", "bucket"), "on_invalid")
    twice = sorted({n for n in domain.names if int((df.columns == n).sum()) > 1})
    if twice:
        raise ValueError(f"column(s) {twice} of the domain appear more than once in the DataFrame; expected each "
                         "column once")
    absent = [n for n in domain.names if n not in df.columns]
    if absent:
        raise ValueError(
            f"column(s) {absent} of the domain are not in the DataFrame; "
            f"its columns are {list(map(str, df.columns))}"
        )
    n_rows = len(df)
    if n_rows == 0:
        raise ValueError("the data have no rows (a header only?); expected at least one record "
                         "to count")
    codes = np.empty((len(domain), n_rows), dtype=np.int64)
    bad_row = np.zeros(n_rows, dtype=bool)
    invalid: dict[str, dict[str, int]] = {}
    examples: dict[str, list[Any]] = {}
    for i, attr in enumerate(domain.attributes):
        col = df[attr.name]
        c, reasons = attr.encode(col)
        bad = c < 0
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            if on_invalid == "error":
                raise InvalidValueError(attr, col.iloc[j], reasons[j], j, col.index[j])
            if on_invalid == "bucket":
                if attr.other is None:
                    raise ValueError(
                        f"column {attr.name!r}: on_invalid='bucket' needs a catch-all level; "
                        f"declare the attribute with other='...' (first invalid value "
                        f"{col.iloc[j]!r}, expected {attr.expected()})"
                    )
                c = np.where(bad, attr.n_regular, c)
            vals, counts = np.unique(reasons[bad].astype(str), return_counts=True)
            invalid[attr.name] = {str(v): int(k) for v, k in zip(vals, counts, strict=True)}
            examples[attr.name] = list(pd.unique(col.iloc[np.flatnonzero(bad)[:_MAX_SHOWN]]))
            bad_row |= bad
        codes[i] = c
    if on_invalid == "drop":
        keep = ~bad_row
        codes = codes[:, keep]
    n_bad = int(bad_row.sum())
    report = HistogramReport(
        domain=domain,
        n_rows=n_rows,
        n_counted=int(codes.shape[1]),
        n_dropped=n_bad if on_invalid == "drop" else 0,
        n_bucketed=n_bad if on_invalid == "bucket" else 0,
        on_invalid=on_invalid,
        invalid=invalid,
        examples=examples,
    )
    return Records(domain, codes), report
