"""Short workload specifications for the command line: `allrange:256`, `wrange:64x128:seed=0`, ...

Grammar: NAME[:ARG[:KEY=VALUE]...]. Kronecker products: `kron:SPEC,SPEC,...` (factor specs separated by
commas). Random families take `seed=S` (default 0) so the same spec always means the same matrix.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

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
)

SPEC_HELP = """\
workload specs:
  identity:N  total:N  prefix:N  allrange:N  width:N:K  allpredicate:N
  wrange:MxN[:seed=S]  wdiscrete:MxN[:seed=S][:off=-1|0]  wrelated:MxN:s=S[:seed=S]
  wtau:MxN:tau=T[:seed=S]  marginals:N1xN2x...:K (all K-way marginals)
  kron:SPEC,SPEC,...  (Kronecker product, e.g. kron:allrange:64,allrange:32)
  npy:PATH (a dense W saved with numpy.save)  gram-npy:PATH (a saved W^T W)
  marginals:NAME:K  marginals:PATH.json:K (all K-way marginals over a domain file, e.g. marginals:adult:2)
  Kronecker products and marginals too large for a dense W^T W are handled implicitly (mechanism hdmm)."""


class SpecError(ValueError):
    """A workload spec that cannot be parsed."""


def _int(s: str, what: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise SpecError(f"{what} must be an integer, got {s!r}") from None
    if v < 1:
        raise SpecError(f"{what} must be positive, got {v}")
    return v


def _dims(s: str) -> tuple[int, int]:
    parts = s.lower().split("x")
    if len(parts) != 2:
        raise SpecError(f"expected MxN (queries x cells), got {s!r}")
    return _int(parts[0], "M"), _int(parts[1], "N")


def _options(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        if "=" not in item:
            raise SpecError(f"expected KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def _need(args: list[str], k: int, name: str, usage: str) -> None:
    if len(args) < k:
        raise SpecError(f"{name} needs arguments: {usage}")


def _load_npy(path: str, what: str) -> np.ndarray:
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"{what} file not found: {path}")
    try:
        return np.load(p, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise SpecError(f"cannot read {what} file {path}: {exc}") from None


def _simple(args: list[str], name: str, make: Callable[[int], Workload]) -> Workload:
    _need(args, 1, name, f"{name}:N")
    return make(_int(args[0], "N"))


def parse_workload(spec: str) -> Workload:
    """Build the workload a spec names (see SPEC_HELP); raises SpecError with the reason."""
    if not isinstance(spec, str) or not spec.strip():
        raise SpecError("empty workload spec")
    spec = spec.strip()
    name, _, rest = spec.partition(":")
    name = name.lower()
    if name in ("kron", "marginals"):
        from dpopt.implicit.specs import (
            parse_implicit_spec,  # lazy: the implicit parser uses this one
        )

        implicit = parse_implicit_spec(spec)
        if implicit is not None:
            return implicit
    if name == "kron":
        factors = [f for f in rest.split(",") if f]
        if len(factors) < 2:
            raise SpecError("kron needs at least two comma-separated factor specs")
        return Kron([parse_workload(f) for f in factors])
    if name in ("npy", "gram-npy"):
        if not rest:
            raise SpecError(f"{name} needs a path: {name}:PATH")
        M = _load_npy(rest, "workload" if name == "npy" else "Gram")
        return ExplicitWorkload(M, name=Path(rest).stem) if name == "npy" else GramWorkload(M, Path(rest).stem)
    args = rest.split(":") if rest else []
    try:
        if name == "identity":
            return _simple(args, name, Identity)
        if name == "total":
            return _simple(args, name, Total)
        if name == "prefix":
            return _simple(args, name, Prefix)
        if name == "allrange":
            return _simple(args, name, AllRange)
        if name == "allpredicate":
            return _simple(args, name, AllPredicate)
        if name == "width":
            _need(args, 2, name, "width:N:K")
            return WidthK(_int(args[0], "N"), _int(args[1], "K"))
        if name in ("wrange", "wdiscrete", "wrelated", "wtau"):
            _need(args, 1, name, f"{name}:MxN[:key=value...]")
            m, n = _dims(args[0])
            opts = _options(args[1:])
            seed = int(opts.pop("seed", "0"))
            if name == "wrange":
                w: Workload = WRange(m, n, seed=seed)
            elif name == "wdiscrete":
                w = WDiscrete(m, n, seed=seed, off_value=float(opts.pop("off", "-1")))
            elif name == "wrelated":
                if "s" not in opts:
                    raise SpecError("wrelated needs s=RANK, e.g. wrelated:64x128:s=13")
                w = WRelated(m, n, _int(opts.pop("s"), "s"), seed=seed)
            else:
                if "tau" not in opts:
                    raise SpecError("wtau needs tau=T, e.g. wtau:32x128:tau=0.4")
                w = WTau(m, n, float(opts.pop("tau")), seed=seed)
            if opts:
                raise SpecError(f"unknown options for {name}: {', '.join(opts)}")
            return w
        if name == "marginals":
            _need(args, 2, name, "marginals:N1xN2x...:K")
            sizes = [_int(s, "attribute size") for s in args[0].lower().split("x")]
            return Marginals(sizes, k=int(args[1]))
    except SpecError:
        raise
    except ValueError as exc:
        raise SpecError(f"bad workload spec {spec!r}: {exc}") from None
    raise SpecError(f"unknown workload family {name!r} in spec {spec!r}")
