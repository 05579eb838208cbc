"""Short workload specifications for the command line: `allrange:256`, `wrange:64x128:seed=0`, ...

Grammar: NAME[:ARG[:KEY=VALUE]...]. Kronecker products: `kron:SPEC,SPEC,...` (factor specs separated by
commas). Random families take `seed=S` (default 0) so the same spec always means the same matrix.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np

from dpopt import queries as q
from dpopt.data import Attribute, Domain, IntegerRange, NumericBins
from dpopt.queries import And, Between, Condition, Equals, In
from dpopt.workloads import (
    AllPredicate,
    AllRange,
    ExplicitWorkload,
    GramWorkload,
    Identity,
    Kron,
    Marginals,
    Prefix,
    Total,
    WDiscrete,
    WidthK,
    Workload,
    WRange,
    WRelated,
    WTau,
    flat_stack,
    kron_marginals,
)

SPEC_HELP = """\
workload specs:
  identity:N  total:N  prefix:N  allrange:N  width:N:K  allpredicate:N
  wrange:MxN[:seed=S]  wdiscrete:MxN[:seed=S][:off=-1|0]  wrelated:MxN:s=S[:seed=S]
  wtau:MxN:tau=T[:seed=S]  marginals:N1xN2x...:K (all K-way marginals, e.g. marginals:16x16x16x16:2)
  marginals:N1xN2x...:K,K,...[:prefix|:range] (every K-way subset; with a suffix, Prefix or AllRange
  queries on its attributes and the total on the others, e.g. marginals:32x32x32:1,2:prefix)
  kron:SPEC,SPEC,...  (Kronecker product, e.g. kron:allrange:64,allrange:32)
  union:SPEC|SPEC|... (the specs' rows stacked over the same cells, e.g. union:prefix:64|allrange:64)
  npy:PATH (a dense W saved with numpy.save)  gram-npy:PATH[:m=M] (a saved W^T W of M queries; without
  m the query count is unknown, so RMSE and max_query_std are not reported)
  marginals:PATH.json:K (all K-way marginals over a domain file {"attribute": size, ...})
  marginals:NAME:K (the same over DATA_DIR/NAME/NAME-domain.json; DATA_DIR is $DPOPT_DATA_DIR,
  default ../shared/data beside a source checkout)
  N, M, K and sizes are positive integers; marginals need 1 <= K <= number of attributes, width K <= N,
  wrelated s <= min(M, N), wtau tau in [0, 1], seed >= 0; trailing or unknown parts are refused.
  Kronecker products and marginals are kept in factored form: every mechanism with a factored form works
  through the factors, and one that needs the dense matrix says so by name and size."""


DOMAIN_SPEC_HELP = """\
workload SPEC (';'-separated parts, answered together):
  total | identity          the row count | every cell
  marginal:a,b              counts for every combination of a and b
  marginals:K               all K-way marginals
  marginals:K,K[:prefix|:range]  every K-way subset; with a suffix, prefix or range queries on its
                            (ordinal) columns jointly
  union:SPEC|SPEC           the parts stacked (as ';' does)
  range:age                 all ranges lo..hi of an ordinal column
  predicate:COND            one count; COND is terms joined by '&':
                            col=v (equals), col=v1|v2 (in), col=lo..hi (between, inclusive)
  e.g.  --workload "marginal:religious,children;predicate:rate_marriage=4..5&children=0;range:rate_marriage\"\
"""


class SpecError(ValueError):
    """A workload spec that cannot be parsed."""


_INTEGER = re.compile(r"[+-]?[0-9]+")


def _int(s: str, what: str) -> int:
    """A positive integer written in decimal digits (no sign, fraction, exponent or underscores)."""
    text = s.strip()
    if not _INTEGER.fullmatch(text):
        raise SpecError(f"{what} must be a positive integer, got {s!r}")
    v = int(text)
    if v < 1:
        raise SpecError(f"{what} must be positive, got {v}")
    return v


def _seed(s: str) -> int:
    """A seed: a non-negative integer."""
    text = s.strip()
    if not _INTEGER.fullmatch(text) or int(text) < 0:
        raise SpecError(f"seed must be a non-negative integer, got {s!r}")
    return int(text)


def _fraction(s: str, what: str) -> float:
    """A real number in [0, 1]."""
    try:
        v = float(s)
    except ValueError:
        raise SpecError(f"{what} must be a number in [0, 1], got {s!r}") from None
    if not 0.0 <= v <= 1.0:
        raise SpecError(f"{what} must lie in [0, 1], got {s!r}")
    return v


def marginal_order(text: str, n_attributes: int, spec: str) -> int:
    """K of a K-way marginals spec: an integer in 1..number of attributes."""
    t = text.strip()
    if not _INTEGER.fullmatch(t):
        raise SpecError(f"marginal order K must be an integer in 1..{n_attributes} in spec {spec!r}, got {text!r}")
    k = int(t)
    if not 1 <= k <= n_attributes:
        raise SpecError(
            f"marginal order K must lie in 1..{n_attributes} (the number of attributes) in spec {spec!r}, got {k}"
        )
    return k


def marginal_sizes(text: str, spec: str) -> list[int]:
    """N1xN2x...: the attribute sizes of a marginals spec, each a positive integer."""
    return [_int(part, f"attribute size in spec {spec!r}") for part in text.lower().split("x")]


def _dims(s: str) -> tuple[int, int]:
    parts = s.lower().split("x")
    if len(parts) != 2:
        raise SpecError(f"expected MxN (queries x cells), got {s!r}")
    return _int(parts[0], "M"), _int(parts[1], "N")


def _options(items: list[str], allowed: tuple[str, ...], name: str) -> dict[str, str]:
    """KEY=VALUE items, each key one of `allowed` and given once."""
    out: dict[str, str] = {}
    for item in items:
        if "=" not in item:
            raise SpecError(f"{name}: expected KEY=VALUE with KEY one of {', '.join(allowed)}, got {item!r}")
        k, v = (t.strip() for t in item.split("=", 1))
        if k not in allowed:
            raise SpecError(f"{name}: unknown option {k!r}; expected one of {', '.join(allowed)}")
        if k in out:
            raise SpecError(f"{name}: option {k!r} given twice")
        out[k] = v
    return out


def _need(args: list[str], k: int, name: str, usage: str) -> None:
    """Refuse fewer or more than k colon-separated arguments."""
    if len(args) < k:
        raise SpecError(f"{name} needs arguments: {usage}")
    if len(args) > k:
        extra = ":".join(args[k:])
        raise SpecError(f"{name} takes {k} argument(s), got trailing {extra!r}; expected {usage}")


def _load_npy(path: str, what: str) -> np.ndarray:
    """The numeric array saved in a .npy file; SpecError naming the file and what it should hold."""
    p = Path(path)
    if p.is_dir():
        raise SpecError(f"{what} file {path} is a folder; expected a .npy file written by numpy.save")
    if not p.is_file():
        raise SpecError(f"{what} file not found: {path}")
    try:
        with open(p, "rb") as fh:
            magic = fh.read(6)
    except OSError as exc:
        raise SpecError(f"cannot read {what} file {path}: {exc.strerror or exc}") from None
    if magic != b"\x93NUMPY":
        raise SpecError(f"{what} file {path} is not a .npy file (it does not start with numpy's header); expected "
                        "an array written by numpy.save")
    try:
        return np.load(p, allow_pickle=False)
    except ValueError as exc:
        if "pickle" in str(exc):
            raise SpecError(f"{what} file {path} holds Python objects, not numbers; expected a numeric array "
                            "written by numpy.save") from None
        raise SpecError(f"cannot read {what} file {path}: {exc}") from None
    except OSError as exc:
        raise SpecError(f"cannot read {what} file {path}: {exc.strerror or exc}") from None


def _npy_workload(name: str, rest: str) -> Workload:
    """npy:PATH (a saved W) or gram-npy:PATH[:m=M] (a saved W^T W, and the number M of queries behind it)."""
    m = None
    if name == "gram-npy" and (tail := re.fullmatch(r"(.*):m=([^:]*)", rest)):
        rest, m = tail.group(1), _int(tail.group(2), "m (the number of queries)")
    if not rest:
        raise SpecError(f"{name} needs a path: " + ("npy:PATH" if name == "npy" else "gram-npy:PATH[:m=M]"))
    M = _load_npy(rest, "workload" if name == "npy" else "Gram")
    if name == "npy":
        return ExplicitWorkload(M, name=Path(rest).stem)
    return GramWorkload(M, Path(rest).stem, m=m)


def _simple(args: list[str], name: str, make: Callable[[int], Workload]) -> Workload:
    _need(args, 1, name, f"{name}:N")
    return make(_int(args[0], "N"))


def _random_family(name: str, args: list[str]) -> Workload:
    """wrange / wdiscrete / wrelated / wtau: MxN then KEY=VALUE options."""
    if not args:
        raise SpecError(f"{name} needs arguments: {name}:MxN[:key=value...]")
    m, n = _dims(args[0])
    allowed = {"wrange": ("seed",), "wdiscrete": ("seed", "off"), "wrelated": ("s", "seed"),
               "wtau": ("tau", "seed")}[name]
    opts = _options(args[1:], allowed, name)
    seed = _seed(opts.get("seed", "0"))
    if name == "wrange":
        return WRange(m, n, seed=seed)
    if name == "wdiscrete":
        off = opts.get("off", "-1")
        if off.lstrip("-") not in ("0", "1", "0.0", "1.0") or off in ("1", "1.0", "-0", "-0.0"):
            raise SpecError(f"wdiscrete: off must be -1 or 0, got {off!r}")
        return WDiscrete(m, n, seed=seed, off_value=float(off))
    if name == "wrelated":
        if "s" not in opts:
            raise SpecError("wrelated needs s=RANK, e.g. wrelated:64x128:s=13")
        rank = _int(opts["s"], "s")
        if rank > min(m, n):
            raise SpecError(f"wrelated: s (the rank) must be at most min(M, N) = {min(m, n)}, got {rank}")
        return WRelated(m, n, rank, seed=seed)
    if "tau" not in opts:
        raise SpecError("wtau needs tau=T, e.g. wtau:32x128:tau=0.4")
    return WTau(m, n, _fraction(opts["tau"], "tau"), seed=seed)


def parse_workload(spec: str, domain: Domain | None = None) -> Workload:
    """The workload a spec names; raises SpecError with the reason.

    Without a domain, the size grammar of SPEC_HELP (`allrange:256`, `marginals:3x4x5:2`, `kron:...`);
    over a data Domain, the column grammar of DOMAIN_SPEC_HELP (`marginals:2`, `range:age`, ...), whose
    workloads are bound to the domain and labelled.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise SpecError("empty workload spec")
    if domain is not None:
        return _domain_workload(spec, domain)
    spec = spec.strip()
    name, _, rest = spec.partition(":")
    name = name.lower()
    if name == "kron":
        factors = rest.split(",")
        if len(factors) < 2 or any(not f.strip() for f in factors):
            raise SpecError(f"kron needs two or more comma-separated factor specs, e.g. kron:allrange:64,allrange:32; "
                            f"got {spec!r}")
        return Kron([parse_workload(f) for f in factors])
    if name == "union":
        return _union(rest, spec)
    if name in ("npy", "gram-npy"):
        return _npy_workload(name, rest)
    args = rest.split(":") if rest else []
    try:
        if name in ("identity", "total", "prefix", "allrange", "allpredicate"):
            make = {"identity": Identity, "total": Total, "prefix": Prefix, "allrange": AllRange,
                    "allpredicate": AllPredicate}[name]
            return _simple(args, name, make)
        if name == "width":
            _need(args, 2, name, "width:N:K")
            n, k = _int(args[0], "N"), _int(args[1], "K")
            if k > n:
                raise SpecError(f"width:N:K needs K <= N, got N={n}, K={k}")
            return WidthK(n, k)
        if name in ("wrange", "wdiscrete", "wrelated", "wtau"):
            return _random_family(name, args)
        if name == "marginals":
            return _marginal_orders(rest, spec)
    except SpecError:
        raise
    except ValueError as exc:
        raise SpecError(f"bad workload spec {spec!r}: {exc}") from None
    raise SpecError(f"unknown workload family {name!r} in spec {spec!r}")


# N1xN2x... written with numbers of any form (2.5, -3, 1e3): marginal_sizes then says what is wrong with them
_SIZES = re.compile(r"(?=.*[0-9])\s*[-+0-9.eE_]+(\s*[xX]\s*[-+0-9.eE_]+)*\s*")


def data_dir() -> Path:
    """Where `marginals:NAME:K` finds NAME/NAME-domain.json: $DPOPT_DATA_DIR, else ../shared/data beside a checkout."""
    env = os.environ.get("DPOPT_DATA_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[1].parent / "shared" / "data"


def _marginals(rest: str, spec: str) -> Marginals:
    """marginals:N1xN2x...:K, marginals:PATH.json:K or marginals:NAME:K (all K-way marginals of the domain)."""
    where, sep, ktext = rest.rpartition(":")
    if not sep or not where:
        raise SpecError(f"marginals needs N1xN2x...:K, PATH.json:K or NAME:K, got {spec!r}")
    if _SIZES.fullmatch(where):
        sizes = marginal_sizes(where, spec)
        return Marginals(sizes, k=marginal_order(ktext, len(sizes), spec))
    if ":" in where and not where.lower().endswith(".json"):
        raise SpecError(f"marginals takes N1xN2x...:K, PATH.json:K or NAME:K; got trailing parts in {spec!r}")
    path, label = Path(where), Path(where).stem
    if not where.lower().endswith(".json"):
        path, label = data_dir() / where / f"{where}-domain.json", where
    if not path.is_file():
        raise SpecError(f"no domain file for {where!r}: expected {path}")
    domain = Domain.from_json(path)
    k = marginal_order(ktext, len(domain.shape), spec)
    return Marginals(domain.shape, k=k, attribute_names=domain.names, name=f"marginals({k}-way over {label})")


# -- unions of Kronecker products: marginals with prefix or range factors, and stacks of specs --------------
MARGINAL_FACTORS = ("prefix", "range")


def _factor_suffix(text: str) -> tuple[str, str | None]:
    """(text without it, the factor) when text ends in ':prefix' or ':range', else (text, None)."""
    head, sep, last = text.rpartition(":")
    if sep and last.strip().lower() in MARGINAL_FACTORS:
        return head, last.strip().lower()
    return text, None


def marginal_orders(text: str, n_attributes: int, spec: str) -> list[int]:
    """K,K,...: distinct marginal orders, each in 1..number of attributes."""
    ks = [marginal_order(t, n_attributes, spec) for t in text.split(",")]
    if len(set(ks)) != len(ks):
        raise SpecError(f"marginal orders must be distinct in spec {spec!r}, got {text!r}")
    return sorted(ks)


def _marginal_orders(rest: str, spec: str) -> Workload:
    """marginals:WHERE:K[,K...][:prefix|:range]; without a suffix or list, today's `_marginals`."""
    body, factor = _factor_suffix(rest)
    where, sep, ktext = body.rpartition(":")
    if factor is None and "," not in ktext:
        return _marginals(rest, spec)
    if not sep or not where:
        raise SpecError(f"marginals needs N1xN2x...:K[,K...][:prefix|:range] (or PATH.json / NAME before :K), "
                        f"got {spec!r}")
    base = _marginals(f"{where}:1", spec)  # the attribute sizes and names WHERE stands for
    ks = marginal_orders(ktext, len(base.domain_sizes), spec)
    if factor is None:
        subsets = [S for k in ks for S in combinations(range(len(base.domain_sizes)), k)]
        return Marginals(base.domain_sizes, subsets=subsets, attribute_names=base.attribute_names,
                         name=f"marginals({','.join(map(str, ks))}-way over {'x'.join(map(str, base.domain_sizes))})")
    return kron_marginals(base.domain_sizes, ks, factor, base.attribute_names)


def _union_parts(rest: str, spec: str) -> list[str]:
    """The '|'-separated part specs of a union, at least two and none empty."""
    parts = [p.strip() for p in rest.split("|")]
    if len(parts) < 2 or any(not p for p in parts):
        raise SpecError(f"union needs two or more '|'-separated specs, e.g. union:prefix:64|allrange:64; got {spec!r}")
    return parts


def _union(rest: str, spec: str) -> Workload:
    """union:SPEC|SPEC|...: the parts' rows stacked (stacks flattened, so unions of Kronecker products stay one)."""
    parts = [parse_workload(p) for p in _union_parts(rest, spec)]
    if len({w.n for w in parts}) != 1:
        cells = ", ".join(f"{w.name}: {w.n}" for w in parts)
        raise SpecError(f"union parts must have the same number of cells in spec {spec!r}; got {cells}")
    return flat_stack(parts, name="union(" + "|".join(w.name for w in parts) + ")")


def _domain_marginal_orders(domain: Domain, arg: str, part: str) -> Workload:
    """marginals:K[,K...][:prefix|:range] over a Domain: plain marginals of each order, or prefix / range queries."""
    body, factor = _factor_suffix(arg)
    ks = marginal_orders(body, len(domain), part)
    try:
        return q.marginals_of_orders(domain, ks) if factor is None else q.kron_marginals_workload(domain, ks, factor)
    except ValueError as exc:
        raise SpecError(f"workload part {part!r}: {exc}") from None


def _domain_union(domain: Domain, arg: str, part: str) -> Workload:
    """union:SPEC|SPEC|... over a Domain: the parts stacked, labels kept."""
    pieces = [_domain_workload(p, domain) for p in _union_parts(arg, part)]
    return q.stack_workloads(pieces, name=part)


# -- workloads over a data Domain ----------------------------------------------------------------
def split_names(text: str) -> list[str]:
    """Column names of a comma-separated list; refuses an empty one."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise SpecError(f"expected a comma-separated list of columns, got {text!r}")
    return names


def _one_column(text: str, part: str) -> str:
    """The one column named by a `range:COL` part."""
    names = split_names(text)
    if len(names) != 1:
        raise SpecError(f"workload part {part!r}: range takes one ordinal column, got {len(names)}; expected "
                        "range:COL (one range part per column)")
    return names[0]


def _value(attr: Attribute, token: str) -> Any:
    """The level of ``attr`` written as ``token`` on the command line."""
    token = token.strip()
    if isinstance(attr, IntegerRange):
        try:
            return int(token)
        except ValueError:
            raise SpecError(f"column {attr.name!r}: {token!r} is not an integer; expected "
                           f"{attr.expected()}") from None
    if isinstance(attr, NumericBins):
        try:
            return float(token)
        except ValueError:
            raise SpecError(f"column {attr.name!r}: {token!r} is not a number") from None
    for code in range(attr.n_regular):
        level = attr.value_of(code)
        if str(level) == token:
            return level
        try:
            if float(token) == float(level):
                return level
        except (TypeError, ValueError):
            pass
    raise SpecError(f"column {attr.name!r}: {token!r} is not a level; expected {attr.expected()}")


def _condition(domain: Domain, text: str) -> Condition:
    parts: list[Condition] = []
    for term in text.split("&"):
        if "=" not in term:
            raise SpecError(f"predicate term {term!r} must look like col=v, col=v1|v2 or col=lo..hi")
        name, rhs = (t.strip() for t in term.split("=", 1))
        try:
            attr = domain.attribute(name)
        except ValueError as exc:
            raise SpecError(str(exc)) from None
        if ".." in rhs:
            lo, hi = rhs.split("..", 1)
            parts.append(Between(name, _value(attr, lo), _value(attr, hi)))
        elif "|" in rhs:
            parts.append(In(name, [_value(attr, v) for v in rhs.split("|")]))
        else:
            parts.append(Equals(name, _value(attr, rhs)))
    return parts[0] if len(parts) == 1 else And(*parts)


def _domain_workload(spec: str, domain: Domain) -> Workload:
    """Workload bound to ``domain`` from a ';'-separated DOMAIN_SPEC_HELP string (labelled rows)."""
    pieces = []
    for part in (p.strip() for p in spec.split(";")):
        if not part:
            continue
        kind, colon, arg = part.partition(":")
        kind = kind.strip()
        if kind in ("total", "identity") and colon:
            raise SpecError(f"workload part {part!r}: {kind} takes no argument (it spans every column of the "
                            f"domain); expected {kind!r} alone")
        if kind == "total":
            pieces.append(q.total_workload(domain))
        elif kind == "identity":
            pieces.append(q.identity_workload(domain))
        elif kind == "marginal":
            pieces.append(q.marginal_workload(domain, split_names(arg)))
        elif kind == "marginals" and ("," in arg or ":" in arg):
            pieces.append(_domain_marginal_orders(domain, arg, part))
        elif kind == "union":
            pieces.append(_domain_union(domain, arg, part))
        elif kind == "marginals":
            pieces.append(q.marginals_workload(domain, marginal_order(arg, len(domain), part)))
        elif kind == "range":
            pieces.append(q.range_workload(domain, _one_column(arg, part)))
        elif kind == "predicate":
            pieces.append(q.predicate_workload(domain, [_condition(domain, arg)]))
        else:
            raise SpecError(f"workload part {part!r}: expected total, identity, marginal:COLS, "
                           "marginals:K[,K...][:prefix|:range], range:COL, predicate:COND or union:SPEC|SPEC")
    if not pieces:
        raise SpecError(f"workload spec {spec!r} is empty")
    return pieces[0] if len(pieces) == 1 else q.stack_workloads(pieces, name=spec)
