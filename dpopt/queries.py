"""Workloads from predicates over a Domain: no 0/1 matrix written by hand.

A condition selects a set of levels of one or more attributes (``Equals``, ``In``, ``Between`` and
their conjunction with ``&``).  A counting query asks how many rows satisfy a condition; its row in W
is the indicator of the selected cells, built as the Kronecker product (in domain order) of one
0/1 vector per attribute (all ones for an attribute the condition does not mention).  This is the
same row-major cell order as ``dpopt.data`` and ``numpy.ravel_multi_index``.

Every builder returns one of dpopt's structured workloads (``Kron``, ``Marginals``, ``Stack`` of
Kronecker products), never a matrix over the whole domain, bound to the Domain it is over
(``workload.domain``) with a label per row ("sex=F & race=2", "20 <= age <= 29"); answering it on
data over another domain is refused by ``check_domain``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from itertools import combinations
from typing import Any

import numpy as np
import scipy.sparse as sp

from dpopt.data import Attribute, Domain, NumericBins, _fmt_num
from dpopt.validation import count_text
from dpopt.workloads import (
    ExplicitWorkload,
    Identity,
    Kron,
    Marginals,
    Stack,
    Workload,
    WorkloadTooLargeError,
    flat_stack,
    range_rows,
)

#: Most queries a workload over a Domain may have: each gets a label (a string of about 100 bytes, so 1 GB of
#: labels here) and a release writes one row per query.
MAX_LABELLED_QUERIES = 10_000_000


def check_labelled_count(m: int, what: str, domain: Domain) -> None:
    """Refuse, before any label is built, a domain-bound workload of more than MAX_LABELLED_QUERIES queries."""
    if m > MAX_LABELLED_QUERIES:
        raise WorkloadTooLargeError(
            f"{what} on {domain!r} has {count_text(m)} queries; a workload over a data domain labels every query and a "
            f"release answers each, at most {MAX_LABELLED_QUERIES:,}: expected fewer or coarser columns"
        )


class DomainMismatchError(ValueError):
    """A workload is over a different Domain than the data it is asked to answer."""


# -- conditions ----------------------------------------------------------------------------------
class Condition:
    """A set of cells described by per-attribute level masks; conjunctions with ``&``."""

    def masks(self, domain: Domain) -> dict[str, np.ndarray]:
        """{attribute name: boolean mask over its codes (shape (k,))} for each constrained attribute."""
        raise NotImplementedError

    def label(self, domain: Domain) -> str:
        """Human-readable text of the condition, with the domain's level labels."""
        raise NotImplementedError

    def __and__(self, other: Condition) -> And:
        if not isinstance(other, Condition):
            return NotImplemented
        return And(self, other)

    def row(self, domain: Domain) -> sp.csr_matrix:
        """Indicator row (1 x domain.size, sparse) of the cells satisfying the condition."""
        masks = self.masks(domain)
        out: sp.csr_matrix | None = None
        for a in domain.attributes:
            m = masks.get(a.name)
            vec = np.ones(a.size) if m is None else m.astype(float)
            v = sp.csr_matrix(vec.reshape(1, -1))
            out = v if out is None else sp.kron(out, v, format="csr")
        assert out is not None
        if out.nnz == 0:
            raise ValueError(f"condition {self.label(domain)!r} selects no cell of {domain!r}")
        return out


def _attr(domain: Domain, name: str) -> Attribute:
    if not isinstance(domain, Domain):
        raise ValueError(f"expected a Domain, got {type(domain).__name__}")
    return domain.attribute(name)


class In(Condition):
    """attribute in {values} (a non-empty set of levels)."""

    def __init__(self, attribute: str, values: Iterable[Any]) -> None:
        self.attribute = attribute
        if isinstance(values, str | bytes):
            raise ValueError(f"In({attribute!r}, ...) needs a collection of values, got the string "
                             f"{values!r}; use Equals for one value")
        self.values = list(values)
        if not self.values:
            raise ValueError(f"In({attribute!r}, ...) needs at least one value")

    def masks(self, domain: Domain) -> dict[str, np.ndarray]:
        a = _attr(domain, self.attribute)
        m = np.zeros(a.size, dtype=bool)
        for v in self.values:
            m[a.code_of(v)] = True
        return {a.name: m}

    def label(self, domain: Domain) -> str:
        a = _attr(domain, self.attribute)
        codes = np.flatnonzero(self.masks(domain)[a.name])
        if codes.size == 1:
            return f"{a.name}={a.label(int(codes[0]))}"
        return f"{a.name} in {{{', '.join(a.label(int(c)) for c in codes)}}}"

    def __repr__(self) -> str:
        return f"In({self.attribute!r}, {self.values!r})"


class Equals(In):
    """attribute == value (In with one value, whose label In already prints as "a=v")."""

    def __init__(self, attribute: str, value: Any) -> None:
        super().__init__(attribute, [value])

    def __repr__(self) -> str:
        return f"Equals({self.attribute!r}, {self.values[0]!r})"


class Between(Condition):
    """low <= attribute <= high, inclusive, on an ordinal attribute.

    Integer ranges: integer values.  Ordered categoricals: levels (by position).  Numeric bins: the
    bins lying inside [low, high]; a bound that cuts a bin in two is refused, since the data only
    know the bin.  A catch-all level is never selected.
    """

    def __init__(self, attribute: str, low: Any, high: Any) -> None:
        self.attribute = attribute
        self.low = low
        self.high = high

    def _codes(self, a: Attribute) -> tuple[int, int]:
        if not a.ordinal:
            raise ValueError(
                f"Between needs an ordinal attribute; {a.name!r} is an unordered categorical "
                "(use In, or declare it Categorical(..., ordered=True))"
            )
        if isinstance(a, NumericBins):
            lo, hi = float(self.low), float(self.high)
            if hi < lo:
                raise ValueError(f"Between({a.name!r}, {self.low}, {self.high}): need low <= high")
            inside = [j for j, iv in enumerate(a.levels) if iv.left >= lo and iv.right <= hi]
            cut = [a.label(j) for j, iv in enumerate(a.levels)
                   if iv.left < hi and iv.right > lo and j not in inside]
            if cut:
                raise ValueError(
                    f"Between({a.name!r}, {self.low}, {self.high}) cuts bin(s) {cut}; use bounds "
                    f"at bin edges {[float(e) for e in a.edges]}"
                )
            if not inside:
                raise ValueError(
                    f"Between({a.name!r}, {self.low}, {self.high}) contains no bin; "
                    f"expected bounds among the edges {[float(e) for e in a.edges]}"
                )
            return inside[0], inside[-1]
        lo_c, hi_c = a.code_of(self.low), a.code_of(self.high)
        if a.other is not None and a.n_regular in (lo_c, hi_c):
            raise ValueError(f"Between({a.name!r}, ...) cannot use the catch-all level {a.other!r}")
        if hi_c < lo_c:
            raise ValueError(f"Between({a.name!r}, {self.low!r}, {self.high!r}): need low <= high")
        return lo_c, hi_c

    def masks(self, domain: Domain) -> dict[str, np.ndarray]:
        a = _attr(domain, self.attribute)
        lo, hi = self._codes(a)
        m = np.zeros(a.size, dtype=bool)
        m[lo : hi + 1] = True
        return {a.name: m}

    def label(self, domain: Domain) -> str:
        a = _attr(domain, self.attribute)
        lo, hi = self._codes(a)
        return _range_label(a, lo, hi)

    def __repr__(self) -> str:
        return f"Between({self.attribute!r}, {self.low!r}, {self.high!r})"


def _range_label(a: Attribute, lo: int, hi: int) -> str:
    """Label of the levels lo..hi of an ordinal attribute."""
    if isinstance(a, NumericBins):
        right = "]" if a.levels[hi].closed == "both" else ")"
        left_edge, right_edge = a.levels[lo].left, a.levels[hi].right
        return f"{a.name} in [{_fmt_num(left_edge)}, {_fmt_num(right_edge)}{right}"
    if lo == hi:
        return f"{a.name}={a.label(lo)}"
    return f"{a.label(lo)} <= {a.name} <= {a.label(hi)}"


class And(Condition):
    """Conjunction: every part holds (masks on the same attribute intersect)."""

    def __init__(self, *parts: Condition) -> None:
        if not parts:
            raise ValueError("And needs at least one condition")
        flat: list[Condition] = []
        for p in parts:
            if not isinstance(p, Condition):
                raise ValueError(f"And takes Condition objects, got {p!r}")
            flat.extend(p.parts if isinstance(p, And) else [p])
        self.parts: list[Condition] = flat

    def masks(self, domain: Domain) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for p in self.parts:
            for name, m in p.masks(domain).items():
                out[name] = out[name] & m if name in out else m
        return out

    def label(self, domain: Domain) -> str:
        return " & ".join(p.label(domain) for p in self.parts)

    def __repr__(self) -> str:
        return " & ".join(repr(p) for p in self.parts)


# -- builders ------------------------------------------------------------------------------------
def _factor(a: Attribute, rows: np.ndarray | sp.spmatrix | None, name: str) -> Workload:
    """One attribute's factor: the given rows over its codes, or the all-ones row that sums it out."""
    if rows is None:
        return ExplicitWorkload(np.ones((1, a.size)), name=f"sum({a.name})")
    return ExplicitWorkload(sp.csr_matrix(rows, dtype=float), name=name)


def _kron(domain: Domain, factors: Mapping[str, Workload], name: str, labels: list[str]) -> Kron:
    """Kronecker product over the domain's attributes (domain order): factors[name], else a ones row."""
    parts = [factors.get(a.name) or _factor(a, None, "") for a in domain.attributes]
    return Kron(parts, name=name).bind(domain, labels)  # type: ignore[return-value]


def predicate_workload(
    domain: Domain,
    conditions: Sequence[Condition] | Mapping[str, Condition],
    name: str | None = None,
) -> Workload:
    """One counting query per condition (m = len(conditions)), labelled by the condition's text.

    Each query is the Kronecker product of one 0/1 row per attribute; several are stacked.
    ``conditions`` may be a mapping {label: condition} to choose the labels.
    """
    items: list[tuple[str | None, Condition]]
    if isinstance(conditions, Mapping):
        items = [(str(k), c) for k, c in conditions.items()]
    else:
        items = [(None, c) for c in conditions]
    if not items:
        raise ValueError("predicate_workload needs at least one condition")
    parts, labels = [], []
    for lab, c in items:
        if not isinstance(c, Condition):
            raise ValueError(f"expected Condition objects (Equals, In, Between, And), got {c!r}")
        masks = c.masks(domain)
        text = c.label(domain)
        if any(not m.any() for m in masks.values()):
            raise ValueError(f"condition {text!r} selects no cell of {domain!r}")
        label = lab if lab is not None else text
        factors = {a: _factor(domain.attribute(a), m.astype(float).reshape(1, -1), f"{a}-mask")
                   for a, m in masks.items()}
        parts.append(_kron(domain, factors, text, [label]))
        labels.append(label)
    name = name or f"predicates({len(parts)})"
    if len(parts) == 1:
        parts[0].name = name
        return parts[0]
    return Stack(parts, name=name).bind(domain, labels)


def marginal_workload(domain: Domain, attributes: Sequence[str]) -> Workload:
    """The marginal over ``attributes``: one count per cell of the sub-domain they span.

    Rows follow the sub-domain's cell order (attributes in domain order, last fastest) and are
    labelled "sex=F & race=2".  The empty list gives the total.  A Kronecker product of identities
    (kept attributes) and ones rows (summed ones).
    """
    if isinstance(attributes, str):
        attributes = [attributes]
    if not attributes:
        return total_workload(domain)
    sub = domain.project(attributes)
    check_labelled_count(sub.size, f"the marginal over {', '.join(sub.names)}", domain)
    factors = {a.name: Identity(a.size) for a in sub.attributes}
    return _kron(domain, factors, f"marginal({','.join(sub.names)})", sub.cell_labels())


def marginals_workload(domain: Domain, k: int) -> Workload:
    """All k-way marginals of the domain stacked (attribute subsets in lexicographic domain order)."""
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= len(domain):
        raise ValueError(f"k must be an integer in 0..{len(domain)}, got {k!r}")
    if k == 0:
        return total_workload(domain)
    subsets = list(combinations(range(len(domain)), k))
    check_labelled_count(sum(math.prod(domain.shape[i] for i in sub) for sub in subsets), f"all {k}-way marginals",
                         domain)
    labels = [lab for s in subsets for lab in domain.project([domain.names[i] for i in s]).cell_labels()]
    W = Marginals([a.size for a in domain.attributes], subsets=subsets)
    W.name = f"marginals({k}-way)"
    return W.bind(domain, labels)


def marginals_of_orders(domain: Domain, orders: Sequence[int]) -> Workload:
    """All K-way marginals for every K in `orders` as one `Marginals` (subsets by order, then lexicographic)."""
    ks = sorted(int(k) for k in orders)
    if not ks or len(set(ks)) != len(ks) or any(not 1 <= k <= len(domain) for k in ks):
        raise ValueError(f"orders must be distinct integers in 1..{len(domain)}, got {list(orders)}")
    subsets = [S for k in ks for S in combinations(range(len(domain)), k)]
    labels = [lab for S in subsets for lab in domain.project([domain.names[i] for i in S]).cell_labels()]
    W = Marginals([a.size for a in domain.attributes], subsets=subsets)
    W.name = f"marginals({','.join(map(str, ks))}-way)"
    return W.bind(domain, labels)


def range_workload(domain: Domain, attribute: str) -> Workload:
    """All range queries lo..hi (lo <= hi) over one ordinal attribute, summed over the others.

    k(k+1)/2 rows for k regular levels, ordered by lo then hi; labels "20 <= age <= 29".
    """
    a = domain.attribute(attribute)
    if not a.ordinal:
        raise ValueError(
            f"range queries need an ordinal attribute; {a.name!r} is an unordered categorical"
        )
    k = a.n_regular
    check_labelled_count(k * (k + 1) // 2, f"all ranges of {a.name!r}", domain)
    lo, hi = np.triu_indices(k)
    R = range_rows(a.size, lo, hi)
    labels = [_range_label(a, int(i), int(j)) for i, j in zip(lo, hi, strict=True)]
    return _kron(domain, {a.name: _factor(a, R, f"ranges({a.name})")}, f"ranges({a.name})", labels)


def _ordinal_rows(a: Attribute, factor: str) -> tuple[sp.csr_matrix, list[str]]:
    """The prefix (lo = 0) or all-range rows over an ordinal attribute's regular levels, with their labels."""
    if not a.ordinal:
        raise ValueError(f"{factor} factors need ordinal attributes; {a.name!r} is an unordered categorical")
    k = a.n_regular
    lo, hi = (np.zeros(k, dtype=int), np.arange(k)) if factor == "prefix" else np.triu_indices(k)
    return range_rows(a.size, lo, hi), [_range_label(a, int(i), int(j)) for i, j in zip(lo, hi, strict=True)]


def kron_marginals_workload(domain: Domain, orders: Sequence[int], factor: str) -> Workload:
    """Every K-way attribute subset S (K in `orders`, lexicographic domain order) as prefix or range queries on
    S's attributes (all ordinal) jointly, summed over the others: a union of Kronecker products, each row
    labelled by its ranges ("age <= 29 & 2 <= hours <= 4")."""
    if factor not in ("prefix", "range"):
        raise ValueError(f"factor must be 'prefix' or 'range', got {factor!r}")
    d = len(domain)
    ks = sorted(int(k) for k in orders)
    if not ks or len(set(ks)) != len(ks) or any(not 1 <= k <= d for k in ks):
        raise ValueError(f"orders must be distinct integers in 1..{d}, got {list(orders)}")
    subsets = [S for k in ks for S in combinations(range(d), k)]
    rows = {i: _ordinal_rows(domain.attributes[i], factor) for i in sorted({i for S in subsets for i in S})}
    parts = []
    for S in subsets:
        labels = [""]
        for i in S:
            labels = [f"{a} & {b}" if a else b for a in labels for b in rows[i][1]]
        names = [domain.names[i] for i in S]
        factors = {domain.names[i]: _factor(domain.attributes[i], rows[i][0], f"{factor}({domain.names[i]})")
                   for i in S}
        parts.append(_kron(domain, factors, f"{factor}({','.join(names)})", labels))
    return stack_workloads(parts, name=f"marginals({','.join(map(str, ks))}-way {factor})")


def identity_workload(domain: Domain) -> Workload:
    """Every cell count (n rows), labelled with the cell's values."""
    check_labelled_count(domain.size, "the identity (every cell)", domain)
    factors = {a.name: Identity(a.size) for a in domain.attributes}
    return _kron(domain, factors, "identity", domain.cell_labels())


def total_workload(domain: Domain) -> Workload:
    """The number of rows (one query, all ones)."""
    return _kron(domain, {}, "total", ["total"])


def stack_workloads(workloads: Sequence[Workload], name: str | None = None) -> Workload:
    """Rows of several workloads over the same Domain, one after another, labels kept.

    Stacked parts are flattened, so the result is a union of the parts' Kronecker products.
    """
    parts = list(workloads)
    if not parts:
        raise ValueError("stack_workloads needs at least one workload")
    domain = getattr(parts[0], "domain", None)
    if not isinstance(domain, Domain):
        raise ValueError(f"workload {parts[0].name!r} is not bound to a Domain")
    for p in parts[1:]:
        check_domain(p, domain)
    labels = [lab for p in parts for lab in p.row_labels()]
    return flat_stack(parts, name=name or "+".join(p.name for p in parts)).bind(domain, labels)


def check_domain(workload: Workload, domain: Domain) -> None:
    """Raise DomainMismatchError unless ``workload`` is bound to exactly ``domain``."""
    wd = getattr(workload, "domain", None)
    if wd is None:
        raise DomainMismatchError(
            f"workload {workload.name!r} is not bound to a Domain; build it with dpopt.queries "
            f"over {domain!r}"
        )
    if wd != domain:
        raise DomainMismatchError(
            f"workload {workload.name!r} is over {wd!r} but the data are over {domain!r} "
            f"({wd.difference(domain)}); build the workload and the histogram from the same Domain"
        )
