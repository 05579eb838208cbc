"""Workload specs that need the implicit path: large Kronecker products and marginals over a domain file.

- `kron:SPEC,SPEC,...`: a KronWorkload of the 1-D factor specs (any spec `dpopt.specs` understands) when
  the dense W^T W would exceed MAX_DENSE_ENTRIES (or always with force=True); else None so the dense
  parser keeps it.
- `marginals:NAME:K`: all K-way marginals over `<data_dir>/NAME/NAME-domain.json` (`$DPOPT_DATA_DIR`);
  `marginals:PATH.json:K` reads that domain file; `marginals:N1xN2x...:K` is implicit when the domain is too
  large for the dense path (or with force=True).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from dpopt.implicit.adult import DEFAULT_DATA_DIR, load_domain
from dpopt.implicit.workloads import ImplicitWorkload, KronWorkload, MarginalsWorkload
from dpopt.specs import SpecError, marginal_order, marginal_sizes, parse_workload
from dpopt.workloads import MAX_DENSE_ENTRIES

IMPLICIT_SPEC_HELP = """\
implicit workload specs (never materialise W or W^T W):
  kron:SPEC,SPEC,...      Kronecker product of 1-D specs (implicit when n^2 > MAX_DENSE_ENTRIES)
  marginals:NAME:K        all K-way marginals over DATA_DIR/NAME/NAME-domain.json (DATA_DIR: $DPOPT_DATA_DIR)
  marginals:PATH.json:K   all K-way marginals over the domain in PATH.json
  marginals:N1xN2x...:K   all K-way marginals over the given sizes (implicit when too large, e.g. marginals:16x16x16x16:2)"""


# N1xN2x... written with numbers of any form (2.5, -3, 1e3): marginal_sizes then says what is wrong with them
_SIZES = re.compile(r"(?=.*[0-9])\s*[-+0-9.eE_]+(\s*[xX]\s*[-+0-9.eE_]+)*\s*")


def _too_large(n: int) -> bool:
    return n * n > MAX_DENSE_ENTRIES


def parse_implicit_spec(
    spec: str, data_dir: str | Path = DEFAULT_DATA_DIR, force: bool = False
) -> ImplicitWorkload | None:
    """The implicit workload a spec names, or None when the dense parser should handle it."""
    if not isinstance(spec, str) or not spec.strip():
        raise SpecError("empty workload spec")
    spec = spec.strip()
    family, _, rest = spec.partition(":")
    family = family.lower()
    if family == "kron":
        parts = rest.split(",")
        if len(parts) < 2 or any(not p.strip() for p in parts):
            raise SpecError(f"kron needs two or more comma-separated factor specs, e.g. kron:allrange:64,allrange:32; got {spec!r}")
        factors = [parse_workload(p) for p in parts]
        n = math.prod(f.n for f in factors)
        if force or _too_large(n):
            return KronWorkload(factors)
        return None
    if family == "marginals":
        where, sep, ktext = rest.rpartition(":")
        if not sep or not where:
            raise SpecError(f"marginals needs NAME:K, PATH.json:K or N1xN2x...:K, got {spec!r}")
        if ":" in where and not where.lower().endswith(".json"):
            raise SpecError(f"marginals takes NAME:K, PATH.json:K or N1xN2x...:K; got trailing parts in {spec!r}")
        try:
            if where.lower().endswith(".json"):
                names, sizes = load_domain(where)
                k = marginal_order(ktext, len(sizes), spec)
                return MarginalsWorkload(sizes, k=k, attribute_names=names, name=f"marginals({k}-way over {Path(where).stem})")
            if _SIZES.fullmatch(where):
                sizes = marginal_sizes(where, spec)
                k = marginal_order(ktext, len(sizes), spec)
                if force or _too_large(math.prod(sizes)):
                    return MarginalsWorkload(sizes, k=k)
                return None
            path = Path(data_dir) / where / f"{where}-domain.json"
            if not path.is_file():
                raise SpecError(f"no domain file for {where!r}: expected {path}")
            names, sizes = load_domain(path)
            k = marginal_order(ktext, len(sizes), spec)
            return MarginalsWorkload(sizes, k=k, attribute_names=names, name=f"marginals({k}-way over {where})")
        except SpecError:
            raise
        except ValueError as exc:
            raise SpecError(f"bad workload spec {spec!r}: {exc}") from None
    return None
